package hubble

import "strconv"

// Values of the policy_source label: who named the policy of a drop.
const (
	// PolicySourceCilium: Cilium named it (ingress_denied_by /
	// egress_denied_by of a policy-verdict event).
	PolicySourceCilium = "cilium"
	// PolicySourceSelected: Cilium named none (a default-deny drop) and
	// zonewatch named the policies that select the denying endpoint in
	// the drop's direction and allow none of the peer (collector/fence).
	PolicySourceSelected = "selected"
)

// Fences names the policies behind a default-deny drop; a
// *fence.Set satisfies it. subject is the denying endpoint's security
// identity (the destination of an ingress drop, the source of an egress
// one), peer the other side's; the value is "" when no policy is known to
// deny it.
type Fences interface {
	Name(egress bool, subject, peer uint32, proto uint8, port uint16) string
}

// FencesPending is what a Fences that reads identities by name also says
// (a *fence.Set does): whether naming a drop between the identities waits
// on such a read. The aggregator then holds the drop (hold.go) and counts
// it once the name is in, or when the hold window ends.
type FencesPending interface {
	NamePending(subject, peer uint32) bool
}

// fencePod is the pod a job's default-deny drop is held for while its
// policy's name waits on an identity read by name: the drop's other side
// (Hubble's name for it, else its identity), so that it is counted with
// its policy once the read lands, not as a drop no policy was found for.
func (a *Aggregator) fencePod(f *Fields, r *Result) (podRef, bool) {
	p, ok := a.fences.(FencesPending)
	if !ok || !r.PolicyDrop() || r.PolicyName != "" || r.Reason != ReasonPolicyDenied {
		return podRef{}, false
	}
	subject, peer, _, far, ok := fenceSides(r, f)
	if !ok || !p.NamePending(subject, peer) {
		return podRef{}, false
	}
	if far.PodName != "" {
		return podRef{far.Namespace, far.PodName}, true
	}
	return podRef{"", "identity/" + strconv.FormatUint(uint64(peer), 10)}, true
}

// fenceSides gives a policy drop's denying endpoint's identity (subject:
// the destination of an ingress drop, the source of an egress one), the
// other side's (peer) and its fields; false for a drop of no direction or
// with an identity unknown to Hubble.
func fenceSides(r *Result, f *Fields) (subject, peer uint32, egress bool, far *EndpointFields, ok bool) {
	switch r.Direction {
	case DirectionIngress:
		subject, peer, far = f.Dst.Identity, f.Src.Identity, &f.Src
	case DirectionEgress:
		subject, peer, egress, far = f.Src.Identity, f.Dst.Identity, true, &f.Dst
	default:
		return 0, 0, false, nil, false
	}
	return subject, peer, egress, far, subject != 0 && peer != 0
}

// SetFences makes the aggregator name the policies behind default-deny
// drops (policy_source="selected"). Call it before the first flow.
func (a *Aggregator) SetFences(f Fences) { a.fences = f }

// nameFence fills in the policy of a policy drop Cilium named none of.
func (a *Aggregator) nameFence(r *Result, f *Fields) {
	if r.PolicyName != "" {
		r.PolicySource = PolicySourceCilium
		return
	}
	if a.fences == nil || r.Reason != ReasonPolicyDenied {
		return
	}
	subject, peer, egress, _, ok := fenceSides(r, f)
	if !ok {
		return
	}
	port := uint16(0)
	if f.Proto != protoICMPv4 && f.Proto != protoICMPv6 {
		port = uint16(f.DstPort)
	}
	if name := a.fences.Name(egress, subject, peer, f.Proto, port); name != "" {
		r.PolicyNamespace, r.PolicyName, r.PolicySource = "", name, PolicySourceSelected
	}
}
