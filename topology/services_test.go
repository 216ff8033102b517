package topology

import (
	"net/netip"
	"testing"
)

// TestServiceLookup: a Service's cluster IP is a cluster address. It is
// placed as its one ready backend (a job pod, or a non-job pod by its
// node's pod CIDR) and as the Service alone, in no zone, while its
// EndpointSlices name none or several; a deleted Service's VIP is unknown
// again.
func TestServiceLookup(t *testing.T) {
	x := testIndex()
	vip, vip6 := ip("10.96.0.20"), ip("fd96::20")
	x.UpsertService(Service{Namespace: "ml", Name: "rdzv", ClusterIPs: []netip.Addr{vip, vip6}})
	check := func(what string, a netip.Addr, wantOK bool, wantNode, wantZone, wantPod string) {
		t.Helper()
		e, ok := x.LookupIP(a)
		if ok != wantOK || e.Node != wantNode || e.Zone != wantZone || e.Pod != wantPod {
			t.Errorf("%s: LookupIP(%s) = %+v, %v; want node %q zone %q pod %q, %v", what, a, e, ok, wantNode, wantZone, wantPod, wantOK)
		}
		if wantOK && (e.Service == nil || e.Service.String() != "ml/rdzv") {
			t.Errorf("%s: LookupIP(%s) names service %v, want ml/rdzv", what, a, e.Service)
		}
	}
	check("no EndpointSlice yet", vip, true, "", UnknownZone, "")
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "rdzv-a", Service: "rdzv", Ready: []netip.Addr{ip("10.244.2.5")}})
	check("one backend, the job's master", vip, true, "n-b", "z-b", "bert-master-0")
	check("the IPv6 cluster IP", vip6, true, "n-b", "z-b", "bert-master-0")
	if e, _ := x.LookupIP(vip); e.Job == nil || e.Job.Name != "bert" || e.Role != RoleCoordinator {
		t.Errorf("the VIP's one backend is not the job's coordinator: %+v", e)
	}
	// The same address in a second slice (dual-stack or a slice split)
	// is still one backend.
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "rdzv-b", Service: "rdzv", Ready: []netip.Addr{ip("10.244.2.5")}})
	check("one backend in two slices", vip, true, "n-b", "z-b", "bert-master-0")
	gen := x.Generation()
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "rdzv-b", Service: "rdzv", Ready: []netip.Addr{ip("10.244.1.77")}})
	check("two backends", vip, true, "", UnknownZone, "")
	if x.Generation() == gen {
		t.Error("a change of the Service's backend left the generation")
	}
	x.DeleteEndpointSlice("ml", "rdzv-a")
	check("the other backend, a non-job pod of n-a", vip, true, "n-a", "z-a", "")
	gen = x.Generation()
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "rdzv-b", Service: "rdzv", Ready: []netip.Addr{ip("10.244.1.77")}})
	if x.Generation() != gen {
		t.Error("an EndpointSlice update that changes nothing moved the generation")
	}
	// A slice that moves to another Service leaves this one.
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "rdzv-b", Service: "other", Ready: []netip.Addr{ip("10.244.1.77")}})
	check("slice moved away", vip, true, "", UnknownZone, "")
	x.DeleteService("ml", "rdzv")
	if e, ok := x.LookupIP(vip); ok || e.Service != nil || e.Zone != UnknownZone {
		t.Errorf("deleted Service's VIP: %+v, %v; want unknown", e, ok)
	}
	// Pods keep their own addresses whatever Services say.
	x.UpsertService(Service{Namespace: "ml", Name: "odd", ClusterIPs: []netip.Addr{ip("10.244.2.5")}})
	if e, _ := x.LookupIP(ip("10.244.2.5")); e.Pod != "bert-master-0" || e.Service != nil {
		t.Errorf("a pod IP that a Service also claims: %+v", e)
	}
	if s, v := x.ServiceCounts(); s != 2 || v != 1 {
		t.Errorf("ServiceCounts = %d services, %d VIPs; want 2 (odd, and other with its slice), 1", s, v)
	}
}

// TestServiceLookupAllocs: placing a VIP allocates nothing.
func TestServiceLookupAllocs(t *testing.T) {
	x := testIndex()
	vip := ip("10.96.0.20")
	x.UpsertService(Service{Namespace: "ml", Name: "rdzv", ClusterIPs: []netip.Addr{vip}})
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "rdzv-a", Service: "rdzv", Ready: []netip.Addr{ip("10.244.2.5")}})
	if n := testing.AllocsPerRun(100, func() { x.LookupIP(vip) }); n != 0 {
		t.Errorf("LookupIP of a VIP: %v allocations", n)
	}
}
