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
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// peerIPCache is an ipcache naming one remote address's tunnel endpoint.
type peerIPCache struct{ addr, nodeIP netip.Addr }

func (c peerIPCache) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	if a != c.addr {
		return topology.RemoteEntry{}, false
	}
	return topology.RemoteEntry{NodeIP: c.nodeIP, Identity: 70000, Bits: 32}, true
}

// TestPeerNodes runs the per-node view with the lean node view
// (kube.PeerNodes) on the real kube-apiserver, as the chart's identity:
// of six nodes it holds its own and those of its job's pods, never
// watches a node, finds the node behind a tunnel endpoint its ipcache
// names through that node's host-network pod, and lets a node go with
// the last pod it held there.
func TestPeerNodes(t *testing.T) {
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(api.Config)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodeIP := func(i int) string { return fmt.Sprintf("10.0.0.%d", 10+i) }
	for i := range 6 {
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
	client := kubernetes.NewForConfigOrDie(cfg)
	index := topology.NewIndex()
	remote := netip.MustParseAddr("10.1.4.7") // a pod of no job on node-4
	index.SetRemote("node-0", peerIPCache{remote, netip.MustParseAddr(nodeIP(4))}, nil, topology.DefaultRules())
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
	eventually("the tunnel endpoint's node resolved", func() bool {
		e, ok := index.LookupIP(remote)
		return ok && e.Node == "node-4" && e.Zone == "zone-1"
	})
	if err := admin.CoreV1().Pods("ml").Delete(ctx, "j-2", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually("node-2 let go with its last held pod", func() bool { return fmt.Sprint(names()) == "[node-0 node-1 node-4]" })
	byName, byAddr, unresolved := l.PeerNodeReads()
	t.Logf("node reads: %d by name, %d by address (%d unresolved); node watches %d", byName, byAddr, unresolved, nodeWatches.Load())
	if nodeWatches.Load() != 0 {
		t.Errorf("%d watches of nodes, want none", nodeWatches.Load())
	}
	if byAddr != 1 || unresolved != 0 {
		t.Errorf("%d reads by address (%d unresolved), want 1 (0)", byAddr, unresolved)
	}
}
