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
	obsTouched             // seen before, counter unchanged, but its lifetime moved: packets passed uncounted
	obsFresh               // new since the last read: all its bytes are new
	obsReset               // counter went down: entry recreated, all its bytes are new
)

type slot struct {
	bytes uint64
	// life is the entry's lifetime (ct_entry.lifetime), which the datapath
	// moves forward on every packet it looks up, counted or not.
	life uint32
	// tag packs, so that a slot stays 16 bytes: bit 0 young (first seen
	// after the map's first read, so created while the exporter watched;
	// what its counters hold tells whether accounting was on when Cilium
	// created it); bit 1 active (it grew in the last read that saw it, so
	// if it goes before the next one, bytes it moved since may be
	// uncounted); bits 2-31 the epoch of that read.
	tag uint32
}

func mkSlot(bytes uint64, life, epoch uint32, young, active bool) slot {
	t := epoch << 2
	if young {
		t |= 1
	}
	if active {
		t |= 2
	}
	return slot{bytes: bytes, life: life, tag: t}
}

func (s slot) young() bool        { return s.tag&1 != 0 }
func (s slot) active() bool       { return s.tag&2 != 0 }
func (s slot) isAt(e uint32) bool { return s.tag>>2 == e&(1<<30-1) }

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
	full         bool // 90% of its entries in use (logged when it starts)
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
func (b *tableState) observe(key []byte, bytes uint64, life, epoch uint32, hold bool) (uint64, obs, bool) {
	k := maphash.Bytes(b.seed, key)
	old, ok := b.m[k]
	same := obsSame
	if ok && life > old.life {
		same = obsTouched
	}
	if hold && b.seeded {
		if !ok {
			return 0, obsFresh, true
		}
		o := same
		switch {
		case bytes < old.bytes:
			old.bytes, o = 0, obsReset
		case bytes > old.bytes:
			o = obsGrown
		}
		young := old.young() || o == obsReset
		// Held growth is lost if the entry goes before counting starts.
		b.m[k] = mkSlot(old.bytes, life, epoch, young, old.active() || o != same)
		return 0, o, young
	}
	switch {
	case !ok && !b.seeded:
		b.m[k] = mkSlot(bytes, life, epoch, false, false)
		return 0, obsBaseline, false
	case !ok:
		b.m[k] = mkSlot(bytes, life, epoch, true, bytes > 0)
		return bytes, obsFresh, true
	case bytes < old.bytes:
		b.m[k] = mkSlot(bytes, life, epoch, true, bytes > 0)
		return bytes, obsReset, true
	case bytes == old.bytes:
		b.m[k] = mkSlot(bytes, life, epoch, old.young(), false)
		return 0, same, old.young()
	}
	b.m[k] = mkSlot(bytes, life, epoch, old.young(), true)
	return bytes - old.bytes, obsGrown, old.young()
}

// complete ends a full read: entries not seen in it are gone; active
// counts those that had grown in the read before, whose bytes since may
// be uncounted.
func (b *tableState) complete(epoch uint32, now time.Time) (deleted, active int) {
	for k, s := range b.m {
		if !s.isAt(epoch) {
			delete(b.m, k)
			deleted++
			if s.active() {
				active++
			}
		}
	}
	b.seeded = true
	b.last = now
	return deleted, active
}
