package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"github.com/cilium/ebpf"
)

// Table is one conntrack map, opened for one poll.
type Table interface {
	KeySize() int
	ValueSize() int
	// Each calls fn for every entry; key and value are valid only during
	// the call. A map that changes while it is read may yield an entry
	// twice or miss one (BPF hash maps give no snapshot).
	Each(fn func(key, value []byte)) error
	Close() error
}

// Source opens conntrack maps by name: pinned BPF maps live, generated
// entries in simulation and tests. A map that does not exist is reported
// with an error wrapping fs.ErrNotExist.
type Source interface {
	Open(name string) (Table, error)
}

// Lister is a Source that can name the maps it holds, so that the
// per-endpoint maps of ConntrackLocal (see LocalMap) are found.
type Lister interface {
	List() ([]string, error)
}

// BPFSource opens Cilium's maps pinned in a BPF filesystem folder.
type BPFSource struct {
	Dir string // e.g. /sys/fs/bpf/tc/globals
	// Load opens a pin read-only: a confined exporter's opener
	// (internal/confine); nil opens it here with cilium/ebpf's
	// LoadPinnedMap and ReadOnly.
	Load func(path string) (*ebpf.Map, error)
}

// List names the files in Dir.
func (s BPFSource) List() ([]string, error) {
	es, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out, nil
}

// Open loads the pinned map read-only and checks its type and sizes.
func (s BPFSource) Open(name string) (Table, error) {
	path := filepath.Join(s.Dir, name)
	m, err := loadPin(s.Load, path)
	if err != nil {
		return nil, fmt.Errorf("opening pinned map %s: %w", path, err)
	}
	t, err := NewMapTable(name, m)
	if err != nil {
		m.Close()
		return nil, err
	}
	return t, nil
}

// NewMapTable reads an open BPF hash map with a Cilium CT layout; closing
// the table closes m.
func NewMapTable(name string, m *ebpf.Map) (Table, error) {
	if typ := m.Type(); typ != ebpf.Hash && typ != ebpf.LRUHash {
		return nil, fmt.Errorf("conntrack map %s is a %s, not a hash map", name, typ)
	}
	if err := CheckSizes(name, int(m.KeySize()), int(m.ValueSize())); err != nil {
		return nil, err
	}
	if m.KeySize() == KeySize4 {
		return &mapTable[[KeySize4]byte]{name: name, m: m}, nil
	}
	return &mapTable[[KeySize6]byte]{name: name, m: m}, nil
}

// batchSize entries per BPF_MAP_LOOKUP_BATCH call: large enough that the
// syscall cost vanishes, small enough to stay in cache (4096 * 94 bytes).
const batchSize = 4096

type mapTable[K [KeySize4]byte | [KeySize6]byte] struct {
	name string
	m    *ebpf.Map
}

// Buffers are pooled per key type so that a poll allocates nothing once warm.
var (
	bufs4 sync.Pool
	bufs6 sync.Pool
)

type batchBufs[K any] struct {
	keys []K
	vals [][ValueSize]byte
}

func (t *mapTable[K]) KeySize() int       { return int(t.m.KeySize()) }
func (t *mapTable[K]) ValueSize() int     { return int(t.m.ValueSize()) }
func (t *mapTable[K]) MaxEntries() uint32 { return t.m.MaxEntries() }
func (t *mapTable[K]) Close() error       { return t.m.Close() }

// MapID is the kernel's ID of the map: Cilium recreating a map (a new
// size, a new layout) gives it a new ID under the same pin.
func (t *mapTable[K]) MapID() uint64 {
	info, err := t.m.Info()
	if err != nil {
		return 0
	}
	id, _ := info.ID()
	return uint64(id)
}

func (t *mapTable[K]) pool() *sync.Pool {
	if t.KeySize() == KeySize4 {
		return &bufs4
	}
	return &bufs6
}

func (t *mapTable[K]) Each(fn func(key, value []byte)) error {
	pool := t.pool()
	b, _ := pool.Get().(*batchBufs[K])
	if b == nil {
		b = &batchBufs[K]{keys: make([]K, batchSize), vals: make([][ValueSize]byte, batchSize)}
	}
	defer pool.Put(b)

	var cursor ebpf.MapBatchCursor
	for {
		n, err := t.m.BatchLookup(&cursor, b.keys, b.vals, nil)
		for i := 0; i < n; i++ {
			fn(keyBytes(&b.keys[i]), b.vals[i][:])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) && n == 0 {
			return t.iterate(fn) // kernels before 5.6
		}
		if err != nil {
			return fmt.Errorf("reading conntrack map %s: %w", t.name, err)
		}
	}
}

