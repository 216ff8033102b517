package conntrack_test

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

// What Cilium v1.20.2 agents taught (issue 26's lab): the tests below
// follow the datapath (bpf/lib/conntrack.h, bpf_lxc.c) and the lab's
// observations, not the code under test.

func TestVersionLayout(t *testing.T) {
	for v, want := range map[string]conntrack.Layout{
		"cilium v1.20.2+g5f2b0f9":                          conntrack.LayoutCombined, // Hubble ServerStatus on an agent
		"1.20.2 spike-build go version go1.26 linux/amd64": conntrack.LayoutCombined, // cilium-dbg version
		"1.20.2-zonewatch-sim":                             conntrack.LayoutCombined,
		"v1.16.0":                                          conntrack.LayoutCombined,
		"1.17.3":                                           conntrack.LayoutCombined,
		"1.15.19":                                          conntrack.LayoutSplit,
		"cilium v1.14.0-rc.1+gabc":                         conntrack.LayoutSplit,
		"hubble-relay v1.20.2+gab":                         conntrack.LayoutAuto, // a Relay's, not an agent's
		"cilium":                                           conntrack.LayoutAuto, // an agent built without a version
		"v-":                                               conntrack.LayoutAuto,
		"2.0.0":                                            conntrack.LayoutAuto,
		"":                                                 conntrack.LayoutAuto,
	} {
		got, ok := conntrack.VersionLayout(v)
		if got != want || ok != (want != conntrack.LayoutAuto) {
			t.Errorf("VersionLayout(%q) = %v, %v; want %v", v, got, ok, want)
		}
	}
}

// TestHardBlockCountsWithoutLayout is the hard block: the job's pods on
// this node only send SYNs that a policy drops at the peer (egress entries
// whose peer never answered, which read the same in both layouts) and no
// Cilium version is known. The source is up, logs no warning or error,
// and counts those bytes.
func TestHardBlockCountsWithoutLayout(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg, logs := logPoller(t, src, conntrack.Config{Node: "n1"})
	syns := func(n uint64) *conntrack.MemTable {
		tab := conntrack.NewMemTable(conntrack.KeySize4)
		for i := range uint64(3) {
			tab.Put(conntrack.Tuple{Src: worker0, Dst: master, SrcPort: uint16(40000 + i), DstPort: 29500, Proto: 6},
				conntrack.Value{Packets: n, Bytes: 74 * n, Lifetime: uint32(100 + n), TxFlagsSeen: 0x02, SrcSecID: podIdentity})
		}
		return tab
	}
	for i := range uint64(6) {
		src.Set(conntrack.MapTCP4, syns(1+i))
		p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
		if !p.Up() {
			t.Fatalf("poll %d: down (nothing is wrong, the layout is only not known yet):\n%s", i, logs)
		}
	}
	if got, want := series(t, p)[key("z-a", "z-b", "cross_zone")], float64(3*5*74); got != want {
		t.Fatalf("retransmitted SYNs counted %v, want %v", got, want)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_layout_info", "layout", "auto"); got != 1 {
		t.Fatalf("layout_info{auto} = %v", got)
	}
	if out := logs.String(); strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") || !strings.Contains(out, "not known yet") {
		t.Fatalf("logs:\n%s", out)
	}
}

// TestVersionDecidesLayout: with the agent's version the layout is known
// at once; ingress entries count from the first poll after the baseline,
// and a version given later decides the maps already read.
func TestVersionDecidesLayout(t *testing.T) {
	hostConn := conn{from: netip.MustParseAddr("10.2.0.1"), to: worker0, toNode: "n1", sport: 50000, dport: 29500, id: 2,
		sentPkts: 1, replyPkts: 1, sent: 74, reply: 74}
	for _, tc := range []struct {
		layout  conntrack.Layout
		version string
	}{{conntrack.LayoutCombined, "cilium v1.20.2+g5f2b0f9"}, {conntrack.LayoutSplit, "1.15.19"}} {
		for _, later := range []bool{false, true} {
			src := conntrack.NewMemSource()
			cfg := conntrack.Config{Node: "n1"}
			if !later {
				cfg.CiliumVersion = tc.version
			}
			p, reg, _ := logPoller(t, src, cfg)
			c := hostConn
			src.Set(conntrack.MapTCP4, table(c.entries("n1", tc.layout)...))
			p.Poll(t0)
			if later {
				p.SetCiliumVersion(tc.version)
			}
			c.sent, c.reply = 10074, 2074
			src.Set(conntrack.MapTCP4, table(c.entries("n1", tc.layout)...))
			p.Poll(t0.Add(10 * time.Second))
			if got := series(t, p)[key("z-b", "z-a", "cross_zone")]; got != 12000 {
				t.Errorf("%s later=%v: %v bytes after one poll, want 12000", tc.version, later, got)
			}
			if got := selfValue(t, reg, "zonewatch_conntrack_layout_info", "layout", tc.layout.String()); got != 1 {
				t.Errorf("%s later=%v: layout_info{%s} = %v", tc.version, later, tc.layout, got)
			}
		}
	}
}

