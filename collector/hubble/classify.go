// Package hubble reads Cilium Hubble flows — live from the Observer gRPC
// API (node socket or Relay) or replayed from `hubble observe -o jsonpb`
// output — and turns them into per-job policy-drop and flow-event
// counters, joined with the topology index for zones.
package hubble

import (
	"hash/maphash"
	"net/netip"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/zonewatch/zonewatch/topology"
)

// Topology is what classification needs from the topology index; a
// *topology.Index satisfies it.
type Topology interface {
	LookupIP(netip.Addr) (topology.Endpoint, bool)
	LookupPod(namespace, name string) (topology.Endpoint, bool)
	JobExists(namespace, name string) bool
}

// Count says what a flow counts as.
type Count uint8

const (
	// NotCounted: a reply, the receiving side of a forwarded flow, an
	// intermediate observation point, a policy-verdict event of a drop
	// already counted, another node's flow, or a verdict we do not count.
	NotCounted Count = iota
	// Forwarded: a forwarded flow event on its sending side.
	Forwarded
	// Dropped: a drop, where it happened.
	Dropped
)

// Label values of the verdict and direction labels.
const (
	VerdictForwarded = "forwarded"
	VerdictDropped   = "dropped"

	DirectionIngress = "ingress"
	DirectionEgress  = "egress"
	DirectionUnknown = "unknown"
)

// Values of the peer label: the other side's relation to the job. Only
// traffic between a job's own pods is fixed by co-locating the job.
const (
	PeerJob     = "job"     // another pod of the same job
	PeerCluster = "cluster" // another pod, workload or host of the cluster
	PeerWorld   = "world"   // outside the cluster
	PeerUnknown = "unknown" // an address neither the index nor Hubble places
)

// Policy drop reasons (the reason label). Other drop reasons are not
// policy drops and only count as flow events with verdict "dropped".
const (
	ReasonPolicyDenied = "POLICY_DENIED"
	ReasonPolicyDeny   = "POLICY_DENY"
	ReasonAuthRequired = "AUTH_REQUIRED"
)

// Cilium monitor message types (pkg/monitor/api MessageType*), as found in
// Flow.event_type.type.
const (
	eventUnknown       = 0 // absent, e.g. masked out of an exported file
	eventDrop          = 1
	eventTrace         = 4
	eventPolicyVerdict = 5
	eventL7            = 129 // MessageTypeAccessLog
)

// Side names one end of a flow.
type Side uint8

const (
	SideNone Side = iota
	SideSource
	SideDestination
)

// Result is the classification of one flow. Its strings are shared with
// the index and the flow; nothing is formatted per flow.
type Result struct {
	Count Count
	// Node is the observing node (flow.node_name without a cluster prefix).
	Node     string
	Src, Dst topology.Endpoint
	// SrcUnresolved / DstUnresolved: the side is a cluster address the
	// index cannot place (world addresses are not unresolved).
	SrcUnresolved, DstUnresolved bool
	// Local is the side on the observing node, by which the job is chosen.
	Local Side
	// Job is the local side's job, else the peer's; nil when neither side
	// is a job pod.
	Job       *topology.Job
	Locality  string
	Direction string
	Verdict   string // VerdictForwarded / VerdictDropped when counted
	// Reason is a policy drop reason, empty for other drops and forwards.
	Reason string
	// PolicyNamespace / PolicyName name the denying policy when the flow
	// carries it (policy-verdict events, Cilium >= 1.16), else empty.
	PolicyNamespace, PolicyName string
	// PolicySource says who named the policy (PolicySourceCilium,
	// PolicySourceSelected); empty when none is named. Set by the
	// Aggregator, not the Classifier.
	PolicySource string
	// Peer is the other side's relation to Job (PeerJob, ...);
	// PeerNamespace/PeerWorkload name a cluster peer's workload (its job,
	// else Hubble's workload name), empty when unnamed.
	Peer                        string
	PeerNamespace, PeerWorkload string
}

// PolicyDrop reports whether the result is a drop by policy.
func (r *Result) PolicyDrop() bool { return r.Count == Dropped && r.Reason != "" }

// Policy renders the policy label: "namespace/name", "name" for a
// cluster-wide policy, "" when unknown (default deny). It allocates; the
// counters keep the two parts apart and join them at scrape time.
func (r *Result) Policy() string { return policyLabel(r.PolicyNamespace, r.PolicyName) }

