package hubble

import (
	"errors"
	"fmt"
	"unicode/utf8"
	"unsafe"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The GetFlows stream is read straight from the wire: the generated
// decoder builds the whole Flow (strings, nested messages: 26 allocations
// for a masked flow, 69 for a whole one) for the dozen fields zonewatch
// reads. wireResponse takes those fields from the bytes into reused
// storage; responses that carry no flow (lost events, Relay's node status)
// are rare and go through the generated decoder.
//
// The decoder follows protobuf's rules as the generated one applies them
// (google.golang.org/protobuf internal/impl): the last value of a scalar
// wins, a message field seen twice is merged, repeated fields append, a
// oneof member replaces another, a field of the wrong wire type is an
// unknown field, field numbers outside [1, 2^29-1] and a stray end-group
// fail the message, and strings it keeps must be UTF-8 (proto3). Fields it
// does not read are only checked for framing, so a message the generated
// decoder would refuse for a bad string deep in, say, the L7 record, still
// counts by the fields zonewatch reads. Whatever cannot be decoded is
// counted and skipped, and never turns into a flow.

// Wire kinds of a received GetFlows response.
const (
	respFlow      = iota + 1 // Fields hold the flow
	respOther                // full holds a lost_events or node_status response
	respUnknown              // none of the response types the client knows
	respMalformed            // not a valid message: counted and skipped
)

// GetFlowsResponse field numbers (observer.proto, v1.20).
const (
	respFieldFlow       = 1
	respFieldNodeStatus = 2
	respFieldLostEvents = 3
)

var (
	errWire = errors.New("malformed protobuf")
	errUTF8 = errors.New("string field is not valid UTF-8")
)

// maxKeptBuffer bounds the copy of a message kept between messages: a
// single huge message does not pin its size for the stream's life.
const maxKeptBuffer = 64 << 10

// wireResponse is one received GetFlows response, decoded in place: the
// stream hands it to RecvMsg again and again.
type wireResponse struct {
	kind int
	// flow: Fields of a flow response. PodName and the IPs are views of
	// buf, valid until the next message; the strings a result or a counter
	// keeps (node, namespaces, workloads, policies) are interned.
	flow Fields
	// full is a response of another kind, by the generated decoder.
	full observerpb.GetFlowsResponse
	// err says why a message was skipped (respMalformed).
	err error

	buf []byte // the message, copied out of gRPC's buffers
	d   wireDecoder
}

// unmarshal decodes one response from gRPC's buffers.
func (w *wireResponse) unmarshal(data mem.BufferSlice) {
	if cap(w.buf) > maxKeptBuffer {
		w.buf = nil
	}
	w.buf = w.buf[:0]
	for _, b := range data {
		w.buf = append(w.buf, b.ReadOnlyData()...)
	}
	w.decode(w.buf)
}

// decode decodes one response from b; b must stay untouched until the
// next message (the flow's views point into it).
func (w *wireResponse) decode(b []byte) {
	w.err = nil
	kind, from, err := responseKind(b)
	switch {
	case err != nil:
		w.kind, w.err = respMalformed, err
	case kind == respFieldFlow:
		w.kind = respFlow
		if err := w.d.flowOfResponse(b[from:], &w.flow); err != nil {
			w.kind, w.err = respMalformed, err
		}
	case kind == respFieldNodeStatus || kind == respFieldLostEvents:
		w.kind = respOther
		proto.Reset(&w.full)
		if err := proto.Unmarshal(b, &w.full); err != nil {
			w.kind, w.err = respMalformed, err
		}
	default:
		w.kind = respUnknown
	}
}

// DecodeResponse decodes a serialized GetFlowsResponse as the client's
// stream does. ok is false for a response that carries no flow; err says
// why a message is malformed. The pod names and IPs of f are views of b.
func DecodeResponse(b []byte) (f Fields, ok bool, err error) {
	var w wireResponse
	w.decode(b)
	return w.flow, w.kind == respFlow, w.err
}

// responseKind checks a GetFlowsResponse's framing and returns the oneof
// member that the message sets in the end (0: none) and, for a flow, the
// offset after the last other member: the flow occurrences after it merge
// into the flow, earlier ones were replaced.
func responseKind(b []byte) (kind protowire.Number, from int, err error) {
	for i := 0; i < len(b); {
		num, typ, n := consumeTag(b[i:])
		if n < 0 {
			return 0, 0, errWire
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return 0, 0, errWire
		}
		i += n + m
		if typ == protowire.BytesType && num >= respFieldFlow && num <= respFieldLostEvents {
			if num != respFieldFlow {
				// A flow after this member starts afresh: the flow
				// occurrences before it were replaced.
				from = i
			}
			kind = num
		}
	}
	return kind, from, nil
}

// consumeTag reads a field's tag as the generated decoder does: a field
// number outside [1, 2^29-1] or an end-group tag outside a group fails the
// message.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	v, n := consumeVarint(b)
	if n < 0 {
		return 0, 0, -1
	}
	num, typ := v>>3, protowire.Type(v&7)
	if num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) || typ == protowire.EndGroupType {
		return 0, 0, -1
	}
	return protowire.Number(num), typ, n
}

