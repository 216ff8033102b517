package conntrack_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

// tunnelIPCache is a node's ipcache naming remote addresses' tunnel
// endpoints.
type tunnelIPCache map[netip.Addr]netip.Addr

func (c tunnelIPCache) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	ep, ok := c[a]
	return topology.RemoteEntry{NodeIP: ep, Identity: 70000, Bits: 32}, ok
}

// nodeReads stands for the lean node view (collector/kube's PeerNodes,
// tested against the real kube-apiserver there): it says whether the node
// behind a tunnel endpoint is being read.
type nodeReads struct{ pending bool }

func (r *nodeReads) Miss(netip.Addr, netip.Addr) {}
func (r *nodeReads) Pending(netip.Addr) bool     { return r.pending }

// TestBytesWaitForTheirPeersNode: a job's bytes to a pod on a node the
// lean node view does not hold yet (a dataset server in another zone)
// wait while that node is read, then count in the node's zone; when the
// read does not land within the wait they count to an unknown zone, never
// lost.
func TestBytesWaitForTheirPeersNode(t *testing.T) {
	dataset := netip.MustParseAddr("10.3.0.9")
	tunnel := netip.MustParseAddr("172.16.0.3")
	for _, lands := range []bool{true, false} {
		t.Run(fmt.Sprintf("read lands %v", lands), func(t *testing.T) {
			idx := newIndex()
			idx.SetRemote("n1", tunnelIPCache{dataset: tunnel}, nil, topology.DefaultRules())
			reads := &nodeReads{pending: true}
			idx.SetNodeReads(reads)
			src := conntrack.NewMemSource()
			p, err := conntrack.New(src, idx, conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Self: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			c := conn{from: worker0, to: dataset, fromNode: "n1", toNode: "n3", sport: 40000, dport: 8080, sent: 100, reply: 100, sentPkts: 1, replyPkts: 1}
			at := t0
			poll := func() {
				src.Set(conntrack.MapTCP4, table(c.entries("n1", conntrack.LayoutCombined)...))
				p.Poll(at)
			}
			poll() // the baseline
			c.sent, c.reply = c.sent+1000, c.reply+9000
			at = at.Add(10 * time.Second)
			poll()
			if got := series(t, p); len(got) != 0 {
				t.Fatalf("counted while the peer's node is read: %v", got)
			}
			want := key("z-a", topology.UnknownZone, topology.LocalityUnknown)
			if lands {
				idx.UpsertNode(topology.Node{Name: "n3", Zone: "z-c", Region: "r1", Addresses: []netip.Addr{tunnel}})
				reads.pending = false
				want = key("z-a", "z-c", topology.LocalityCrossZone)
				at = at.Add(time.Second)
			} else {
				at = at.Add(20 * time.Second)
			}
			poll()
			if got := series(t, p); len(got) != 1 || got[want] != 10000 {
				t.Fatalf("after the wait: %v; want 10000 B in %s", got, want)
			}
			// Later growth counts at once, where the first bytes went (a
			// lookup that finds no node ends: nothing waits for it).
			reads.pending = false
			c.sent += 500
			at = at.Add(10 * time.Second)
			poll()
			if got := series(t, p); len(got) != 1 || got[want] != 10500 {
				t.Errorf("growth after the wait: %v; want 10500 B in %s", got, want)
			}
		})
	}
}
