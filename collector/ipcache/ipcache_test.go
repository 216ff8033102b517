package ipcache

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var (
	node1 = netip.MustParseAddr("10.200.0.11")
	node2 = netip.MustParseAddr("10.200.0.12")
	node6 = netip.MustParseAddr("fd00:200::13")
)

// lab fills t as the lab's node 1 saw it (CILIUM-LAB-NOTES, native
// routing), plus what tunnel mode and IPv6 add.
func lab(t *MemTable) {
	t.Put(netip.MustParsePrefix("10.201.1.10/32"), Value{Identity: 51234})                               // a pod here
	t.Put(netip.MustParsePrefix("10.201.2.10/32"), Value{Identity: 51234, TunnelEndpoint: node2})        // a pod on node 2
	t.Put(netip.MustParsePrefix("10.201.2.11/32"), Value{Identity: 40001, TunnelEndpoint: node2})        // another
	t.Put(netip.MustParsePrefix("10.200.0.12/32"), Value{Identity: IdentityRemoteNode})                  // node 2 itself
	t.Put(netip.MustParsePrefix("10.200.0.11/32"), Value{Identity: IdentityHost})                        // this node
	t.Put(netip.MustParsePrefix("10.201.2.0/24"), Value{Identity: IdentityWorld, TunnelEndpoint: node2}) // node 2's pod CIDR (tunnel)
	t.Put(netip.MustParsePrefix("0.0.0.0/0"), Value{Identity: IdentityWorldIPv4})
}

