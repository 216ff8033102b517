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
	// An IPv6 connection goes to an IPv6 backend, and the slices name none.
	check("the IPv6 cluster IP, no IPv6 backend", vip6, true, "", UnknownZone, "")
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

// TestDualStackServiceOneBackend: a dual-stack Service has an
// EndpointSlice per address family (EndpointSlice addressType IPv4 and
// IPv6), so its one pod is two ready addresses: each ClusterIP is placed
// at the backend of its own family (before, the two addresses were "many"
// and both VIPs unattributed{reason="service"}). Two pods of one family
// are still several.
func TestDualStackServiceOneBackend(t *testing.T) {
	x := testIndex()
	vip, vip6 := ip("10.96.0.30"), ip("fd96::30")
	x.UpsertService(Service{Namespace: "ml", Name: "ds", ClusterIPs: []netip.Addr{vip, vip6}})
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "ds-v4", Service: "ds", Ready: []netip.Addr{ip("10.244.1.5")}})
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "ds-v6", Service: "ds", Ready: []netip.Addr{ip("fd10::1:0:0:0:5")}})
	for _, a := range []netip.Addr{vip, vip6} {
		if e, ok := x.LookupIP(a); !ok || e.Pod != "bert-worker-0" || e.Zone != "z-a" || e.Service == nil {
			t.Errorf("LookupIP(%s) = %+v, %v; want bert-worker-0 in z-a, naming the Service", a, e, ok)
		}
	}
	x.UpsertEndpointSlice(EndpointSlice{Namespace: "ml", Name: "ds-v4", Service: "ds", Ready: []netip.Addr{ip("10.244.1.5"), ip("10.244.1.6")}})
	if e, _ := x.LookupIP(vip); e.Pod != "" || e.Zone != UnknownZone {
		t.Errorf("two IPv4 backends: LookupIP(%s) = %+v, want the Service alone", vip, e)
	}
	if e, _ := x.LookupIP(vip6); e.Pod != "bert-worker-0" {
		t.Errorf("one IPv6 backend beside two IPv4 ones: LookupIP(%s) = %+v, want bert-worker-0", vip6, e)
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
