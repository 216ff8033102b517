package conntrack_test

import (
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
)

// The tests of issue 18: what Cilium's datapath really writes, version by
// version (bpf/lib/conntrack.h ct_create4 and __ct_lookup4 of v1.15.19,
// v1.16.0 and v1.20.2), and what the exporter says about it.

// logPoller is a poller on n1 that logs to logs.
func logPoller(t *testing.T, src conntrack.Source, cfg conntrack.Config) (*conntrack.Poller, *prometheus.Registry, *logBuf) {
	t.Helper()
	var logs logBuf
	reg := prometheus.NewRegistry()
	cfg.Node, cfg.Self = "n1", reg
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	p, err := conntrack.New(src, newIndex(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, reg, &logs
}

// established is a combined (1.16+) egress entry of worker0 -> master that
// saw its handshake both ways.
func established(sport uint16, pkts, bytes uint64) ctEntry {
	return ctEntry{conntrack.Tuple{Src: worker0, Dst: master, SrcPort: sport, DstPort: 29500, Proto: 6},
		conntrack.Value{Packets: pkts, Bytes: bytes, TxFlagsSeen: 0x12, RxFlagsSeen: 0x12}}
}

// Point 1: the advice for turning accounting on is the one of the running
// version: 1.14/1.15 count by default (runtime option), 1.16 has only the
// runtime option, 1.17+ the flag and Helm value.
func TestEnableAdviceByVersion(t *testing.T) {
	for _, tc := range []struct {
		version string
		layout  conntrack.Layout
		want    []string
		not     []string
	}{
		{"1.15.19", conntrack.LayoutAuto, []string{"counts by default", "ConntrackAccounting=Enabled"}, []string{"bpf.ctAccounting"}},
		{"", conntrack.LayoutSplit, []string{"counts by default"}, []string{"bpf.ctAccounting"}},
		{"v1.16.3", conntrack.LayoutCombined, []string{"cilium-dbg config ConntrackAccounting=Enabled", "restarts"}, []string{"bpf.ctAccounting"}},
		{"1.17.0", conntrack.LayoutCombined, []string{"bpf.ctAccounting=true", "--bpf-conntrack-accounting"}, []string{"cilium-dbg config"}},
		{"1.20.2", conntrack.LayoutAuto, []string{"bpf.ctAccounting=true", `"1" from 1.18`}, []string{"cilium-dbg config"}},
		// Combined, version unknown: 1.16 and 1.17+ both, each labelled.
		{"", conntrack.LayoutCombined, []string{"Cilium 1.16 has no flag", "Cilium 1.17 and later"}, []string{"counts by default"}},
	} {
		got := conntrack.EnableAdvice(tc.version, tc.layout)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("EnableAdvice(%q, %s) = %q: missing %q", tc.version, tc.layout, got, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got, n) {
				t.Errorf("EnableAdvice(%q, %s) = %q: says %q", tc.version, tc.layout, got, n)
			}
		}
	}

	// The log names the version's switch.
	src := conntrack.NewMemSource()
	src.Set(conntrack.MapTCP4, table(established(40000, 0, 0)))
	p, _, logs := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutCombined, CiliumVersion: "1.16.1"})
	p.Poll(t0)
	if p.Up() || !strings.Contains(logs.String(), "cilium-dbg config ConntrackAccounting=Enabled") || strings.Contains(logs.String(), "bpf.ctAccounting") {
		t.Fatalf("1.16, accounting off: up=%v, log:\n%s", p.Up(), logs)
	}
}

