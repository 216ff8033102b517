package conntrack

import (
	"net/netip"
	"time"

	"github.com/zonewatch/zonewatch/topology"
)

// Unattributed reasons.
const (
	unattrNoJob    = "no_job"
	unattrNotLocal = "not_local"
	unattrOutside  = "opened_outside_cluster"
	// unattrService: the peer is a Service's cluster IP with no one
	// backend to place it (none or several ready): the datapath left the
	// VIP in the entry (kube-proxy DNATs after Cilium's conntrack).
	unattrService = "service"
)

type pending struct {
	tuple Tuple
	bytes uint64
	limit uint64
	secID uint32
	// acceptorTx: a split ingress entry's tx_bytes, what the acceptor
	// sent. both: a split ingress entry opened by no Cilium endpoint,
	// whose counter is tx+rx (what both sides sent; see read).
	acceptorTx, both bool
}

// podOpened reports whether the opener of a raw key's connection (its
// first address) is a pod the index holds: job pods, never host-network
// ones. Their node's egress entry holds the connection's bytes, whatever
// identity the acceptor's entry names.
func (p *Poller) podOpened(key []byte) bool {
	var a netip.Addr
	if len(key) == KeySize4 {
		a = netip.AddrFrom4([4]byte(key[0:4]))
	} else {
		a = netip.AddrFrom16([16]byte(key[0:16]))
	}
	return p.openerIsPod(a)
}

func (p *Poller) openerIsPod(a netip.Addr) bool {
	e, _ := p.idx.LookupIP(a)
	return e.Pod != ""
}

// lookup places an address through the index, or as the job pod it was
// until recently: a pod that finished or was deleted leaves the index at
// once, while the final reads of its entries (see Run) are still to be
// attributed to its job. A job pod's place is remembered from its first
// lookup; once the index no longer knows it, for goingWindow.
func (p *Poller) lookup(a netip.Addr, now time.Time) topology.Endpoint {
	e, _ := p.idx.LookupIP(a)
	if e.Service != nil {
		return e // a cluster IP: its backend is the index's to say, now
	}
	r, ok := p.recent[a]
	switch {
	case e.Pod != "":
		if !ok || r.ep != e || !r.gone.IsZero() {
			p.recent[a] = recentPod{ep: e}
		}
		return e
	case !ok:
		return e
	case r.gone.IsZero():
		r.gone = now
		p.recent[a] = r
	}
	if now.Sub(r.gone) <= goingWindow {
		return r.ep
	}
	delete(p.recent, a)
	return e
}

// remember keeps the places of departed job pods (any node's: a peer's
// zone counts too) for the reads their going triggers, as if looked up
// just before they left the index.
func (p *Poller) remember(ds []topology.Departure) {
	if len(ds) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range ds {
		for _, a := range d.IPs {
			a = a.Unmap()
			if r, ok := p.recent[a]; !ok || r.ep != d.Endpoint || !r.gone.IsZero() {
				p.recent[a] = recentPod{ep: d.Endpoint}
			}
		}
	}
}

// recentPod is a job pod's place as the index last told it, and when
// the index was first found without it.
type recentPod struct {
	ep   topology.Endpoint
	gone time.Time
}

// forgetRecent drops, every goingWindow, the places of pods gone from
// the index for that long (their addresses may not be looked up again).
func (p *Poller) forgetRecent(now time.Time) {
	if now.Sub(p.recentSwept) < goingWindow {
		return
	}
	p.recentSwept = now
	for a, r := range p.recent {
		if r.gone.IsZero() {
			if e, _ := p.idx.LookupIP(a); e.Pod == "" {
				r.gone = now
				p.recent[a] = r
			}
			continue
		}
		if now.Sub(r.gone) > goingWindow {
			delete(p.recent, a)
		}
	}
}

// PlacementPending is what an Index that reads nodes on demand also says
// (a *topology.Index with collector/kube's PeerNodes does): whether
// placing an address waits on a read of its node.
type PlacementPending interface {
	PlacementPending(netip.Addr) bool
}

