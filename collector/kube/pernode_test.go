package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// clusterCilium is what the Cilium agents of a cluster would hold, derived
// from the cluster's objects: the ipcache (every pod address with its node
// and identity, every node address) and the identities (a pod's labels as
// Cilium's own label filter keeps them, with its namespace). Each node's
// view of it (nodeIPCache) gives its own endpoints no tunnel endpoint, as
// the agent does.
type clusterCilium struct {
	mu      sync.Mutex
	entries map[netip.Addr]ciliumEntry
	ids     map[string]uint32 // identity labels (sorted, with namespace) -> id
	labels  map[uint32]identityLabels
	live    map[uint32]bool // identities some pod has now
}

type ciliumEntry struct {
	node     string
	nodeIP   netip.Addr
	identity uint32
}

type identityLabels struct {
	namespace string
	labels    map[string]string
}

func newClusterCilium() *clusterCilium {
	return &clusterCilium{ids: map[string]uint32{}, labels: map[uint32]identityLabels{}}
}

// ciliumIgnored is the default label filter of Cilium v1.20.2
// (pkg/labelsfilter, defaultLabelPrefixCfg): the label keys an identity
// leaves out, each pattern matched at the start of the key. Of the keys
// the job rules read it drops the completion index (also kept as an
// annotation, which identities never hold).
var ciliumIgnored = regexp.MustCompile(`^(io\.kubernetes|kubernetes\.io|statefulset\.kubernetes\.io/pod-name|apps\.kubernetes\.io/pod-index|` +
	`batch\.kubernetes\.io/job-completion-index|batch\.kubernetes\.io/controller-uid|.*beta\.kubernetes\.io|k8s\.io|pod-template-generation|` +
	`pod-template-hash|controller-revision-hash|controller-uid|annotation.*|etcd_node|topology\.kubernetes\.io)`)

// identity allocates (or finds) the identity of a pod's labels as Cilium
// derives it: the labels its default filter keeps, and the namespace.
func (c *clusterCilium) identity(ns string, podLabels map[string]string) uint32 {
	kept := map[string]string{}
	var keys []string
	for k, v := range podLabels {
		if !ciliumIgnored.MatchString(k) {
			kept[k] = v
			keys = append(keys, k+"="+v)
		}
	}
	sort.Strings(keys)
	key := ns + "|" + strings.Join(keys, ",")
	id, ok := c.ids[key]
	if !ok {
		id = uint32(100000 + len(c.ids))
		c.ids[key] = id
		c.labels[id] = identityLabels{ns, kept}
	}
	return id
}

// sync rebuilds the ipcache from the cluster's current nodes and pods.
func (c *clusterCilium) sync(nodes []corev1.Node, pods []corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = map[netip.Addr]ciliumEntry{}
	c.live = map[uint32]bool{}
	nodeIP := map[string]netip.Addr{}
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP {
				nodeIP[n.Name] = ip
				c.entries[ip] = ciliumEntry{node: n.Name, identity: 6} // remote-node
			}
		}
	}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Spec.NodeName == "" || p.Status.PodIP == "" ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			continue
		}
		id := c.identity(p.Namespace, p.Labels)
		c.live[id] = true
		c.entries[ip] = ciliumEntry{node: p.Spec.NodeName, nodeIP: nodeIP[p.Spec.NodeName], identity: id}
	}
}

func (c *clusterCilium) entry(a netip.Addr) (ciliumEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[a]
	return e, ok
}

// Labels implements topology.Identities: an identity is known while a pod
// has it (the agents' identity cache; Cilium collects unused ones later).
func (c *clusterCilium) Labels(id uint32) (string, map[string]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.labels[id]
	if !ok || !c.live[id] {
		return "", nil, false
	}
	return l.namespace, l.labels, true
}

// nodeIPCache is one node's ipcache.
type nodeIPCache struct {
	c    *clusterCilium
	node string
}

func (n nodeIPCache) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	e, ok := n.c.entry(a)
	if !ok {
		return topology.RemoteEntry{Identity: 2}, true // the world prefix, 0.0.0.0/0
	}
	out := topology.RemoteEntry{NodeIP: e.nodeIP, Identity: e.identity, Bits: 32}
	if e.node == n.node || e.identity == 6 {
		out.NodeIP = netip.Addr{} // this node's endpoints, node addresses: no tunnel endpoint
	}
	return out, true
}