// Point 2: turning accounting off freezes the counters of existing
// entries; connections opened afterwards count nothing. The source goes
// down although most counters are non-zero, and comes back when counters
// grow again.
func TestFrozenCountersMeanAccountingOff(t *testing.T) {
	t.Run("combined", func(t *testing.T) {
		src := conntrack.NewMemSource()
		p, _, logs := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutCombined})
		old := []ctEntry{established(40000, 50, 60000), established(40001, 70, 90000)}
		src.Set(conntrack.MapTCP4, table(old...))
		p.Poll(t0)
		if !p.Up() {
			t.Fatal("down on the first read of counting entries")
		}
		// Accounting off: the old counters stay, a new connection counts 0.
		src.Set(conntrack.MapTCP4, table(append(old, established(40002, 0, 0))...))
		p.Poll(t0.Add(10 * time.Second))
		if p.Up() {
			t.Fatal("up while connections opened since count nothing (frozen counters)")
		}
		if !strings.Contains(logs.String(), "accounting_off") {
			t.Fatalf("not reported as accounting off:\n%s", logs)
		}
		// Nothing new: still off (frozen counters say nothing).
		p.Poll(t0.Add(20 * time.Second))
		if p.Up() {
			t.Fatal("up again without any counter growing")
		}
		// Back on: counters grow again.
		src.Set(conntrack.MapTCP4, table(established(40000, 60, 75000), old[1], established(40002, 3, 300)))
		p.Poll(t0.Add(30 * time.Second))
		if !p.Up() {
			t.Fatal("still down although counters grow")
		}
	})
	t.Run("long-lived connections only", func(t *testing.T) {
		// No connection opens; the old ones keep passing packets: their
		// lifetime moves forward on every packet, their counters do not.
		src := conntrack.NewMemSource()
		p, _, _ := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutCombined})
		at := func(life uint32, bytes uint64) *conntrack.MemTable {
			e := established(40000, 1+bytes/1000, bytes)
			e.v.Lifetime = life
			f := established(40001, 1+bytes/1000, bytes)
			f.v.Lifetime = life
			return table(e, f)
		}
		src.Set(conntrack.MapTCP4, at(1000, 50000))
		p.Poll(t0)
		// Counting: lifetime and bytes move together. One read may fall
		// between the datapath's lifetime write and its counter adds.
		src.Set(conntrack.MapTCP4, at(1010, 50000))
		p.Poll(t0.Add(10 * time.Second))
		src.Set(conntrack.MapTCP4, at(1020, 90000))
		p.Poll(t0.Add(20 * time.Second))
		if !p.Up() {
			t.Fatal("down while counters grow")
		}
		// Accounting off: the lifetime moves, the counters stay.
		for i, life := range []uint32{1030, 1040} {
			src.Set(conntrack.MapTCP4, at(life, 90000))
			p.Poll(t0.Add(time.Duration(30+10*i) * time.Second))
		}
		if p.Up() {
			t.Fatal("up while established connections pass packets without counting them")
		}
	})
	t.Run("split", func(t *testing.T) {
		// 1.14/1.15 with ConntrackAccounting disabled at run time: creation
		// still counts the first packet (tx on egress), lookups add nothing.
		src := conntrack.NewMemSource()
		p, _, _ := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutSplit})
		split := func(sport uint16, rxp, rx, txp, tx uint64) ctEntry {
			return ctEntry{conntrack.Tuple{Src: worker0, Dst: master, SrcPort: sport, DstPort: 29500, Proto: 6},
				conntrack.Value{Word0: rxp, Word1: rx, Packets: txp, Bytes: tx, TxFlagsSeen: 0x12, RxFlagsSeen: 0x12}}
		}
		old := []ctEntry{split(40000, 20, 2000, 30, 40000)}
		src.Set(conntrack.MapTCP4, table(old...))
		p.Poll(t0)
		src.Set(conntrack.MapTCP4, table(append(old, split(40001, 0, 0, 1, 74))...))
		p.Poll(t0.Add(10 * time.Second))
		if p.Up() {
			t.Fatal("up while an established connection opened since counts only its SYN")
		}
	})
}

// Point 4: up to 1.15, ct_create4 writes a TUPLE_F_RELATED ICMP entry that
// copies the new connection's entry, counters included; 1.16+ writes it
// with zero counters. Neither is a connection: skipped, and a zero one
// does not say "accounting off".
func TestRelatedEntriesSkipped(t *testing.T) {
	for _, layout := range []conntrack.Layout{conntrack.LayoutSplit, conntrack.LayoutCombined} {
		t.Run(layout.String(), func(t *testing.T) {
			src := conntrack.NewMemSource()
			p, _, _ := logPoller(t, src, conntrack.Config{Layout: layout})
			src.Set(conntrack.MapTCP4, table())
			src.Set(conntrack.MapAny4, table())
			p.Poll(t0)
			c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500,
				sent: 10000, reply: 500, sentPkts: 8, replyPkts: 4}
			main := c.entries("n1", layout)[0]
			rel := main
			rel.t.Proto, rel.t.SrcPort, rel.t.DstPort = 1, 0, 0
			rel.t.Flags |= 2 // TUPLE_F_RELATED
			if layout == conntrack.LayoutCombined {
				rel.v.Packets, rel.v.Bytes = 0, 0
			} else {
				rel.v.Packets, rel.v.Bytes = 1, 74 // the copy of the first packet
			}
			src.Set(conntrack.MapTCP4, table(main))
			src.Set(conntrack.MapAny4, table(rel))
			p.Poll(t0.Add(10 * time.Second))
			if !p.Up() {
				t.Fatal("down: a related entry was taken for a connection")
			}
			want := 10000.0
			if layout == conntrack.LayoutCombined {
				want = 10500
			}
			if got := series(t, p)[key("z-a", "z-b", "cross_zone")]; got != want {
				t.Fatalf("bytes = %v, want %v (the related entry counted too?)", got, want)
			}
		})
	}
}

