package conntrack_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

// bpfEnv is where real BPF maps live for a test: pinned in a bpffs
// mounted in a temp folder when allowed, else unpinned maps handed over
// by file descriptor.
type bpfEnv struct {
	dir  string // tc/globals in a private bpffs; "" when not mounted
	maps map[string]*ebpf.Map
}

// newBPFEnv mounts a bpffs, or skips the test saying what is missing.
func newBPFEnv(tb testing.TB) *bpfEnv {
	tb.Helper()
	if testing.Short() {
		tb.Skip("real BPF maps: skipped in -short (make test-unit)")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		tb.Logf("RemoveMemlock: %v", err)
	}
	probe, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: conntrack.KeySize4, ValueSize: conntrack.ValueSize, MaxEntries: 1})
	if err != nil {
		tb.Skipf("SKIP: this machine does not allow creating BPF maps (BPF_MAP_CREATE: %v); run as root with CAP_BPF to test the reader against real maps", err)
	}
	probe.Close()
	env := &bpfEnv{maps: map[string]*ebpf.Map{}}
	mnt := tb.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, ""); err != nil {
		tb.Logf("cannot mount a bpffs (%v): using unpinned maps", err)
	} else {
		tb.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
		env.dir = filepath.Join(mnt, "tc", "globals")
		if err := os.MkdirAll(env.dir, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() {
		for _, m := range env.maps {
			m.Close()
		}
	})
	return env
}

// create makes a map as Cilium does (LRU hash, no BTF) and pins it.
func (e *bpfEnv) create(tb testing.TB, name string, typ ebpf.MapType, keySize, valueSize, max uint32) *ebpf.Map {
	tb.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: keySize, ValueSize: valueSize, MaxEntries: max})
	if err != nil {
		tb.Fatalf("creating %s: %v", name, err)
	}
	if e.dir != "" {
		if err := m.Pin(filepath.Join(e.dir, name)); err != nil {
			tb.Fatalf("pinning %s: %v", name, err)
		}
	}
	e.maps[name] = m
	return m
}

func (e *bpfEnv) source() conntrack.Source {
	if e.dir != "" {
		return conntrack.BPFSource{Dir: e.dir}
	}
	return funcSource(func(name string) (conntrack.Table, error) {
		m := e.maps[name]
		if m == nil {
			return nil, os.ErrNotExist
		}
		c, err := m.Clone()
		if err != nil {
			return nil, err
		}
		t, err := conntrack.NewMapTable(name, c)
		if err != nil {
			c.Close()
		}
		return t, err
	})
}

func put(tb testing.TB, m *ebpf.Map, e ctEntry) {
	tb.Helper()
	if err := m.Update(conntrack.AppendKey(nil, e.t), conntrack.AppendValue(nil, e.v), ebpf.UpdateAny); err != nil {
		tb.Fatal(err)
	}
}

var (
	worker0v6 = netip.MustParseAddr("fd00:1::10")
	masterV6  = netip.MustParseAddr("fd00:2::10")
)

// dualStackIndex is newIndex with v6 addresses for worker-0 and the master.
func dualStackIndex() *topology.Index {
	idx := newIndex()
	idx.UpsertPod(0, topology.Pod{Namespace: "ml", Name: "train-worker-0", Node: "n1", IPs: []netip.Addr{worker0, worker0v6},
		Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleWorker}})
	idx.UpsertPod(0, topology.Pod{Namespace: "ml", Name: "train-master-0", Node: "n2", IPs: []netip.Addr{master, masterV6},
		Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleCoordinator}})
	return idx
}

