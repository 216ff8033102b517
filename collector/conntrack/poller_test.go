package conntrack_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

var (
	worker0 = netip.MustParseAddr("10.1.0.10") // job ml/train, node n1, zone z-a
	worker1 = netip.MustParseAddr("10.1.0.11") // job ml/train, node n1
	master  = netip.MustParseAddr("10.2.0.10") // job ml/train, node n2, zone z-b
	other   = netip.MustParseAddr("10.1.0.50") // a non-job pod on n1 (pod CIDR)
	world   = netip.MustParseAddr("93.184.216.34")
)

// newIndex is a real topology index: two nodes in two zones, one job
// with two workers on n1 and its master on n2.
func newIndex() *topology.Index {
	idx := topology.NewIndex()
	idx.UpsertNode(topology.Node{Name: "n1", Zone: "z-a", Region: "r1",
		Addresses: []netip.Addr{netip.MustParseAddr("172.16.0.1")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}})
	idx.UpsertNode(topology.Node{Name: "n2", Zone: "z-b", Region: "r1",
		Addresses: []netip.Addr{netip.MustParseAddr("172.16.0.2")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/24")}})
	pod := func(name, node string, ip netip.Addr, role string) {
		idx.UpsertPod(0, topology.Pod{Namespace: "ml", Name: name, Node: node, IPs: []netip.Addr{ip},
			Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: role}})
	}
	pod("train-worker-0", "n1", worker0, topology.RoleWorker)
	pod("train-worker-1", "n1", worker1, topology.RoleWorker)
	pod("train-master-0", "n2", master, topology.RoleCoordinator)
	return idx
}

// conn is one connection as it really happened: from opened to accepted,
// with the bytes each side sent.
type conn struct {
	from, to            netip.Addr
	fromNode, toNode    string // "" outside the cluster (no Cilium there)
	sport, dport        uint16
	sent, reply         uint64 // bytes from -> to, to -> from
	sentPkts, replyPkts uint64
	// id is the opener's security identity, the src_sec_id of both
	// entries (bpf_lxc.c: SECLABEL on egress, the packet's source
	// identity on ingress); 0: podIdentity.
	id uint32
}

// podIdentity is a pod's security identity (not reserved, global scope).
const podIdentity = 51234

// entries is what Cilium on node holds for c, written from the datapath
// rules: an OUT entry on the opener's node (its egress created it), an IN
// entry on the acceptor's node; split counts per entry what its local
// endpoint sent (tx, CT_EGRESS lookups) and received (rx), combined counts
// every packet of both directions.
func (c conn) entries(node string, layout conntrack.Layout) []ctEntry {
	var out []ctEntry
	tu := conntrack.Tuple{Src: c.from, Dst: c.to, SrcPort: c.sport, DstPort: c.dport, Proto: 6}
	mk := func(flags uint8, tx, txp, rx, rxp uint64) ctEntry {
		tu.Flags = flags
		v := conntrack.Value{TxFlagsSeen: 0x12, RxFlagsSeen: 0x12, SrcSecID: c.id}
		if v.SrcSecID == 0 {
			v.SrcSecID = podIdentity
		}
		if layout == conntrack.LayoutSplit {
			v.Word0, v.Word1, v.Packets, v.Bytes = rxp, rx, txp, tx
		} else {
			v.Packets, v.Bytes = txp+rxp, tx+rx
		}
		return ctEntry{tu, v}
	}
	if c.fromNode != "" && (node == "" || c.fromNode == node) {
		out = append(out, mk(0, c.sent, c.sentPkts, c.reply, c.replyPkts))
	}
	if c.toNode != "" && (node == "" || c.toNode == node) {
		out = append(out, mk(1, c.reply, c.replyPkts, c.sent, c.sentPkts))
	}
	return out
}

type ctEntry struct {
	t conntrack.Tuple
	v conntrack.Value
}

func table(es ...ctEntry) *conntrack.MemTable {
	t := conntrack.NewMemTable(conntrack.KeySize4)
	for _, e := range es {
		t.Put(e.t, e.v)
	}
	return t
}

// series reads the byte counters a poller exports.
func series(t *testing.T, ps ...*conntrack.Poller) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, p := range ps {
		ch := make(chan prometheus.Metric, 100)
		// Update fails exactly while the source is down.
		if err := p.Update(ch); (err != nil) == p.Up() {
			t.Fatalf("Update error %v with the source up %v", err, p.Up())
		}
		close(ch)
		for m := range ch {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				t.Fatal(err)
			}
			var lv []string
			for _, l := range pb.GetLabel() {
				lv = append(lv, l.GetName()+"="+l.GetValue())
			}
			out[strings.Join(lv, ",")] += pb.GetCounter().GetValue()
		}
	}
	return out
}