// TestEveryByteLandsOnce: across every node's exporter, each connection's
// bytes are counted once, in a job or as unattributed, whoever opened it:
// pods, a node's host network (host, remote-node, kube-apiserver, or world
// on a node's cilium_host address, as the lab saw), the world, a CIDR
// identity; and a pod whose acceptor-side entry carries remote-node (seen
// briefly on the receiving node) is still counted by its own node only.
func TestEveryByteLandsOnce(t *testing.T) {
	n1Router, n2Router := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.2.0.1")
	n2Node := netip.MustParseAddr("172.16.0.2")
	conns := func(data bool) []conn {
		cs := twoNodeConns(data)
		more := []conn{
			{from: n1Router, to: worker0, toNode: "n1", sport: 50000, dport: 29500, sent: 3000, reply: 300, id: 1},  // kubelet, host
			{from: n2Node, to: worker1, toNode: "n1", sport: 50001, dport: 29500, sent: 2000, reply: 200, id: 6},    // remote-node
			{from: n2Router, to: worker0, toNode: "n1", sport: 50002, dport: 29500, sent: 1500, reply: 150, id: 2},  // world on cilium_host
			{from: n1Router, to: master, toNode: "n2", sport: 50003, dport: 29500, sent: 1200, reply: 120, id: 7},   // kube-apiserver node
			{from: world, to: worker0, toNode: "n1", sport: 50004, dport: 443, sent: 800, reply: 80, id: 1<<24 | 7}, // a CIDR identity
			{from: master, to: worker1, fromNode: "n2", toNode: "n1", sport: 50005, dport: 29400, sent: 700, reply: 70, id: 6},
			{from: n2Router, to: other, toNode: "n1", sport: 50006, dport: 80, sent: 600, reply: 60, id: 6}, // to a non-job pod
		}
		for i := range more {
			c := &more[i]
			if !data {
				c.sent, c.reply = 0, 0
			}
			c.sent += 74
			c.reply += 74
			c.sentPkts, c.replyPkts = 1+c.sent/1000, 1+c.reply/1000
		}
		return append(cs, more...)
	}
	var total float64
	for _, c := range conns(true) {
		total += float64(c.sent + c.reply)
	}
	for _, c := range conns(false) {
		total -= float64(c.sent + c.reply)
	}
	for _, layout := range []conntrack.Layout{conntrack.LayoutCombined, conntrack.LayoutSplit} {
		t.Run(layout.String(), func(t *testing.T) {
			s1, s2 := srcFor("n1", layout, conns(false)), srcFor("n2", layout, conns(false))
			p1, r1 := newPoller(t, s1, "n1", layout)
			p2, r2 := newPoller(t, s2, "n2", layout)
			p1.Poll(t0)
			p2.Poll(t0)
			s1.Set(conntrack.MapTCP4, tableFor("n1", layout, conns(true)))
			s2.Set(conntrack.MapTCP4, tableFor("n2", layout, conns(true)))
			p1.Poll(t0.Add(10 * time.Second))
			p2.Poll(t0.Add(10 * time.Second))
			var counted float64
			for _, v := range series(t, p1, p2) {
				counted += v
			}
			unattr := selfValue(t, r1, "zonewatch_conntrack_unattributed_bytes_total") + selfValue(t, r2, "zonewatch_conntrack_unattributed_bytes_total")
			if counted+unattr != total {
				t.Fatalf("jobs %v + unattributed %v = %v, want every byte once: %v", counted, unattr, counted+unattr, total)
			}
			// The host-opened connections, both directions at the acceptor,
			// beside the pods' own (counted by their senders with split,
			// by their openers with combined).
			zone, back := float64((3000+300)+(4000+100)), float64((2000+200)+(1500+150))
			if layout == conntrack.LayoutSplit {
				back += 500 + 7000 + 100 + 700
			} else {
				back += 7000 + 300 + 700 + 70
			}
			got := series(t, p1, p2)
			if got[key("z-a", "z-a", "zone")] != zone || got[key("z-b", "z-a", "cross_zone")] != back {
				t.Errorf("counted %v, want zone %v and z-b>z-a %v", got, zone, back)
			}
			if got := selfValue(t, r1, "zonewatch_conntrack_unattributed_bytes_total", "reason", "opened_outside_cluster") +
				selfValue(t, r2, "zonewatch_conntrack_unattributed_bytes_total", "reason", "opened_outside_cluster"); got != 650+880 {
				t.Errorf("opened_outside_cluster = %v, want %v", got, 650+880)
			}
		})
	}
}

// TestFinalReadWhenPodGoes: Run reads the maps as soon as a local job pod
// stops counting (here: it finished and left the index), and attributes
// what its entry moved since the last read to its job, although the index
// no longer knows its address; then Cilium deletes the entry.
func TestFinalReadWhenPodGoes(t *testing.T) {
	idx := newIndex()
	src := conntrack.NewMemSource()
	p, err := conntrack.New(src, idx, conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 74, reply: 74, sentPkts: 1, replyPkts: 1}
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	runHourly(t, p)
	cross := key("z-a", "z-b", "cross_zone")
	// The baseline poll, a poll during the transfer, then the pod ends.
	waitFor(t, func() bool { return p.Up() })
	c.sent = 1_000_074
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	p.Poll(time.Now())
	if got := series(t, p)[cross]; got != 1_000_000 {
		t.Fatalf("%v bytes during the transfer, want 1e6", got)
	}
	c.sent = 5_000_074
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	idx.UpsertPod(0, topology.Pod{Namespace: "ml", Name: "train-worker-0", Node: "n1", IPs: []netip.Addr{worker0}, Finished: true,
		Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleWorker}})
	waitFor(t, func() bool { return series(t, p)[cross] == 5_000_000 })
}

