package conntrack

import (
	"errors"
	"io/fs"
	"time"
)

// pollStats is what one poll saw, for the accounting and layout checks.
type pollStats struct {
	entries  int // connection entries (no service or related ones)
	counting int // of which with a non-zero counter
	// on / off: evidence that accounting is on now (a counter grew, a
	// young entry counted its first packet) or off (a young entry without
	// the counts its creation would have set).
	on, off    int
	touched    int // entries whose lifetime moved while their counter did not (combined)
	resets     int
	deleted    int
	activeGone int  // of the deleted, those that had grown in the read before
	undecided  bool // a map with entries has no layout yet
	ambiguous  bool
	local      int // per-endpoint (ConntrackLocal) maps read
	localN     int // their entries
}

// pollRun is the scratch of one poll: made by Poll, gone with it.
type pollRun struct {
	now     time.Time
	epoch   uint32
	ready   bool // the index was filled when the poll began
	pending []pending
	st      pollStats
}

// Poll reads every map once and adds the byte deltas since the previous
// poll.
func (p *Poller) Poll(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	p.epoch++
	pr := &pollRun{now: now, epoch: p.epoch, ready: p.cfg.Ready == nil || p.cfg.Ready(), pending: p.spare[:0]}
	defer func() { p.spare = pr.pending[:0] }()
	st := &pr.st
	present, failed := 0, 0
	var failReason string
	var failErr error
	names, err := p.mapNames()
	if err != nil {
		// The listing counts as one more map read that failed, classified
		// as a map's error is: permission when denied, else read (mapNames
		// wraps errRead).
		present++
		failed++
		r := errReason(err)
		p.m.errors.WithLabelValues(r).Inc()
		failReason, failErr = r, err
	}
	for _, name := range names {
		t, err := p.src.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			delete(p.tables, name)
			p.m.entries.DeleteLabelValues(name)
			p.m.maxEntries.DeleteLabelValues(name)
			continue
		}
		present++
		if err == nil {
			err = CheckSizes(name, t.KeySize(), t.ValueSize())
			if err == nil {
				err = p.read(pr, name, t)
			}
			t.Close()
		}
		if err != nil {
			failed++
			r := errReason(err)
			p.m.errors.WithLabelValues(r).Inc()
			if failErr == nil {
				failReason, failErr = r, err
			}
		}
	}
	p.forgetGone(names)
	p.reportLocal(*st)
	p.m.deleted.Add(float64(st.deleted))
	p.m.activeGone.Add(float64(st.activeGone))
	p.m.resets.Add(float64(st.resets))

	// Accounting is decided from what changed: a counter that grew, or a
	// young entry with counts, says on; young entries without the counts
	// their creation sets, or nothing but zero counters, say off. Frozen
	// counters (accounting turned off keeps the last values) say nothing.
	// Entries that passed packets without counting them say off too (a
	// node with long-lived connections only), in two polls running: the
	// datapath writes the lifetime before it adds to the counters, so one
	// read can fall in between.
	if st.on == 0 && st.touched > 0 {
		p.touchedPolls++
	} else {
		p.touchedPolls = 0
	}
	switch {
	case st.on > 0:
		p.accountOff = false
	case st.off > 0, st.entries > 0 && st.counting == 0, p.touchedPolls >= 2:
		p.accountOff = true
	}
	// Deltas are counted unless accounting is off; a map that failed
	// midway still gives what was read before the failure. Without a
	// layout, egress entries count (the same in both layouts) and the
	// growth of ingress entries is held: nothing is wrong yet, so the
	// source stays up and says so once, unless the entries disagree.
	reason := ""
	switch {
	case p.accountOff:
		reason = reasonAccounting
	case st.ambiguous:
		reason = reasonAmbiguous
	}
	if !p.accountOff {
		p.count(pr)
	}
	p.forgetRecent(now)
	if st.undecided && !p.undecidedSaid {
		p.undecidedSaid = true
		p.log.Info("conntrack layout not known yet (no Cilium version, too few ingress entries): counting egress entries, which read the same in both layouts; the growth of ingress entries is counted once the layout is known")
	}
	switch {
	case present == 0:
		reason = reasonAbsent
		p.m.errors.WithLabelValues(reasonAbsent).Inc()
	case failed == present, failed > 0 && reason == "":
		reason = failReason
	}
	p.setState(reason, failErr)
	p.m.duration.Set(time.Since(start).Seconds())
}