// TestRealBPFMaps reads real kernel hash maps with Cilium's key and value
// layouts (v4 and v6, TCP and any) through the BPF reader.
func TestRealBPFMaps(t *testing.T) {
	env := newBPFEnv(t)
	if env.dir != "" {
		t.Logf("real BPF maps pinned in a bpffs mounted at %s", env.dir)
	}
	tcp4 := env.create(t, conntrack.MapTCP4, ebpf.LRUHash, conntrack.KeySize4, conntrack.ValueSize, 1024)
	any4 := env.create(t, conntrack.MapAny4, ebpf.LRUHash, conntrack.KeySize4, conntrack.ValueSize, 1024)
	tcp6 := env.create(t, conntrack.MapTCP6, ebpf.LRUHash, conntrack.KeySize6, conntrack.ValueSize, 1024)
	// cilium_ct_any6_global absent: IPv6 maps exist only in part, which is fine.

	reg := prometheus.NewRegistry()
	p, err := conntrack.New(env.source(), dualStackIndex(), conntrack.Config{Node: "n1", Self: reg})
	if err != nil {
		t.Fatal(err)
	}
	tcp := func(src, dst netip.Addr, sport uint16, bytes uint64) ctEntry {
		return ctEntry{conntrack.Tuple{Src: src, Dst: dst, SrcPort: sport, DstPort: 29500, Proto: 6},
			conntrack.Value{Packets: 1 + bytes/1500, Bytes: bytes, TxFlagsSeen: 0x12, RxFlagsSeen: 0x12}}
	}
	// Enough voting entries for the layout to be decided on the first poll.
	for i := 0; i < 10; i++ {
		put(t, tcp4, tcp(worker0, master, uint16(40000+i), 1000))
	}
	put(t, tcp6, tcp(worker0v6, masterV6, 41000, 1000))
	udp := ctEntry{conntrack.Tuple{Src: worker0, Dst: worker1, SrcPort: 5000, DstPort: 5001, Proto: 17}, conntrack.Value{Packets: 1, Bytes: 100}}
	put(t, any4, udp)
	p.Poll(t0)
	if !p.Up() {
		t.Fatal("source down after the first poll of real maps")
	}
	for i := 0; i < 10; i++ {
		put(t, tcp4, tcp(worker0, master, uint16(40000+i), 3000))
	}
	put(t, tcp6, tcp(worker0v6, masterV6, 41000, 11000))
	udp.v.Packets, udp.v.Bytes = 5, 700
	put(t, any4, udp)
	p.Poll(t0.Add(10 * time.Second))
	got := series(t, p)
	want := map[string]float64{
		key("z-a", "z-b", "cross_zone"): 10*2000 + 10000, // v4 TCP + v6 TCP
		key("z-a", "z-a", "zone"):       600,             // UDP, any4
	}
	if !equal(got, want) {
		t.Fatalf("counted %v, want %v", got, want)
	}
	if n := selfValue(t, reg, "zonewatch_conntrack_entries", "map", conntrack.MapTCP4); n != 10 {
		t.Fatalf("entries gauge %v, want 10", n)
	}

	// Entries Cilium's GC deleted between polls are counted as deleted.
	if err := tcp4.Delete(conntrack.AppendKey(nil, tcp(worker0, master, 40000, 0).t)); err != nil {
		t.Fatal(err)
	}
	p.Poll(t0.Add(20 * time.Second))
	if n := selfValue(t, reg, "zonewatch_conntrack_deleted_entries_total"); n != 1 {
		t.Fatalf("deleted %v, want 1", n)
	}
	// It had grown in the poll before: what it moved since may be lost.
	if n := selfValue(t, reg, "zonewatch_conntrack_deleted_active_entries_total"); n != 1 {
		t.Fatalf("deleted while active %v, want 1", n)
	}
	// One that stopped growing before it went lost nothing.
	if err := tcp4.Delete(conntrack.AppendKey(nil, tcp(worker0, master, 40001, 0).t)); err != nil {
		t.Fatal(err)
	}
	p.Poll(t0.Add(30 * time.Second))
	if n := selfValue(t, reg, "zonewatch_conntrack_deleted_active_entries_total"); n != 1 {
		t.Fatalf("deleted while active %v, want still 1", n)
	}
}

