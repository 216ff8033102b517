// Package ctmappeer tests zonewatch's conntrack reader against Cilium's
// own definitions: keys and values built with Cilium's Go types
// (pkg/maps/ctmap, pkg/tuple of github.com/cilium/cilium v1.20.2, the
// version the main module pins), in real kernel maps created from
// Cilium's own map spec (ctmap.NewGlobalMapSpec), printed by Cilium's own
// dump code (the text of `cilium-dbg bpf ct list global`), and read by
// the poller through a BPF filesystem; and a split-layout fixture made
// with the v1.15.19 types (testdata, see gen115/). The ipcache reader
// (collector/ipcache) is checked the same way against pkg/maps/ipcache
// (ipcache_test.go; the v1 layout of 1.14-1.17 with v1.18.11's types,
// gen118/). It is a module of its own so that Cilium's agent packages
// stay out of the main module.
package ctmappeer

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/cilium/pkg/bpf"
	"github.com/cilium/cilium/pkg/identity"
	"github.com/cilium/cilium/pkg/maps/ctmap"
	"github.com/cilium/cilium/pkg/option"
	"github.com/cilium/cilium/pkg/tuple"
	"github.com/cilium/cilium/pkg/u8proto"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

// TestDecoderMatchesCiliumTypes: sizes, offsets, flag values and map
// names of the decoder are Cilium's.
func TestDecoderMatchesCiliumTypes(t *testing.T) {
	var e ctmap.CtEntry
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(CtEntry)", unsafe.Sizeof(e), conntrack.ValueSize},
		{"sizeof(CtKey4Global)", unsafe.Sizeof(ctmap.CtKey4Global{}), conntrack.KeySize4},
		{"sizeof(CtKey6Global)", unsafe.Sizeof(ctmap.CtKey6Global{}), conntrack.KeySize6},
		{"offsetof(Packets)", unsafe.Offsetof(e.Packets), 16},
		{"offsetof(Bytes)", unsafe.Offsetof(e.Bytes), 24},
		{"offsetof(Lifetime)", unsafe.Offsetof(e.Lifetime), 32},
		{"offsetof(TxFlagsSeen)", unsafe.Offsetof(e.TxFlagsSeen), 42},
		{"offsetof(RxFlagsSeen)", unsafe.Offsetof(e.RxFlagsSeen), 43},
		{"offsetof(SourceSecurityID)", unsafe.Offsetof(e.SourceSecurityID), 44},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d in Cilium, %d in the decoder", c.what, c.got, c.want)
		}
	}
	for _, c := range []struct {
		flags                     uint8
		ingress, related, service bool
	}{
		{tuple.TUPLE_F_OUT, false, false, false},
		{tuple.TUPLE_F_IN, true, false, false},
		{tuple.TUPLE_F_OUT | tuple.TUPLE_F_RELATED, false, true, false},
		{tuple.TUPLE_F_IN | tuple.TUPLE_F_RELATED, true, true, false},
		{tuple.TUPLE_F_SERVICE, false, false, true},
	} {
		tu := conntrack.Tuple{Flags: c.flags}
		if tu.Ingress() != c.ingress || tu.Related() != c.related || tu.Service() != c.service {
			t.Errorf("flags %#x: ingress/related/service = %v/%v/%v, want %v/%v/%v",
				c.flags, tu.Ingress(), tu.Related(), tu.Service(), c.ingress, c.related, c.service)
		}
	}
	for got, want := range map[string]string{
		conntrack.MapTCP4: ctmap.MapNameTCP4Global, conntrack.MapAny4: ctmap.MapNameAny4Global,
		conntrack.MapTCP6: ctmap.MapNameTCP6Global, conntrack.MapAny6: ctmap.MapNameAny6Global,
	} {
		if got != want {
			t.Errorf("map name %q, Cilium's is %q", got, want)
		}
	}
	// The per-endpoint maps of ConntrackLocal, named as Cilium names them.
	for _, prefix := range []string{ctmap.MapNameTCP4, ctmap.MapNameAny4, ctmap.MapNameTCP6, ctmap.MapNameAny6} {
		for _, id := range []uint16{1, 42, 4095, 65535} {
			if n := bpf.LocalMapName(prefix, id); !conntrack.LocalMap(n) {
				t.Errorf("LocalMap(%q) = false", n)
			}
		}
	}
	if conntrack.LocalMap(ctmap.MapNameTCP4Global) {
		t.Error("the global map taken for a per-endpoint one")
	}
	spec := ctmap.NewGlobalMapSpec(ctmap.MapConfig{TCP: true})
	if spec.Type != ebpf.LRUHash || spec.KeySize != conntrack.KeySize4 || spec.ValueSize != conntrack.ValueSize || spec.MaxEntries != 524288 {
		t.Errorf("Cilium's TCP4 map spec %+v: not the LRU hash of 14/56 bytes and 512k entries the docs describe", spec)
	}
}

