package conntrack

import (
	"fmt"
	"time"
)

// table returns the state of a map, new when the map was recreated.
func (p *Poller) table(name string, t Table) *tableState {
	var id uint64
	if i, ok := t.(interface{ MapID() uint64 }); ok {
		id = i.MapID()
	}
	ts := p.tables[name]
	if ts != nil && id != 0 && ts.id != 0 && id != ts.id {
		p.log.Info("conntrack map recreated: its entries are read as new baselines and its layout decided again", "map", name)
		ts = nil
	}
	if ts == nil {
		ts = newTableState()
		ts.id = id
		ts.layout = p.versionLayout // none when forced: see layoutOf
		p.tables[name] = ts
		p.m.layoutChanges.WithLabelValues(mapLabel(name))
	}
	return ts
}

// read walks one map: baselines, deltas, and the evidence for the checks.
func (p *Poller) read(pr *pollRun, name string, t Table) error {
	st, now := &pr.st, pr.now
	ts := p.table(name, t)
	var max uint32
	if m, ok := t.(interface{ MaxEntries() uint32 }); ok && !LocalMap(name) {
		if max = m.MaxEntries(); max > 0 {
			p.m.maxEntries.WithLabelValues(name).Set(float64(max))
		}
	}
	layout := p.layoutOf(ts)
	// Until the index is filled, growth is held in the baselines rather
	// than dropped, and counted once it is; so is the growth of ingress
	// entries until the layout is known. Egress entries read the same in
	// both layouts: offset 24 is what the opener sent (split tx_bytes) or
	// both directions (combined bytes), counted for the opener either way.
	epoch, n, entries := pr.epoch, 0, 0
	hold := !pr.ready
	holdIn := hold || layout == LayoutAuto
	// A delta covers the time since its entry's growth was last counted,
	// which a hold stretches: judged against one interval, minutes of a
	// fast connection's held growth would look implausible.
	limitOut, limitIn := plausibleSince(ts.counted, now), plausibleSince(ts.countedIn, now)
	// Votes count until the map's layout is decided, and always against
	// a forced one (whose maps never decide one of their own).
	voteAll := ts.layout == LayoutAuto
	err := t.Each(func(key, val []byte) {
		n++
		flags := keyFlags(key)
		if flags&(tupleSvc|tupleRel) != 0 {
			return
		}
		v := decodeValue(val)
		entries++
		if v.Packets != 0 || v.Bytes != 0 || plausible(v.Word0, v.Word1) {
			st.counting++
		}
		ev := Classify(flags, v)
		// A split ingress entry that no Cilium endpoint opened (the host
		// network, the world) is the only entry of its connection: it
		// tracks both directions, tx+rx, as combined entries do. (Before
		// the layout is known too: a combined ingress entry has zero in
		// word 1, so its counter reads the same.)
		ingress, counter, both := flags&tupleIn != 0, v.Bytes, false
		if ingress && layout != LayoutCombined && !endpointIdentity(v.SrcSecID) && !p.podOpened(key) {
			counter, both = v.Bytes+v.Word1, true
		}
		delta, o, young, vote := ts.observe(key, counter, v.Lifetime, epoch, hold || ingress && holdIn, ev != EvidenceNone)
		if voteAll && vote {
			ts.window[ev]++ // once an entry: one seen over many polls is one vote
		}
		switch o {
		case obsReset:
			st.resets++
			fallthrough
		case obsFresh:
			ts.young[ev]++
		case obsGrown:
			st.on++
		case obsTouched:
			// Combined: every looked-up packet moves the lifetime and,
			// with accounting, the one counter (__ct_lookup). Split
			// counts rx apart, which is not kept here.
			if layout == LayoutCombined {
				st.touched++
			}
		}
		if young && o != obsGrown {
			// Counts set at creation say on once, at first sight: they
			// stay when accounting is turned off afterwards.
			switch accountingEvidence(v, layout) {
			case acctOn:
				if o == obsFresh || o == obsReset {
					st.on++
				}
			case acctOff:
				st.off++
			}
		}
		if delta == 0 {
			return
		}
		tu, _ := DecodeKey(key)
		limit := limitOut
		if ingress {
			limit = limitIn
		}
		pr.pending = append(pr.pending, pending{tuple: tu, bytes: delta, limit: limit, secID: v.SrcSecID,
			acceptorTx: ingress && layout == LayoutSplit && !both, both: both})
	})
	st.entries += entries
	if err != nil {
		return fmt.Errorf("%w: %w", errRead, err)
	}
	seeding := !ts.seeded
	deleted, active := ts.complete(epoch)
	if seeding || !hold {
		ts.counted = now
	}
	if seeding || !holdIn {
		ts.countedIn = now
	}
	st.deleted += deleted
	st.activeGone += active
	if LocalMap(name) {
		st.local++
		st.localN += n
	} else {
		p.m.entries.WithLabelValues(name).Set(float64(n))
	}
	// A full LRU map evicts live entries, whose last bytes are lost; its
	// size follows node memory (bpf-map-dynamic-size-ratio), so say so.
	if full := max > 0 && uint64(n)*10 >= uint64(max)*9; full != ts.full {
		ts.full = full
		if full {
			p.log.Warn("conntrack map nearly full: Cilium evicts entries (LRU) and their last bytes are not counted; raise bpf-ct-global-tcp-max / -any-max or bpf.mapDynamicSizeRatio",
				"map", name, "entries", n, "max_entries", max)
		}
	}
	p.decideLayout(name, ts)
	if entries > 0 && ts.layout == LayoutAuto && p.layout == LayoutAuto {
		st.undecided = true
		st.ambiguous = st.ambiguous || ts.ambig
	}
	return nil
}

// plausibleSince is the most bytes an entry can have moved since its
// growth was last counted at since (maxBytesPerSecond; one second when
// never).
func plausibleSince(since, now time.Time) uint64 {
	if s := now.Sub(since).Seconds(); !since.IsZero() && s > 1 {
		return uint64(s * maxBytesPerSecond)
	}
	return maxBytesPerSecond
}