// TestRealBPFMapsBadLayouts: a map with an unknown value size or of the
// wrong type is refused with a clear error; the other maps still count.
func TestRealBPFMapsBadLayouts(t *testing.T) {
	env := newBPFEnv(t)
	tcp4 := env.create(t, conntrack.MapTCP4, ebpf.LRUHash, conntrack.KeySize4, conntrack.ValueSize, 64)
	env.create(t, conntrack.MapAny4, ebpf.LRUHash, conntrack.KeySize4, 72, 64) // a future Cilium?
	env.create(t, conntrack.MapTCP6, ebpf.Array, 4, conntrack.ValueSize, 64)   // not a CT map at all
	for i := 0; i < 10; i++ {
		put(t, tcp4, ctEntry{conntrack.Tuple{Src: worker0, Dst: master, SrcPort: uint16(40000 + i), DstPort: 29500, Proto: 6},
			conntrack.Value{Packets: 1, Bytes: 100, RxFlagsSeen: 0x12}})
	}
	reg := prometheus.NewRegistry()
	p, err := conntrack.New(env.source(), newIndex(), conntrack.Config{Node: "n1", Self: reg})
	if err != nil {
		t.Fatal(err)
	}
	p.Poll(t0)
	if p.Up() {
		t.Fatal("up with a map of unknown layout")
	}
	if n := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "layout"); n != 1 {
		t.Fatalf("layout errors %v, want 1", n)
	}
	if n := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "open"); n != 1 {
		t.Fatalf("open errors %v, want 1 (the array map)", n)
	}
	if n := selfValue(t, reg, "zonewatch_conntrack_entries", "map", conntrack.MapTCP4); n != 10 {
		t.Fatalf("the good map was not read: entries %v", n)
	}

	var le *conntrack.ErrLayout
	if _, err := env.source().Open(conntrack.MapAny4); !errors.As(err, &le) || le.ValueSize != 72 {
		t.Fatalf("Open(value size 72) = %v, want *ErrLayout", err)
	}
}

func TestBPFSourceAbsent(t *testing.T) {
	_, err := conntrack.BPFSource{Dir: t.TempDir()}.Open(conntrack.MapTCP4)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open of a missing pin = %v, want ErrNotExist", err)
	}
}

// TestRealBPFMapManyBatches reads a map larger than one batch.
func TestRealBPFMapManyBatches(t *testing.T) {
	env := newBPFEnv(t)
	const n = 10000
	m := env.create(t, conntrack.MapTCP4, ebpf.LRUHash, conntrack.KeySize4, conntrack.ValueSize, 2*n)
	entry := func(i int, bytes uint64) ctEntry {
		return ctEntry{conntrack.Tuple{Src: worker0, Dst: master, SrcPort: uint16(i), DstPort: uint16(29500 + i%7), Proto: 6},
			conntrack.Value{Packets: 1, Bytes: bytes, RxFlagsSeen: 0x12}}
	}
	for i := 0; i < n; i++ {
		put(t, m, entry(i, 100))
	}
	reg := prometheus.NewRegistry()
	p, err := conntrack.New(env.source(), newIndex(), conntrack.Config{Node: "n1", Self: reg})
	if err != nil {
		t.Fatal(err)
	}
	p.Poll(t0)
	for i := 0; i < n; i++ {
		put(t, m, entry(i, 100+uint64(i%10)))
	}
	p.Poll(t0.Add(10 * time.Second))
	if got := selfValue(t, reg, "zonewatch_conntrack_entries", "map", conntrack.MapTCP4); got != n {
		t.Fatalf("entries %v, want %d", got, n)
	}
	if got, want := series(t, p)[key("z-a", "z-b", "cross_zone")], float64(n/10*45); got != want {
		t.Fatalf("bytes %v, want %v", got, want)
	}
}
