package conntrack

import (
	"hash/maphash"
	"time"
)

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

// tableState is the last byte counter of every entry of one map, to turn
// counters into deltas. Entries are keyed by a 64-bit hash of the raw key
// (v4 and v6 alike): 24 bytes a slot keep a full 512k-entry map near 15 MB
// and cache-friendly; two keys present together collide with probability
// about n²/2^65 (1e-8 at 512k), and a collision costs one wrong delta.
type tableState struct {
	m    map[uint64]slot
	seed maphash.Seed
	// seeded is set by the first complete read; before it, entries are
	// baselines (their bytes may be hours old).
	seeded bool
	last   time.Time // time of the last complete read
}

func newTableState() *tableState {
	return &tableState{m: map[uint64]slot{}, seed: maphash.MakeSeed()}
}

// observe records an entry's counter and returns what it grew by. With
// hold (layout not known yet) the growth is kept for later instead: known
// entries keep their baseline (reset to 0 if the counter went down) and new
// ones are not recorded, so they count in full once counting starts.
func (b *tableState) observe(key []byte, bytes uint64, epoch uint32, hold bool) (uint64, obs) {
	k := maphash.Bytes(b.seed, key)
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
func (b *tableState) complete(epoch uint32, now time.Time) (deleted int) {
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