// runHourly runs p.Run, an hour between its timed polls (what the test
// sees comes from its reads on pods' going), until the test ends.
func runHourly(t *testing.T, p *conntrack.Poller) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx, time.Hour); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not within 30 s")
		}
	}
}

// TestHeldGrowthLostIsFlagged: growth held (here: the informers not
// synced yet) is lost if Cilium deletes the entry before counting starts;
// the entry is counted as deleted while active.
func TestHeldGrowthLostIsFlagged(t *testing.T) {
	src := conntrack.NewMemSource()
	reg := prometheus.NewRegistry()
	p, err := conntrack.New(src, newIndex(), conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Self: reg,
		Ready: func() bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 74, reply: 74, sentPkts: 1, replyPkts: 1}
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	p.Poll(t0)
	c.sent = 10074
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	p.Poll(t0.Add(10 * time.Second))
	src.Set(conntrack.MapTCP4, table())
	p.Poll(t0.Add(20 * time.Second))
	if n := selfValue(t, reg, "zonewatch_conntrack_deleted_active_entries_total"); n != 1 {
		t.Fatalf("deleted while active = %v, want 1 (its held growth is lost)", n)
	}
}

// TestReadWhenShortLivedPodGoes replays what the exporter on gpu-a2 saw
// in the Cilium lab's "pod deleted right after a transfer" (TestCiliumLab,
// its debug log): a job pod bound to the node, given its IP, moving
// 16,384,000 bytes and marked terminating (the API deletion), all within
// 160 ms; Cilium deletes its entry at the CNI DEL a second later, then the
// object goes. Run looked at the index once a second and compared the
// scheduled pods it saw: the pod came and went between two looks, so its
// going was never seen, no read came before the CNI DEL, and none of its
// bytes were counted (5 of 7 lab runs). Here the events come between two
// looks too (the poll interval is an hour: only a read on the pod's going
// can count the bytes), on a real index and a real Run.
func TestReadWhenShortLivedPodGoes(t *testing.T) {
	idx := newIndex()
	src := conntrack.NewMemSource()
	reg := prometheus.NewRegistry()
	p, err := conntrack.New(src, idx, conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Self: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// The job trains already: its worker's connection is in the map.
	running := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 74, reply: 74, sentPkts: 1, replyPkts: 1}
	src.Set(conntrack.MapTCP4, table(running.entries("n1", 0)...))
	runHourly(t, p)
	waitFor(t, func() bool { return p.Up() }) // the first read: baselines

	// What the informer and the datapath did, in the lab's order.
	w2 := netip.MustParseAddr("10.1.0.12")
	pod := topology.Pod{Namespace: "ml", Name: "train-worker-2", Node: "n1",
		Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleWorker}}
	idx.UpsertPod(0, pod) // created, bound to n1
	pod.IPs = []netip.Addr{w2}
	idx.UpsertPod(0, pod) // CNI ADD: Running, its IP
	// Its connection to the master, opened and done: 12.5 MiB up, 3.1 MiB
	// down (the lab's payload; combined: one counter for both ways).
	short := conn{from: w2, to: master, fromNode: "n1", toNode: "n2", sport: 40001, dport: 29500,
		sent: 13_107_200, reply: 3_276_800, sentPkts: 900, replyPkts: 300}
	src.Set(conntrack.MapTCP4, table(append(running.entries("n1", 0), short.entries("n1", 0)...)...))
	pod.Terminating = true
	idx.UpsertPod(0, pod) // the API deletion: deletionTimestamp

	// The read on its going must come while the entry is there; the CNI
	// DEL waits for it here, so that no timing decides the outcome.
	cross := key("z-a", "z-b", "cross_zone")
	want := float64(short.sent + short.reply)
	for deadline := time.Now().Add(30 * time.Second); series(t, p)[cross] != want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no read on the pod's going: %v bytes counted, want %v (Run never saw the pod go)", series(t, p)[cross], want)
		}
	}
	// CNI DEL (Cilium scrubs the endpoint's entries), then the object goes.
	src.Set(conntrack.MapTCP4, table(running.entries("n1", 0)...))
	idx.DeletePod(0, "ml", "train-worker-2")
	p.Poll(time.Now())
	if got := series(t, p)[cross]; got != want {
		t.Errorf("after the CNI DEL: %v bytes, want %v", got, want)
	}
	if u := selfValue(t, reg, "zonewatch_conntrack_unattributed_bytes_total"); u != 0 {
		t.Errorf("%v bytes unattributed, want none", u)
	}
}
