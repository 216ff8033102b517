package conntrack_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"sync"
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

// voters are n idle connections of a non-job pod to the master: entries
// that tell the layout (each once: minVotes of them decide it) and whose
// bytes, not moving, are never counted.
func voters(n int) []conn {
	var cs []conn
	for i := range n {
		cs = append(cs, conn{from: other, to: master, fromNode: "n1", toNode: "n2", sport: uint16(45000 + i), dport: 29500,
			sent: 1074, reply: 574, sentPkts: 2, replyPkts: 1})
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