func key(srcZone, dstZone, locality string) string {
	return fmt.Sprintf("dst_zone=%s,job_name=train,locality=%s,namespace=ml,src_zone=%s", dstZone, locality, srcZone)
}

// selfValue returns a self-metric's value (summed over matching series).
func selfValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func newPoller(t *testing.T, src conntrack.Source, node string, layout conntrack.Layout) (*conntrack.Poller, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	p, err := conntrack.New(src, newIndex(), conntrack.Config{Node: node, Layout: layout, Self: reg})
	if err != nil {
		t.Fatal(err)
	}
	return p, reg
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

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

// twoNodeConns are the connections of the once-only test, with the bytes
// each side sends between the two polls (handshakes come before).
func twoNodeConns(data bool) []conn {
	cs := []conn{
		{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 10000, reply: 500},
		{from: master, to: worker1, fromNode: "n2", toNode: "n1", sport: 41000, dport: 29400, sent: 7000, reply: 300},
		{from: worker0, to: worker1, fromNode: "n1", toNode: "n1", sport: 42000, dport: 29400, sent: 4000, reply: 100},
		{from: other, to: master, fromNode: "n1", toNode: "n2", sport: 43000, dport: 29500, sent: 900, reply: 100},
		{from: world, to: master, fromNode: "", toNode: "n2", sport: 44000, dport: 8080, sent: 600, reply: 50, id: 2},
	}
	for i := range cs {
		c := &cs[i]
		if !data {
			c.sent, c.reply = 0, 0
		}
		c.sent += 74 // SYN
		c.reply += 74
		c.sentPkts, c.replyPkts = 1+c.sent/1000, 1+c.reply/1000
	}
	return cs
}

func tableFor(node string, layout conntrack.Layout, cs []conn) *conntrack.MemTable {
	var es []ctEntry
	for _, c := range cs {
		es = append(es, c.entries(node, layout)...)
	}
	return table(es...)
}

func srcFor(node string, layout conntrack.Layout, cs []conn) *conntrack.MemSource {
	s := conntrack.NewMemSource()
	s.Set(conntrack.MapTCP4, tableFor(node, layout, cs))
	return s
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
				// One exporter per node, each reading its node's maps.
				s1, s2 := srcFor("n1", tc.layout, twoNodeConns(false)), srcFor("n2", tc.layout, twoNodeConns(false))
				p1, r1 := newPoller(t, s1, "n1", layout)
				p2, r2 := newPoller(t, s2, "n2", layout)
				// One exporter for the cluster, fed every node's maps.
				sAll := srcFor("", tc.layout, twoNodeConns(false))
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
					s.Set(conntrack.MapTCP4, tableFor(node, tc.layout, twoNodeConns(true)))
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

func equal(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// logBuf captures the poller's log.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// badSizeTable is a map of a layout no Cilium version has.
type badSizeTable struct{}

func (badSizeTable) KeySize() int                       { return conntrack.KeySize4 }
func (badSizeTable) ValueSize() int                     { return 72 }
func (badSizeTable) Each(func(key, value []byte)) error { return nil }
func (badSizeTable) Close() error                       { return nil }

type funcSource func(name string) (conntrack.Table, error)

func (f funcSource) Open(name string) (conntrack.Table, error) { return f(name) }

func TestDownReasons(t *testing.T) {
	zeroCounters := func() *conntrack.MemSource {
		s := conntrack.NewMemSource()
		tab := conntrack.NewMemTable(conntrack.KeySize4)
		for _, c := range twoNodeConns(true) {
			for _, e := range c.entries("n1", conntrack.LayoutCombined) {
				tab.Put(e.t, conntrack.Value{TxFlagsSeen: 0x12, RxFlagsSeen: 0x12})
			}
		}
		s.Set(conntrack.MapTCP4, tab)
		return s
	}
	for _, tc := range []struct {
		name   string
		src    conntrack.Source
		layout conntrack.Layout
		reason string // in the errors metric; "" when none
		log    string
	}{
		{"absent", conntrack.NewMemSource(), conntrack.LayoutAuto, "absent", "mountPropagation"},
		{"permission", funcSource(func(name string) (conntrack.Table, error) {
			return nil, fmt.Errorf("opening pinned map /sys/fs/bpf/tc/globals/%s: %w", name, syscall.EPERM)
		}), conntrack.LayoutAuto, "permission", "capability BPF"},
		{"unknown layout", funcSource(func(string) (conntrack.Table, error) { return badSizeTable{}, nil }), conntrack.LayoutAuto, "layout", "value size 72"},
		{"accounting off", zeroCounters(), conntrack.LayoutAuto, "", "bpf.ctAccounting=true"},
		{"accounting off, forced layout", zeroCounters(), conntrack.LayoutCombined, "", "bpf.ctAccounting=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuf
			reg := prometheus.NewRegistry()
			p, err := conntrack.New(tc.src, newIndex(), conntrack.Config{Node: "n1", Layout: tc.layout, Self: reg,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
				if p.Up() {
					t.Fatalf("poll %d: source up", i)
				}
			}
			if got := series(t, p); len(got) != 0 {
				t.Fatalf("bytes counted while down: %v", got)
			}
			if tc.reason != "" {
				// absent: once per poll; the others once per map and poll.
				want := 3.0
				if tc.reason != "absent" {
					want = 3 * float64(len(conntrack.MapNames))
				}
				if got := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", tc.reason); got != want {
					t.Errorf("errors{reason=%q} = %v, want %v", tc.reason, got, want)
				}
			}
			out := logs.String()
			if n := strings.Count(out, "conntrack source down"); n != 1 {
				t.Errorf("logged %d times, want once:\n%s", n, out)
			}
			if !strings.Contains(out, tc.log) {
				t.Errorf("log does not say %q:\n%s", tc.log, out)
			}
		})
	}
}

func TestAccountingTurnedOn(t *testing.T) {
	src := conntrack.NewMemSource()
	p, _ := newPoller(t, src, "n1", conntrack.LayoutAuto)
	c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500}
	src.Set(conntrack.MapTCP4, table(c.entries("n1", conntrack.LayoutCombined)...)) // all zero
	p.Poll(t0)
	if p.Up() {
		t.Fatal("up with accounting off")
	}
	// Cilium restarted with bpf.ctAccounting=true: counters start at 0 and
	// grow; everything after the switch is counted.
	var es []ctEntry
	for i := 0; i < 10; i++ {
		c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: uint16(40000 + i), dport: 29500,
			sent: 5000, reply: 500, sentPkts: 5, replyPkts: 5}
		es = append(es, c.entries("n1", conntrack.LayoutCombined)...)
	}
	src.Set(conntrack.MapTCP4, table(es...))
	p.Poll(t0.Add(10 * time.Second))
	if !p.Up() {
		t.Fatal("still down with accounting on")
	}
	// This poll decided the layout; the growth it saw was held, not lost,
	// and is counted by the next one.
	p.Poll(t0.Add(20 * time.Second))
	// Entry 40000 was known (0 -> 5500); 40001-40009 are fresh.
	if got := series(t, p)[key("z-a", "z-b", "cross_zone")]; got != 10*5500 {
		t.Fatalf("bytes = %v, want %v", got, 10*5500)
	}
}

func TestImplausibleDeltaSkipped(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg := newPoller(t, src, "n1", conntrack.LayoutCombined)
	c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 1000, sentPkts: 1, replyPkts: 1}
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	p.Poll(t0)
	c.sent = 1 << 63 // a garbage counter (cf. castai/egressd#19)
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	p.Poll(t0.Add(10 * time.Second))
	if got := series(t, p); len(got) != 0 {
		t.Fatalf("implausible delta counted: %v", got)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "implausible"); got != 1 {
		t.Fatalf("implausible errors = %v, want 1", got)
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
	for i = 0; i < 20; i++ {
		c.reply = uint64(1000 * (i + 1))
		src.Set(conntrack.MapTCP4, table(c.entries("n1", conntrack.LayoutSplit)...))
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
	src := srcFor("n1", conntrack.LayoutCombined, twoNodeConns(true))
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
