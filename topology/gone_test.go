package topology_test

import (
	"fmt"
	"math"
	"net/netip"
	"runtime"
	"testing"

	"github.com/zonewatch/zonewatch/topology"
)

// TestGoneStateBoundedUnderNodeChurn (issue 33, item 7): an autoscaled
// GPU pool gives every new node a unique name (gpu-pool-7f3k2, ...), runs
// a job pod there, and scales the node away. What the index keeps about
// pods that went must not grow with the number of node names ever seen:
// after the first rounds fill whatever it keeps, more rounds of the same
// churn add nothing.
func TestGoneStateBoundedUnderNodeChurn(t *testing.T) {
	x := topology.NewIndex()
	serial := 0
	churn := func(nodes int) {
		for range nodes {
			serial++
			name := fmt.Sprintf("gpu-pool-a-%08d", serial)
			ip := netip.AddrFrom4([4]byte{10, byte(serial >> 16), byte(serial >> 8), byte(serial)})
			x.UpsertNode(topology.Node{Name: name, Zone: "z-a"})
			pod := topology.Pod{Namespace: "ml", Name: "train-worker-" + name, Node: name, IPs: []netip.Addr{ip},
				Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleWorker}}
			x.UpsertPod(0, pod)
			pod.Finished = true
			x.UpsertPod(0, pod) // the pod went (finished) ...
			x.DeletePod(0, "ml", pod.Name)
			x.DeleteNode(name) // ... and its node was scaled away
		}
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	const round = 20000
	churn(round) // fills what the index may keep (a bounded log)
	before := heap()
	churn(2 * round)
	grown := int64(heap()) - int64(before)
	// A map entry keyed by a 19-byte node name costs 40 bytes or more;
	// noise in HeapAlloc is far below a byte per node over 40,000 nodes.
	perNode := float64(grown) / (2 * round)
	t.Logf("grown %d bytes over %d nodes (%.2f a node)", grown, 2*round, perNode)
	if perNode > 4 {
		t.Errorf("the index grew %d bytes (%.1f a node) over %d nodes that came and went: its state of gone pods is not pruned", grown, perNode, 2*round)
	}
	if n, _, _ := x.Counts(); n != 0 {
		t.Errorf("%d nodes held, want 0", n)
	}
	runtime.KeepAlive(x)
}

// TestPodsGoneKeepsPlace: a job pod that finished leaves LookupIP at once,
// yet PodsGone hands out its place (job, node, zone, addresses) with the
// departure, once; a consumer that fell more than the log behind is told
// so.
func TestPodsGoneKeepsPlace(t *testing.T) {
	x := topology.NewIndex()
	x.UpsertNode(topology.Node{Name: "n1", Zone: "z-a"})
	_, start, _, wake := x.PodsGone(math.MaxUint64, nil)
	ip := netip.MustParseAddr("10.1.0.12")
	pod := topology.Pod{Namespace: "ml", Name: "train-worker-2", Node: "n1", IPs: []netip.Addr{ip},
		Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleWorker}}
	x.UpsertPod(0, pod)
	pod.Finished = true
	x.UpsertPod(0, pod)
	select {
	case <-wake:
	default:
		t.Fatal("PodsGone's channel not closed at the pod's going")
	}
	if e, _ := x.LookupIP(ip); e.Pod != "" {
		t.Fatalf("LookupIP still places the finished pod: %+v", e)
	}
	ds, next, missed, _ := x.PodsGone(start, nil)
	if len(ds) != 1 || missed || next != start+1 {
		t.Fatalf("PodsGone(%d) = %d departures, next %d, missed %v; want 1, %d, false", start, len(ds), next, missed, start+1)
	}
	if e := ds[0].Endpoint; e.Pod != pod.Name || e.Node != "n1" || e.Zone != "z-a" || e.Job == nil || e.Job.Name != "train" || len(ds[0].IPs) != 1 || ds[0].IPs[0] != ip {
		t.Errorf("departure %+v (job %v), want train-worker-2 of ml/train on n1 in z-a at %v", e, e.Job, ip)
	}
	if ds, _, _, _ := x.PodsGone(next, nil); len(ds) != 0 {
		t.Errorf("the departure handed out twice: %+v", ds)
	}
	for i := range 5000 {
		pod := topology.Pod{Namespace: "ml", Name: fmt.Sprintf("p-%d", i), Node: "n1",
			Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleWorker}}
		x.UpsertPod(0, pod)
		x.DeletePod(0, "ml", pod.Name)
	}
	if ds, now, missed, _ := x.PodsGone(next, nil); !missed || now != next+5000 || len(ds) >= 5000 {
		t.Errorf("5000 departures behind: %d handed out, next %d, missed %v; want fewer, %d, true", len(ds), now, missed, next+5000)
	}
}

// TestTerminatingPods: a job pod counts as terminating from its API
// deletion until it finishes or leaves the index, on its node and in the
// sum; a host-network pod (no endpoint of its own) and an unscheduled one
// never do, and the counts return to zero (issue 45, item 7).
func TestTerminatingPods(t *testing.T) {
	x := topology.NewIndex()
	id := topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleWorker}
	want := func(n1, n2, all int) {
		t.Helper()
		if a, b, c := x.TerminatingPods("n1"), x.TerminatingPods("n2"), x.TerminatingPods(""); a != n1 || b != n2 || c != all {
			t.Fatalf("terminating n1=%d n2=%d all=%d, want %d %d %d", a, b, c, n1, n2, all)
		}
	}
	w0 := topology.Pod{Namespace: "ml", Name: "w0", Node: "n1", IPs: []netip.Addr{netip.MustParseAddr("10.1.0.10")}, Identity: id}
	w1 := topology.Pod{Namespace: "ml", Name: "w1", Node: "n1", IPs: []netip.Addr{netip.MustParseAddr("10.1.0.11")}, Identity: id}
	w2 := topology.Pod{Namespace: "ml", Name: "w2", Node: "n2", IPs: []netip.Addr{netip.MustParseAddr("10.2.0.10")}, Identity: id}
	host := topology.Pod{Namespace: "ml", Name: "h", Node: "n1", HostNetwork: true, Identity: id, Terminating: true}
	pending := topology.Pod{Namespace: "ml", Name: "p", Identity: id, Terminating: true}
	for _, p := range []topology.Pod{w0, w1, w2, host, pending} {
		x.UpsertPod(0, p)
	}
	want(0, 0, 0)
	w0.Terminating, w1.Terminating, w2.Terminating = true, true, true
	x.UpsertPod(0, w0)
	x.UpsertPod(0, w0) // the same again: no change
	x.UpsertPod(0, w1)
	x.UpsertPod(0, w2)
	x.UpsertPod(1, w2) // a second feed holds it too
	want(2, 1, 3)
	w0.Finished = true
	x.UpsertPod(0, w0) // its containers ended: not running any more
	want(1, 1, 2)
	x.DeletePod(0, "ml", "w1")
	x.DeletePod(0, "ml", "w2") // feed 1 still holds it
	want(0, 1, 1)
	w2.Identity = topology.Identity{}
	x.UpsertPod(1, w2) // no job any more: out of the index
	x.DeletePod(0, "ml", "w0")
	want(0, 0, 0)
}
