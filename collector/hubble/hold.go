package hubble

import (
	"context"
	"net/netip"
	"strings"
	"time"
)

// Held flows. A flow is classified against the view as it is when the
// flow arrives; a view that has not yet caught up (at start-up, when a
// job's pod has just started on this node and its job's pods are still
// being listed, on a busy node whose informer handlers run late) places
// its pods without their job, and a drop of the job's first packets would
// be counted for nobody. So a drop or a sending-side forward that finds no
// job while Hubble names one of its pods is held and classified again, each
// second, until the view gives it a job (it is then counted, late) or the
// pod has been unplaced for the hold window (it is then counted as
// uncounted with reason no_job: a pod of no job). A policy drop of a job
// whose other side Hubble names as a pod of the job's namespace that the
// view gives no job yet (the job's other pods are still being listed) is
// held the same way, for that pod: counted with its peer and zones once
// the view places the pod, or, when the window ends first (a pod of no
// job), counted as it classifies then; counted at once it would be a drop
// from a peer outside the job, in an unknown zone. A job's flow whose
// other side waits on a read of its node (the lean node view's: a pod on
// a node not held yet) is held the same way, for that side, and counted
// in the node's zone once it is in. The window runs per pod, from the
// first flow of it that found no job, so a pod of no job holds its flows
// once, in its first seconds, and never again; every flow is either
// counted or counted in zonewatch_hubble_flows_uncounted_total with its
// reason.

// DefaultHold is the hold window of a live stream: how long a pod Hubble
// names may stay without a job in the view before its flows count as no
// job's. It covers a job feed's first list on a loaded apiserver and the
// ipcache's refresh interval (10 s) with room to spare.
const DefaultHold = 20 * time.Second

// Bounds of the flows held at once, in all and per pod: a burst from new
// pods of no job cannot hold more than this; flows beyond are counted as
// uncounted with reason hold_full.
const (
	maxHeld       = 4096
	maxHeldPerPod = 512
	// retryEvery is the pace of retries (Observe retries when due; Run
	// when the stream is quiet).
	retryEvery = time.Second
	// forgetUnplaced is how long a pod found without a job is
	// remembered: within it, its flows are not held again.
	forgetUnplaced = 10 * time.Minute
	maxUnplaced    = 8192
)

// Reasons of zonewatch_hubble_flows_uncounted_total.
const (
	uncountedKind     = "kind"
	uncountedNoJob    = "no_job"
	uncountedHoldFull = "hold_full"
)

type podRef struct{ namespace, name string }

type heldFlow struct {
	f     Fields // its own copy: a live flow's strings are views of a buffer
	pod   podRef
	until time.Time
}

// holder keeps the held flows; guarded by Aggregator.obs.
type holder struct {
	window time.Duration
	now    func() time.Time
	flows  []heldFlow
	perPod map[podRef]int
	// unplaced: when a pod's flow first found no job.
	unplaced map[podRef]time.Time
	next     time.Time
}

// SetHold makes the aggregator hold the flows the view cannot yet give a
// job for up to window per pod (0: none, as for files, whose view is
// complete before the first flow). Call it before the first flow.
func (a *Aggregator) SetHold(window time.Duration) {
	a.obs.Lock()
	defer a.obs.Unlock()
	if window <= 0 {
		a.held = nil
		return
	}
	a.held = &holder{window: window, now: time.Now, perPod: map[podRef]int{}, unplaced: map[podRef]time.Time{}}
}

// Held returns how many flows are held now.
func (a *Aggregator) Held() int {
	a.obs.Lock()
	defer a.obs.Unlock()
	if a.held == nil {
		return 0
	}
	return len(a.held.flows)
}

// Run retries the held flows each second until ctx ends, so that a quiet
// stream's held flows are counted too. Observe retries them as well.
func (a *Aggregator) Run(ctx context.Context) {
	t := time.NewTicker(retryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Retry()
		}
	}
}

// Retry classifies the held flows again now.
func (a *Aggregator) Retry() {
	a.obs.Lock()
	defer a.obs.Unlock()
	if a.held != nil {
		a.retryLocked(a.held.now())
	}
}

// holdLocked holds a flow that found no job when Hubble names a pod on one
// of its sides whose hold window is open, or a job's policy drop whose
// other side is a pod the view does not yet give a job (farPod); false
// when the flow is not held (a flow of no job is then uncounted, with
// reason; a job's is counted).
func (a *Aggregator) holdLocked(f *Fields, r *Result) (held bool, reason string) {
	h := a.held
	if h == nil {
		return false, uncountedNoJob
	}
	pod, ok := a.heldPod(f, r)
	if !ok {
		return false, uncountedNoJob
	}
	now := h.now()
	first, seen := h.unplaced[pod]
	if !seen {
		pod = podRef{strings.Clone(pod.namespace), strings.Clone(pod.name)}
		first = now
		if len(h.unplaced) >= maxUnplaced {
			h.forgetLocked(now, true)
		}
		h.unplaced[pod] = first
	}
	until := first.Add(h.window)
	if !now.Before(until) {
		return false, uncountedNoJob
	}
	if len(h.flows) >= maxHeld || h.perPod[pod] >= maxHeldPerPod {
		return false, uncountedHoldFull
	}
	h.flows = append(h.flows, heldFlow{f: cloneFields(f), pod: pod, until: until})
	h.perPod[pod]++
	if k, ok := a.topo.(interface{ Kick() }); ok {
		k.Kick() // an address the ipcache may not have yet
	}
	return true, ""
}

