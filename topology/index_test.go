package topology

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func testIndex() *Index {
	x := NewIndex()
	x.UpsertNode(Node{Name: "n-a", Zone: "z-a", Region: "r1", Addresses: []netip.Addr{ip("172.18.0.10"), ip("fd00::10")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd10:0:0:1::/64")}})
	x.UpsertNode(Node{Name: "n-b", Zone: "z-b", Region: "r1", Addresses: []netip.Addr{ip("172.18.1.10")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}})
	x.UpsertNode(Node{Name: "n-far", Zone: "z-x", Region: "r2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.245.0.0/16")}})
	x.UpsertNode(Node{Name: "n-nozone", Addresses: []netip.Addr{ip("172.18.9.9")}})
	job := func(name, node, role string, ips ...string) Pod {
		p := Pod{Namespace: "ml", Name: name, Node: node, Identity: Identity{Kind: "PyTorchJob", Name: "bert", Role: role}}
		for _, s := range ips {
			p.IPs = append(p.IPs, ip(s))
		}
		return p
	}
	x.UpsertPod(0, job("bert-master-0", "n-b", RoleCoordinator, "10.244.2.5"))
	x.UpsertPod(0, job("bert-worker-0", "n-a", RoleWorker, "10.244.1.5", "fd10::1:0:0:0:5"))
	x.UpsertPod(0, job("bert-worker-1", "n-a", RoleWorker, "10.244.1.6"))
	return x
}

func TestLookupIP(t *testing.T) {
	x := testIndex()
	cases := []struct {
		ip                    string
		ok                    bool
		pod, node, zone, role string
		job                   bool
	}{
		{ip: "10.244.2.5", ok: true, pod: "bert-master-0", node: "n-b", zone: "z-b", role: RoleCoordinator, job: true},
		{ip: "fd10::1:0:0:0:5", ok: true, pod: "bert-worker-0", node: "n-a", zone: "z-a", role: RoleWorker, job: true},
		{ip: "::ffff:10.244.1.6", ok: true, pod: "bert-worker-1", node: "n-a", zone: "z-a", role: RoleWorker, job: true},
		{ip: "10.244.1.77", ok: true, node: "n-a", zone: "z-a"}, // non-job pod on n-a: pod CIDR
		{ip: "fd10:0:0:1::99", ok: true, node: "n-a", zone: "z-a"},
		{ip: "172.18.1.10", ok: true, node: "n-b", zone: "z-b"}, // node address
		{ip: "10.245.7.7", ok: true, node: "n-far", zone: "z-x"},
		{ip: "172.18.9.9", ok: true, node: "n-nozone", zone: UnknownZone}, // node without zone label
		{ip: "8.8.8.8", ok: false, zone: UnknownZone},
		{ip: "2001:db8::1", ok: false, zone: UnknownZone},
	}
	for _, c := range cases {
		e, ok := x.LookupIP(ip(c.ip))
		if ok != c.ok || e.Pod != c.pod || e.Node != c.node || e.Zone != c.zone || e.Role != c.role || (e.Job != nil) != c.job {
			t.Errorf("LookupIP(%s) = %+v, %v", c.ip, e, ok)
		}
	}
}

func TestLocality(t *testing.T) {
	x := testIndex()
	get := func(s string) Endpoint { e, _ := x.LookupIP(ip(s)); return e }
	cases := []struct{ a, b, want string }{
		{"10.244.1.5", "10.244.1.6", LocalitySameZone},
		{"10.244.1.5", "10.244.2.5", LocalityCrossZone},
		{"10.244.1.5", "10.245.0.1", LocalityCrossRegion},
		{"10.244.1.5", "8.8.8.8", LocalityUnknown},
		{"172.18.9.9", "10.244.1.5", LocalityUnknown},
	}
	for _, c := range cases {
		if got := Locality(get(c.a), get(c.b)); got != c.want {
			t.Errorf("Locality(%s, %s) = %s, want %s", c.a, c.b, got, c.want)
		}
	}
}

func TestPodLifecycle(t *testing.T) {
	x := testIndex()
	// The master moves to n-a: the job is no longer split.
	p := Pod{Namespace: "ml", Name: "bert-master-0", Node: "n-a", IPs: []netip.Addr{ip("10.244.1.9")},
		Identity: Identity{Kind: "PyTorchJob", Name: "bert", Role: RoleCoordinator}}
	pl := x.Placements("")
	if len(pl) != 1 || !pl[0].Split() || strings.Join(pl[0].Zones, ",") != "z-a,z-b" {
		t.Fatalf("before move: %+v", pl)
	}
	x.DeletePod(0, "ml", "bert-master-0")
	x.UpsertPod(0, p)
	if e, ok := x.LookupIP(ip("10.244.2.5")); ok && e.Pod != "" {
		t.Fatalf("old IP still maps to a pod: %+v", e)
	}
	pl = x.Placements("n-b")
	if len(pl) != 0 {
		t.Fatalf("n-b should host no job pod: %+v", pl)
	}
	pl = x.Placements("n-a")
	if len(pl) != 1 || pl[0].Split() || len(pl[0].Pods) != 3 {
		t.Fatalf("after move: %+v", pl)
	}

	// A finished pod does not count for placement and gives up its IP.
	p.Finished = true
	x.UpsertPod(0, p)
	if e, _ := x.LookupIP(ip("10.244.1.9")); e.Pod != "" {
		t.Fatalf("finished pod still owns its IP: %+v", e)
	}
	if pl = x.Placements(""); len(pl[0].Pods) != 2 {
		t.Fatalf("finished pod counted: %+v", pl[0].Pods)
	}

	// Held by two feeds: the pod stays until both let go.
	x.UpsertPod(5, p)
	x.DeletePod(0, "ml", "bert-master-0")
	if _, ok := x.LookupPod("ml", "bert-master-0"); !ok {
		t.Fatal("pod dropped while feed 5 still holds it")
	}
	x.DeletePod(5, "ml", "bert-master-0")
	if _, ok := x.LookupPod("ml", "bert-master-0"); ok {
		t.Fatal("pod kept after every feed let go")
	}

	// The last pod leaves: the job is gone.
	x.DeletePod(0, "ml", "bert-worker-0")
	x.DeletePod(0, "ml", "bert-worker-1")
	if x.JobExists("ml", "bert") || len(x.Placements("")) != 0 {
		t.Fatal("job outlived its pods")
	}
}

func TestHostNetworkAndPendingPods(t *testing.T) {
	x := testIndex()
	x.UpsertPod(0, Pod{Namespace: "ml", Name: "hn", Node: "n-a", HostNetwork: true, IPs: []netip.Addr{ip("172.18.0.10")},
		Identity: Identity{Kind: "Job", Name: "hn", Role: RoleWorker}})
	if e, _ := x.LookupIP(ip("172.18.0.10")); e.Pod != "" || e.Node != "n-a" {
		t.Fatalf("hostNetwork pod took over the node address: %+v", e)
	}
	x.UpsertPod(0, Pod{Namespace: "ml", Name: "pending", Identity: Identity{Kind: "Job", Name: "pend", Role: RoleWorker}})
	for _, j := range x.Placements("") {
		if j.Job.Name == "pend" {
			t.Fatalf("pending job counted for placement: %+v", j)
		}
	}
}

func TestNodeDeletedKeepsPodsUnknownZone(t *testing.T) {
	x := testIndex()
	x.DeleteNode("n-b")
	e, ok := x.LookupIP(ip("10.244.2.5"))
	if !ok || e.Zone != UnknownZone || e.Pod != "bert-master-0" {
		t.Fatalf("pod on deleted node: %+v %v", e, ok)
	}
	if _, ok := x.LookupIP(ip("172.18.1.10")); ok {
		t.Fatal("deleted node's address still resolves")
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	x := testIndex()
	addrs := []netip.Addr{ip("10.244.2.5"), ip("10.244.1.77"), ip("8.8.8.8"), ip("fd10::1:0:0:0:5")}
	allocs := testing.AllocsPerRun(1000, func() {
		for _, a := range addrs {
			x.LookupIP(a)
		}
		x.LookupPod("ml", "bert-worker-0")
	})
	if allocs != 0 {
		t.Fatalf("lookups allocate: %v allocs per run", allocs)
	}
}

// bigIndex builds a cluster of the size DESIGN.md plans for.
func bigIndex(nodes, jobs, podsPerJob int) *Index {
	x := NewIndex()
	for i := 0; i < nodes; i++ {
		x.UpsertNode(Node{
			Name: fmt.Sprintf("node-%05d", i), Zone: fmt.Sprintf("zone-%d", i%4), Region: "r1",
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)})},
			PodCIDRs:  []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)},
		})
	}
	for j := 0; j < jobs; j++ {
		for k := 0; k < podsPerJob; k++ {
			n := (j*podsPerJob + k) % nodes
			role := RoleWorker
			if k == 0 {
				role = RoleCoordinator
			}
			x.UpsertPod(0, Pod{
				Namespace: fmt.Sprintf("team-%d", j%50), Name: fmt.Sprintf("job-%d-worker-%d", j, k),
				Node:     fmt.Sprintf("node-%05d", n),
				IPs:      []netip.Addr{netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), byte(2 + k)})},
				Identity: Identity{Kind: "PyTorchJob", Name: fmt.Sprintf("job-%d", j), Role: role, ReplicaType: "worker"},
			})
		}
	}
	return x
}

func BenchmarkLookupIP(b *testing.B) {
	x := bigIndex(5000, 2000, 10)
	pod := netip.AddrFrom4([4]byte{10, 0, 7, 3})     // job pod
	other := netip.AddrFrom4([4]byte{10, 0, 7, 200}) // pod CIDR only
	world := netip.AddrFrom4([4]byte{8, 8, 8, 8})
	b.ReportAllocs()
	b.Run("job-pod", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			x.LookupIP(pod)
		}
	})
	b.Run("pod-cidr", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			x.LookupIP(other)
		}
	})
	b.Run("unknown", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			x.LookupIP(world)
		}
	})
}