// Point 5: a connection a hostNetwork pod (or the node) opens to a job pod
// has no CT entry on the opener's side; in the combined layout the
// acceptor's ingress entry, whose src_sec_id is the host or remote-node
// identity, is the only one with its bytes: counted there, with the
// opener's zone as src_zone.
func TestHostNetworkOpenerCounted(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg, _ := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutCombined})
	node2 := netip.MustParseAddr("172.16.0.2") // n2's address, zone z-b
	node1 := netip.MustParseAddr("172.16.0.1")
	in := func(from netip.Addr, secID uint32, sport uint16, bytes uint64) ctEntry {
		return ctEntry{conntrack.Tuple{Src: from, Dst: worker0, SrcPort: sport, DstPort: 29500, Proto: 6, Flags: 1},
			conntrack.Value{Packets: 1 + bytes/1000, Bytes: bytes, TxFlagsSeen: 0x12, RxFlagsSeen: 0x12, SrcSecID: secID}}
	}
	mk := func(b uint64) *conntrack.MemTable {
		return table(in(node2, 6, 50000, b), in(node1, 1, 50001, b), in(master, 51234, 50002, b))
	}
	src.Set(conntrack.MapTCP4, mk(100))
	p.Poll(t0)
	src.Set(conntrack.MapTCP4, mk(5100))
	p.Poll(t0.Add(10 * time.Second))
	got := series(t, p)
	want := map[string]float64{
		key("z-b", "z-a", "cross_zone"): 5000, // opened by n2's host network
		key("z-a", "z-a", "zone"):       5000, // opened by n1's own host network
		// master's connection (a pod identity) is counted by n2's exporter
	}
	if !equal(got, want) {
		t.Fatalf("counted %v, want %v", got, want)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_unattributed_bytes_total", "reason", "opened_outside_cluster"); got != 0 {
		t.Fatalf("outside = %v", got)
	}
}

// Point 7: the per-endpoint maps of ConntrackLocal (1.14-1.17, named
// cilium_ct4_<endpoint id>) hold the entries of their endpoints instead of
// the global map: read too, reported once, their entries summed.
func TestPerEndpointMapsRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"cilium_ct4_00042", true}, {"cilium_ct_any6_03101", true}, {"cilium_ct4_global", false},
		{"cilium_ct4_0042", false}, {"cilium_ct4_0004x", false}, {"cilium_lb4_00042", false},
	} {
		if got := conntrack.LocalMap(tc.name); got != tc.want {
			t.Errorf("LocalMap(%q) = %v", tc.name, got)
		}
	}
	src := conntrack.NewMemSource()
	p, reg, logs := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutCombined})
	local := "cilium_ct4_00042"
	src.Set(conntrack.MapTCP4, table(established(40000, 5, 5000)))
	src.Set(local, table(established(41000, 5, 5000)))
	p.Poll(t0)
	src.Set(conntrack.MapTCP4, table(established(40000, 9, 9000)))
	src.Set(local, table(established(41000, 9, 7000)))
	p.Poll(t0.Add(10 * time.Second))
	if got := series(t, p)[key("z-a", "z-b", "cross_zone")]; got != 4000+2000 {
		t.Fatalf("bytes = %v, want 6000 (global + per-endpoint map)", got)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_entries", "map", "per_endpoint"); got != 1 {
		t.Fatalf("per-endpoint entries = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "per-endpoint conntrack maps found"); n != 1 {
		t.Fatalf("per-endpoint maps reported %d times:\n%s", n, logs)
	}
	// The endpoint goes, its map with it.
	src.Set(local, nil)
	p.Poll(t0.Add(20 * time.Second))
	if got := selfValue(t, reg, "zonewatch_conntrack_entries", "map", "per_endpoint"); got != 0 {
		t.Fatalf("per-endpoint entries = %v after the map went", got)
	}
}

// Point 7: map sizes follow node memory; a map near full evicts live
// entries (LRU): its size is exported and a nearly full map is logged once.
func TestNearlyFullMapReported(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg, logs := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutCombined})
	var es []ctEntry
	for i := 0; i < 9; i++ {
		es = append(es, established(uint16(40000+i), 5, 5000))
	}
	tab := table(es...)
	tab.Max = 10
	src.Set(conntrack.MapTCP4, tab)
	p.Poll(t0)
	p.Poll(t0.Add(10 * time.Second))
	if got := selfValue(t, reg, "zonewatch_conntrack_map_max_entries", "map", conntrack.MapTCP4); got != 10 {
		t.Fatalf("max entries = %v, want 10", got)
	}
	if n := strings.Count(logs.String(), "conntrack map nearly full"); n != 1 {
		t.Fatalf("nearly full logged %d times, want once:\n%s", n, logs)
	}
}