func policyLabel(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// Classifier classifies flows. It keeps a small cache to pair the
// policy-verdict event and the drop event of one packet, so a Classifier
// is used by one goroutine at a time.
type Classifier struct {
	topo Topology
	node string
	seed maphash.Seed
	// pairs is a direct-mapped cache of recent drop-type events by packet
	// tuple; see pair.
	pairs [1024]pairSlot
}

type pairSlot struct {
	key  uint64
	kind int32
	at   int64
}

// pairWindow is how far apart (flow time) the policy-verdict and drop
// events of one packet may be; both are stamped when the agent reads them,
// microseconds apart, while a retransmission comes a second later.
const pairWindow = int64(500e6)

// NewClassifier returns a classifier joining flows with topo. node is this
// exporter's node (DaemonSet mode): flows observed on other nodes are not
// counted, and a flow without node_name is taken as observed there. Empty
// node accepts every node's flows (Relay, files).
func NewClassifier(topo Topology, node string) *Classifier {
	return &Classifier{topo: topo, node: observingNode(node), seed: maphash.MakeSeed()}
}

// Classify classifies f without allocating.
func (c *Classifier) Classify(f *flowpb.Flow) Result {
	x := FieldsOf(f)
	return c.ClassifyFields(&x)
}

// ClassifyFields classifies a flow's Fields without allocating.
func (c *Classifier) ClassifyFields(f *Fields) Result { return c.classify(f, true) }

// classify classifies f; pairing says whether a drop event is paired with
// the other event of its packet (not again when a held flow is retried:
// its pairing was decided when it arrived).
func (c *Classifier) classify(f *Fields, pairing bool) Result {
	var r Result
	r.Node = observingNode(f.NodeName)
	if r.Node == "" {
		r.Node = c.node
	}
	src, dst := &f.Src, &f.Dst
	srcAddr, dstAddr := parseAddr(f.SrcIP), parseAddr(f.DstIP)
	var srcOK, dstOK bool
	r.Src, srcOK = c.resolve(srcAddr, src)
	r.Dst, dstOK = c.resolve(dstAddr, dst)
	r.SrcUnresolved = !srcOK && !isWorld(src) && !linkScope(srcAddr)
	r.DstUnresolved = !dstOK && !isWorld(dst) && !linkScope(dstAddr)
	srcLocal := isLocal(r.Src, src, r.Node)
	dstLocal := isLocal(r.Dst, dst, r.Node)
	r.Direction = direction(f.Direction)
	r.Locality = topology.Locality(r.Src, r.Dst)

	event := f.EventType
	switch {
	case c.node != "" && r.Node != c.node:
		// another node's flow (a DaemonSet pointed at Relay)
	case f.Verdict == flowpb.Verdict_FORWARDED:
		if countForwarded(f, event, srcLocal, dstLocal) {
			r.Count, r.Verdict = Forwarded, VerdictForwarded
		}
	case f.Verdict == flowpb.Verdict_DROPPED && event == eventL7:
		// An L7 denial (HTTP 403, DNS refused by an L7 policy): the proxy
		// refused a request on a forwarded connection; no packet was
		// dropped. Not counted (the client does not even ask for them).
	case f.Verdict == flowpb.Verdict_DROPPED:
		if pairing && (event == eventDrop || event == eventPolicyVerdict) && c.pair(f, event) {
			break // the other event of this packet counted it
		}
		r.Count, r.Verdict = Dropped, VerdictDropped
		r.Reason = policyReason(f)
		if r.Reason != "" {
			r.PolicyNamespace, r.PolicyName = deniedBy(f)
		}
	}

	// The local side: the sender of a counted forward; otherwise the side
	// on this node, by the direction when both are.
	switch {
	case r.Count == Forwarded || (srcLocal && !dstLocal):
		r.Local = SideSource
	case dstLocal && !srcLocal:
		r.Local = SideDestination
	case srcLocal && dstLocal && r.Direction == DirectionIngress:
		r.Local = SideDestination
	case srcLocal && dstLocal:
		r.Local = SideSource
	}
	local, peer := r.Src.Job, r.Dst.Job
	if r.Local == SideDestination {
		local, peer = peer, local
	}
	r.Job = local
	if r.Job == nil {
		r.Job = peer
	}
	r.Peer, r.PeerNamespace, r.PeerWorkload = peerOf(&r, src, dst)
	return r
}

// peerOf relates the side that is not r.Job's to r.Job. The counters and
// analyze both read it, so "between the job's own pods" means one thing.
func peerOf(r *Result, src, dst *EndpointFields) (relation, namespace, workload string) {
	if r.Job == nil {
		return PeerUnknown, "", ""
	}
	if r.Src.Job == r.Job && r.Dst.Job == r.Job {
		return PeerJob, "", ""
	}
	e, ep := r.Dst, dst
	if r.Src.Job != r.Job {
		e, ep = r.Src, src
	}
	// The index first: an address it places (a pod, a node address, a
	// pod CIDR with the cilium_host router) is the cluster's whatever
	// identity Hubble gave it; Cilium v1.20 shows world (2) for a remote
	// node's router address (docs/hubble.md).
	switch {
	case e.Job != nil:
		return PeerCluster, e.Job.Namespace, e.Job.Name
	case e.Known():
	case e.Service != nil:
		// A Service's cluster IP with no single backend (the datapath
		// left the VIP: kube-proxy); Hubble calls it world.
		return PeerCluster, "", ""
	case isWorld(ep):
		return PeerWorld, "", ""
	case !clusterIdentity(ep.Identity):
		return PeerUnknown, "", ""
	}
	// A pod the index does not hold (no job), a node, or an endpoint
	// Hubble gave a cluster identity.
	if ep.Workload == "" {
		return PeerCluster, "", ""
	}
	return PeerCluster, ep.Namespace, ep.Workload
}

// countForwarded decides whether a forwarded event is the one count of its
// packet: on the sending side, not a reply, a trace event (policy-verdict,
// L7 and socket events describe the same packets again), at the point
// where the packet leaves the sender's datapath.
func countForwarded(f *Fields, event int32, srcLocal, dstLocal bool) bool {
	if event != eventTrace && event != eventUnknown {
		return false
	}
	if f.Reply {
		return false
	}
	if !srcLocal {
		return false // the receiving node; the sender counts it
	}
	switch f.Point {
	case flowpb.TraceObservationPoint_UNKNOWN_POINT:
		return true // a file without the field: one line per packet
	case flowpb.TraceObservationPoint_TO_ENDPOINT, flowpb.TraceObservationPoint_TO_HOST:
		// Delivered on this node: the sender is here too.
		return true
	case flowpb.TraceObservationPoint_TO_STACK, flowpb.TraceObservationPoint_TO_OVERLAY,
		flowpb.TraceObservationPoint_TO_NETWORK:
		// Leaving the node. For a local destination (legacy host routing)
		// the packet comes back and is counted at to-endpoint.
		return !dstLocal
	default:
		// from-* points (shown without monitor aggregation) precede a to-*
		// point of the same packet; to-proxy and to-crypto are detours.
		return false
	}
}

// pair reports whether f is the second of the policy-verdict and drop
// events of one packet. The first one seen counts (normally the policy
// verdict, which names the policy); either alone counts, so a cluster with
// one of the two event kinds disabled still counts every drop.
func (c *Classifier) pair(f *Fields, event int32) bool {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(f.SrcIP)
	h.WriteByte(0)
	h.WriteString(f.DstIP)
	h.WriteByte(0)
	h.WriteString(f.NodeName)
	sp, dp, proto := f.SrcPort, f.DstPort, f.Proto
	var b [9]byte
	b[0], b[1], b[2], b[3] = byte(sp>>24), byte(sp>>16), byte(sp>>8), byte(sp)
	b[4], b[5], b[6], b[7] = byte(dp>>24), byte(dp>>16), byte(dp>>8), byte(dp)
	b[8] = proto
	h.Write(b[:])
	key := h.Sum64() | 1 // 0 marks an empty slot
	at := f.Time
	s := &c.pairs[key%uint64(len(c.pairs))]
	if s.key == key && s.kind != event {
		if d := at - s.at; d <= pairWindow && d >= -pairWindow {
			*s = pairSlot{}
			return true
		}
	}
	*s = pairSlot{key: key, kind: event, at: at}
	return false
}

// resolve places one side: the flow's IP first, then the flow's
// namespace/pod_name (a job pod whose IP the informer has not seen yet).
func (c *Classifier) resolve(a netip.Addr, ep *EndpointFields) (topology.Endpoint, bool) {
	e, ok := topology.Endpoint{Zone: topology.UnknownZone}, false
	if a.IsValid() {
		e, ok = c.topo.LookupIP(a)
		if ok && e.Job != nil {
			return e, true
		}
	}
	if ep.PodName != "" {
		if pe, found := c.topo.LookupPod(ep.Namespace, ep.PodName); found {
			return pe, true
		}
	}
	return e, ok
}

// parseAddr parses a flow's IP; the zero Addr when empty or invalid.
func parseAddr(s string) netip.Addr {
	if s == "" {
		return netip.Addr{}
	}
	a, _ := netip.ParseAddr(s)
	return a
}

// linkScope reports whether an address is link-local or multicast: the
// addresses of one link (IPv6 neighbour discovery and MLD from fe80::
// to ff02::, which Cilium drops as UNSUPPORTED_L3_PROTOCOL when its IPv6
// is off; IPv4 169.254/16 and 224/4), no endpoint's place in the cluster.
// Such a side is not unresolved. So is the unspecified address (::,
// 0.0.0.0): a pod's MLD reports and duplicate-address probes leave from ::
// before its link-local address is ready (seen on the real-Cilium lab:
// all of the unresolved flows left once link-local was classified).
func linkScope(a netip.Addr) bool {
	return a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified()
}

// isLocal reports whether a side runs on the observing node. A side the
// index cannot place is local when Hubble gave it an endpoint ID, which
// only endpoints of the observing node have.
func isLocal(e topology.Endpoint, ep *EndpointFields, node string) bool {
	if e.Node != "" && node != "" {
		return e.Node == node
	}
	return ep.ID != 0
}

// Reserved identities of addresses outside the cluster, and the scope of
// the identities Cilium allocates on a node for CIDR, FQDN and
// kube-apiserver peers (pkg/identity/numericidentity.go, v1.20:
// IdentityScopeMask 0xFF000000, IdentityScopeLocal 1<<24; remote-node
// identities are scope 2<<24 and cluster-wide ones scope 0).
const (
	identityWorld      = 2
	identityWorldIPv4  = 9
	identityWorldIPv6  = 10
	identityScopeMask  = 0xFF000000
	identityScopeLocal = 1 << 24
)

// clusterIdentity reports whether a security identity belongs to the
// cluster (cilium v1.20 pkg/identity/numericidentity.go): reserved host,
// unmanaged, health, init, remote-node, kube-apiserver and ingress (1-8
// but world), well-known (100-255) and global ones (a pod's, also of
// another mesh cluster), and the remote-node scope (2<<24). The local
// scope (1<<24: CIDR, FQDN) is outside the cluster.
func clusterIdentity(id uint32) bool {
	switch id >> 24 {
	case 0:
		return (id >= 1 && id <= 8 && id != identityWorld) || id >= 100
	case 2:
		return true
	}
	return false
}

// isWorld reports whether a side is outside the cluster: a world identity
// or a local-scope (CIDR/FQDN) one. It decides by the identity, which the
// field mask keeps, so that live flows (masked, no labels) and files
// (whole flows) agree; labels decide only when there is no identity.
func isWorld(ep *EndpointFields) bool {
	switch id := ep.Identity; {
	case id == identityWorld, id == identityWorldIPv4, id == identityWorldIPv6:
		return true
	case id&identityScopeMask == identityScopeLocal:
		return true
	case id != 0:
		return false
	}
	return ep.WorldLabel
}

// observingNode strips the cluster prefix Hubble puts on node names
// ("cluster/node"); Kubernetes node names have no slash.
func observingNode(s string) string {
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func direction(d flowpb.TrafficDirection) string {
	switch d {
	case flowpb.TrafficDirection_INGRESS:
		return DirectionIngress
	case flowpb.TrafficDirection_EGRESS:
		return DirectionEgress
	}
	return DirectionUnknown
}

func policyReason(f *Fields) string {
	r := f.DropReasonDesc
	if r == flowpb.DropReason_DROP_REASON_UNKNOWN {
		r = flowpb.DropReason(f.DropReason) // older flows: the numeric field only
	}
	switch r {
	case flowpb.DropReason_POLICY_DENIED:
		return ReasonPolicyDenied
	case flowpb.DropReason_POLICY_DENY:
		return ReasonPolicyDeny
	case flowpb.DropReason_AUTH_REQUIRED:
		return ReasonAuthRequired
	}
	return ""
}

// deniedBy names the policy that denied the flow, in the direction of the
// drop first.
func deniedBy(f *Fields) (namespace, name string) {
	first, second := f.IngressDeniedBy, f.EgressDeniedBy
	if f.Direction == flowpb.TrafficDirection_EGRESS {
		first, second = second, first
	}
	if first.Name == "" {
		first = second
	}
	return first.Namespace, first.Name
}
