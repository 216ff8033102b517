package ipcache

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
)

// Table is one ipcache map, opened for one read.
type Table interface {
	KeySize() int
	ValueSize() int
	// Each calls fn for every entry; key and value are valid only during
	// the call.
	Each(fn func(key, value []byte)) error
	Close() error
}

// Source opens ipcache maps by name: pinned BPF maps live, MemTables in
// tests and simulation. A map that does not exist is reported with an
// error wrapping fs.ErrNotExist.
type Source interface {
	Open(name string) (Table, error)
}

// BPFSource opens Cilium's maps pinned in a BPF filesystem folder (the
// conntrack maps' folder: <bpffs>/tc/globals).
type BPFSource struct {
	Dir string
	// Load opens a pin read-only: a confined exporter's opener
	// (internal/confine); nil opens it here with cilium/ebpf's
	// LoadPinnedMap and ReadOnly.
	Load func(path string) (*ebpf.Map, error)
}

// Open loads the pinned map read-only and checks its type and sizes.
func (s BPFSource) Open(name string) (Table, error) {
	path := filepath.Join(s.Dir, name)
	m, err := loadPin(s.Load, path)
	if err != nil {
		return nil, fmt.Errorf("opening pinned map %s: %w", path, err)
	}
	if m.Type() != ebpf.LPMTrie {
		m.Close()
		return nil, fmt.Errorf("ipcache map %s is a %s, not an LPM trie: %w", name, m.Type(), errLayout)
	}
	if _, err := LayoutOf(int(m.KeySize()), int(m.ValueSize())); err != nil {
		m.Close()
		return nil, fmt.Errorf("ipcache map %s: %w", name, err)
	}
	if m.ValueSize() == ValueSizeV1 {
		return &mapTable[[ValueSizeV1]byte]{name: name, m: m}, nil
	}
	return &mapTable[[ValueSizeV2]byte]{name: name, m: m}, nil
}

var errLayout = errors.New("unknown layout")

type mapTable[V [ValueSizeV1]byte | [ValueSizeV2]byte] struct {
	name string
	m    *ebpf.Map
}

func (t *mapTable[V]) KeySize() int   { return int(t.m.KeySize()) }
func (t *mapTable[V]) ValueSize() int { return int(t.m.ValueSize()) }
func (t *mapTable[V]) Close() error   { return t.m.Close() }

// batch entries per BPF_MAP_LOOKUP_BATCH call.
const batch = 1024

type batchBufs[V any] struct {
	keys [][KeySize]byte
	vals []V
}

// Buffers are pooled per layout: a warm read allocates nothing.
var (
	bufsV1 sync.Pool
	bufsV2 sync.Pool
)

// Each reads the map in batches where the kernel supports it for LPM
// tries, else one entry at a time (get-next-key and lookup: two syscalls
// an entry).
func (t *mapTable[V]) Each(fn func(key, value []byte)) error {
	pool := &bufsV2
	if t.ValueSize() == ValueSizeV1 {
		pool = &bufsV1
	}
	b, _ := pool.Get().(*batchBufs[V])
	if b == nil {
		b = &batchBufs[V]{keys: make([][KeySize]byte, batch), vals: make([]V, batch)}
	}
	defer pool.Put(b)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := t.m.BatchLookup(&cursor, b.keys, b.vals, nil)
		for i := 0; i < n; i++ {
			fn(b.keys[i][:], valueBytes(&b.vals[i]))
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) && n == 0 {
			return t.iterate(fn)
		}
		if err != nil {
			return fmt.Errorf("reading ipcache map %s: %w", t.name, err)
		}
	}
}

func (t *mapTable[V]) iterate(fn func(key, value []byte)) error {
	var k [KeySize]byte
	var v V
	it := t.m.Iterate()
	for it.Next(&k, &v) {
		fn(k[:], valueBytes(&v))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterating ipcache map %s: %w", t.name, err)
	}
	return nil
}

// valueBytes views a fixed-size value as a slice without copying.
func valueBytes[V [ValueSizeV1]byte | [ValueSizeV2]byte](v *V) []byte {
	switch p := any(v).(type) {
	case *[ValueSizeV1]byte:
		return p[:]
	case *[ValueSizeV2]byte:
		return p[:]
	}
	return nil
}

// MemTable is an ipcache map held in memory, for tests and simulation.
type MemTable struct {
	layout     Layout
	keys, vals []byte
	// Err, when set, is returned by Each after half the entries.
	Err error
}

// NewMemTable returns an empty table of layout l.
func NewMemTable(l Layout) *MemTable { return &MemTable{layout: l} }

func (t *MemTable) valueSize() int {
	if t.layout == LayoutV1 {
		return ValueSizeV1
	}
	return ValueSizeV2
}

// Put appends an entry for prefix p of cluster 0.
func (t *MemTable) Put(p netip.Prefix, v Value) {
	t.PutRaw(AppendKey(nil, p, 0), AppendValue(nil, v, t.layout))
}

// PutRaw appends an encoded entry.
func (t *MemTable) PutRaw(key, value []byte) {
	t.keys = append(t.keys, key...)
	t.vals = append(t.vals, value...)
}

// Reset empties the table, keeping its memory.
func (t *MemTable) Reset() { t.keys, t.vals = t.keys[:0], t.vals[:0] }

func (t *MemTable) KeySize() int   { return KeySize }
func (t *MemTable) ValueSize() int { return t.valueSize() }
func (t *MemTable) Close() error   { return nil }

func (t *MemTable) Each(fn func(key, value []byte)) error {
	vs := t.valueSize()
	n := len(t.vals) / vs
	for i := 0; i < n; i++ {
		if t.Err != nil && i == n/2 {
			return t.Err
		}
		fn(t.keys[i*KeySize:(i+1)*KeySize], t.vals[i*vs:(i+1)*vs])
	}
	return nil
}

// MemSource serves MemTables by map name.
type MemSource struct {
	mu     sync.Mutex
	tables map[string]*MemTable
}

// NewMemSource returns a source with no maps.
func NewMemSource() *MemSource { return &MemSource{tables: map[string]*MemTable{}} }

// Set makes t the map called name (nil removes it).
func (s *MemSource) Set(name string, t *MemTable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t == nil {
		delete(s.tables, name)
		return
	}
	s.tables[name] = t
}

func (s *MemSource) Open(name string) (Table, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tables[name]; t != nil {
		return t, nil
	}
	return nil, fmt.Errorf("map %s: %w", name, os.ErrNotExist)
}

// loadPin opens the pin at path read-only, through load when set.
func loadPin(load func(string) (*ebpf.Map, error), path string) (*ebpf.Map, error) {
	if load != nil {
		return load(path)
	}
	return ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
}
