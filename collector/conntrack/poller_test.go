package conntrack_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

func TestDeltasAcrossPolls(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg := newPoller(t, src, "n1", conntrack.LayoutCombined)
	c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sentPkts: 1, replyPkts: 1}
	cross := key("z-a", "z-b", topology.LocalityCrossZone)

	poll := func(i int, cs ...conn) {
		var es []ctEntry
		for _, c := range cs {
			es = append(es, c.entries("n1", conntrack.LayoutCombined)...)
		}
		src.Set(conntrack.MapTCP4, table(es...))
		p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
		if !p.Up() {
			t.Fatalf("poll %d: source down", i)
		}
	}

	c.sent, c.reply = 900, 100
	poll(1, c) // first read: a baseline, its bytes may be hours old
	if got := series(t, p)[cross]; got != 0 {
		t.Fatalf("first poll counted %v bytes, want 0 (baseline)", got)
	}
	c.sent, c.reply = 2900, 100
	poll(2, c)
	if got := series(t, p)[cross]; got != 2000 {
		t.Fatalf("after growth: %v, want 2000", got)
	}
	poll(3, c) // unchanged: nothing added
	if got := series(t, p)[cross]; got != 2000 {
		t.Fatalf("unchanged entry: %v, want 2000", got)
	}

	// The connection closes and its entry goes; a new one (new port)
	// appears: all its bytes happened since the last poll.
	c2 := c
	c2.sport, c2.sent, c2.reply = 40001, 450, 50
	poll(4, c2)
	if got := series(t, p)[cross]; got != 2500 {
		t.Fatalf("after delete + fresh entry: %v, want 2500", got)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_deleted_entries_total"); got != 1 {
		t.Fatalf("deleted entries = %v, want 1", got)
	}

	// Same key, counter down: the entry was recreated (TCP reopen); its
	// whole new counter is new.
	c2.sent, c2.reply = 150, 50
	poll(5, c2)
	if got := series(t, p)[cross]; got != 2700 {
		t.Fatalf("after reset: %v, want 2700", got)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_entry_resets_total"); got != 1 {
		t.Fatalf("resets = %v, want 1", got)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_entries", "map", conntrack.MapTCP4); got != 1 {
		t.Fatalf("entries gauge = %v, want 1 (n1 holds the egress entry only)", got)
	}
}

func TestReadErrorKeepsBaselines(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg := newPoller(t, src, "n1", conntrack.LayoutCombined)
	a := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 1000, sentPkts: 1, replyPkts: 1}
	b := conn{from: worker1, to: master, fromNode: "n1", toNode: "n2", sport: 40001, dport: 29500, sent: 1000, sentPkts: 1, replyPkts: 1}
	set := func(err error) {
		tab := table(append(a.entries("n1", 0), b.entries("n1", 0)...)...)
		tab.Err = err
		src.Set(conntrack.MapTCP4, tab)
	}
	set(nil)
	p.Poll(t0)
	a.sent, b.sent = 2000, 2000
	set(fmt.Errorf("map batch lookup: %w", syscall.EINTR)) // fails after the first entry
	p.Poll(t0.Add(10 * time.Second))
	if p.Up() {
		t.Fatal("source up after a failed read")
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "read"); got != 1 {
		t.Fatalf("read errors = %v, want 1", got)
	}
	b.sent = 3000
	set(nil)
	p.Poll(t0.Add(20 * time.Second))
	if !p.Up() {
		t.Fatal("source still down after a good read")
	}
	// a: +1000 (read before the failure), b: +2000; nothing lost, nothing twice.
	if got := series(t, p)[key("z-a", "z-b", topology.LocalityCrossZone)]; got != 3000 {
		t.Fatalf("bytes = %v, want 3000", got)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_deleted_entries_total"); got != 0 {
		t.Fatalf("a failed read deleted %v entries", got)
	}
}

