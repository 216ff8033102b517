package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// peerIPCache is an ipcache naming remote addresses' tunnel endpoints.
type peerIPCache map[netip.Addr]netip.Addr

func (c peerIPCache) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	ep, ok := c[a]
	if !ok {
		return topology.RemoteEntry{}, false
	}
	return topology.RemoteEntry{NodeIP: ep, Identity: 70000, Bits: 32}, true
}

// TestPeerNodes runs the per-node view with the lean node view
// (kube.PeerNodes) on the real kube-apiserver, as the chart's identity:
// of seven nodes it holds its own and those of its job's pods, never
// watches a node, finds the node behind a tunnel endpoint its ipcache
// names through that node's host-network pod or, on a node that runs
// none (a pod of no job on another zone's node: a dataset server), through
// the pod with the address being placed, after which every address behind
// that endpoint is placed without another read, also where the endpoint
// is none of the node's addresses; and lets a node go with the last pod
// it held there.
func TestPeerNodes(t *testing.T) {
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(api.Config)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodeIP := func(i int) string { return fmt.Sprintf("10.0.0.%d", 10+i) }
	for i := range 7 {
		n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i),
			Labels: map[string]string{kube.LabelZone: fmt.Sprintf("zone-%d", i%3)}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP(i)}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name, node, ip string, labels map[string]string, hostNetwork bool) {
		t.Helper()
		p, err := admin.CoreV1().Pods("ml").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node, HostNetwork: hostNetwork, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		if _, err := admin.CoreV1().Pods("ml").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	job := func(k int) map[string]string {
		return map[string]string{"training.kubeflow.org/job-name": "j", "training.kubeflow.org/replica-type": "worker",
			"training.kubeflow.org/replica-index": fmt.Sprint(k)}
	}
	// Job j: pods on node-0 (this exporter's), node-1 and node-2; an
	// agent-like host-network pod on node-4, whose address is its node's;
	// node-3 and node-5 host nothing this node needs.
	pod("j-0", "node-0", "10.1.0.1", job(0), false)
	pod("j-1", "node-1", "10.1.1.1", job(1), false)
	pod("j-2", "node-2", "10.1.2.1", job(2), false)
	pod("agent-4", "node-4", nodeIP(4), map[string]string{"k8s-app": "cilium"}, true)
	pod("web-3", "node-3", "10.1.3.1", map[string]string{"app": "web"}, false)
	pod("dataset-5", "node-5", "10.1.5.9", map[string]string{"app": "dataset"}, false)
	// A pod that finished with the address a pod on node-6 may have now:
	// it names no node.
	pod("old-6", "node-6", "10.1.6.1", map[string]string{"app": "batch"}, false)
	old, err := admin.CoreV1().Pods("ml").Get(ctx, "old-6", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old.Status.Phase = corev1.PodSucceeded
	if _, err := admin.CoreV1().Pods("ml").UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	id := api.ChartIdentity(t, nil)
	cfg := rest.CopyConfig(id.Config)
	var nodeWatches atomic.Int64
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.URL.Path == "/api/v1/nodes" && r.URL.Query().Get("watch") != "" {
				nodeWatches.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	client := kubeapi.NewForConfigOrDie(cfg)
	index := topology.NewIndex()
	addr := netip.MustParseAddr
	remote := addr("10.1.4.7")   // a pod of no job on node-4, with an agent-like pod
	dataset := addr("10.1.5.9")  // dataset-5 on node-5, which runs no host-network pod
	behind5 := addr("10.1.5.10") // an address behind node-5's tunnel endpoint, of no pod
	// node-3's tunnel endpoint is none of its addresses (a second
	// interface): web-3's pod names the node, whose read holds the
	// endpoint too.
	tunnel3 := addr("10.0.9.3")
	behind3 := addr("10.1.3.2")
	gone := addr("10.1.6.1") // only a finished pod had it: no node
	ipc := peerIPCache{remote: addr(nodeIP(4)), dataset: addr(nodeIP(5)), behind5: addr(nodeIP(5)),
		addr("10.1.3.1"): tunnel3, behind3: tunnel3, gone: addr(nodeIP(6))}
	index.SetRemote("node-0", ipc, nil, topology.DefaultRules())
	l, fs, err := kube.NewLocal(client, index, topology.DefaultRules(), "node-0", 0, slog.New(slog.DiscardHandler), kube.PeerNodes(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Run(ctx, fs); err != nil {
		t.Fatal(err)
	}
	names := func() []string { return index.NodeNames() }
	if got := fmt.Sprint(names()); got != "[node-0 node-1 node-2]" {
		t.Fatalf("after sync the index holds nodes %s, want node-0, node-1, node-2 (this node and its job's)", got)
	}
	if e, ok := index.LookupIP(netip.MustParseAddr("10.1.2.1")); !ok || e.Zone != "zone-2" {
		t.Fatalf("job pod on node-2 placed %+v %v, want zone-2", e, ok)
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("%s: not before the test's deadline; nodes %v", what, names())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	// A tunnel endpoint of no node held: the first lookup asks, a later
	// one places it.
	placed := func(a netip.Addr, node, zone string) func() bool {
		return func() bool {
			e, ok := index.LookupIP(a)
			return ok && e.Node == node && e.Zone == zone
		}
	}
	eventually("the tunnel endpoint's node resolved through its host-network pod", placed(remote, "node-4", "zone-1"))
	eventually("the dataset pod's node resolved through the pod", placed(dataset, "node-5", "zone-2"))
	if index.PlacementPending(dataset) {
		t.Errorf("%s is placed and still pending", dataset)
	}
	st := l.PeerNodeReads()
	if e, ok := index.LookupIP(behind5); !ok || e.Node != "node-5" {
		t.Errorf("%s, behind node-5's tunnel endpoint, placed %+v %v, want node-5 at once", behind5, e, ok)
	}
	eventually("web-3's node resolved through the pod", placed(addr("10.1.3.1"), "node-3", "zone-0"))
	if e, ok := index.LookupIP(behind3); !ok || e.Node != "node-3" {
		t.Errorf("%s, behind node-3's tunnel endpoint %s (none of its addresses), placed %+v %v, want node-3 at once", behind3, tunnel3, e, ok)
	}
	index.LookupIP(gone)
	eventually("the finished pod's address given up", func() bool { return l.PeerNodeReads().Unresolved == 1 && !index.PlacementPending(gone) })
	if e, ok := index.LookupIP(gone); ok {
		t.Errorf("%s, of a finished pod only, placed %+v", gone, e)
	}
	if after := l.PeerNodeReads(); after.ByEndpoint-st.ByEndpoint != 2 || after.ByPodAddress-st.ByPodAddress != 2 {
		t.Errorf("after node-5 was placed: %d reads by tunnel endpoint, %d by pod address; want 2 and 2 (node-3's and the finished pod's: none for %s)",
			after.ByEndpoint-st.ByEndpoint, after.ByPodAddress-st.ByPodAddress, behind5)
	}
	if err := admin.CoreV1().Pods("ml").Delete(ctx, "j-2", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually("node-2 let go with its last held pod", func() bool { return fmt.Sprint(names()) == "[node-0 node-1 node-3 node-4 node-5]" })
	st = l.PeerNodeReads()
	t.Logf("node reads: %d by name, %d by tunnel endpoint, %d by pod address; lookups %d found, %d unresolved, %d failed, %d dropped; node watches %d",
		st.ByName, st.ByEndpoint, st.ByPodAddress, st.Found, st.Unresolved, st.Failed, st.Dropped, nodeWatches.Load())
	if nodeWatches.Load() != 0 {
		t.Errorf("%d watches of nodes, want none", nodeWatches.Load())
	}
	// One lookup per tunnel endpoint: node-4's by its agent, node-5's,
	// node-3's and node-6's by the pod (node-6's finding none).
	if st.ByEndpoint != 4 || st.ByPodAddress != 3 || st.Found != 3 || st.Unresolved != 1 || st.Failed != 0 || st.Dropped != 0 {
		t.Errorf("lookups: %+v; want 4 by tunnel endpoint, 3 by pod address, 3 found, 1 unresolved", st)
	}
}