// consumeVarint is protowire.ConsumeVarint with the one- and two-byte
// cases (tags, ports, enums, lengths) inlined.
func consumeVarint(b []byte) (uint64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		return uint64(b[0]), 1
	}
	if len(b) > 1 && b[1] < 0x80 {
		return uint64(b[0]&0x7f) | uint64(b[1])<<7, 2
	}
	return protowire.ConsumeVarint(b)
}

// consumeBytes is protowire.ConsumeBytes over consumeVarint.
func consumeBytes(b []byte) ([]byte, int) {
	m, n := consumeVarint(b)
	if n < 0 || m > uint64(len(b)-n) {
		return nil, -1
	}
	return b[n : n+int(m)], n + int(m)
}

// wireDecoder decodes flows into Fields; it keeps the interned strings.
type wireDecoder struct {
	names interner

	// Scratch of the message being decoded: fields whose final value
	// combines several wire fields.
	sec            int64
	nanos          int32
	isReply, reply bool
	l4             protowire.Number // the Layer4 oneof member set (0: none)
	workloads      [2]bool          // source, destination: a workload seen
	denied         [2]bool          // ingress, egress: a named policy seen
}

// flowOfResponse decodes the flow occurrences of a response (from the
// offset responseKind returned) into f.
func (d *wireDecoder) flowOfResponse(b []byte, f *Fields) error {
	d.reset(f)
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		if num == respFieldFlow && typ == protowire.BytesType {
			v, m := consumeBytes(b)
			if m < 0 {
				return errWire
			}
			if err := d.flow(v, f); err != nil {
				return err
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return errWire
		}
		b = b[m:]
	}
	d.finish(f)
	return nil
}

func (d *wireDecoder) reset(f *Fields) {
	*f = Fields{}
	d.sec, d.nanos, d.isReply, d.reply, d.l4 = 0, 0, false, false, 0
	d.workloads, d.denied = [2]bool{}, [2]bool{}
}

func (d *wireDecoder) finish(f *Fields) {
	if f.HasTime {
		f.Time = d.sec*1e9 + int64(d.nanos)
	}
	f.Reply = d.isReply || d.reply
}

// Flow field numbers (flow.proto, v1.20) that zonewatch reads.
const (
	flowTime             = 1
	flowVerdict          = 2
	flowDropReason       = 3
	flowIP               = 5
	flowL4               = 6
	flowSource           = 8
	flowDestination      = 9
	flowNodeName         = 11
	flowReply            = 16
	flowEventType        = 19
	flowTrafficDirection = 22
	flowObservationPoint = 24
	flowDropReasonDesc   = 25
	flowIsReply          = 26
	flowEgressDeniedBy   = 21004
	flowIngressDeniedBy  = 21005
)

// flow merges one Flow message into f.
func (d *wireDecoder) flow(b []byte, f *Fields) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		var err error
		switch typ {
		case protowire.VarintType:
			var v uint64
			v, n = consumeVarint(b)
			if n < 0 {
				return errWire
			}
			switch num {
			case flowVerdict:
				f.Verdict = flowpb.Verdict(int32(v))
			case flowDropReason:
				f.DropReason = uint32(v)
			case flowReply:
				d.reply = v != 0
			case flowTrafficDirection:
				f.Direction = flowpb.TrafficDirection(int32(v))
			case flowObservationPoint:
				f.Point = flowpb.TraceObservationPoint(int32(v))
			case flowDropReasonDesc:
				f.DropReasonDesc = flowpb.DropReason(int32(v))
			}
		case protowire.BytesType:
			var v []byte
			v, n = consumeBytes(b)
			if n < 0 {
				return errWire
			}
			switch num {
			case flowTime:
				f.HasTime = true
				err = d.timestamp(v)
			case flowIP:
				err = ipFields(v, f)
			case flowL4:
				err = d.layer4(v, f)
			case flowSource:
				err = d.endpoint(v, &f.Src, 0)
			case flowDestination:
				err = d.endpoint(v, &f.Dst, 1)
			case flowNodeName:
				f.NodeName, err = d.names.string(v)
			case flowEventType:
				f.EventType, err = eventType(v, f.EventType)
			case flowIsReply:
				d.isReply, err = boolValue(v, d.isReply)
			case flowIngressDeniedBy:
				err = d.policy(v, &f.IngressDeniedBy, 0)
			case flowEgressDeniedBy:
				err = d.policy(v, &f.EgressDeniedBy, 1)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errWire
			}
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// eachField calls fn for every field of the message b; fn returns the
// bytes it consumed, or 0 to have the field skipped as unknown.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, b []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		m, err := fn(num, typ, b)
		if err != nil {
			return err
		}
		if m == 0 {
			if m = protowire.ConsumeFieldValue(num, typ, b); m < 0 {
				return errWire
			}
		}
		b = b[m:]
	}
	return nil
}

