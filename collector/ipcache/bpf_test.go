package ipcache

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// bpfDir mounts a private bpffs and returns its tc/globals folder, or
// skips (fails when tools are required) saying what is missing.
func bpfDir(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("real BPF maps: skipped in -short")
	}
	testenv.Root(t, "real BPF maps need root (CAP_BPF, CAP_SYS_ADMIN to mount a bpffs)")
	_ = rlimit.RemoveMemlock()
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, ""); err != nil {
		testenv.Unmet(t, "cannot mount a bpffs: "+err.Error())
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	dir := filepath.Join(mnt, "tc", "globals")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// lpm creates and pins an LPM trie the way Cilium's agent does
// (BPF_F_NO_PREALLOC; 1.20 adds BPF_F_RDONLY_PROG).
func lpm(t testing.TB, dir, name string, valueSize uint32, flags uint32) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: KeySize, ValueSize: valueSize,
		MaxEntries: 512000, Flags: unix.BPF_F_NO_PREALLOC | flags})
	if err != nil {
		t.Fatalf("creating %s: %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Pin(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	return m
}

func fill(t testing.TB, m *ebpf.Map, tab *MemTable) {
	t.Helper()
	if err := tab.Each(func(k, v []byte) {
		if err := m.Update(k, v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
}

// TestPinnedMaps: the lab's entries in real pinned LPM tries of both
// layouts, read through the bpffs; more entries than one batch.
func TestPinnedMaps(t *testing.T) {
	dir := bpfDir(t)
	for _, c := range []struct {
		name  string
		l     Layout
		size  uint32
		flags uint32
	}{{MapV2, LayoutV2, ValueSizeV2, unix.BPF_F_RDONLY_PROG}, {MapV1, LayoutV1, ValueSizeV1, 0}} {
		t.Run(c.name, func(t *testing.T) {
			for _, n := range []string{MapV1, MapV2} {
				os.Remove(filepath.Join(dir, n))
			}
			tab := NewMemTable(c.l)
			lab(tab)
			for i := 0; i < 3*batch; i++ {
				tab.Put(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 202, byte(i >> 8), byte(i)}), 32), Value{Identity: 60000, TunnelEndpoint: node1})
			}
			fill(t, lpm(t, dir, c.name, c.size, c.flags), tab)
			r, _ := newReader(t, BPFSource{Dir: dir})
			if err := r.Refresh(); err != nil {
				t.Fatal(err)
			}
			if r.Len() != 7+3*batch {
				t.Errorf("%d entries, want %d", r.Len(), 7+3*batch)
			}
			want := Entry{NodeIP: node2, Identity: 51234, Flags: FlagHasTunnelEndpoint, Bits: 32}
			if e, ok := r.Lookup(netip.MustParseAddr("10.201.2.10")); !ok || e != want {
				t.Errorf("%+v, %v; want %+v", e, ok, want)
			}
			if e, _ := r.Lookup(netip.MustParseAddr("10.202.11.255")); e.NodeIP != node1 || e.Identity != 60000 {
				t.Errorf("the last batch: %+v", e)
			}
			if e, _ := r.Lookup(netip.MustParseAddr("10.201.2.77")); e.Bits != 24 {
				t.Errorf("pod CIDR: %+v", e)
			}
		})
	}
}

func TestPinnedWrongMaps(t *testing.T) {
	dir := bpfDir(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: KeySize, ValueSize: ValueSizeV2, MaxEntries: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(dir, MapV2)); err != nil {
		t.Fatal(err)
	}
	r, _ := newReader(t, BPFSource{Dir: dir})
	if err := r.Refresh(); !errors.Is(err, errLayout) || r.Up() {
		t.Errorf("a hash map under the ipcache's name: %v, up %v; want a layout error", err, r.Up())
	}
	os.Remove(filepath.Join(dir, MapV2))
	if err := r.Refresh(); classify(err) != reasonAbsent {
		t.Errorf("no map: %v (%s), want absent", err, classify(err))
	}
}
