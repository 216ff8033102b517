package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

// startupHold is the hold window TestStartupDropsCounted runs the
// aggregator with (the exporter's); 0 shows what is lost without it.
var startupHold = hubble.DefaultHold

// TestStartupDropsCounted is item 3 of issue 45 on the real kube-apiserver
// and a Hubble Observer over gRPC (sim.NewHubble on a unix socket, read by
// collector/hubble's Client into its Aggregator with the exporter's hold):
// a PyTorchJob's master runs on the view's node (zone b), its two workers
// on other nodes (zone a), and a zone fence drops every SYN of the workers
// to the master; the master's node's Hubble shows each denied SYN as a
// policy-verdict and a drop event. The per-node view (NewLocal, with a
// fake ipcache: an in-memory map, empty until its first read) starts
// beside the job, and the drops are delivered in three phases while it
// catches up, the hook holding it at each step: (a) the node's pod
// informer has not delivered the local master (its add handler held) and
// the ipcache has not been read; (b) the master is delivered, the ipcache
// read (the workers placed on their nodes, without their job), and the
// job's feed is still listing (its list call held); (c) the feed has listed, the workers are in its store, and its
// handlers are delayed (held). Then the hook releases them. Every drop is
// counted for the job, between the job's own pods, from zone a to zone b,
// nothing as a peer drop, nothing uncounted; and every flow the client
// processed is counted, uncounted with its reason, or held.
func TestStartupDropsCounted(t *testing.T) {
	testenv.Integration(t)
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := kubernetes.NewForConfigOrDie(api.Config)
	const ns, job, fence = "ml-team", "llm", "zone-fence"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The cluster: node-0 (the view's, zone b) runs the master, node-1
	// and node-2 (zone a) a worker each. The scenario is the same cluster
	// for the fake Hubble.
	shape := ghostShapes[0] // PyTorchJob
	s := &sim.Scenario{Zones: []string{"zone-a", "zone-b"}}
	sj := sim.Job{Namespace: ns, Name: job, Kind: "PyTorchJob", Behaviour: sim.Behaviour{FlowsPerSecond: 1, BlockedBy: ns + "/" + fence}}
	for i, zone := range []string{"zone-b", "zone-a", "zone-a"} {
		node := fmt.Sprintf("node-%d", i)
		nodeIP := netip.MustParseAddr(fmt.Sprintf("172.18.0.%d", 10+i))
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{kube.LabelZone: zone}}}
		n, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP.String()}}
		if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		s.Nodes = append(s.Nodes, sim.Node{Name: node, Zone: zone, IP: nodeIP, PodCIDR: netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/24", i))})
		name, labels := shape.pod(job, i, i == 0)
		role := topology.RoleWorker
		if i == 0 {
			role = topology.RoleCoordinator
		}
		ip := fmt.Sprintf("10.%d.0.2", i)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}}
		created, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		sj.Pods = append(sj.Pods, sim.Pod{Namespace: ns, Name: name, Node: node, IP: netip.MustParseAddr(ip), Role: role,
			Labels: labels, OwnerKind: "PyTorchJob", OwnerName: job})
	}
	s.Jobs = []sim.Job{sj}
	master := sj.Pods[0].Name
	feed := ns + "/" + shape.label + "=" + job

	// The view, held from its start: (a), (b) and (c); the node's ipcache
	// not read yet (empty) until (b).
	index := topology.NewIndex()
	ipc := &startupIPCache{}
	index.SetRemote("node-0", ipc, nil, topology.DefaultRules())
	l, fs, err := kube.NewLocal(kubeapi.NewForConfigOrDie(api.Config), index, topology.DefaultRules(), "node-0", 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h := newHandlers(ctx)
	kube.SetHook(l, h.hook)
	nodeAdd := h.hold(on("", "add", master))
	feedList := h.hold(on(feed, "list", ""))
	feedAdd := h.hold(on(feed, "add", ""))

	// The node's Hubble and the exporter's client and aggregator.
	dir, err := os.MkdirTemp("", "zws")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "h.sock")
	hub := sim.NewHubble(s, "node-0", 0)
	if err := hub.Start(sock); err != nil {
		t.Fatal(err)
	}
	defer hub.Stop()
	agg := hubble.NewAggregator(index, "node-0", time.Minute, hubble.NewMetrics(nil))
	agg.SetHold(startupHold)
	base := time.Now()
	c := hubble.NewClient(hubble.Config{Address: "unix://" + sock, Since: base.Add(-time.Second),
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, agg)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { agg.Run(runCtx); done <- struct{}{} }()
	go func() { c.Run(runCtx); done <- struct{}{} }()
	defer func() { stop(); <-done; <-done }()
	viewCtx, stopView := context.WithCancel(ctx)
	defer stopView()
	synced := make(chan error, 1)
	go func() { synced <- l.Run(viewCtx, fs) }()

	// Each phase publishes 5 s of the job's denied SYNs on node-0 and
	// waits until the client has received them all.
	m := agg.Metrics()
	received := func() uint64 {
		return uint64(testutil.ToFloat64(m.Processed) + testutil.ToFloat64(m.SkippedReplayed) + testutil.ToFloat64(m.SkippedEarly))
	}
	var published, phases int
	var log []string
	phase := func(what string) {
		t.Helper()
		published += hub.Generate(base.Add(time.Duration(phases)*5*time.Second), 5*time.Second)
		phases++
		waitUntil(t, ctx, what+": the client receives every flow", func() bool {
			st := hub.Streams()
			return st.Open > 0 && st.CaughtUp && received() == st.Flows
		})
		log = append(log, fmt.Sprintf("%s: %d flows published, %d drop series, %d flows held", what, published, agg.Drops().Len(), agg.Held()))
		accountedFlows(t, agg)
	}

	phase("(a) the node's pod informer has not delivered " + master + ", the ipcache not read")
	mark := h.mark()
	h.release(nodeAdd)
	h.waitRan(t, mark, "the node's pod informer adds "+master, on("", "add", master))
	// The ipcache's first read: every pod's address, the remote ones on
	// their node (its tunnel endpoint), with a pod's identity.
	for _, p := range sj.Pods {
		e := topology.RemoteEntry{Identity: 30000, Bits: 32}
		if p.Node != "node-0" {
			e.NodeIP = s.NodeByName(p.Node).IP
		}
		ipc.put(p.IP, e)
	}
	phase("(b) the ipcache read, the job's feed is listing")
	h.release(feedList)
	waitUntil(t, ctx, "the job's feed stores the job's 3 pods", func() bool {
		return len(kube.FeedStored(l, ns, shape.label, job)) == 3
	})
	phase("(c) the job's feed has listed, its handlers are held")
	h.release(feedAdd)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	for _, p := range sj.Pods {
		if e, _ := index.LookupIP(p.IP); e.Job == nil || e.Job.Name != job {
			t.Fatalf("after the release, %s (%s) resolves to %+v", p.Name, p.IP, e)
		}
	}
	waitUntil(t, ctx, "no flow held", func() bool { return agg.Held() == 0 })

	// Each denied SYN is one policy-verdict and one drop event on node-0.
	want := float64(published / 2)
	var got, wrong float64
	var series []string
	agg.Drops().Each(func(k hubble.DropKey, v float64) {
		series = append(series, fmt.Sprintf("%s/%s %s>%s %s peer=%s policy=%s/%s: %g", k.Namespace, k.Job, k.SrcZone, k.DstZone, k.Locality, k.Peer, k.PolicyNamespace, k.PolicyName, v))
		if k.Namespace == ns && k.Job == job && k.SrcZone == "zone-a" && k.DstZone == "zone-b" && k.Peer == hubble.PeerJob &&
			k.PolicyNamespace == ns && k.PolicyName == fence {
			got += v
		} else {
			wrong += v
		}
	})
	var peerDrops float64
	agg.PeerDrops().Each(func(_ hubble.PeerDropKey, v float64) { peerDrops += v })
	slices.Sort(series)
	uncounted := map[string]float64{}
	for reason, c := range m.Uncounted {
		uncounted[reason] = testutil.ToFloat64(c)
	}
	if got != want || wrong != 0 || peerDrops != 0 || uncounted["no_job"] != 0 || uncounted["hold_full"] != 0 {
		t.Errorf("%g drops of %s/%s counted between its pods from zone-a to zone-b, want %g; %g counted otherwise, %g as peer drops; uncounted %v\n%s\ndrop series:\n%s",
			got, ns, job, want, wrong, peerDrops, uncounted, strings.Join(log, "\n"), strings.Join(series, "\n"))
	}
	accountedFlows(t, agg)
	t.Logf("hold %v: %g of %g drops counted for %s/%s (zone-a>zone-b, peer job), processed %g flows; uncounted %v\n%s",
		startupHold, got, want, ns, job, testutil.ToFloat64(m.Processed), uncounted, strings.Join(log, "\n"))
}

