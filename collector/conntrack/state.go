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
	// tag packs, so that a slot stays 16 bytes: the slot flags in the low
	// slotFlagBits bits, the epoch of the read that last saw the entry in
	// the rest.
	tag uint32
}

// Slot flags.
const (
	// slotYoung: first seen after the map's first read, so created while
	// the exporter watched; what its counters hold tells whether
	// accounting was on when Cilium created it.
	slotYoung uint32 = 1 << iota
	// slotActive: it grew in the last read that saw it, so if it goes
	// before the next one, bytes it moved since may be uncounted.
	slotActive
	// slotVoted: its layout evidence was counted; an entry votes once,
	// however many polls see it.
	slotVoted
	// slotUnbased: first seen while growth was held: all its bytes are
	// new and count from zero once counting starts; bytes is the last
	// counter seen, for the evidence.
	slotUnbased
	slotFlagBits = 4
)

func mkSlot(bytes uint64, life, epoch, flags uint32) slot {
	return slot{bytes: bytes, life: life, tag: epoch<<slotFlagBits | flags}
}

// flagIf returns f when cond holds, else no flag.
func flagIf(cond bool, f uint32) uint32 {
	if cond {
		return f
	}
	return 0
}

func (s slot) has(f uint32) bool  { return s.tag&f != 0 }
func (s slot) young() bool        { return s.has(slotYoung) }
func (s slot) active() bool       { return s.has(slotActive) }
func (s slot) isAt(e uint32) bool { return s.tag>>slotFlagBits == e&(1<<(32-slotFlagBits)-1) }

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
	// counted and countedIn: the last complete read whose growth was
	// counted (not held) for egress and for ingress entries; the first
	// read sets both (its baselines).
	counted, countedIn time.Time
	id                 uint64 // kernel map ID, when the table tells it; a new ID is a new map

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

// observe records an entry's counter and returns what it grew by, what
// it found, whether the entry is young (first seen after the first read),
// and whether its layout evidence is to be counted now (evidence: it has
// some; vote: its first sight with some, a recreated entry being a new
// one). With hold (layout not known yet, index not synced) the growth is
// kept for later instead: known entries keep their baseline (reset to 0
// if the counter went down) and new ones are recorded unbased, so they
// count in full once counting starts.
func (b *tableState) observe(key []byte, bytes uint64, life, epoch uint32, hold, evidence bool) (delta uint64, o obs, young, vote bool) {
	k := maphash.Bytes(b.seed, key)
	old, ok := b.m[k]
	same := obsSame
	if ok && life > old.life {
		same = obsTouched
	}
	o = same
	switch {
	case !ok:
		o = obsFresh
	case bytes < old.bytes:
		o = obsReset
	case bytes > old.bytes:
		o = obsGrown
	}
	vote = evidence && (!ok || o == obsReset || !old.has(slotVoted))
	voted := flagIf(vote || ok && o != obsReset && old.has(slotVoted), slotVoted)
	switch {
	case hold && b.seeded && (!ok || old.has(slotUnbased)):
		// New while held: its growth is all of its bytes.
		b.m[k] = mkSlot(bytes, life, epoch, slotYoung|slotUnbased|voted|flagIf(bytes > 0, slotActive))
		return 0, o, true, vote
	case hold && b.seeded:
		base := old.bytes
		if o == obsReset {
			base = 0
		}
		young = old.young() || o == obsReset
		// Held growth is lost if the entry goes before counting starts.
		b.m[k] = mkSlot(base, life, epoch, flagIf(young, slotYoung)|voted|flagIf(old.active() || o != same, slotActive))
		return 0, o, young, vote
	case !ok && !b.seeded:
		b.m[k] = mkSlot(bytes, life, epoch, voted)
		return 0, obsBaseline, false, vote
	case !ok, o == obsReset, old.has(slotUnbased):
		// New since the last read, recreated, or new while held: all its
		// bytes are new.
		b.m[k] = mkSlot(bytes, life, epoch, slotYoung|voted|flagIf(bytes > 0, slotActive))
		return bytes, o, true, vote
	case o != obsGrown:
		b.m[k] = mkSlot(bytes, life, epoch, flagIf(old.young(), slotYoung)|voted)
		return 0, o, old.young(), vote
	}
	b.m[k] = mkSlot(bytes, life, epoch, flagIf(old.young(), slotYoung)|voted|slotActive)
	return bytes - old.bytes, obsGrown, old.young(), vote
}

// complete ends a full read: entries not seen in it are gone; active
// counts those that had grown in the read before, whose bytes since may
// be uncounted.
func (b *tableState) complete(epoch uint32) (deleted, active int) {
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
	return deleted, active
}