func TestCountedOnceAcrossTwoNodes(t *testing.T) {
	cross, back, local := key("z-a", "z-b", "cross_zone"), key("z-b", "z-a", "cross_zone"), key("z-a", "z-a", "zone")
	for _, tc := range []struct {
		layout conntrack.Layout
		want   map[string]float64
		unattr map[string]float64
	}{
		// Before 1.16 every byte is counted once, by its sender; a
		// connection opened from outside has only the acceptor's entry,
		// and both its directions are outside the cluster's zones.
		{conntrack.LayoutSplit, map[string]float64{
			cross: 10000 + 300,      // w0 -> master; w1's replies to master
			back:  500 + 7000 + 100, // master's replies to w0, master -> w1, master's replies to the non-job pod
			local: 4000 + 100,       // w0 <-> w1 on n1, each side its own
		}, map[string]float64{"no_job": 900, "opened_outside_cluster": 650}},
		// 1.16 and later: both directions, once, by the opener.
		{conntrack.LayoutCombined, map[string]float64{
			cross: 10000 + 500,
			back:  7000 + 300,
			local: 4000 + 100,
		}, map[string]float64{"no_job": 1000, "opened_outside_cluster": 650}},
	} {
		t.Run(tc.layout.String(), func(t *testing.T) {
			for _, auto := range []bool{false, true} {
				layout := tc.layout
				if auto {
					layout = conntrack.LayoutAuto
				}
				// Auto: each node's entries decide its layout, minVotes
				// (8) of them, each voting once.
				conns := func(data bool) []conn {
					if auto {
						return append(twoNodeConns(data), voters(8)...)
					}
					return twoNodeConns(data)
				}
				// One exporter per node, each reading its node's maps.
				s1, s2 := srcFor("n1", tc.layout, conns(false)), srcFor("n2", tc.layout, conns(false))
				p1, r1 := newPoller(t, s1, "n1", layout)
				p2, r2 := newPoller(t, s2, "n2", layout)
				// One exporter for the cluster, fed every node's maps.
				sAll := srcFor("", tc.layout, conns(false))
				pAll, rAll := newPoller(t, sAll, "", layout)
				polls := 1
				if auto {
					polls = 4 // a few small polls until minVotes entries agree
				}
				for i := 0; i < polls; i++ {
					for _, p := range []*conntrack.Poller{p1, p2, pAll} {
						p.Poll(t0.Add(time.Duration(i) * time.Second))
					}
				}
				for _, p := range []*conntrack.Poller{p1, p2, pAll} {
					if !p.Up() {
						t.Fatalf("auto=%v: source down after %d polls", auto, polls)
					}
				}
				for node, s := range map[string]*conntrack.MemSource{"n1": s1, "n2": s2, "": sAll} {
					s.Set(conntrack.MapTCP4, tableFor(node, tc.layout, conns(true)))
				}
				for _, p := range []*conntrack.Poller{p1, p2, pAll} {
					p.Poll(t0.Add(10 * time.Second))
				}
				if got := series(t, p1, p2); !equal(got, tc.want) {
					t.Errorf("auto=%v: per-node exporters counted %v, want %v", auto, got, tc.want)
				}
				if got := series(t, pAll); !equal(got, tc.want) {
					t.Errorf("auto=%v: cluster exporter counted %v, want %v", auto, got, tc.want)
				}
				for reason, want := range tc.unattr {
					got := selfValue(t, r1, "zonewatch_conntrack_unattributed_bytes_total", "reason", reason) +
						selfValue(t, r2, "zonewatch_conntrack_unattributed_bytes_total", "reason", reason)
					if got != want {
						t.Errorf("auto=%v: unattributed %s = %v, want %v", auto, reason, got, want)
					}
					if got := selfValue(t, rAll, "zonewatch_conntrack_unattributed_bytes_total", "reason", reason); got != want {
						t.Errorf("auto=%v: cluster exporter unattributed %s = %v, want %v", auto, reason, got, want)
					}
				}
			}
		})
	}
}

func TestServiceEntriesIgnored(t *testing.T) {
	src := conntrack.NewMemSource()
	p, _ := newPoller(t, src, "n1", conntrack.LayoutCombined)
	svc := conntrack.Tuple{Src: worker0, Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: 53000, DstPort: 53, Proto: 17, Flags: 4}
	any4 := conntrack.NewMemTable(conntrack.KeySize4)
	any4.Put(svc, conntrack.Value{Word1: 7, Packets: 1, Bytes: 60})
	src.Set(conntrack.MapAny4, any4)
	p.Poll(t0)
	any4 = conntrack.NewMemTable(conntrack.KeySize4)
	any4.Put(svc, conntrack.Value{Word1: 7, Packets: 100, Bytes: 6000})
	src.Set(conntrack.MapAny4, any4)
	p.Poll(t0.Add(10 * time.Second))
	if got := series(t, p); len(got) != 0 {
		t.Fatalf("service entry counted: %v", got)
	}
	if !p.Up() {
		t.Fatal("down with only a service entry (nothing to decide)")
	}
}

