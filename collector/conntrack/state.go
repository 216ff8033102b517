package conntrack

import "time"

// obs says what observe found for an entry.
type obs uint8

const (
	obsBaseline obs = iota // first read of the map: counted from here on
	obsGrown               // seen before, counter grew (or stayed)
	obsFresh               // new since the last read: all its bytes are new
	obsReset               // counter went down: entry recreated, all its bytes are new
)

type slot struct {
	bytes uint64
	epoch uint32
}

// baseline is the last counter of every entry of one map, keyed by the
// raw key, to turn counters into deltas. 14-byte keys keep a 512k-entry v4
// map near 20 MB.
type baseline[K comparable] struct {
	m    map[K]slot
	conv func([]byte) K
	// seeded is set by the first complete read; before it, entries are
	// baselines (their bytes may be hours old).
	seeded bool
	last   time.Time // time of the last complete read
}

func newBaseline[K comparable](conv func([]byte) K) *baseline[K] {
	return &baseline[K]{m: map[K]slot{}, conv: conv}
}

// observe records an entry's counter and returns what it grew by. With
// hold (layout not known yet) the growth is kept for later instead: known
// entries keep their baseline (reset to 0 if the counter went down) and new
// ones are not recorded, so they count in full once counting starts.
func (b *baseline[K]) observe(key []byte, bytes uint64, epoch uint32, hold bool) (uint64, obs) {
	k := b.conv(key)
	old, ok := b.m[k]
	if hold && b.seeded {
		if !ok {
			return 0, obsFresh
		}
		o := obsGrown
		if bytes < old.bytes {
			old.bytes, o = 0, obsReset
		}
		b.m[k] = slot{bytes: old.bytes, epoch: epoch}
		return 0, o
	}
	b.m[k] = slot{bytes: bytes, epoch: epoch}
	switch {
	case !ok && !b.seeded:
		return 0, obsBaseline
	case !ok:
		return bytes, obsFresh
	case bytes < old.bytes:
		return bytes, obsReset
	}
	return bytes - old.bytes, obsGrown
}

// complete ends a full read: entries not seen in it are gone.
func (b *baseline[K]) complete(epoch uint32, now time.Time) (deleted int) {
	for k, s := range b.m {
		if s.epoch != epoch {
			delete(b.m, k)
			deleted++
		}
	}
	b.seeded = true
	b.last = now
	return deleted
}

func (b *baseline[K]) lastRead() time.Time { return b.last }
func (b *baseline[K]) len() int            { return len(b.m) }

// tableState is a baseline of either key size.
type tableState interface {
	observe(key []byte, bytes uint64, epoch uint32, hold bool) (uint64, obs)
	complete(epoch uint32, now time.Time) int
	lastRead() time.Time
	len() int
}

func newTableState(keySize int) tableState {
	if keySize == KeySize4 {
		return newBaseline(func(b []byte) [KeySize4]byte { return [KeySize4]byte(b) })
	}
	return newBaseline(func(b []byte) [KeySize6]byte { return [KeySize6]byte(b) })
}