func (t *mapTable[K]) iterate(fn func(key, value []byte)) error {
	var k K
	var v [ValueSize]byte
	it := t.m.Iterate()
	for it.Next(&k, &v) {
		fn(keyBytes(&k), v[:])
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterating conntrack map %s: %w", t.name, err)
	}
	return nil
}

// keyBytes views a fixed-size key as a slice without copying.
func keyBytes[K [KeySize4]byte | [KeySize6]byte](k *K) []byte {
	switch p := any(k).(type) {
	case *[KeySize4]byte:
		return p[:]
	case *[KeySize6]byte:
		return p[:]
	}
	return nil
}

// MemTable is a conntrack map held in memory, for simulation and tests.
type MemTable struct {
	keySize int
	keys    []byte
	vals    []byte
	// Err, when set, is returned by Each after half the entries, as a
	// map read that fails midway would.
	Err error
	// ID, when set, is the map's identity (MapID): another ID under the
	// same name is a recreated map.
	ID uint64
	// Max, when set, is the map's size (MaxEntries).
	Max uint32
}

// NewMemTable returns an empty table for v4 (keySize 14) or v6 (38) keys.
func NewMemTable(keySize int) *MemTable { return &MemTable{keySize: keySize} }

// Put appends an entry; keys are not checked for uniqueness.
func (t *MemTable) Put(tu Tuple, v Value) {
	t.keys = AppendKey(t.keys, tu)
	t.vals = AppendValue(t.vals, v)
}

// PutRaw appends an encoded entry.
func (t *MemTable) PutRaw(key, value []byte) {
	t.keys = append(t.keys, key...)
	t.vals = append(t.vals, value...)
}

// Len returns the number of entries.
func (t *MemTable) Len() int { return len(t.vals) / ValueSize }

// Reset empties the table, keeping its memory.
func (t *MemTable) Reset() { t.keys, t.vals = t.keys[:0], t.vals[:0] }

// SetBytes overwrites the Bytes (offset 24) of entry i.
func (t *MemTable) SetBytes(i int, bytes uint64) {
	b := t.vals[i*ValueSize+24 : i*ValueSize+32]
	binary.NativeEndian.PutUint64(b, bytes)
}

func (t *MemTable) MapID() uint64      { return t.ID }
func (t *MemTable) MaxEntries() uint32 { return t.Max }
func (t *MemTable) KeySize() int       { return t.keySize }
func (t *MemTable) ValueSize() int     { return ValueSize }
func (t *MemTable) Close() error       { return nil }

func (t *MemTable) Each(fn func(key, value []byte)) error {
	n := t.Len()
	for i := 0; i < n; i++ {
		if t.Err != nil && i == n/2 {
			return t.Err
		}
		fn(t.keys[i*t.keySize:(i+1)*t.keySize], t.vals[i*ValueSize:(i+1)*ValueSize])
	}
	return nil
}

// MemSource serves MemTables by map name; a missing name does not exist.
type MemSource struct {
	mu     sync.Mutex
	tables map[string]*MemTable
}

// NewMemSource returns a source with no maps.
func NewMemSource() *MemSource {
	return &MemSource{tables: map[string]*MemTable{}}
}

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

// Names returns the maps held, sorted.
func (s *MemSource) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.tables {
		out = append(out, n)
	}
	sort.Strings(out)
	return slices.Clip(out)
}

// List is Names.
func (s *MemSource) List() ([]string, error) { return s.Names(), nil }

func (s *MemSource) Open(name string) (Table, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[name]
	if t == nil {
		return nil, fmt.Errorf("map %s: %w", name, os.ErrNotExist)
	}
	return t, nil
}

// loadPin opens the pin at path read-only, through load when set.
func loadPin(load func(string) (*ebpf.Map, error), path string) (*ebpf.Map, error) {
	if load != nil {
		return load(path)
	}
	return ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
}