func newReader(t testing.TB, src Source) (*Reader, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := New(src, Config{Self: reg})
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

func TestLookupLongestPrefix(t *testing.T) {
	for _, l := range []Layout{LayoutV2, LayoutV1} {
		t.Run(fmt.Sprint("v", int(l)), func(t *testing.T) {
			tab := NewMemTable(l)
			lab(tab)
			src := NewMemSource()
			name := MapV2
			if l == LayoutV1 {
				name = MapV1
			}
			src.Set(name, tab)
			r, reg := newReader(t, src)
			if _, ok := r.Lookup(netip.MustParseAddr("10.201.2.10")); ok {
				t.Fatal("an entry before the first read")
			}
			if err := r.Refresh(); err != nil {
				t.Fatal(err)
			}
			if !r.Up() || r.Len() != 7 {
				t.Fatalf("up %v, %d entries; want up, 7", r.Up(), r.Len())
			}
			for _, c := range []struct {
				addr string
				want Entry
				ok   bool
			}{
				{"10.201.2.10", Entry{NodeIP: node2, Identity: 51234, Flags: FlagHasTunnelEndpoint, Bits: 32}, true},
				{"10.201.2.11", Entry{NodeIP: node2, Identity: 40001, Flags: FlagHasTunnelEndpoint, Bits: 32}, true},
				{"::ffff:10.201.2.11", Entry{NodeIP: node2, Identity: 40001, Flags: FlagHasTunnelEndpoint, Bits: 32}, true},
				{"10.201.1.10", Entry{Identity: 51234, Bits: 32}, true},
				{"10.200.0.12", Entry{Identity: IdentityRemoteNode, Bits: 32}, true},
				{"10.200.0.11", Entry{Identity: IdentityHost, Bits: 32}, true},
				{"10.201.2.99", Entry{NodeIP: node2, Identity: IdentityWorld, Flags: FlagHasTunnelEndpoint, Bits: 24}, true},
				{"8.8.8.8", Entry{Identity: IdentityWorldIPv4, Bits: 0}, true},
				{"fd00::1", Entry{}, false},
				{"", Entry{}, false},
			} {
				var a netip.Addr
				if c.addr != "" {
					a = netip.MustParseAddr(c.addr)
				}
				got, ok := r.Lookup(a)
				if got != c.want || ok != c.ok {
					t.Errorf("Lookup(%s) = %+v, %v; want %+v, %v", c.addr, got, ok, c.want, c.ok)
				}
			}
			if got := testutil.ToFloat64(r.m.entries.WithLabelValues(name)); got != 7 {
				t.Errorf("zonewatch_ipcache_entries{map=%q} = %v, want 7", name, got)
			}
			if n, _ := testutil.GatherAndCount(reg, "zonewatch_ipcache_entries"); n != 1 {
				t.Errorf("%d entries series, want 1 (the map read)", n)
			}
		})
	}
}

func TestIPv6TunnelEndpoint(t *testing.T) {
	tab := NewMemTable(LayoutV2)
	tab.Put(netip.MustParsePrefix("fd00:201:3::10/128"), Value{Identity: 51234, TunnelEndpoint: node6})
	tab.Put(netip.MustParsePrefix("fd00:201:3::/64"), Value{Identity: IdentityWorldIPv6, TunnelEndpoint: node6})
	tab.Put(netip.MustParsePrefix("10.201.3.10/32"), Value{Identity: 51234, TunnelEndpoint: node6}) // v4 pod, v6 underlay
	src := NewMemSource()
	src.Set(MapV2, tab)
	r, _ := newReader(t, src)
	if err := r.Refresh(); err != nil {
		t.Fatal(err)
	}
	want := Entry{NodeIP: node6, Identity: 51234, Flags: FlagHasTunnelEndpoint | FlagIPv6TunnelEndpoint, Bits: 128}
	if got, ok := r.Lookup(netip.MustParseAddr("fd00:201:3::10")); !ok || got != want {
		t.Errorf("v6 pod: %+v, %v; want %+v", got, ok, want)
	}
	if got, _ := r.Lookup(netip.MustParseAddr("fd00:201:3::99")); got.Bits != 64 || got.NodeIP != node6 {
		t.Errorf("v6 pod CIDR: %+v", got)
	}
	if got, _ := r.Lookup(netip.MustParseAddr("10.201.3.10")); got.NodeIP != node6 {
		t.Errorf("v4 pod behind a v6 node: %+v", got)
	}
}

// TestV1TunnelEndpointWithoutFlag: a v1 value names its node whether or
// not the agent set FlagHasTunnelEndpoint (the address is what counts).
func TestV1TunnelEndpointWithoutFlag(t *testing.T) {
	v := AppendValue(nil, Value{Identity: 7000, TunnelEndpoint: node1}, LayoutV1)
	v[ValueSizeV1-1] = 0
	got, err := DecodeValue(v, LayoutV1)
	if err != nil || got.TunnelEndpoint != node1 || got.Identity != 7000 {
		t.Errorf("%+v, %v", got, err)
	}
}

func TestPrefersV2(t *testing.T) {
	old, cur := NewMemTable(LayoutV1), NewMemTable(LayoutV2)
	old.Put(netip.MustParsePrefix("10.201.2.10/32"), Value{Identity: 1111, TunnelEndpoint: node1}) // stale, from 1.17
	cur.Put(netip.MustParsePrefix("10.201.2.10/32"), Value{Identity: 2222, TunnelEndpoint: node2})
	src := NewMemSource()
	src.Set(MapV1, old)
	src.Set(MapV2, cur)
	r, reg := newReader(t, src)
	if err := r.Refresh(); err != nil {
		t.Fatal(err)
	}
	if e, _ := r.Lookup(netip.MustParseAddr("10.201.2.10")); e.Identity != 2222 || e.NodeIP != node2 {
		t.Errorf("%+v: not the v2 map's entry", e)
	}
	// The v2 map goes (a downgrade): the v1 map is read.
	src.Set(MapV2, nil)
	if err := r.Refresh(); err != nil {
		t.Fatal(err)
	}
	if e, _ := r.Lookup(netip.MustParseAddr("10.201.2.10")); e.Identity != 1111 {
		t.Errorf("%+v: not the v1 map's entry", e)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP zonewatch_ipcache_entries Entries of the Cilium ipcache map placed in the last read, by the map read (cilium_ipcache_v2 from Cilium 1.18, cilium_ipcache before).
# TYPE zonewatch_ipcache_entries gauge
zonewatch_ipcache_entries{map="cilium_ipcache"} 1
`), "zonewatch_ipcache_entries"); err != nil {
		t.Error(err)
	}
}

func TestBadEntriesCountedAndSkipped(t *testing.T) {
	tab := NewMemTable(LayoutV2)
	lab(tab)
	v := AppendValue(nil, Value{Identity: 9999, TunnelEndpoint: node1}, LayoutV2)
	k := AppendKey(nil, netip.MustParsePrefix("10.201.9.9/32"), 0)
	k[7] = 3 // family
	tab.PutRaw(k, v)
	k = AppendKey(nil, netip.MustParsePrefix("10.201.9.9/32"), 0)
	k[0] = 32 + 33 // prefix longer than an IPv4 address
	tab.PutRaw(k, v)
	k = AppendKey(nil, netip.MustParsePrefix("10.201.9.9/32"), 0)
	k[0] = 5 // shorter than the static part
	tab.PutRaw(k, v)
	tab.PutRaw(AppendKey(nil, netip.MustParsePrefix("10.201.2.10/32"), 7), v) // another cluster's
	src := NewMemSource()
	src.Set(MapV2, tab)
	r, reg := newReader(t, src)
	if err := r.Refresh(); err != nil {
		t.Fatal(err)
	}
	if r.Len() != 7 {
		t.Errorf("%d entries placed, want 7", r.Len())
	}
	// Only 0.0.0.0/0 holds it: the bad entries placed nothing.
	if e, _ := r.Lookup(netip.MustParseAddr("10.201.9.9")); e.Identity != IdentityWorldIPv4 || e.Bits != 0 {
		t.Errorf("a malformed entry was placed: %+v", e)
	}
	if e, _ := r.Lookup(netip.MustParseAddr("10.201.2.10")); e.Identity != 51234 {
		t.Errorf("another cluster's entry replaced ours: %+v", e)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP zonewatch_ipcache_skipped_entries Entries of the last ipcache read that were not placed, by reason: family (neither IPv4 nor IPv6), prefix (a prefix length out of range), cluster (another cluster ID: overlapping pod CIDRs in a cluster mesh), nodes (more than 65535 distinct tunnel endpoints).
# TYPE zonewatch_ipcache_skipped_entries gauge
zonewatch_ipcache_skipped_entries{reason="cluster"} 1
zonewatch_ipcache_skipped_entries{reason="family"} 1
zonewatch_ipcache_skipped_entries{reason="nodes"} 0
zonewatch_ipcache_skipped_entries{reason="prefix"} 2
`), "zonewatch_ipcache_skipped_entries"); err != nil {
		t.Error(err)
	}
}