// heldPod is the pod a flow is held for: for a flow of a job, the other
// side (farPod, fencePod, placePod); else the side on this node, else the
// source, else the destination, that Hubble names as a pod.
func (a *Aggregator) heldPod(f *Fields, r *Result) (podRef, bool) {
	if r.Job != nil {
		if p, ok := farPod(f, r); ok {
			return p, true
		}
		if p, ok := a.fencePod(f, r); ok {
			return p, true
		}
		return a.placePod(f, r)
	}
	first, second := &f.Src, &f.Dst
	if r.Local == SideDestination {
		first, second = second, first
	}
	for _, ep := range []*EndpointFields{first, second} {
		if ep.PodName != "" {
			return podRef{ep.Namespace, ep.PodName}, true
		}
	}
	return podRef{}, false
}

// farPod is the pod a job's policy drop waits for: its other side, when
// Hubble names it as a pod of the job's namespace and the view gives it
// no job (a pod of the job not listed yet, or a pod of no job: held once,
// as every pod of no job).
func farPod(f *Fields, r *Result) (podRef, bool) {
	if !r.PolicyDrop() {
		return podRef{}, false
	}
	e, ep := r.Dst, &f.Dst
	if r.Src.Job != r.Job {
		e, ep = r.Src, &f.Src
	}
	if e.Job != nil || ep.PodName == "" || ep.Namespace != r.Job.Namespace {
		return podRef{}, false
	}
	return podRef{ep.Namespace, ep.PodName}, true
}

// PlacementPending is what a Topology that reads nodes on demand also
// says (a *topology.Index with collector/kube's PeerNodes does): whether
// placing an address waits on a read of its node.
type PlacementPending interface {
	PlacementPending(netip.Addr) bool
}

// placePod is the pod a job's flow is held for while the view reads the
// node of its side that it cannot place yet (the first flow to a pod on a
// node the lean node view does not hold): counted now, the flow would
// count to an unknown zone; once the node is read, in that node's zone.
// The side is Hubble's pod, else its address.
func (a *Aggregator) placePod(f *Fields, r *Result) (podRef, bool) {
	if !r.SrcUnresolved && !r.DstUnresolved {
		return podRef{}, false
	}
	p, ok := a.topo.(PlacementPending)
	if !ok {
		return podRef{}, false
	}
	if r.DstUnresolved && p.PlacementPending(parseAddr(f.DstIP)) {
		return sidePod(f.Dst.Namespace, f.Dst.PodName, f.DstIP), true
	}
	if r.SrcUnresolved && p.PlacementPending(parseAddr(f.SrcIP)) {
		return sidePod(f.Src.Namespace, f.Src.PodName, f.SrcIP), true
	}
	return podRef{}, false
}

// sidePod names a flow's side for the hold: Hubble's pod, else its
// address.
func sidePod(namespace, pod, ip string) podRef {
	if pod != "" {
		return podRef{namespace, pod}
	}
	return podRef{"", "address/" + ip}
}

// retryLocked classifies the held flows again: those the view now gives a
// job (and a job's drop its other side) are counted; past their window, a
// flow of a job is counted as it classifies, one of no job uncounted
// (no_job).
func (a *Aggregator) retryLocked(now time.Time) {
	h := a.held
	if now.Before(h.next) {
		return
	}
	h.next = now.Add(retryEvery)
	kept := h.flows[:0]
	for i := range h.flows {
		hf := &h.flows[i]
		r := a.cls.classify(&hf.f, false)
		_, waits := a.heldPod(&hf.f, &r)
		switch {
		case r.Count == NotCounted:
			a.m.uncounted(uncountedKind)
		case r.Job != nil && !waits:
			delete(h.unplaced, hf.pod)
			a.countLocked(&r, &hf.f)
		case r.Job != nil && !now.Before(hf.until):
			a.countLocked(&r, &hf.f)
		case !now.Before(hf.until):
			a.finishUncountedLocked(&r, uncountedNoJob)
		default:
			kept = append(kept, *hf)
			continue
		}
		h.perPod[hf.pod]--
		if h.perPod[hf.pod] <= 0 {
			delete(h.perPod, hf.pod)
		}
	}
	clear(h.flows[len(kept):])
	h.flows = kept
	h.forgetLocked(now, false)
}

// forgetLocked forgets the pods found without a job long ago (all but
// those with held flows when full).
func (h *holder) forgetLocked(now time.Time, full bool) {
	if !full && len(h.unplaced) < maxUnplaced/2 {
		return
	}
	for p, t := range h.unplaced {
		if (full || now.Sub(t) >= forgetUnplaced) && h.perPod[p] == 0 {
			delete(h.unplaced, p)
		}
	}
}

// cloneFields copies a flow's strings out of the buffer they view.
func cloneFields(f *Fields) Fields {
	c := *f
	c.NodeName = strings.Clone(f.NodeName)
	c.SrcIP, c.DstIP = strings.Clone(f.SrcIP), strings.Clone(f.DstIP)
	for _, ep := range []*EndpointFields{&c.Src, &c.Dst} {
		ep.Namespace, ep.PodName, ep.Workload = strings.Clone(ep.Namespace), strings.Clone(ep.PodName), strings.Clone(ep.Workload)
	}
	for _, p := range []*PolicyRef{&c.IngressDeniedBy, &c.EgressDeniedBy} {
		p.Namespace, p.Name = strings.Clone(p.Namespace), strings.Clone(p.Name)
	}
	return c
}
