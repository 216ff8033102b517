package hubble

import (
	"net/netip"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/zonewatch/zonewatch/topology"
)

// TestServiceVIPPeer: a flow to a Service's cluster IP (what Hubble shows
// where kube-proxy translates after Cilium: the VIP, identity world) is
// the backend's when the Service has one ready backend, and a cluster
// peer in no zone when it has several; never peer "world" or unresolved.
func TestServiceVIPPeer(t *testing.T) {
	x := indexOf(testScenario())
	vip := podEP{ip: "10.96.0.30"}
	x.UpsertService(topology.Service{Namespace: "research", Name: "bert-rdzv", ClusterIPs: []netip.Addr{netip.MustParseAddr(vip.ip)}})
	x.UpsertEndpointSlice(topology.EndpointSlice{Namespace: "research", Name: "bert-rdzv-1", Service: "bert-rdzv",
		Ready: []netip.Addr{netip.MustParseAddr(bertCoord.ip)}})
	c := NewClassifier(x, "gpu-a1")
	f := trace("gpu-a1", bertWorker, vip, flowpb.TraceObservationPoint_TO_STACK, false)
	f.Destination = &flowpb.Endpoint{Identity: 2, Labels: []string{"reserved:world"}}
	r := c.Classify(f)
	if r.Count != Forwarded || r.Peer != PeerJob || r.Dst.Zone != zoneC || r.Locality != topology.LocalityCrossZone || r.DstUnresolved {
		t.Errorf("to the VIP of the job's coordinator: %+v, want forwarded, peer job, dst zone %s, cross zone", r, zoneC)
	}
	x.UpsertEndpointSlice(topology.EndpointSlice{Namespace: "research", Name: "bert-rdzv-2", Service: "bert-rdzv",
		Ready: []netip.Addr{netip.MustParseAddr(frontend.ip)}})
	r = c.Classify(f)
	if r.Count != Forwarded || r.Peer != PeerCluster || r.Dst.Zone != topology.UnknownZone || r.DstUnresolved {
		t.Errorf("to a VIP with two backends: %+v, want forwarded, peer cluster, dst zone unknown, not unresolved", r)
	}
	x.DeleteService("research", "bert-rdzv")
	if r = c.Classify(f); r.Peer != PeerWorld {
		t.Errorf("to an address no Service has (any more), identity world: peer %s, want world", r.Peer)
	}
}
