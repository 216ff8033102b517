package hubble

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

const (
	zoneA  = "us-east-1a"
	zoneB  = "us-east-1b"
	zoneC  = "us-east-1c"
	region = "us-east-1"
)

// t0 is the simulated time flows start at.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// testScenario is a small cluster with one job per case: a healthy job in
// one zone (one pair on one node), a job whose coordinator is blocked in
// another zone, a job with cross-zone traffic, and a non-job pod.
func testScenario() *sim.Scenario {
	node := func(name, zone, ip, cidr string) sim.Node {
		return sim.Node{Name: name, Zone: zone, IP: addr(ip), PodCIDR: netip.MustParsePrefix(cidr)}
	}
	pod := func(ns, name, node, ip, role string) sim.Pod {
		return sim.Pod{Namespace: ns, Name: name, Node: node, IP: addr(ip), Role: role,
			Labels: map[string]string{"app": name}, OwnerKind: "PyTorchJob", OwnerName: name}
	}
	return &sim.Scenario{
		Region: region, Zones: []string{zoneA, zoneB, zoneC},
		Nodes: []sim.Node{
			node("gpu-a1", zoneA, "172.18.0.10", "10.244.1.0/24"),
			node("gpu-a2", zoneA, "172.18.0.11", "10.244.2.0/24"),
			node("cpu-a1", zoneA, "172.18.0.12", "10.244.3.0/24"),
			node("gpu-b1", zoneB, "172.18.1.10", "10.244.4.0/24"),
			node("gpu-c1", zoneC, "172.18.2.10", "10.244.7.0/24"),
		},
		Jobs: []sim.Job{
			{Namespace: "ml-team", Name: "resnet-healthy", Kind: "PyTorchJob", Behaviour: sim.Behaviour{FlowsPerSecond: 2},
				Pods: []sim.Pod{
					pod("ml-team", "resnet-healthy-master-0", "gpu-a1", "10.244.1.2", topology.RoleCoordinator),
					pod("ml-team", "resnet-healthy-worker-0", "gpu-a1", "10.244.1.3", topology.RoleWorker),
					pod("ml-team", "resnet-healthy-worker-1", "gpu-a2", "10.244.2.2", topology.RoleWorker),
				}},
			{Namespace: "ml-team", Name: "llm-blocked", Kind: "PyTorchJob", Behaviour: sim.Behaviour{FlowsPerSecond: 1, BlockedBy: "ml-team/zone-isolation"},
				Pods: []sim.Pod{
					pod("ml-team", "llm-blocked-master-0", "gpu-b1", "10.244.4.2", topology.RoleCoordinator),
					pod("ml-team", "llm-blocked-worker-0", "gpu-a2", "10.244.2.3", topology.RoleWorker),
					pod("ml-team", "llm-blocked-worker-1", "gpu-a2", "10.244.2.4", topology.RoleWorker),
				}},
			{Namespace: "research", Name: "bert-slow", Kind: "JobSet", Behaviour: sim.Behaviour{FlowsPerSecond: 2},
				Pods: []sim.Pod{
					pod("research", "bert-slow-workers-0-0", "gpu-c1", "10.244.7.2", topology.RoleCoordinator),
					pod("research", "bert-slow-workers-1-0", "gpu-a1", "10.244.1.4", topology.RoleWorker),
					pod("research", "bert-slow-workers-2-0", "gpu-a1", "10.244.1.5", topology.RoleWorker),
				}},
		},
		Others: []sim.Pod{{Namespace: "shop", Name: "frontend-0", Node: "cpu-a1", IP: addr("10.244.3.2"), Labels: map[string]string{"app": "frontend"}}},
	}
}

// indexOf fills a real topology index with the scenario's nodes and job
// pods, as the informers would.
func indexOf(s *sim.Scenario) *topology.Index {
	x := topology.NewIndex()
	for _, n := range s.Nodes {
		x.UpsertNode(topology.Node{Name: n.Name, Zone: n.Zone, Region: s.Region, Addresses: []netip.Addr{n.IP}, PodCIDRs: []netip.Prefix{n.PodCIDR}})
	}
	for _, j := range s.Jobs {
		for _, p := range j.Pods {
			x.UpsertPod(0, topology.Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Node, IPs: []netip.Addr{p.IP},
				Identity: topology.Identity{Kind: j.Kind, Name: j.Name, Role: p.Role}})
		}
	}
	return x
}

// startHubble serves a fake Observer for node ("" for all) on a short
// unix socket path.
func startHubble(t testing.TB, s *sim.Scenario, node string, capacity int) (*sim.Hubble, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "zwh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "h.sock")
	h := sim.NewHubble(s, node, capacity)
	if err := h.Start(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	return h, sock
}

// follow runs a client on sock, replaying from before t0, until the test
// ends.
func follow(t testing.TB, sock string, agg *Aggregator, mask bool) *Client {
	t.Helper()
	c := NewClient(Config{Address: "unix://" + sock, Since: t0.Add(-time.Second), NoFieldMask: !mask,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, agg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// received is how many flows c has received: counted, or skipped as
// counted before or older than the client.
func received(c *Client) uint64 {
	return uint64(testutil.ToFloat64(c.m.Processed) + testutil.ToFloat64(c.m.SkippedReplayed) + testutil.ToFloat64(c.m.SkippedEarly))
}

// delivered reports whether the servers have sent all they hold and the
// clients have received every flow sent: with nothing published
// meanwhile, no flow is on its way (a condition to wait for instead of a
// sleep).
func delivered(hs []*sim.Hubble, cs ...*Client) bool {
	var sent, got uint64
	for _, h := range hs {
		st := h.Streams()
		if !st.CaughtUp {
			return false
		}
		sent += st.Flows
	}
	for _, c := range cs {
		got += received(c)
	}
	return got == sent
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