// varint reads a varint field's value.
func varint(b []byte) (uint64, int, error) {
	v, n := consumeVarint(b)
	if n < 0 {
		return 0, 0, errWire
	}
	return v, n, nil
}

// bytesField reads a length-delimited field's value.
func bytesField(b []byte) ([]byte, int, error) {
	v, n := consumeBytes(b)
	if n < 0 {
		return nil, 0, errWire
	}
	return v, n, nil
}

// timestamp merges a google.protobuf.Timestamp.
func (d *wireDecoder) timestamp(b []byte) error {
	sec, nanos, hasSec, hasNanos, err := varints12(b)
	if hasSec {
		d.sec = int64(sec)
	}
	if hasNanos {
		d.nanos = int32(nanos)
	}
	return err
}

// varints12 reads a message's varint fields 1 and 2 (the last of each
// wins), saying which were there; it is read as the fields come, so that
// an error leaves what came before it (and 0 for the field in error).
func varints12(b []byte) (v1, v2 uint64, has1, has2 bool, err error) {
	err = eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.VarintType || (num != 1 && num != 2) {
			return 0, nil
		}
		v, n, err := varint(b)
		if num == 1 {
			v1, has1 = v, true
		} else {
			v2, has2 = v, true
		}
		return n, err
	})
	return v1, v2, has1, has2, err
}

// ipFields merges a flow.IP: source (1) and destination (2).
func ipFields(b []byte, f *Fields) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			return 0, nil
		}
		v, n, err := bytesField(b)
		if err != nil {
			return 0, err
		}
		s, err := view(v)
		if num == 1 {
			f.SrcIP = s
		} else {
			f.DstIP = s
		}
		return n, err
	})
}

// layer4 merges a flow.Layer4: a oneof of TCP (1), UDP (2), ICMPv4 (3),
// ICMPv6 (4), SCTP (5), VRRP (6), IGMP (7). A member replaces another
// and merges with itself.
func (d *wireDecoder) layer4(b []byte, f *Fields) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || num < 1 || num > 7 {
			return 0, nil
		}
		v, n, err := bytesField(b)
		if err != nil {
			return 0, err
		}
		if num != d.l4 {
			d.l4 = num
			f.SrcPort, f.DstPort, f.Proto = 0, 0, 0
		}
		switch num {
		case 1:
			f.Proto = protoTCP
		case 2:
			f.Proto = protoUDP
		case 3:
			f.Proto = protoICMPv4
		case 4:
			f.Proto = protoICMPv6
		case 5:
			f.Proto = protoSCTP
		default: // VRRP, IGMP: no ports
			return n, eachField(v, func(protowire.Number, protowire.Type, []byte) (int, error) { return 0, nil })
		}
		// Every member with ports has them (or ICMP's type and code) as
		// fields 1 and 2, uint32.
		src, dst, hasSrc, hasDst, err := varints12(v)
		if hasSrc {
			f.SrcPort = uint32(src)
		}
		if hasDst {
			f.DstPort = uint32(dst)
		}
		return n, err
	})
}