// Bounds of the deltas that wait for their peer's node (waitingDelta):
// how long at most (the flows that name the peer ask for its node a
// round trip or two before), and how many at once (beyond, a delta is
// counted as it places then).
const (
	placeWait  = 20 * time.Second
	maxWaiting = 4096
)

// waitingDelta is a job's delta whose peer's node was being read when it
// was polled: counted at a later poll, in that node's zone once it is
// in, or as it places then after placeWait.
type waitingDelta struct {
	pending
	until time.Time
}

// count attributes the poll's deltas to jobs. Every delta lands in a job
// or in an unattributed reason, except the ingress entries of connections
// a Cilium endpoint opened: its own node counts their bytes, from its
// egress entry. A job's delta whose peer waits on a read of its node
// waits, at most placeWait, and is counted at a later poll.
func (p *Poller) count(pr *pollRun) {
	var u unattributed
	pp, _ := p.idx.(PlacementPending)
	waiting := p.waiting
	p.waiting = p.waitSpare[:0]
	for i := range waiting {
		p.countOne(pr, &waiting[i].pending, pp, waiting[i].until, &u)
	}
	clear(waiting)
	p.waitSpare = waiting[:0]
	for i := range pr.pending {
		p.countOne(pr, &pr.pending[i], pp, pr.now.Add(placeWait), &u)
	}
	p.m.unattributed.WithLabelValues(unattrNoJob).Add(float64(u.noJob))
	p.m.unattributed.WithLabelValues(unattrNotLocal).Add(float64(u.notLocal))
	p.m.unattributed.WithLabelValues(unattrOutside).Add(float64(u.outside))
	p.m.unattributed.WithLabelValues(unattrService).Add(float64(u.service))
}

// unattributed sums one count's bytes by unattributed reason.
type unattributed struct{ noJob, notLocal, outside, service uint64 }

// countOne attributes one delta (count); pp (nil: none) says whether its
// peer waits on a read of its node, which it may until until.
func (p *Poller) countOne(pr *pollRun, d *pending, pp PlacementPending, until time.Time, u *unattributed) {
	if d.bytes > d.limit {
		p.m.errors.WithLabelValues(reasonImplausible).Inc()
		return
	}
	t := d.tuple
	local, peer := t.Src, t.Dst
	openerIsPeer := false
	if t.Ingress() {
		switch {
		case d.acceptorTx:
			// tx_bytes of an ingress entry: what the acceptor sent.
			local, peer = t.Dst, t.Src
		case d.both || !endpointIdentity(d.secID) && !p.openerIsPod(t.Src):
			// Opened by no Cilium endpoint: the host network of a node
			// (host, remote-node, kube-apiserver, or world on a node's
			// cilium_host address), or outside the cluster. No egress
			// entry holds these bytes: the acceptor's node counts both
			// directions, with the opener's zone as src_zone.
			if !hostIdentity(d.secID) {
				if _, ok := p.idx.LookupIP(t.Src); !ok {
					u.outside += d.bytes
					return
				}
			}
			local, peer, openerIsPeer = t.Dst, t.Src, true
		default:
			// Combined, opened by a Cilium endpoint: its node counts it.
			return
		}
	}
	le := p.lookup(local, pr.now)
	if le.Node == "" || (p.cfg.Node != "" && le.Node != p.cfg.Node) {
		u.notLocal += d.bytes
		return
	}
	if le.Job == nil {
		u.noJob += d.bytes
		return
	}
	pe := p.lookup(peer, pr.now)
	if pe.Service != nil && !pe.Known() {
		u.service += d.bytes
		return
	}
	if pe.Node == "" && pp != nil && pr.now.Before(until) && len(p.waiting) < maxWaiting && pp.PlacementPending(peer) {
		p.waiting = append(p.waiting, waitingDelta{*d, until})
		return
	}
	src, dst := le.Zone, pe.Zone
	if openerIsPeer {
		src, dst = dst, src
	}
	p.bytes.Add(bytesKey{le.Job.Namespace, le.Job.Name, src, dst, topology.Locality(le, pe)}, float64(d.bytes))
}