// randomCluster is the test's cluster: nodes in zones, jobs of several
// controllers and pods of no job, each pod with an address of its node.
type randomCluster struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	r      *rand.Rand
	nodes  int
	zones  map[string]string // node -> zone label
	jobs   map[string][]*corev1.Pod
	seq    int
	nextIP map[string]int
}

func (c *randomCluster) nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

func (c *randomCluster) createNodes() {
	for i := range c.nodes {
		name := c.nodeName(i)
		c.zones[name] = fmt.Sprintf("zone-%d", i%3)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelZone: c.zones[name], kube.LabelRegion: "r1"}},
			Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.1.%d.0/24", i)}}
		created, err := c.client.CoreV1().Nodes().Create(c.ctx, n, metav1.CreateOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.0.%d", i+1)}}
		if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *randomCluster) relabelNode() {
	name := c.nodeName(c.r.IntN(c.nodes))
	n, err := c.client.CoreV1().Nodes().Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.zones[name] = fmt.Sprintf("zone-%d", c.r.IntN(4))
	n.Labels[kube.LabelZone] = c.zones[name]
	if _, err := c.client.CoreV1().Nodes().Update(c.ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// jobPods returns the pods of a new job of a random controller, as its
// controller labels them.
func (c *randomCluster) jobPods(ns string) (string, []*corev1.Pod) {
	c.seq++
	name := fmt.Sprintf("j%d", c.seq)
	var pods []*corev1.Pod
	add := func(pod string, labels map[string]string) {
		pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, Labels: labels}})
	}
	n := 1 + c.r.IntN(4)
	switch c.r.IntN(5) {
	case 0: // PyTorchJob: a master and workers
		add(name+"-master-0", map[string]string{"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": "master",
			"training.kubeflow.org/replica-index": "0", "training.kubeflow.org/job-role": "master", "training.kubeflow.org/operator-name": "pytorchjob-controller"})
		for i := range n {
			add(fmt.Sprintf("%s-worker-%d", name, i), map[string]string{"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": "worker",
				"training.kubeflow.org/replica-index": fmt.Sprint(i), "training.kubeflow.org/operator-name": "pytorchjob-controller"})
		}
	case 1: // JobSet: its Jobs' pods carry the batch labels too
		for i := range n + 1 {
			add(fmt.Sprintf("%s-node-0-%d", name, i), map[string]string{"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "node",
				"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-name": name + "-node-0", topology.LabelCompletionIndex: fmt.Sprint(i)})
		}
	case 2: // LeaderWorkerSet: two groups
		for g := range 2 {
			for w := range n {
				add(fmt.Sprintf("%s-%d-%d", name, g, w), map[string]string{"leaderworkerset.sigs.k8s.io/name": name,
					"leaderworkerset.sigs.k8s.io/group-index": fmt.Sprint(g), "leaderworkerset.sigs.k8s.io/worker-index": fmt.Sprint(w)})
			}
		}
	case 3: // an Indexed batch Job, of one pod (no training job) or more
		for i := range n {
			add(fmt.Sprintf("%s-%d", name, i), map[string]string{"batch.kubernetes.io/job-name": name, topology.LabelCompletionIndex: fmt.Sprint(i)})
		}
	default: // Volcano
		add(name+"-master-0", map[string]string{"volcano.sh/job-name": name, "volcano.sh/task-spec": "master"})
		for i := range n {
			add(fmt.Sprintf("%s-worker-%d", name, i), map[string]string{"volcano.sh/job-name": name, "volcano.sh/task-spec": "worker"})
		}
	}
	return name, pods
}

