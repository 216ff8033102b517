package conntrack_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

// TestServiceVIPEntries: with kube-proxy, Cilium's conntrack entry of a
// pod's connection to a ClusterIP names the VIP (kube-proxy DNATs in the
// node's stack, after bpf_lxc; docs/conntrack.md). Its bytes go to the
// backend's zone while the Service's EndpointSlices name one ready
// backend, and to unattributed reason="service" while they name several
// (or none): never to the job with dst_zone "unknown".
func TestServiceVIPEntries(t *testing.T) {
	idx := newIndex()
	vip := netip.MustParseAddr("10.96.0.42")
	idx.UpsertService(topology.Service{Namespace: "ml", Name: "train-rdzv", ClusterIPs: []netip.Addr{vip}})
	idx.UpsertEndpointSlice(topology.EndpointSlice{Namespace: "ml", Name: "train-rdzv-1", Service: "train-rdzv", Ready: []netip.Addr{master}})
	src := conntrack.NewMemSource()
	reg := prometheus.NewRegistry()
	p, err := conntrack.New(src, idx, conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Self: reg})
	if err != nil {
		t.Fatal(err)
	}
	c := conn{from: worker0, to: vip, fromNode: "n1", sport: 41000, dport: 29500, sentPkts: 1, replyPkts: 1}
	poll := func(i int, sent, reply uint64) {
		c.sent, c.reply = sent, reply
		src.Set(conntrack.MapTCP4, table(c.entries("n1", conntrack.LayoutCombined)...))
		p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
	}
	cross := key("z-a", "z-b", topology.LocalityCrossZone)
	unknown := key("z-a", topology.UnknownZone, topology.LocalityUnknown)
	poll(1, 100, 10)
	poll(2, 1100, 110) // 1,100 B through the VIP to its one backend
	if got := series(t, p); got[cross] != 1100 || got[unknown] != 0 {
		t.Fatalf("one backend: %v, want %s 1100", got, cross)
	}
	// A second ready backend: which one the connection got, only the
	// datapath knows.
	idx.UpsertEndpointSlice(topology.EndpointSlice{Namespace: "ml", Name: "train-rdzv-2", Service: "train-rdzv", Ready: []netip.Addr{worker1}})
	poll(3, 2100, 210)
	got := series(t, p)
	if got[cross] != 1100 || got[unknown] != 0 {
		t.Fatalf("two backends: %v, want %s still 1100 and nothing to the unknown zone", got, cross)
	}
	if s := selfValue(t, reg, "zonewatch_conntrack_unattributed_bytes_total", "reason", "service"); s != 1100 {
		t.Fatalf("unattributed service = %v, want 1100", s)
	}
	// Back to one (the slice goes): the backend's zone again.
	idx.DeleteEndpointSlice("ml", "train-rdzv-1")
	poll(4, 3100, 310) // the one left is worker1, in z-a
	if got := series(t, p)[key("z-a", "z-a", topology.LocalitySameZone)]; got != 1100 {
		t.Fatalf("the remaining backend worker1: %v, want 1100 in z-a", series(t, p))
	}
	// The Service goes: its old VIP is no cluster address the index
	// knows; the bytes are the job's, to an unknown zone, as before
	// Services were watched.
	idx.DeleteService("ml", "train-rdzv")
	poll(5, 4100, 410)
	if got := series(t, p)[unknown]; got != 1100 {
		t.Fatalf("after the Service's deletion: %v, want %s 1100", series(t, p), unknown)
	}
}
