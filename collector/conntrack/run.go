package conntrack

import (
	"context"
	"math"
	"time"

	"github.com/zonewatch/zonewatch/topology"
)

// Run polls every interval until ctx ends. When a job pod of this node
// stops counting (terminating, finished or deleted), it reads at once and
// then every fastInterval for as long as a job pod of this node is
// terminating and goingWindow after: Cilium deletes the CT entries of an
// endpoint with it, and what they moved since the last read would be lost
// (docs/conntrack.md, "What can be missed between polls").
func (p *Poller) Run(ctx context.Context, interval time.Duration) {
	s := schedule{interval: interval}
	tick := time.NewTicker(min(interval, watchEvery))
	defer tick.Stop()
	for {
		now := time.Now()
		// The first call takes the count there is now.
		went, terminating, wake := p.podsWent()
		if s.due(now, went, terminating) {
			p.Poll(now)
			s.polled(now, time.Since(now))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-wake: // a job pod went, here or on another node
		}
	}
}

// How Run follows pods that go: the index wakes it at once when one does
// (and it looks every watchEvery); after a pod went, the maps are read
// every fastInterval (or five times the last poll's duration, if longer)
// while a job pod of the node is terminating (its grace period, of any
// length: its containers may stop, and its endpoint go, at any moment of
// it) and for goingWindow after the going or the last look that found one
// terminating: a finished or deleted pod's CNI DEL, after which Cilium has
// deleted its entries.
const (
	watchEvery   = time.Second
	fastInterval = time.Second
	goingWindow  = 45 * time.Second
)

// schedule decides when Run reads the maps.
type schedule struct {
	interval  time.Duration
	last      time.Time // start of the last poll; zero before the first
	took      time.Duration
	fastUntil time.Time
}

// due reports whether to poll at now; went: a pod went since the last
// call; terminating: a pod is terminating now.
func (s *schedule) due(now time.Time, went, terminating bool) bool {
	if went || terminating {
		s.fastUntil = now.Add(goingWindow)
	}
	if went {
		return true
	}
	if s.last.IsZero() {
		return true
	}
	every := s.interval
	if now.Before(s.fastUntil) {
		every = min(every, max(fastInterval, 5*s.took))
	}
	// Half a tick of slack: ticks and polls do not start on the dot.
	return now.Sub(s.last)+watchEvery/2 >= every
}

func (s *schedule) polled(at time.Time, took time.Duration) { s.last, s.took = at, took }

// podIndex is what the topology index tells about pods that go; an Index
// without it gets no reads on pod changes.
type podIndex interface {
	PodsGone(after uint64, dst []topology.Departure) ([]topology.Departure, uint64, bool, <-chan struct{})
	TerminatingPods(node string) int
}

// podsWent reports whether a job pod of this node (of any node with an
// empty Config.Node) stopped counting for placement since the last call
// (terminating, finished or deleted) and whether one is terminating now,
// and returns the channel closed at the next pod's going (nil without a
// podIndex). It reads the index's log
// of departures rather than comparing the pods seen at each call: a pod
// that came and went between two calls, as a short-lived one does
// (created, moving its bytes and deleted within a second), is not missed,
// and its place, which the index forgets at once when it finished or was
// deleted, is remembered for the reads its going triggers. Only Run calls
// it.
func (p *Poller) podsWent() (went, terminating bool, wake <-chan struct{}) {
	pi, ok := p.idx.(podIndex)
	if !ok {
		return false, false, nil
	}
	after := p.goneSeen
	if !p.goneKnown {
		after = math.MaxUint64 // the first call takes the cursor there is now
	}
	ds, next, missed, wake := pi.PodsGone(after, p.departed[:0])
	p.goneSeen, p.goneKnown = next, true
	defer func() { clear(ds); p.departed = ds[:0] }() // hold no gone job past the call
	here := 0
	for _, d := range ds {
		if p.cfg.Node == "" || d.Endpoint.Node == p.cfg.Node {
			here++
		}
	}
	if missed {
		p.log.Warn("more job pods went at once than the index remembers: reading the conntrack maps now, but the last bytes of some may count as no_job", "node", p.cfg.Node)
	} else if here > 0 {
		p.log.Debug("job pod went: reading the conntrack maps now", "node", p.cfg.Node, "pods", here)
	}
	p.remember(ds)
	return here > 0 || missed, pi.TerminatingPods(p.cfg.Node) > 0, wake
}