// place creates a pod on a random node (or unscheduled) and runs it.
func (c *randomCluster) place(p *corev1.Pod) {
	p = p.DeepCopy()
	p.ResourceVersion, p.UID = "", ""
	p.Spec = corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}
	unscheduled := c.r.IntN(12) == 0
	if !unscheduled {
		p.Spec.NodeName = c.nodeName(c.r.IntN(c.nodes))
	}
	created, err := c.client.CoreV1().Pods(p.Namespace).Create(c.ctx, p, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	if unscheduled {
		return
	}
	node := created.Spec.NodeName
	c.nextIP[node]++
	ip := fmt.Sprintf("10.1.%s.%d", strings.TrimPrefix(node, "node-"), 1+c.nextIP[node]%250)
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if c.r.IntN(15) == 0 {
		created.Status.Phase = corev1.PodSucceeded
	}
	if _, err := c.client.CoreV1().Pods(p.Namespace).UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *randomCluster) deletePod(p *corev1.Pod) {
	err := c.client.CoreV1().Pods(p.Namespace).Delete(c.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil {
		c.t.Fatal(err)
	}
}

// churn makes one random change: a job created, deleted or one of its pods
// re-placed, a node relabelled, a pod of no job created.
func (c *randomCluster) churn() {
	names := make([]string, 0, len(c.jobs))
	for j := range c.jobs {
		names = append(names, j)
	}
	sort.Strings(names)
	switch op := c.r.IntN(10); {
	case op < 3 || len(names) < 3:
		ns := []string{"ml", "research"}[c.r.IntN(2)]
		name, pods := c.jobPods(ns)
		for _, p := range pods {
			c.place(p)
		}
		c.jobs[ns+"/"+name] = pods
	case op < 5:
		j := names[c.r.IntN(len(names))]
		for _, p := range c.jobs[j] {
			c.deletePod(p)
		}
		delete(c.jobs, j)
	case op < 8:
		pods := c.jobs[names[c.r.IntN(len(names))]]
		p := pods[c.r.IntN(len(pods))]
		c.deletePod(p)
		c.waitGone(p)
		c.place(p)
	case op < 9:
		c.relabelNode()
	default:
		c.seq++
		c.place(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: fmt.Sprintf("web-%d", c.seq), Labels: map[string]string{"app": "web"}}})
	}
}

