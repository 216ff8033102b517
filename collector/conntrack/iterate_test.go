package conntrack

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
)

// TestIterateFallback reads a real map with the per-key iteration used on
// kernels without BPF_MAP_LOOKUP_BATCH (before 5.6), and checks it sees
// what the batch read sees.
func TestIterateFallback(t *testing.T) {
	if testing.Short() {
		t.Skip("real BPF maps: skipped in -short (make test-unit)")
	}
	_ = rlimit.RemoveMemlock()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: KeySize6, ValueSize: ValueSize, MaxEntries: 64})
	if err != nil {
		t.Skipf("SKIP: this machine does not allow creating BPF maps (%v)", err)
	}
	want := map[Tuple]Value{}
	for i := 0; i < 40; i++ {
		tu := Tuple{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), SrcPort: uint16(1000 + i), DstPort: 80, Proto: 6}
		v := Value{Packets: uint64(i + 1), Bytes: uint64(100 * (i + 1))}
		if err := m.Update(AppendKey(nil, tu), AppendValue(nil, v), ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		want[tu] = v
	}
	tab, err := NewMapTable("test", m)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	mt := tab.(*mapTable[[KeySize6]byte])
	for name, read := range map[string]func(func(key, value []byte)) error{"iterate": mt.iterate, "batch": mt.Each} {
		got := map[Tuple]Value{}
		if err := read(func(key, value []byte) {
			tu, err := DecodeKey(key)
			if err != nil {
				t.Fatal(err)
			}
			v, err := DecodeValue(value)
			if err != nil {
				t.Fatal(err)
			}
			got[tu] = v
		}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d entries, want %d", name, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("%s: %+v = %+v, want %+v", name, k, got[k], v)
			}
		}
	}
}
