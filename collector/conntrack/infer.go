package conntrack

// acct is what one young entry says about accounting.
type acct uint8

const (
	acctNone acct = iota
	acctOn
	acctOff
)

// accountingEvidence tells what a young entry (created while the exporter
// watched) says about accounting: its creation sets the first packet's
// counts when accounting is on (ct_create4/6 in bpf/lib/conntrack.h):
// combined (1.16+) sets packets=1 only with accounting, split (1.14/1.15)
// sets one side's first packet always but adds later packets only with it.
func accountingEvidence(v Value, layout Layout) acct {
	zero := v.Packets == 0 && v.Bytes == 0 && !plausible(v.Word0, v.Word1)
	switch layout {
	case LayoutSplit:
		pkts := v.Word0 + v.Packets
		switch {
		case pkts > 1:
			return acctOn
		case v.TxFlagsSeen != 0 && v.RxFlagsSeen != 0:
			// A TCP handshake went both ways, yet one packet counted.
			return acctOff
		}
	case LayoutCombined:
		if v.Packets > 0 {
			return acctOn
		}
		return acctOff
	default:
		if zero {
			return acctOff // no layout leaves every counter at zero
		}
	}
	return acctNone
}

// verdict returns the layout that at least pct% of votes (and at least
// min) agree on.
func verdict(votes [3]uint64, min, pct uint64) (Layout, bool) {
	total := votes[EvidenceSplit] + votes[EvidenceCombined]
	switch {
	case total < min:
	case votes[EvidenceSplit]*100 >= total*pct:
		return LayoutSplit, true
	case votes[EvidenceCombined]*100 >= total*pct:
		return LayoutCombined, true
	}
	return LayoutAuto, false
}

// decideLayout decides a map's layout once: from the entries created
// while the exporter watched when enough of them vote, else from all
// entries (minVotes at 90%). A decided layout changes only when
// changeVotes entries created since agree at 95% on the other one; a
// change is logged and counted. A forced layout never changes, but
// entries that clearly contradict it are logged once.
func (p *Poller) decideLayout(name string, ts *tableState) {
	if p.cfg.Layout != LayoutAuto {
		if l, ok := verdict(ts.window, minVotes, 90); ok && l != p.cfg.Layout && !ts.contradicted {
			ts.contradicted = true
			p.log.Warn("--conntrack.layout contradicts the conntrack entries; bytes may be misattributed",
				"map", name, "layout", p.cfg.Layout.String(), "entries_look", l.String())
		}
		if ts.window[EvidenceSplit]+ts.window[EvidenceCombined] >= maxWindow {
			ts.window = [3]uint64{}
		}
		return
	}
	if ts.layout == LayoutAuto {
		votes := ts.young
		l, ok := verdict(votes, minVotes, 90)
		if !ok {
			votes = ts.window
			l, ok = verdict(votes, minVotes, 90)
		}
		if !ok {
			if ts.window[EvidenceSplit]+ts.window[EvidenceCombined] >= maxWindow {
				ts.ambig, ts.window = true, [3]uint64{}
			}
			return
		}
		p.log.Info("conntrack layout decided from the entries", "map", name, "layout", l.String(),
			"split_votes", votes[EvidenceSplit], "combined_votes", votes[EvidenceCombined])
		p.setLayout(ts, l)
		return
	}
	if l, ok := verdict(ts.young, changeVotes, 95); ok && l != ts.layout {
		was := ts.layout
		p.log.Warn("conntrack layout changed: the entries created since say otherwise (Cilium upgraded or downgraded across 1.16?)",
			"map", name, "was", was.String(), "layout", l.String(),
			"split_votes", ts.young[EvidenceSplit], "combined_votes", ts.young[EvidenceCombined])
		p.m.layoutChanges.WithLabelValues(mapLabel(name)).Inc()
		p.setLayout(ts, l)
		// One datapath writes every map: the others that had the old
		// layout (a UDP map may see too few new entries to vote) follow.
		for other, ots := range p.tables {
			if ots.layout == was {
				p.log.Warn("conntrack layout changed with another map's", "map", other, "with", name, "layout", l.String())
				p.m.layoutChanges.WithLabelValues(mapLabel(other)).Inc()
				p.setLayout(ots, l)
			}
		}
		return
	}
	if ts.young[EvidenceSplit]+ts.young[EvidenceCombined] >= maxWindow {
		ts.young = [3]uint64{}
	}
}

func (p *Poller) setLayout(ts *tableState, l Layout) {
	ts.layout, ts.window, ts.young, ts.ambig = l, [3]uint64{}, [3]uint64{}, false
	p.useLayout(l)
}

// layoutOf is the layout a map's entries are read with: the map's own
// (decided from its entries or the Cilium version), else the forced or
// last decided one.
func (p *Poller) layoutOf(ts *tableState) Layout {
	if ts.layout != LayoutAuto {
		return ts.layout
	}
	return p.layout
}

// useLayout makes l the layout of maps without a decision of their own.
func (p *Poller) useLayout(l Layout) {
	if p.layout != l {
		p.m.layout.Reset()
		p.m.layout.WithLabelValues(l.String()).Set(1)
		p.layout = l
	}
}
