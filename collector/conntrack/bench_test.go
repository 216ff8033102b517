package conntrack_test

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

// benchEntries is Cilium's default size of the global TCP CT map
// (bpf-ct-global-tcp-max = 524288): a full map.
const benchEntries = 512 * 1024

// benchWorld is a large cluster's index (64 nodes in 4 zones, 128 jobs of
// 32 pods) and a full CT map of node n0: its job pods talk to pods all over
// the cluster and to unknown peers; a quarter of the entries are ingress.
func benchWorld(tb testing.TB) (*topology.Index, []ctEntry) {
	tb.Helper()
	idx := topology.NewIndex()
	for n := 0; n < 64; n++ {
		idx.UpsertNode(topology.Node{Name: fmt.Sprintf("n%d", n), Zone: fmt.Sprintf("z%d", n%4), Region: "r",
			PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n), 0, 0}), 16)}})
	}
	var local, all []netip.Addr
	for j := 0; j < 128; j++ {
		for k := 0; k < 32; k++ {
			n := (j*32 + k) % 64
			ip := netip.AddrFrom4([4]byte{10, byte(n), byte(j), byte(k + 1)})
			idx.UpsertPod(0, topology.Pod{Namespace: "ns", Name: fmt.Sprintf("job%d-%d", j, k), Node: fmt.Sprintf("n%d", n), IPs: []netip.Addr{ip},
				Identity: topology.Identity{Kind: "PyTorchJob", Name: fmt.Sprintf("job%d", j), Role: topology.RoleWorker}})
			all = append(all, ip)
			if n == 0 {
				local = append(local, ip)
			}
		}
	}
	es := make([]ctEntry, benchEntries)
	for i := range es {
		src := local[i%len(local)]
		dst := all[(i*7919)%len(all)]
		if i%16 == 0 {
			dst = netip.AddrFrom4([4]byte{93, 184, byte(i >> 8), byte(i)}) // outside
		}
		t := conntrack.Tuple{Src: src, Dst: dst, SrcPort: uint16(1024 + i/len(local)), DstPort: 29500, Proto: 6}
		if i%4 == 3 {
			t.Src, t.Dst, t.Flags = dst, src, 1 // accepted here
		}
		// Both entries of a pod's connection carry its identity.
		es[i] = ctEntry{t, conntrack.Value{Packets: 10, Bytes: 10000, TxFlagsSeen: 0x12, RxFlagsSeen: 0x12, SrcSecID: podIdentity}}
	}
	return idx, es
}

// activeEvery: one entry in activeEvery moves bytes between two polls.
const activeEvery = 10

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkPoll512k polls a full in-memory CT map: decoding, deltas,
// deletion sweep and attribution of the 10% active entries; heap-MB is
// what the poller keeps between polls (its baselines).
func BenchmarkPoll512k(b *testing.B) {
	idx, es := benchWorld(b)
	tab := table(es...)
	src := conntrack.NewMemSource()
	src.Set(conntrack.MapTCP4, tab)
	before := heapAlloc()
	p, err := conntrack.New(src, idx, conntrack.Config{Node: "n0", Layout: conntrack.LayoutCombined})
	if err != nil {
		b.Fatal(err)
	}
	now := t0
	bump := func(i int) {
		for j := i % activeEvery; j < benchEntries; j += activeEvery {
			tab.SetBytes(j, uint64(10000+1500*(i+1)))
		}
		now = now.Add(10 * time.Second)
	}
	p.Poll(now) // baselines
	for i := range activeEvery {
		bump(i)
		p.Poll(now) // warm: buffers sized for the active entries, every peer placed once
	}
	state := heapAlloc() - before
	b.ReportAllocs()
	b.ResetTimer()
	for i := activeEvery; i < activeEvery+b.N; i++ {
		b.StopTimer()
		bump(i)
		b.StartTimer()
		p.Poll(now)
	}
	b.StopTimer()
	b.ReportMetric(float64(benchEntries)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
	b.ReportMetric(float64(state)/1e6, "heap-MB")
	if !p.Up() {
		b.Fatal("source down")
	}
}

// BenchmarkPollBPF512k is the same poll against a real kernel LRU hash map
// of 512k entries, read with BPF_MAP_LOOKUP_BATCH.
func BenchmarkPollBPF512k(b *testing.B) {
	env := newBPFEnv(b)
	idx, es := benchWorld(b)
	m := env.create(b, conntrack.MapTCP4, ebpf.LRUHash, conntrack.KeySize4, conntrack.ValueSize, benchEntries+benchEntries/4)
	keys := make([][conntrack.KeySize4]byte, len(es))
	vals := make([][conntrack.ValueSize]byte, len(es))
	for i, e := range es {
		keys[i] = [conntrack.KeySize4]byte(conntrack.AppendKey(nil, e.t))
		vals[i] = [conntrack.ValueSize]byte(conntrack.AppendValue(nil, e.v))
	}
	if n, err := m.BatchUpdate(keys, vals, nil); err != nil || n != len(es) {
		b.Fatalf("filling the map: %d, %v", n, err)
	}
	before := heapAlloc()
	p, err := conntrack.New(env.source(), idx, conntrack.Config{Node: "n0", Layout: conntrack.LayoutCombined})
	if err != nil {
		b.Fatal(err)
	}
	now := t0
	var ak [][conntrack.KeySize4]byte
	var av [][conntrack.ValueSize]byte
	bump := func(i int) {
		ak, av = ak[:0], av[:0]
		for j := i % activeEvery; j < benchEntries; j += activeEvery {
			e := es[j]
			e.v.Bytes = uint64(10000 + 1500*(i+1))
			ak = append(ak, keys[j])
			av = append(av, [conntrack.ValueSize]byte(conntrack.AppendValue(nil, e.v)))
		}
		if _, err := m.BatchUpdate(ak, av, nil); err != nil {
			b.Fatal(err)
		}
		now = now.Add(10 * time.Second)
	}
	p.Poll(now) // baselines
	for i := range activeEvery {
		bump(i)
		p.Poll(now) // warm: buffers sized for the active entries, every peer placed once
	}
	state := heapAlloc() - before
	b.ReportAllocs()
	b.ResetTimer()
	for i := activeEvery; i < activeEvery+b.N; i++ {
		b.StopTimer()
		bump(i)
		b.StartTimer()
		p.Poll(now)
	}
	b.StopTimer()
	b.ReportMetric(float64(benchEntries)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
	b.ReportMetric(float64(state)/1e6, "heap-MB")
	if !p.Up() {
		b.Fatal("source down")
	}
}