// TestEnableAdviceNamesCiliumSwitches: the advice uses Cilium's own name
// for the agent flag. (The 1.16 runtime option, "ConntrackAccounting" in
// pkg/option/runtime_options.go v1.14.0-v1.18, is gone from v1.20.2.)
func TestEnableAdviceNamesCiliumSwitches(t *testing.T) {
	if a := conntrack.EnableAdvice("1.20.2", conntrack.LayoutCombined); !strings.Contains(a, "--"+option.BPFConntrackAccounting) {
		t.Errorf("1.20 advice %q does not name the flag --%s", a, option.BPFConntrackAccounting)
	}
}

var (
	worker0  = netip.MustParseAddr("10.1.0.10") // job ml/train on n1 (z-a)
	master   = netip.MustParseAddr("10.2.0.10") // job ml/train on n2 (z-b)
	node2    = netip.MustParseAddr("172.16.0.2")
	worker6  = netip.MustParseAddr("fd00:1::10")
	master6  = netip.MustParseAddr("fd00:2::10")
	dnsVIP   = netip.MustParseAddr("10.96.0.10")
	tcpFlags = uint8(0x12) // SYN|ACK seen
)

// key4 is a CT key as Cilium's datapath writes it for a connection opened
// from opener:sport to acceptor:dport. The address fields are named for
// reply traffic (pkg/tuple: "reversed compared to the original direction"),
// the ports for the original direction; ToNetwork puts the ports in
// network byte order as the datapath stores them.
func key4(opener, acceptor netip.Addr, sport, dport uint16, proto u8proto.U8proto, flags uint8) *ctmap.CtKey4Global {
	var k ctmap.CtKey4Global
	k.DestAddr.FromAddr(opener)
	k.SourceAddr.FromAddr(acceptor)
	k.SourcePort, k.DestPort = sport, dport
	k.NextHeader, k.Flags = proto, flags
	return k.ToNetwork().(*ctmap.CtKey4Global)
}

func key6(opener, acceptor netip.Addr, sport, dport uint16, proto u8proto.U8proto, flags uint8) *ctmap.CtKey6Global {
	var k ctmap.CtKey6Global
	k.DestAddr.FromAddr(opener)
	k.SourceAddr.FromAddr(acceptor)
	k.SourcePort, k.DestPort = sport, dport
	k.NextHeader, k.Flags = proto, flags
	return k.ToNetwork().(*ctmap.CtKey6Global)
}