// TestFailuresKeepOrEmpty: a read failing midway keeps the last snapshot
// (and leaves no half-read entries behind for later); no map empties it.
func TestFailuresKeepOrEmpty(t *testing.T) {
	tab := NewMemTable(LayoutV2)
	lab(tab)
	src := NewMemSource()
	src.Set(MapV2, tab)
	r, reg := newReader(t, src)
	if r.Tried() {
		t.Fatal("tried before the first read")
	}
	if err := r.Refresh(); err != nil {
		t.Fatal(err)
	}
	if !r.Tried() {
		t.Fatal("not tried after the first read")
	}
	pod := netip.MustParseAddr("10.201.2.10")

	tab.Reset()
	for i := 0; i < 10; i++ {
		tab.Put(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 201, 5, byte(i)}), 32), Value{Identity: 5000, TunnelEndpoint: node1})
	}
	tab.Err = errors.New("EIO")
	if err := r.Refresh(); err == nil || r.Up() {
		t.Fatalf("err %v, up %v: want a failed read, down", err, r.Up())
	}
	if e, ok := r.Lookup(pod); !ok || e.NodeIP != node2 {
		t.Errorf("last snapshot not kept: %+v, %v", e, ok)
	}
	// The next good read holds exactly the map: nothing of the half read.
	tab.Err = nil
	tab.Reset()
	tab.Put(netip.MustParsePrefix("10.201.5.9/32"), Value{Identity: 5001, TunnelEndpoint: node1})
	if err := r.Refresh(); err != nil || r.Len() != 1 {
		t.Fatalf("err %v, %d entries; want 1", err, r.Len())
	}
	if _, ok := r.Lookup(netip.MustParseAddr("10.201.5.0")); ok {
		t.Error("an entry of the failed read survived")
	}
	if _, ok := r.Lookup(pod); ok {
		t.Error("an entry gone from the map survived")
	}
	r.Refresh() // the spare, refilled: the same answers
	if e, _ := r.Lookup(netip.MustParseAddr("10.201.5.9")); e.Identity != 5001 || r.Len() != 1 {
		t.Errorf("second snapshot: %+v, %d", e, r.Len())
	}

	src.Set(MapV2, nil)
	if err := r.Refresh(); err == nil || r.Up() || r.Len() != 0 {
		t.Errorf("no map: err %v, up %v, %d entries; want an error, down, empty", err, r.Up(), r.Len())
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP zonewatch_ipcache_errors_total Cilium ipcache reads that failed, by reason: absent (no map), permission, open, layout (unknown key or value size), read.
# TYPE zonewatch_ipcache_errors_total counter
zonewatch_ipcache_errors_total{reason="absent"} 1
zonewatch_ipcache_errors_total{reason="layout"} 0
zonewatch_ipcache_errors_total{reason="open"} 0
zonewatch_ipcache_errors_total{reason="permission"} 0
zonewatch_ipcache_errors_total{reason="read"} 1
`), "zonewatch_ipcache_errors_total"); err != nil {
		t.Error(err)
	}
}

type oddTable struct{ MemTable }

func (oddTable) ValueSize() int { return 16 }

type oddSource struct{}

func (oddSource) Open(string) (Table, error) { return &oddTable{}, nil }

// TestTriedAfterAFailedFirstRead: readiness waits for the first read,
// not for a good one (a node whose map cannot be read still serves, its
// source down).
func TestTriedAfterAFailedFirstRead(t *testing.T) {
	r, _ := newReader(t, NewMemSource())
	if err := r.Refresh(); err == nil || r.Up() || !r.Tried() {
		t.Fatalf("no map: err %v, up %v, tried %v; want an error, down, tried", err, r.Up(), r.Tried())
	}
}

func TestUnknownLayout(t *testing.T) {
	r, _ := newReader(t, oddSource{})
	err := r.Refresh()
	if err == nil || r.Up() || classify(err) != reasonLayout {
		t.Errorf("err %v (%s), up %v: want a layout error", err, classify(err), r.Up())
	}
}

func TestKeyRoundTrip(t *testing.T) {
	for _, p := range []string{"10.201.2.10/32", "10.201.2.0/24", "0.0.0.0/0", "fd00::1/128", "fd00:201::/48", "::/0"} {
		want := netip.MustParsePrefix(p)
		k, err := DecodeKey(AppendKey(nil, want, 3))
		if err != nil || k.Prefix != want || k.ClusterID != 3 {
			t.Errorf("%s: %+v, %v", p, k, err)
		}
	}
}

// bigTable is a cluster of nodes x pods remote pods (each node's pods
// behind its tunnel endpoint), the nodes and their pod CIDRs.
func bigTable(nodes, pods int) *MemTable {
	tab := NewMemTable(LayoutV2)
	for n := 0; n < nodes; n++ {
		ip := netip.AddrFrom4([4]byte{10, 200, byte(n >> 8), byte(n)})
		tab.Put(netip.PrefixFrom(ip, 32), Value{Identity: IdentityRemoteNode})
		tab.Put(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), 0}), 24), Value{Identity: IdentityWorld, TunnelEndpoint: ip})
		for p := 0; p < pods; p++ {
			tab.Put(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), byte(p + 1)}), 32), Value{Identity: 256 + uint32(p), TunnelEndpoint: ip})
		}
	}
	tab.Put(netip.MustParsePrefix("0.0.0.0/0"), Value{Identity: IdentityWorldIPv4})
	return tab
}

func TestLookupAllocatesNothing(t *testing.T) {
	src := NewMemSource()
	src.Set(MapV2, bigTable(50, 10))
	r, _ := newReader(t, src)
	if err := r.Refresh(); err != nil {
		t.Fatal(err)
	}
	addrs := []netip.Addr{netip.MustParseAddr("10.0.7.3"), netip.MustParseAddr("10.0.7.200"), netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("fd00::1")}
	if n := testing.AllocsPerRun(100, func() {
		for _, a := range addrs {
			r.Lookup(a)
		}
	}); n != 0 {
		t.Errorf("%v allocations per lookup round, want 0", n)
	}
	// A warm refresh reuses the snapshot before last.
	r.Refresh()
	if n := testing.AllocsPerRun(5, func() { r.Refresh() }); n > 10 {
		t.Errorf("%v allocations per warm refresh of %d entries, want a handful", n, r.Len())
	}
}

// 5,000 nodes x 10 pods: the ipcache of the cluster issue 34 sizes.
func BenchmarkLookup(b *testing.B) {
	src := NewMemSource()
	src.Set(MapV2, bigTable(5000, 10))
	r, _ := newReader(b, src)
	if err := r.Refresh(); err != nil {
		b.Fatal(err)
	}
	addrs := []netip.Addr{netip.MustParseAddr("10.3.7.3"), netip.MustParseAddr("10.19.136.5"), netip.MustParseAddr("10.0.7.200"), netip.MustParseAddr("192.0.2.1")}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.Lookup(addrs[i%len(addrs)])
	}
}

func BenchmarkRefresh(b *testing.B) {
	src := NewMemSource()
	src.Set(MapV2, bigTable(5000, 10))
	r, _ := newReader(b, src)
	r.Refresh()
	r.Refresh()
	b.ReportAllocs()
	for b.Loop() {
		r.Refresh()
	}
	b.ReportMetric(float64(r.Len()), "entries")
}
