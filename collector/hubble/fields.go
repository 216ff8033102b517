package hubble

import (
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// Fields are the parts of a Hubble flow that zonewatch reads: what
// classification, pairing and the resume marks use, and nothing else. The
// stream's wire decoder (wire.go) fills them straight from the protobuf
// bytes; FieldsOf takes them from a decoded Flow (files, tests). Both obey
// protobuf's merge rules, so the two agree on every message (wire_test.go,
// FuzzWireDecode).
type Fields struct {
	// Time is flow.time in unix nanoseconds (seconds*1e9 + nanos, as
	// int64 arithmetic); HasTime says whether the flow has a time at all.
	Time    int64
	HasTime bool
	// NodeName is the observing node as Hubble names it ("cluster/node").
	NodeName string

	Verdict        flowpb.Verdict
	DropReason     uint32 // the deprecated numeric field of older flows
	DropReasonDesc flowpb.DropReason
	EventType      int32 // event_type.type: a Cilium monitor message type
	Direction      flowpb.TrafficDirection
	Point          flowpb.TraceObservationPoint
	// Reply is is_reply.value or the deprecated reply.
	Reply bool

	SrcIP, DstIP string
	// SrcPort and DstPort are ICMP's type and code; Proto is the IP
	// protocol of the layer-4 header Hubble decoded (0: none or another).
	SrcPort, DstPort uint32
	Proto            uint8

	Src, Dst EndpointFields

	// IngressDeniedBy and EgressDeniedBy are the first policy with a name
	// in each of the two lists.
	IngressDeniedBy, EgressDeniedBy PolicyRef
}

// EndpointFields are the parts of a flow's source or destination that
// zonewatch reads.
type EndpointFields struct {
	ID, Identity       uint32
	Namespace, PodName string
	// Workload is the name of the first workload (empty when none).
	Workload string
	// WorldLabel: a label starts with "reserved:world" (whole flows only;
	// the field mask drops labels).
	WorldLabel bool
}

// PolicyRef names a policy.
type PolicyRef struct{ Namespace, Name string }

// IP protocol numbers of the layer-4 headers Hubble decodes.
const (
	protoICMPv4 = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
	protoSCTP   = 132
)

// worldLabel starts the labels of Cilium's world identities
// (reserved:world, reserved:world-ipv4, reserved:world-ipv6).
const worldLabel = "reserved:world"

// FieldsOf takes the Fields of a decoded flow, without allocating.
func FieldsOf(f *flowpb.Flow) Fields {
	x := Fields{
		NodeName:        f.GetNodeName(),
		Verdict:         f.GetVerdict(),
		DropReason:      f.GetDropReason(),
		DropReasonDesc:  f.GetDropReasonDesc(),
		EventType:       f.GetEventType().GetType(),
		Direction:       f.GetTrafficDirection(),
		Point:           f.GetTraceObservationPoint(),
		Reply:           f.GetIsReply().GetValue() || f.GetReply(),
		SrcIP:           f.GetIP().GetSource(),
		DstIP:           f.GetIP().GetDestination(),
		Src:             endpointFieldsOf(f.GetSource()),
		Dst:             endpointFieldsOf(f.GetDestination()),
		IngressDeniedBy: firstNamed(f.GetIngressDeniedBy()),
		EgressDeniedBy:  firstNamed(f.GetEgressDeniedBy()),
	}
	if t := f.GetTime(); t != nil {
		x.Time, x.HasTime = t.GetSeconds()*1e9+int64(t.GetNanos()), true
	}
	switch p := f.GetL4().GetProtocol().(type) {
	case *flowpb.Layer4_TCP:
		x.SrcPort, x.DstPort, x.Proto = p.TCP.GetSourcePort(), p.TCP.GetDestinationPort(), protoTCP
	case *flowpb.Layer4_UDP:
		x.SrcPort, x.DstPort, x.Proto = p.UDP.GetSourcePort(), p.UDP.GetDestinationPort(), protoUDP
	case *flowpb.Layer4_SCTP:
		x.SrcPort, x.DstPort, x.Proto = p.SCTP.GetSourcePort(), p.SCTP.GetDestinationPort(), protoSCTP
	case *flowpb.Layer4_ICMPv4:
		x.SrcPort, x.DstPort, x.Proto = p.ICMPv4.GetType(), p.ICMPv4.GetCode(), protoICMPv4
	case *flowpb.Layer4_ICMPv6:
		x.SrcPort, x.DstPort, x.Proto = p.ICMPv6.GetType(), p.ICMPv6.GetCode(), protoICMPv6
	}
	return x
}

func endpointFieldsOf(ep *flowpb.Endpoint) EndpointFields {
	e := EndpointFields{ID: ep.GetID(), Identity: ep.GetIdentity(), Namespace: ep.GetNamespace(), PodName: ep.GetPodName()}
	if ws := ep.GetWorkloads(); len(ws) > 0 {
		e.Workload = ws[0].GetName()
	}
	for _, l := range ep.GetLabels() {
		if strings.HasPrefix(l, worldLabel) {
			e.WorldLabel = true
			break
		}
	}
	return e
}

func firstNamed(list []*flowpb.Policy) PolicyRef {
	for _, p := range list {
		if p.GetName() != "" {
			return PolicyRef{p.GetNamespace(), p.GetName()}
		}
	}
	return PolicyRef{}
}
