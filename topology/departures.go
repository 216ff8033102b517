package topology

import "net/netip"

// Departure is a job pod that stopped counting for placement (terminating,
// finished, deleted, no job any more), placed as the index held it just
// before. A finished or deleted pod's addresses leave the index in the
// event that records its departure, while the conntrack read that the
// departure triggers still has its last bytes to attribute.
type Departure struct {
	Endpoint Endpoint
	IPs      []netip.Addr // nil for a host-network pod
}

// departuresKept bounds the departure log: a consumer that looks once a
// second misses none unless more job pods than this go cluster-wide in
// that second. The log, not a count per node, is what PodsGone reads, so
// nothing here grows with the node names an autoscaled pool goes through.
const departuresKept = 4096

// departures is a ring of the last departuresKept departures; seq counts
// every departure since the index began (the next one's number).
type departures struct {
	ring []Departure
	seq  uint64
	wake chan struct{} // closed and replaced at each departure
}

// departLocked records that a job pod stopped counting, before its record
// leaves the index, and wakes PodsGone's callers.
func (x *Index) departLocked(rec *podRec) {
	d := Departure{Endpoint: x.podEndpointLocked(rec)}
	if !rec.HostNetwork {
		d.IPs = rec.IPs
	}
	g := &x.departed
	if len(g.ring) < departuresKept {
		g.ring = append(g.ring, d)
	} else {
		g.ring[g.seq%departuresKept] = d
	}
	g.seq++
	close(g.wake)
	g.wake = make(chan struct{})
}

// PodsGone appends to dst the departures of job pods after cursor after,
// and returns them, the cursor to pass next time, whether departures after
// the cursor were already dropped from the log (missed), and a channel
// closed at the next departure. Cursor 0 is the index's beginning; a
// cursor past the end (math.MaxUint64) returns none, only the cursor. A
// pod that came and went between two calls is not missed, and its place
// comes with it although LookupIP has forgotten it.
func (x *Index) PodsGone(after uint64, dst []Departure) (ds []Departure, next uint64, missed bool, wake <-chan struct{}) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	g := &x.departed
	first := min(after, g.seq)
	if g.seq-first > uint64(len(g.ring)) {
		first, missed = g.seq-uint64(len(g.ring)), true
	}
	for s := first; s < g.seq; s++ {
		dst = append(dst, g.ring[s%departuresKept])
	}
	return dst, g.seq, missed, g.wake
}