func (c *randomCluster) waitGone(p *corev1.Pod) {
	for range 100 {
		if _, err := c.client.CoreV1().Pods(p.Namespace).Get(c.ctx, p.Name, metav1.GetOptions{}); err != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("pod %s/%s not gone", p.Namespace, p.Name)
}

// observed is everything one node's exporter exports from a view: the
// node's placements, the Hubble counters and the conntrack byte series of
// the same flows and connections, and which jobs exist.
type observed struct {
	Placements []string
	Hubble     []string
	Bytes      []string
	JobsExist  []string
}

// addrInfo is one address of the cluster, as the flows name it.
type addrInfo struct {
	ip       netip.Addr
	node     string // the pod's (or node's) node
	ns, pod  string
	workload string
	identity uint32
	// unnamed: a job pod whose identity cannot name its job (an Indexed
	// Job's: Cilium drops the completion index, and a minimum of pods is
	// not in an identity).
	unnamed bool
}

// observe runs the exporter's consumers, Hubble's aggregator and the
// conntrack poller, over idx with the same flows on node.
func observe(t *testing.T, idx *topology.Index, node string, addrs []addrInfo, skip func(a, b addrInfo) bool) observed {
	t.Helper()
	var o observed
	for _, jp := range idx.Placements(node) {
		jp.Version = 0
		o.Placements = append(o.Placements, fmt.Sprintf("%+v", jp))
	}
	agg := hubble.NewAggregator(idx, node, time.Hour, nil)
	ep := func(a addrInfo) hubble.EndpointFields {
		e := hubble.EndpointFields{Identity: a.identity, Namespace: a.ns, PodName: a.pod, Workload: a.workload}
		if a.node == node && a.pod != "" {
			e.ID = 1000 // only the observing node's endpoints have an ID
		}
		if a.node == "" {
			e.Identity = 2 // world
		}
		return e
	}
	src := conntrack.NewMemSource()
	tab := conntrack.NewMemTable(conntrack.KeySize4)
	port := uint16(1000)
	for _, a := range addrs {
		for _, b := range addrs {
			if a.ip == b.ip || skip(a, b) {
				continue
			}
			for _, tmpl := range []hubble.Fields{
				{Verdict: flowpb.Verdict_FORWARDED, EventType: 4, Point: flowpb.TraceObservationPoint_TO_STACK, Direction: flowpb.TrafficDirection_EGRESS},
				{Verdict: flowpb.Verdict_FORWARDED, EventType: 4, Point: flowpb.TraceObservationPoint_TO_ENDPOINT, Direction: flowpb.TrafficDirection_INGRESS},
				{Verdict: flowpb.Verdict_DROPPED, EventType: 1, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, Direction: flowpb.TrafficDirection_INGRESS},
				{Verdict: flowpb.Verdict_DROPPED, EventType: 5, DropReasonDesc: flowpb.DropReason_POLICY_DENY, Direction: flowpb.TrafficDirection_EGRESS,
					EgressDeniedBy: hubble.PolicyRef{Namespace: "ml", Name: "zone-fence"}},
			} {
				f := tmpl
				port++
				f.NodeName, f.SrcIP, f.DstIP = node, a.ip.String(), b.ip.String()
				f.SrcPort, f.DstPort, f.Proto = uint32(port), 29500, 6
				f.Src, f.Dst = ep(a), ep(b)
				agg.ObserveFields(&f)
			}
			// Cilium on node holds the opener's entry where a runs and the
			// acceptor's where b runs (combined counters).
			tu := conntrack.Tuple{Src: a.ip, Dst: b.ip, SrcPort: port, DstPort: 29500, Proto: 6}
			v := conntrack.Value{TxFlagsSeen: 0x12, RxFlagsSeen: 0x12, SrcSecID: a.identity, Packets: 10, Bytes: 1000}
			if a.node == "" {
				v.SrcSecID = 2
			}
			if a.node == node {
				tab.Put(tu, v)
			}
			if b.node == node {
				tu.Flags = 1
				tab.Put(tu, v)
			}
		}
	}
	for _, vec := range []prometheus.Collector{agg.Drops(), agg.Events(), agg.PeerDrops()} {
		o.Hubble = append(o.Hubble, collect(t, vec)...)
	}
	src.Set(conntrack.MapTCP4, tab)
	p, err := conntrack.New(src, idx, conntrack.Config{Node: node, Layout: conntrack.LayoutCombined, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1e9, 0)
	p.Poll(t0)
	for i := range tab.Len() {
		tab.SetBytes(i, uint64(5000+100*i))
	}
	p.Poll(t0.Add(10 * time.Second))
	o.Bytes = collect(t, p)
	return o
}

// seriesJobs lists the namespace/job of every series.
var seriesJob = regexp.MustCompile(`namespace=([^,}]*),job_name=([^,}]*)`)

// existing fills in which of the jobs named in either view's series each
// view says exist (the counters' reaping asks it).
func existing(a, b *observed, ia, ib *topology.Index) {
	var names []string
	for _, o := range []*observed{a, b} {
		for _, s := range slices.Concat(o.Hubble, o.Bytes) {
			if m := seriesJob.FindStringSubmatch(s); m != nil {
				names = append(names, m[1]+"/"+m[2])
			}
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	for _, pair := range []struct {
		o   *observed
		idx *topology.Index
	}{{a, ia}, {b, ib}} {
		for _, j := range names {
			ns, name, _ := strings.Cut(j, "/")
			if pair.idx.JobExists(ns, name) {
				pair.o.JobsExist = append(pair.o.JobsExist, j)
			}
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

type updater interface {
	Update(ch chan<- prometheus.Metric) error
}

// collect renders a collector's series as sorted "name{labels} value".
func collect(t *testing.T, c any) []string {
	t.Helper()
	ch := make(chan prometheus.Metric, 1<<16)
	switch c := c.(type) {
	case updater:
		if err := c.Update(ch); err != nil {
			t.Fatal(err)
		}
	case prometheus.Collector:
		c.Collect(ch)
	}
	close(ch)
	var out []string
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		var lv []string
		for _, l := range pb.GetLabel() {
			lv = append(lv, l.GetName()+"="+l.GetValue())
		}
		v := pb.GetCounter().GetValue() + pb.GetGauge().GetValue()
		name := fqName.FindStringSubmatch(m.Desc().String())[1]
		out = append(out, fmt.Sprintf("%s{%s} %g", name, strings.Join(lv, ","), v))
	}
	sort.Strings(out)
	return out
}

// TestPerNodeViewMatchesClusterWide is the differential test of the
// per-node view (issue 34): on the real kube-apiserver, a randomized
// cluster (PyTorchJobs, JobSets, LeaderWorkerSets, Indexed Jobs, Volcano
// jobs, pods of no job, some unscheduled or finished) goes through rounds
// of churn (jobs created, deleted, pods re-placed, nodes relabelled).
// After each round, every node's exporter view (NewLocal: the node's pods
// and its jobs' pods, with the ipcache and identities Cilium would hold
// for that cluster) must export exactly what the cluster-wide view (NewLive)
// exports on that node: placements, Hubble drop and flow counters (with
// peer workloads), conntrack bytes and unattributed bytes, and which jobs
// exist (the counters' reaping).
func TestPerNodeViewMatchesClusterWide(t *testing.T) {
	testenv.Integration(t)
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	client := kubernetes.NewForConfigOrDie(api.Config)
	for _, ns := range []string{"ml", "research"} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	c := &randomCluster{t: t, ctx: ctx, client: client, r: rand.New(rand.NewPCG(seed, 34)), nodes: 6,
		zones: map[string]string{}, jobs: map[string][]*corev1.Pod{}, nextIP: map[string]int{}}
	c.createNodes()
	for range 8 {
		c.churn()
	}

	rules := topology.DefaultRules()
	logger := slog.New(slog.DiscardHandler)
	wide := topology.NewIndex()
	l, fs, err := kube.NewLive(client, wide, rules, 0, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Run(ctx, fs); err != nil {
		t.Fatal(err)
	}
	// Two per-node views of each node: with the identities' labels, and as
	// the exporter runs today, without (a remote pod of a job with no pod
	// on the node is then a non-job peer: pairs with one are left out of
	// that comparison and counted).
	cil := newClusterCilium()
	type view struct {
		node  string
		ids   bool
		index *topology.Index
		feed  *kube.Live
	}
	var views []view
	for i := range c.nodes {
		node := c.nodeName(i)
		for _, withIDs := range []bool{true, false} {
			idx := topology.NewIndex()
			var ids topology.Identities
			if withIDs {
				ids = cil
			}
			idx.SetRemote(node, nodeIPCache{cil, node}, ids, rules)
			l, fs, err := kube.NewLocal(client, idx, rules, node, 0, logger)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Run(ctx, fs); err != nil {
				t.Fatal(err)
			}
			views = append(views, view{node, withIDs, idx, l})
		}
	}

	var compared atomic.Int64
	defer func() { t.Logf("%d rounds compared", compared.Load()) }()
	check := func(round int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var pods []corev1.Pod
			for _, ns := range []string{"ml", "research"} {
				pl, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				pods = append(pods, pl.Items...)
			}
			cil.sync(nodes.Items, pods)
			var addrs []addrInfo
			for _, n := range nodes.Items {
				e, _ := cil.entry(netip.MustParseAddr(n.Status.Addresses[0].Address))
				addrs = append(addrs, addrInfo{ip: netip.MustParseAddr(n.Status.Addresses[0].Address), node: n.Name, identity: e.identity})
			}
			for _, p := range pods {
				if p.Status.PodIP == "" {
					continue
				}
				ip := netip.MustParseAddr(p.Status.PodIP)
				e, _ := cil.entry(ip)
				workload, unnamed := p.Labels["app"], false
				for _, r := range rules {
					if v := p.Labels[r.NameLabel]; v != "" {
						workload, unnamed = v, r.Indexed || r.MinPods > 1
						break
					}
				}
				a := addrInfo{ip: ip, node: p.Spec.NodeName, identity: e.identity, unnamed: unnamed}
				if e.identity != 0 {
					// Hubble names an endpoint from what Cilium holds of it:
					// a pod that finished has no endpoint any more.
					a.ns, a.pod, a.workload = p.Namespace, p.Name, workload
				}
				addrs = append(addrs, a)
			}
			addrs = append(addrs, addrInfo{ip: netip.MustParseAddr("10.1.0.250")}, // a pod CIDR address no pod has
				addrInfo{ip: netip.MustParseAddr("10.99.0.1")}, addrInfo{ip: netip.MustParseAddr("8.8.8.8")})
			var diffs []string
			skipped := map[bool]int{}
			for _, v := range views {
				// A pod of a job this view does not hold, which it cannot
				// name: without identities any, with them an Indexed
				// Job's.
				remoteJob := func(a addrInfo) bool {
					we, _ := wide.LookupIP(a.ip)
					le, _ := v.index.LookupIP(a.ip)
					return we.Job != nil && le.Pod == "" && (!v.ids || a.unnamed)
				}
				skip := func(a, b addrInfo) bool {
					if remoteJob(a) || remoteJob(b) {
						skipped[v.ids]++
						return true
					}
					return false
				}
				want := observe(t, wide, v.node, addrs, skip)
				got := observe(t, v.index, v.node, addrs, skip)
				existing(&want, &got, wide, v.index)
				if !reflect.DeepEqual(want, got) {
					var places strings.Builder
					for _, a := range addrs {
						we, wok := wide.LookupIP(a.ip)
						le, lok := v.index.LookupIP(a.ip)
						jobName := func(e topology.Endpoint) string {
							if e.Job == nil {
								return ""
							}
							return e.Job.Namespace + "/" + e.Job.Name
						}
						if we.Node != le.Node || we.Zone != le.Zone || jobName(we) != jobName(le) || wok != lok {
							ent, eok := nodeIPCache{cil, v.node}.Lookup(a.ip)
							ns, labels, lok2 := cil.Labels(ent.Identity)
							fmt.Fprintf(&places, "  %s (%s/%s on %q): cluster-wide %+v %v, per-node %+v %v; ipcache %+v %v, identity %s %v %v\n", a.ip, a.ns, a.pod, a.node, we, wok, le, lok, ent, eok, ns, labels, lok2)
						}
					}
					// The first flow the two views classify apart.
					cw, cl := hubble.NewClassifier(wide, v.node), hubble.NewClassifier(v.index, v.node)
				flows:
					for _, a := range addrs {
						for _, b := range addrs {
							if a.ip == b.ip || skip(a, b) {
								continue
							}
							f := hubble.Fields{Verdict: flowpb.Verdict_DROPPED, EventType: 1, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, Direction: flowpb.TrafficDirection_INGRESS,
								NodeName: v.node, SrcIP: a.ip.String(), DstIP: b.ip.String(), SrcPort: 1, DstPort: 2, Proto: 6}
							f.Src = hubble.EndpointFields{Identity: a.identity, Namespace: a.ns, PodName: a.pod, Workload: a.workload}
							f.Dst = hubble.EndpointFields{Identity: b.identity, Namespace: b.ns, PodName: b.pod, Workload: b.workload}
							if a.node == v.node && a.pod != "" {
								f.Src.ID = 1000
							}
							if b.node == v.node && b.pod != "" {
								f.Dst.ID = 1000
							}
							rw, rl := cw.ClassifyFields(&f), cl.ClassifyFields(&f)
							if fmt.Sprint(rw.Job, rw.Peer, rw.Locality, rw.Src.Zone, rw.Dst.Zone, rw.Local) != fmt.Sprint(rl.Job, rl.Peer, rl.Locality, rl.Src.Zone, rl.Dst.Zone, rl.Local) {
								fmt.Fprintf(&places, "  flow %+v -> %+v: cluster-wide %+v / %+v job %v, per-node %+v / %+v job %v\n", a, b, rw.Src, rw.Dst, rw.Job, rl.Src, rl.Dst, rl.Job)
								break flows
							}
						}
					}
					diffs = append(diffs, fmt.Sprintf("node %s (identities %v):\n%s%s", v.node, v.ids, places.String(), diffObserved(want, got)))
				}
			}
			if len(diffs) == 0 {
				compared.Add(1)
				var nf []string
				for _, v := range views {
					if v.ids {
						nf = append(nf, fmt.Sprintf("%s:%d", v.node, v.feed.Feeds()))
					}
				}
				n, p, j := wide.Counts()
				t.Logf("round %d: %d nodes, %d job pods, %d jobs, %d addresses: every node's views agree; of %d address pairs left out with identities %d (an Indexed Job's pod not held), without %d (a pod of a job not held); job feeds per node %v",
					round, n, p, j, len(addrs), len(views)/2*len(addrs)*(len(addrs)-1), skipped[true]/2, skipped[false]/2, nf)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the per-node views differ from the cluster-wide one:\n%s", round, strings.Join(diffs, "\n"))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	check(0)
	for round := 1; round <= 8; round++ {
		for range 6 {
			c.churn()
		}
		check(round)
	}
}

// diffObserved lists what one view exports and the other does not.
func diffObserved(want, got observed) string {
	var b strings.Builder
	for _, part := range []struct {
		name      string
		want, got []string
	}{{"placements", want.Placements, got.Placements}, {"hubble", want.Hubble, got.Hubble}, {"bytes", want.Bytes, got.Bytes}, {"jobs existing", want.JobsExist, got.JobsExist}} {
		for _, s := range part.want {
			if !slices.Contains(part.got, s) {
				fmt.Fprintf(&b, "  %s: cluster-wide only: %s\n", part.name, s)
			}
		}
		for _, s := range part.got {
			if !slices.Contains(part.want, s) {
				fmt.Fprintf(&b, "  %s: per-node only: %s\n", part.name, s)
			}
		}
	}
	return b.String()
}