// startupIPCache is the node's ipcache as the index reads it: empty
// until its first read.
type startupIPCache struct {
	mu sync.Mutex
	m  map[netip.Addr]topology.RemoteEntry
}

func (c *startupIPCache) put(a netip.Addr, e topology.RemoteEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[netip.Addr]topology.RemoteEntry{}
	}
	c.m[a] = e
}

func (c *startupIPCache) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[a]
	return e, ok
}

// accountedFlows checks that every flow the aggregator processed is
// counted (its flow events), uncounted with a reason, or held. The
// counters are read without the aggregator's lock while its retries run:
// a snapshot taken across a retry may not add up, so a few are taken; one
// that adds up is a pass, and a flow lost keeps every one from adding up.
func accountedFlows(t *testing.T, a *hubble.Aggregator) {
	t.Helper()
	var last string
	for range 50 {
		var counted, un float64
		a.Events().Each(func(_ hubble.EventKey, v float64) { counted += v })
		m := a.Metrics()
		for _, c := range m.Uncounted {
			un += testutil.ToFloat64(c)
		}
		held := a.Held()
		p := testutil.ToFloat64(m.Processed)
		if p == counted+un+float64(held) {
			return
		}
		last = fmt.Sprintf("processed %g flows: %g counted, %g uncounted, %d held", p, counted, un, held)
		time.Sleep(20 * time.Millisecond)
	}
	t.Error(last)
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
