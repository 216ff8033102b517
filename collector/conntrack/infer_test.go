package conntrack_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/collector/conntrack"
)

// Point 3: entries made by 1.15 survive an upgrade to 1.16 (same 56-byte
// value) and keep looking split. The layout is decided once per map and
// changes only when the entries created since overwhelmingly say so; the
// change is logged and counted, and old entries never flip it back.
func TestLayoutDecidedOncePerMap(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg, logs := logPoller(t, src, conntrack.Config{})
	// 1.15: split entries, established, rx counters in words 0/1.
	var old []ctEntry
	for i := 0; i < 40; i++ {
		old = append(old, ctEntry{conntrack.Tuple{Src: worker0, Dst: master, SrcPort: uint16(30000 + i), DstPort: 29500, Proto: 6},
			conntrack.Value{Word0: 10, Word1: 1000, Packets: 20, Bytes: 30000, TxFlagsSeen: 0x12, RxFlagsSeen: 0x12}})
	}
	src.Set(conntrack.MapTCP4, table(old...))
	// A UDP map with split entries too, which sees no new ones later.
	var udp []ctEntry
	for i := 0; i < 10; i++ {
		udp = append(udp, ctEntry{conntrack.Tuple{Src: worker0, Dst: master, SrcPort: uint16(20000 + i), DstPort: 5000, Proto: 17},
			conntrack.Value{Word0: 3, Word1: 300, Packets: 3, Bytes: 300}})
	}
	src.Set(conntrack.MapAny4, table(udp...))
	p.Poll(t0)
	if got := selfValue(t, reg, "zonewatch_conntrack_layout_info", "layout", "split"); got != 1 {
		t.Fatalf("layout split = %v after 40 split entries", got)
	}
	// Upgrade to 1.16: the old entries stay (words 0/1 frozen, the
	// datapath adds both directions to offset 16/24); new connections are
	// combined: both directions in packets/bytes, words 0/1 zero.
	var young []ctEntry
	poll := func(i int, bump uint64) {
		es := make([]ctEntry, 0, len(old)+len(young))
		for _, e := range old {
			e.v.Packets += bump
			e.v.Bytes += bump * 1000
			es = append(es, e)
		}
		es = append(es, young...)
		src.Set(conntrack.MapTCP4, table(es...))
		p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
	}
	for i := 1; i <= 8; i++ {
		for j := 0; j < 10; j++ {
			young = append(young, established(uint16(40000+10*i+j), 5, 5000))
		}
		poll(i, uint64(i))
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_layout_info", "layout", "combined"); got != 1 {
		t.Fatalf("layout combined = %v after 80 connections opened on 1.16; log:\n%s", got, logs)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_layout_changes_total", "map", conntrack.MapTCP4); got != 1 {
		t.Fatalf("layout changes = %v, want 1", got)
	}
	// The UDP map had too few new entries to vote; one datapath writes
	// both, so it follows.
	if got := selfValue(t, reg, "zonewatch_conntrack_layout_changes_total", "map", conntrack.MapAny4); got != 1 {
		t.Fatalf("layout changes of the UDP map = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "conntrack layout changed") {
		t.Fatalf("change not logged:\n%s", logs)
	}
	// The old entries are still there and still look split: no flip back.
	for i := 9; i < 30; i++ {
		poll(i, uint64(i))
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_layout_changes_total", "map", conntrack.MapTCP4); got != 1 {
		t.Fatalf("layout changes = %v after more polls with the old entries, want 1", got)
	}
	if !p.Up() {
		t.Fatal("down after the change")
	}
}

// A recreated map (new kernel map ID under the same name) is a new map:
// read as baselines, its layout decided again.
func TestRecreatedMapIsNew(t *testing.T) {
	src := conntrack.NewMemSource()
	p, _, logs := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutCombined})
	tab := table(established(40000, 5, 5000))
	tab.ID = 7
	src.Set(conntrack.MapTCP4, tab)
	p.Poll(t0)
	tab = table(established(40000, 9, 9000))
	tab.ID = 8 // same key, a new map: its counter is no growth of the old one
	src.Set(conntrack.MapTCP4, tab)
	p.Poll(t0.Add(10 * time.Second))
	if got := series(t, p); len(got) != 0 {
		t.Fatalf("counted %v from the first read of a recreated map", got)
	}
	if !strings.Contains(logs.String(), "recreated") {
		t.Fatalf("recreation not logged:\n%s", logs)
	}
}

// TestDocsPerVersionTable: docs/conntrack.md has a row for every Cilium
// version from 1.14 to 1.20, naming the switch EnableAdvice gives for it.
func TestDocsPerVersionTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/conntrack.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if cells := strings.Split(line, " | "); len(cells) == 5 && strings.HasPrefix(cells[0], "| 1.") {
			rows[strings.TrimPrefix(cells[0], "| ")] = line
		}
	}
	for minor := 14; minor <= 20; minor++ {
		v := fmt.Sprintf("1.%d", minor)
		row, ok := rows[v]
		if !ok {
			t.Errorf("docs/conntrack.md: no row for Cilium %s", v)
			continue
		}
		advice := conntrack.EnableAdvice(v+".0", conntrack.LayoutAuto)
		switch {
		case minor <= 15:
			if !strings.Contains(row, "**on**") || !strings.Contains(advice, "counts by default") {
				t.Errorf("Cilium %s: docs and advice disagree that it counts by default:\n%s\n%s", v, row, advice)
			}
		case minor == 16:
			if !strings.Contains(row, "ConntrackAccounting=Enabled") || !strings.Contains(advice, "ConntrackAccounting=Enabled") {
				t.Errorf("Cilium 1.16: docs and advice do not both name the runtime option:\n%s\n%s", row, advice)
			}
		default:
			if !strings.Contains(advice, "bpf.ctAccounting=true") || strings.Contains(row, "**on**") {
				t.Errorf("Cilium %s: advice %q", v, advice)
			}
		}
	}
}
