package conntrack

import (
	"hash/maphash"
	"time"
)

// obs says what observe found for an entry.
type obs uint8

const (
	obsBaseline obs = iota // first read of the map: counted from here on
	obsSame                // seen before, counter unchanged
	obsGrown               // seen before, counter grew
	obsFresh               // new since the last read: all its bytes are new
	obsReset               // counter went down: entry recreated, all its bytes are new
)

type slot struct {
	bytes uint64
	epoch uint32
	// young: first seen after the map's first read, so created while the
	// exporter watched; what its counters hold tells whether accounting
	// was on when Cilium created it.
	young bool
}

// tableState is what the poller keeps of one map between polls: the last
// byte counter of every entry, to turn counters into deltas, and the
// layout decided for the map. Entries are keyed by a 64-bit hash of the
// raw key (v4 and v6 alike): 16 bytes a slot keep a full 512k-entry map
// near 15 MB and cache-friendly; two keys present together collide with
// probability about n²/2^65 (1e-8 at 512k), and a collision costs one
// wrong delta.
type tableState struct {
	m    map[uint64]slot
	seed maphash.Seed
	// seeded is set by the first complete read; before it, entries are
	// baselines (their bytes may be hours old).
	seeded bool
	last   time.Time // time of the last complete read
	id     uint64    // kernel map ID, when the table tells it; a new ID is a new map

	// layout decided for this map (LayoutAuto while undecided). window
	// holds the votes of every entry of every poll until then; young the
	// votes of entries at their first sight after the first read, which
	// show what the running datapath writes (entries from before an
	// upgrade never vote there).
	layout Layout
	window [3]uint64
	young  [3]uint64
	ambig  bool
	// contradicted: a forced layout was seen contradicted (logged once).
	contradicted bool
}

func newTableState() *tableState {
	return &tableState{m: map[uint64]slot{}, seed: maphash.MakeSeed()}
}

// observe records an entry's counter and returns what it grew by, and
// whether the entry is young (first seen after the first read). With hold
// (layout not known yet, index not synced) the growth is kept for later
// instead: known entries keep their baseline (reset to 0 if the counter
// went down) and new ones are not recorded, so they count in full once
// counting starts.
func (b *tableState) observe(key []byte, bytes uint64, epoch uint32, hold bool) (uint64, obs, bool) {
	k := maphash.Bytes(b.seed, key)
	old, ok := b.m[k]
	if hold && b.seeded {
		if !ok {
			return 0, obsFresh, true
		}
		o := obsSame
		switch {
		case bytes < old.bytes:
			old.bytes, o = 0, obsReset
		case bytes > old.bytes:
			o = obsGrown
		}
		b.m[k] = slot{bytes: old.bytes, epoch: epoch, young: old.young || o == obsReset}
		return 0, o, old.young || o == obsReset
	}
	switch {
	case !ok && !b.seeded:
		b.m[k] = slot{bytes: bytes, epoch: epoch}
		return 0, obsBaseline, false
	case !ok:
		b.m[k] = slot{bytes: bytes, epoch: epoch, young: true}
		return bytes, obsFresh, true
	case bytes < old.bytes:
		b.m[k] = slot{bytes: bytes, epoch: epoch, young: true}
		return bytes, obsReset, true
	case bytes == old.bytes:
		b.m[k] = slot{bytes: bytes, epoch: epoch, young: old.young}
		return 0, obsSame, old.young
	}
	b.m[k] = slot{bytes: bytes, epoch: epoch, young: old.young}
	return bytes - old.bytes, obsGrown, old.young
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