// bpfDir mounts a private bpffs and returns its tc/globals folder, or
// skips saying what is missing.
func bpfDir(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("real BPF maps: skipped in -short")
	}
	_ = rlimit.RemoveMemlock()
	probe, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Skipf("SKIP: this machine does not allow creating BPF maps (%v); run as root with CAP_BPF", err)
	}
	probe.Close()
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, ""); err != nil {
		t.Skipf("SKIP: cannot mount a bpffs (%v); run as root with CAP_SYS_ADMIN", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	dir := filepath.Join(mnt, "tc", "globals")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ciliumMap creates a CT map from Cilium's own spec (shrunk from 512k
// entries to keep the test light) and pins it under name.
func ciliumMap(t *testing.T, dir, name string, cfg ctmap.MapConfig) *ebpf.Map {
	t.Helper()
	spec := ctmap.NewGlobalMapSpec(cfg)
	spec.MaxEntries = 4096
	m, err := ebpf.NewMap(spec)
	if err != nil {
		t.Fatalf("creating %s from Cilium's spec: %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Pin(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	return m
}

func update(t *testing.T, m *ebpf.Map, k, v any) {
	t.Helper()
	if err := m.Update(k, v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeLikeCiliumDump: every raw entry of a real map written with
// Cilium's types decodes to what Cilium's own dump code prints for it
// (ctmap.DumpEntriesWithTimeDiff: key.ToHost().Dump(sb, true) and
// CtEntry.String, the lines of `cilium-dbg bpf ct list global`).
func TestDecodeLikeCiliumDump(t *testing.T) {
	dir := bpfDir(t)
	m4 := ciliumMap(t, dir, ctmap.MapNameTCP4Global, ctmap.MapConfig{TCP: true})
	m6 := ciliumMap(t, dir, ctmap.MapNameTCP6Global, ctmap.MapConfig{IPv6: true, TCP: true})
	entry := func(pkts, bytes uint64, secID identity.NumericIdentity) *ctmap.CtEntry {
		return &ctmap.CtEntry{Packets: pkts, Bytes: bytes, Lifetime: 21600, TxFlagsSeen: tcpFlags, RxFlagsSeen: tcpFlags, SourceSecurityID: uint32(secID)}
	}
	update(t, m4, key4(worker0, master, 40000, 29500, u8proto.TCP, tuple.TUPLE_F_OUT), entry(12, 9000, 0))
	update(t, m4, key4(node2, worker0, 50000, 29500, u8proto.TCP, tuple.TUPLE_F_IN), entry(3, 400, identity.ReservedIdentityRemoteNode))
	update(t, m4, key4(worker0, master, 0, 0, u8proto.ICMP, tuple.TUPLE_F_OUT|tuple.TUPLE_F_RELATED), entry(0, 0, 0))
	update(t, m4, key4(worker0, dnsVIP, 53000, 53, u8proto.UDP, tuple.TUPLE_F_SERVICE), &ctmap.CtEntry{Union0: [2]uint64{0, 7}})
	update(t, m6, key6(worker6, master6, 41000, 29500, u8proto.TCP, tuple.TUPLE_F_OUT), entry(1<<33, 1<<45, 0))

	for _, m := range []*ebpf.Map{m4, m6} {
		n := 0
		it := m.Iterate()
		rawKey, rawVal := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		for it.Next(&rawKey, &rawVal) {
			n++
			// Cilium's view of the same bytes.
			var sb strings.Builder
			var ck ctmap.CtKey
			if m.KeySize() == conntrack.KeySize4 {
				ck = (*ctmap.CtKey4Global)(unsafe.Pointer(&rawKey[0]))
			} else {
				ck = (*ctmap.CtKey6Global)(unsafe.Pointer(&rawKey[0]))
			}
			ck.ToHost().Dump(&sb, true)
			ce := (*ctmap.CtEntry)(unsafe.Pointer(&rawVal[0]))
			cilium := sb.String() + ce.String()

			tu, err := conntrack.DecodeKey(rawKey)
			if err != nil {
				t.Fatal(err)
			}
			v, err := conntrack.DecodeValue(rawVal)
			if err != nil {
				t.Fatal(err)
			}
			dir := "OUT"
			if tu.Ingress() {
				dir = "IN"
			}
			ours := fmt.Sprintf("%s %s %s -> %s ", u8proto.U8proto(tu.Proto), dir,
				netip.AddrPortFrom(tu.Src, tu.SrcPort), netip.AddrPortFrom(tu.Dst, tu.DstPort))
			if tu.Related() {
				ours += "related "
			}
			if tu.Service() {
				// Cilium prints service keys unswapped (no connection).
				ours = fmt.Sprintf("%s SVC %s:%d -> %s:%d ", u8proto.U8proto(tu.Proto), tu.Dst, tu.DstPort, tu.Src, tu.SrcPort)
			}
			ours += fmt.Sprintf("expires=%d Packets=%d Bytes=%d RxFlagsSeen=%#02x", v.Lifetime, v.Packets, v.Bytes, v.RxFlagsSeen)
			ours6 := strings.NewReplacer("[", "", "]", "").Replace(ours) // Cilium prints v6 addr:port without brackets
			if !strings.HasPrefix(cilium, ours) && !strings.HasPrefix(cilium, ours6) {
				t.Errorf("decoded\n  %s\nCilium dumps\n  %s", ours, cilium)
			}
			if want := fmt.Sprintf("SourceSecurityID=%d ", v.SrcSecID); !strings.Contains(cilium, want) {
				t.Errorf("SrcSecID %d, Cilium dumps %s", v.SrcSecID, cilium)
			}
		}
		if err := it.Err(); err != nil || n == 0 {
			t.Fatalf("iterating: %v, %d entries", err, n)
		}
	}
}

func index() *topology.Index {
	idx := topology.NewIndex()
	idx.UpsertNode(topology.Node{Name: "n1", Zone: "z-a", Region: "r1",
		Addresses: []netip.Addr{netip.MustParseAddr("172.16.0.1")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("fd00:1::/64")}})
	idx.UpsertNode(topology.Node{Name: "n2", Zone: "z-b", Region: "r1",
		Addresses: []netip.Addr{node2}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/24"), netip.MustParsePrefix("fd00:2::/64")}})
	for _, p := range []struct {
		name, node string
		ips        []netip.Addr
	}{{"train-worker-0", "n1", []netip.Addr{worker0, worker6}}, {"train-master-0", "n2", []netip.Addr{master, master6}}} {
		idx.UpsertPod(0, topology.Pod{Namespace: "ml", Name: p.name, Node: p.node, IPs: p.ips,
			Identity: topology.Identity{Kind: "PyTorchJob", Name: "train"}})
	}
	return idx
}

// TestPollerOnCiliumEntries: node n1's maps, written with Cilium's types
// as the v1.20 datapath fills them (combined counters; an ICMP related
// entry with zero counters next to each new connection, as ct_create4
// writes it before setting the counters; a socket-LB service entry; an
// ingress entry opened by a remote node's host network; a per-endpoint
// map of ConntrackLocal), read by the poller through the bpffs.
func TestPollerOnCiliumEntries(t *testing.T) {
	dir := bpfDir(t)
	tcp4 := ciliumMap(t, dir, ctmap.MapNameTCP4Global, ctmap.MapConfig{TCP: true})
	any4 := ciliumMap(t, dir, ctmap.MapNameAny4Global, ctmap.MapConfig{})
	tcp6 := ciliumMap(t, dir, ctmap.MapNameTCP6Global, ctmap.MapConfig{IPv6: true, TCP: true})
	local := ciliumMap(t, dir, bpf.LocalMapName(ctmap.MapNameTCP4, 1234), ctmap.MapConfig{TCP: true})

	reg := prometheus.NewRegistry()
	p, err := conntrack.New(conntrack.BPFSource{Dir: dir}, index(), conntrack.Config{Node: "n1", Self: reg})
	if err != nil {
		t.Fatal(err)
	}
	write := func(scale uint64) {
		for i := uint16(0); i < 10; i++ {
			update(t, tcp4, key4(worker0, master, 40000+i, 29500, u8proto.TCP, tuple.TUPLE_F_OUT),
				&ctmap.CtEntry{Packets: 2 * scale, Bytes: 1000 * scale, TxFlagsSeen: tcpFlags, RxFlagsSeen: tcpFlags})
		}
		update(t, any4, key4(worker0, master, 0, 0, u8proto.ICMP, tuple.TUPLE_F_OUT|tuple.TUPLE_F_RELATED), &ctmap.CtEntry{})
		update(t, any4, key4(worker0, dnsVIP, 53000, 53, u8proto.UDP, tuple.TUPLE_F_SERVICE),
			&ctmap.CtEntry{Union0: [2]uint64{0, 7}, Packets: scale, Bytes: 60 * scale})
		update(t, tcp4, key4(node2, worker0, 50000, 29500, u8proto.TCP, tuple.TUPLE_F_IN),
			&ctmap.CtEntry{Packets: scale, Bytes: 300 * scale, TxFlagsSeen: tcpFlags, RxFlagsSeen: tcpFlags,
				SourceSecurityID: uint32(identity.ReservedIdentityRemoteNode)})
		update(t, tcp6, key6(worker6, master6, 41000, 29500, u8proto.TCP, tuple.TUPLE_F_OUT),
			&ctmap.CtEntry{Packets: scale, Bytes: 500 * scale, TxFlagsSeen: tcpFlags, RxFlagsSeen: tcpFlags})
		update(t, local, key4(worker0, master, 42000, 29500, u8proto.TCP, tuple.TUPLE_F_OUT),
			&ctmap.CtEntry{Packets: scale, Bytes: 700 * scale, TxFlagsSeen: tcpFlags, RxFlagsSeen: tcpFlags})
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	write(1)
	p.Poll(t0)
	write(3)
	p.Poll(t0.Add(10 * time.Second))
	p.Poll(t0.Add(20 * time.Second)) // the growth held while deciding the layout is counted
	if !p.Up() {
		t.Fatal("source down on Cilium's entries")
	}
	got := map[string]float64{
		"z-a->z-b": p.Bytes("ml", "train", "z-a", "z-b", topology.LocalityCrossZone),
		"z-b->z-a": p.Bytes("ml", "train", "z-b", "z-a", topology.LocalityCrossZone),
	}
	want := map[string]float64{
		"z-a->z-b": 10*2000 + 1000 + 1400, // v4 global, v6, per-endpoint map
		"z-b->z-a": 600,                   // opened by n2's host network, seen only here
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %v bytes, want %v", k, got[k], w)
		}
	}
	var layouts []string
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "zonewatch_conntrack_layout_info" {
			for _, m := range mf.GetMetric() {
				layouts = append(layouts, m.GetLabel()[0].GetValue())
			}
		}
	}
	if len(layouts) != 1 || layouts[0] != "combined" {
		t.Errorf("layout %v, want combined (Cilium v1.20)", layouts)
	}
}

// TestAccountingOffOnCiliumEntries: a v1.20 node where accounting was
// turned off. The old entries keep their counters (frozen) while their
// lifetime moves (__ct_lookup refreshes it on every packet); a connection
// opened since has packets=0 (ct_create4 sets the counters only with
// enable_conntrack_accounting), next to its related ICMP entry.
func TestAccountingOffOnCiliumEntries(t *testing.T) {
	dir := bpfDir(t)
	tcp4 := ciliumMap(t, dir, ctmap.MapNameTCP4Global, ctmap.MapConfig{TCP: true})
	any4 := ciliumMap(t, dir, ctmap.MapNameAny4Global, ctmap.MapConfig{})
	p, err := conntrack.New(conntrack.BPFSource{Dir: dir}, index(), conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined})
	if err != nil {
		t.Fatal(err)
	}
	old := func(life uint32) {
		for i := uint16(0); i < 3; i++ {
			update(t, tcp4, key4(worker0, master, 40000+i, 29500, u8proto.TCP, tuple.TUPLE_F_OUT),
				&ctmap.CtEntry{Packets: 900, Bytes: 1 << 20, Lifetime: life, TxFlagsSeen: tcpFlags, RxFlagsSeen: tcpFlags})
		}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	old(1000)
	p.Poll(t0)
	if !p.Up() {
		t.Fatal("down on the first read of counting entries")
	}
	old(1010)
	p.Poll(t0.Add(10 * time.Second))
	update(t, tcp4, key4(worker0, master, 41000, 29500, u8proto.TCP, tuple.TUPLE_F_OUT),
		&ctmap.CtEntry{Lifetime: 1020, TxFlagsSeen: tcpFlags, RxFlagsSeen: tcpFlags})
	update(t, any4, key4(worker0, master, 0, 0, u8proto.ICMP, tuple.TUPLE_F_OUT|tuple.TUPLE_F_RELATED), &ctmap.CtEntry{Lifetime: 1020})
	old(1020)
	p.Poll(t0.Add(20 * time.Second))
	if p.Up() {
		t.Fatal("up although accounting is off (frozen counters, a new connection counting nothing)")
	}
}