// endpoint merges a flow.Endpoint: ID (1), identity (2), namespace (3),
// labels (4), pod_name (5), workloads (6); side 0 is the source. A loop of
// its own, not eachField: whole flows carry a dozen labels per side.
func (d *wireDecoder) endpoint(b []byte, e *EndpointFields, side int) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		var err error
		switch {
		case typ == protowire.VarintType && (num == 1 || num == 2):
			var v uint64
			if v, n = consumeVarint(b); n < 0 {
				return errWire
			}
			if num == 1 {
				e.ID = uint32(v)
			} else {
				e.Identity = uint32(v)
			}
		case typ == protowire.BytesType && num >= 3 && num <= 6:
			var v []byte
			if v, n = consumeBytes(b); n < 0 {
				return errWire
			}
			switch num {
			case 3:
				e.Namespace, err = d.names.string(v)
			case 4:
				// Only a world label decides something; others are not
				// kept, nor checked.
				if len(v) >= len(worldLabel) && string(v[:len(worldLabel)]) == worldLabel {
					if !utf8.Valid(v) {
						return errUTF8
					}
					e.WorldLabel = true
				}
			case 5:
				e.PodName, err = view(v)
			case 6:
				err = d.workload(v, e, side)
			}
		default:
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return errWire
			}
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// workload reads one flow.Workload; the first one's name (1) is kept.
func (d *wireDecoder) workload(b []byte, e *EndpointFields, side int) error {
	first := !d.workloads[side]
	d.workloads[side] = true
	return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || num != 1 {
			return 0, nil
		}
		v, n, err := bytesField(b)
		if err != nil {
			return 0, err
		}
		if !first {
			return n, nil
		}
		e.Workload, err = d.names.string(v)
		return n, err
	})
}

// policy reads one flow.Policy of a denied-by list (list 0 ingress, 1
// egress): the first with a name (1) is kept, with its namespace (2).
func (d *wireDecoder) policy(b []byte, p *PolicyRef, list int) error {
	var name, namespace []byte
	err := eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			return 0, nil
		}
		v, n, err := bytesField(b)
		if err != nil {
			return 0, err
		}
		if !utf8.Valid(v) {
			return 0, errUTF8
		}
		if num == 1 {
			name = v
		} else {
			namespace = v
		}
		return n, nil
	})
	if err != nil || d.denied[list] || len(name) == 0 {
		return err
	}
	d.denied[list] = true
	p.Name, _ = d.names.string(name)
	p.Namespace, _ = d.names.string(namespace)
	return nil
}

// eventType reads flow.CiliumEventType's type (1) over the previous value.
func eventType(b []byte, prev int32) (int32, error) {
	err := eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.VarintType || num != 1 {
			return 0, nil
		}
		v, n, err := varint(b)
		prev = int32(v)
		return n, err
	})
	return prev, err
}

// boolValue reads a google.protobuf.BoolValue's value (1) over prev.
func boolValue(b []byte, prev bool) (bool, error) {
	err := eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.VarintType || num != 1 {
			return 0, nil
		}
		v, n, err := varint(b)
		prev = v != 0
		return n, err
	})
	return prev, err
}

// view is b as a string without a copy, for what is only looked up or
// parsed before the next message (pod names, IPs); checked as UTF-8 as
// the generated decoder checks proto3 strings.
func view(b []byte) (string, error) {
	if !utf8.Valid(b) {
		return "", errUTF8
	}
	return unsafe.String(unsafe.SliceData(b), len(b)), nil
}

// maxInterned bounds an interner; when full it starts over (the strings
// already handed out stay valid: they are ordinary strings).
const maxInterned = 4096

// interner hands out one string per distinct value, so that decoding the
// same node, namespace, workload and policy names again allocates nothing.
// The last few values are compared first: a stream repeats them.
type interner struct {
	m      map[string]string
	recent [8]string
	next   int
}

func (in *interner) string(b []byte) (string, error) {
	if len(b) == 0 {
		return "", nil
	}
	for _, s := range in.recent {
		if s == string(b) {
			return s, nil
		}
	}
	s, ok := in.m[string(b)]
	if !ok {
		if !utf8.Valid(b) {
			return "", errUTF8
		}
		if in.m == nil || len(in.m) >= maxInterned {
			in.m = make(map[string]string, 64)
		}
		s = string(b)
		in.m[s] = s
	}
	in.recent[in.next] = s
	in.next = (in.next + 1) % len(in.recent)
	return s, nil
}

// wireCodec is the gRPC codec of the GetFlows call: it decodes into a
// *wireResponse itself and leaves everything else (the request) to gRPC's
// protobuf codec. Its name is "proto", so the server sees the usual
// content type.
type wireCodec struct{ proto encoding.CodecV2 }

func newWireCodec() wireCodec { return wireCodec{encoding.GetCodecV2(grpcproto.Name)} }

func (c wireCodec) Name() string { return grpcproto.Name }

func (c wireCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

// Unmarshal never fails for a *wireResponse: a bad message is a kind of
// response, counted and skipped by the client, not the end of the stream.
func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if w, ok := v.(*wireResponse); ok {
		w.unmarshal(data)
		return nil
	}
	if c.proto == nil {
		return fmt.Errorf("no protobuf codec registered for %T", v)
	}
	return c.proto.Unmarshal(data, v)
}