func TestJobGoneSeriesReaped(t *testing.T) {
	src := srcFor("n1", conntrack.LayoutCombined, twoNodeConns(false))
	idx := newIndex()
	p, err := conntrack.New(src, idx, conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Grace: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	p.Poll(t0)
	src.Set(conntrack.MapTCP4, tableFor("n1", conntrack.LayoutCombined, twoNodeConns(true)))
	p.Poll(t0.Add(10 * time.Second))
	if len(series(t, p)) == 0 {
		t.Fatal("nothing counted")
	}
	for _, n := range []string{"train-worker-0", "train-worker-1", "train-master-0"} {
		idx.DeletePod(0, "ml", n)
	}
	got := series(t, p) // scraped once more while gone
	if len(got) == 0 {
		t.Fatal("series of a gone job vanished before its last scrape")
	}
	time.Sleep(time.Millisecond)
	if got := series(t, p); len(got) != 0 {
		t.Fatalf("series of a gone job kept: %v", got)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	src := srcFor("n1", conntrack.LayoutCombined, twoNodeConns(true))
	p, _ := newPoller(t, src, "n1", conntrack.LayoutCombined)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx, time.Millisecond); close(done) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
	if !p.Up() {
		t.Fatal("down after Run")
	}
}

// TestHeldUntilLayoutKnown: without a Cilium version, a node with one
// ingress entry needs minVotes polls to decide the layout; its growth
// meanwhile is counted then, not dropped, and the source is up all along
// (nothing is wrong, only not known yet).
func TestHeldUntilLayoutKnown(t *testing.T) {
	src := conntrack.NewMemSource()
	var logs logBuf
	p, err := conntrack.New(src, newIndex(), conntrack.Config{Node: "n1", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// The master opened it; worker0's replies are the tx of n1's entry.
	c := conn{from: master, to: worker0, fromNode: "n2", toNode: "n1", sport: 40000, dport: 29500, sentPkts: 1, replyPkts: 1, sent: 500}
	var i int
	decided := func() bool {
		return !strings.Contains(logs.String(), "not known yet") || strings.Contains(logs.String(), "decided")
	}
	// New connections of a non-job pod come, one a poll: once minVotes (8)
	// of them agree, the layout is known.
	for i = 0; i < 20; i++ {
		c.reply = uint64(1000 * (i + 1))
		es := c.entries("n1", conntrack.LayoutSplit)
		for _, v := range voters(i) {
			es = append(es, v.entries("n1", conntrack.LayoutSplit)...)
		}
		src.Set(conntrack.MapTCP4, table(es...))
		p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
		if !p.Up() {
			t.Fatalf("poll %d: down while the layout is not known yet", i)
		}
		if i > 0 && decided() {
			break
		}
		if got := series(t, p); len(got) != 0 {
			t.Fatalf("poll %d: counted %v before the layout was known", i, got)
		}
	}
	if i < 2 || i == 20 {
		t.Fatalf("layout decided after %d polls:\n%s", i, logs.String())
	}
	p.Poll(t0.Add(time.Duration(i+1) * 10 * time.Second))
	// Everything since the first (baseline) poll: reply went 1000 -> 1000*(i+1).
	if got, want := series(t, p)[key("z-a", "z-b", "cross_zone")], float64(1000*i); got != want {
		t.Fatalf("after %d polls: %v bytes, want %v", i+2, got, want)
	}
	if strings.Contains(logs.String(), "level=WARN") || strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("warned about a layout not known yet:\n%s", logs.String())
	}
}

func TestForcedLayoutContradictedIsLogged(t *testing.T) {
	var logs logBuf
	src := srcFor("n1", conntrack.LayoutCombined, append(twoNodeConns(true), voters(8)...))
	p, err := conntrack.New(src, newIndex(), conntrack.Config{Node: "n1", Layout: conntrack.LayoutSplit,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		p.Poll(t0.Add(time.Duration(i) * time.Second))
	}
	if n := strings.Count(logs.String(), "contradicts"); n != 1 {
		t.Fatalf("contradiction logged %d times, want once:\n%s", n, logs.String())
	}
}

func TestHeldUntilIndexReady(t *testing.T) {
	src := conntrack.NewMemSource()
	ready := false
	p, err := conntrack.New(src, newIndex(), conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Ready: func() bool { return ready }})
	if err != nil {
		t.Fatal(err)
	}
	c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 1000, sentPkts: 1, replyPkts: 1}
	for i := 0; i < 3; i++ {
		c.sent += 1000
		src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
		p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
	}
	if got := series(t, p); len(got) != 0 {
		t.Fatalf("counted before the index was ready: %v", got)
	}
	ready = true
	p.Poll(t0.Add(30 * time.Second))
	if got := series(t, p)[key("z-a", "z-b", "cross_zone")]; got != 2000 {
		t.Fatalf("bytes = %v, want 2000 (growth since the baseline)", got)
	}
}
