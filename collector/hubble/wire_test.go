package hubble

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	relaypb "github.com/cilium/cilium/api/v1/relay"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
)

// agree decodes a serialized GetFlowsResponse with the generated decoder
// and the wire decoder and reports how they differ; generatedOK is false
// when the generated decoder refuses the message (the wire decoder may
// then accept it: it does not look into the fields it skips).
func agree(b []byte) (generatedOK bool, diff string) {
	var resp observerpb.GetFlowsResponse
	if proto.Unmarshal(b, &resp) != nil {
		DecodeResponse(b) // must not panic
		return false, ""
	}
	got, ok, err := DecodeResponse(b)
	if err != nil {
		return true, "the wire decoder refused a message the generated one took: " + err.Error()
	}
	if ok != (resp.GetFlow() != nil) {
		return true, "the decoders disagree on whether the response is a flow"
	}
	if !ok {
		return true, ""
	}
	if want := FieldsOf(resp.GetFlow()); got != want {
		return true, "fields differ:\n  wire      " + fieldsString(got) + "\n  generated " + fieldsString(want)
	}
	return true, ""
}

func fieldsString(f Fields) string { return fmt.Sprintf("%+v", f) }

// checkAgree fails t when the decoders disagree on b.
func checkAgree(t *testing.T, name string, b []byte) {
	t.Helper()
	ok, diff := agree(b)
	if !ok {
		t.Errorf("%s: the generated decoder refused a test message", name)
	}
	if diff != "" {
		t.Errorf("%s: %s", name, diff)
	}
}

func responseOf(f *flowpb.Flow) *observerpb.GetFlowsResponse {
	return &observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: f}, NodeName: f.GetNodeName(), Time: f.GetTime()}
}

func marshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// testFlows are the hand-made flows of this package's tests, whole and
// under the field mask.
func testFlows(tb testing.TB) map[string]*flowpb.Flow {
	d := flowOf("gpu-b1", llmWorker, llmMaster, flowpb.Verdict_DROPPED, eventPolicyVerdict)
	d.DropReasonDesc, d.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
	d.IngressDeniedBy = []*flowpb.Policy{{Name: ""}, {Namespace: "ml-team", Name: "zone-isolation"}}
	d.EgressDeniedBy = []*flowpb.Policy{{Namespace: "other", Name: "egress-fence"}}
	udp := trace("gpu-a1", resWorker, resMaster, flowpb.TraceObservationPoint_TO_ENDPOINT, true)
	udp.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 53, DestinationPort: 40000}}}
	icmp := policyDrop("gpu-b1", llmWorker, llmMaster)
	icmp.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv6{ICMPv6: &flowpb.ICMPv6{Type: 133}}}
	icmp.DropReason, icmp.DropReasonDesc = 139, flowpb.DropReason_UNSUPPORTED_L3_PROTOCOL
	sctp := trace("cpu-a1", frontend, resMaster, flowpb.TraceObservationPoint_TO_STACK, false)
	sctp.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_SCTP{SCTP: &flowpb.SCTP{SourcePort: 1, DestinationPort: 2}}}
	sctp.Reply = true
	world := trace("cpu-a1", frontend, resMaster, flowpb.TraceObservationPoint_TO_STACK, false)
	world.Destination = &flowpb.Endpoint{Labels: []string{"k8s:app=x", "reserved:world-ipv4"}}
	world.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_IGMP{IGMP: &flowpb.IGMP{Type: 1}}}
	out := map[string]*flowpb.Flow{"typical": typicalFlow(), "heavy": heavyFlow(), "policy-verdict": d, "udp-reply": udp,
		"icmpv6": icmp, "sctp": sctp, "world-label": world, "empty": {}}
	for name, f := range out {
		if m, err := sim.MaskFlow(f, FieldMaskPaths); err == nil {
			out[name+"-masked"] = m
		} else {
			tb.Fatal(err)
		}
	}
	return out
}

func TestWireDecoderAgreesOnTestFlows(t *testing.T) {
	for name, f := range testFlows(t) {
		checkAgree(t, name, marshal(t, responseOf(f)))
	}
}

// Protobuf's rules where a message repeats what it says: each case is
// bytes as a sender may write them (concatenated messages merge).
func TestWireDecoderMergeRules(t *testing.T) {
	flow := func(f *flowpb.Flow) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), marshal(t, f))
	}
	lost := protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), marshal(t, &flowpb.LostEvent{NumEventsLost: 3}))
	status := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), marshal(t, &relaypb.NodeStatusEvent{StateChange: relaypb.NodeState_NODE_CONNECTED}))
	a, b := typicalFlow(), heavyFlow()
	b.Source.Workloads = []*flowpb.Workload{{Name: "second"}}
	b.IP.Destination = ""
	b.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{DestinationPort: 9}}}
	c := &flowpb.Flow{L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 7}}}, Time: &timestamppb.Timestamp{Nanos: 5}}
	wrongType := protowire.AppendVarint(protowire.AppendTag(nil, flowSource, protowire.VarintType), 7)               // source as a varint: unknown
	group := protowire.AppendTag(protowire.AppendTag(nil, 77, protowire.StartGroupType), 77, protowire.EndGroupType) // an unknown group
	unknownMember := protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), []byte{8, 1})
	cases := map[string][]byte{
		"two flows merge":                append(flow(a), flow(b)...),
		"three flows merge":              bytes.Join([][]byte{flow(a), flow(b), flow(c)}, nil),
		"a flow replaced by lost events": append(flow(a), lost...),
		"lost events replaced by a flow": append(lost, flow(b)...),
		"flow, status, flow":             bytes.Join([][]byte{flow(a), status, flow(c)}, nil),
		"flow, status, flow, flow":       bytes.Join([][]byte{flow(a), status, flow(b), flow(c)}, nil),
		"a field of the wrong wire type": flow(&flowpb.Flow{}),
		"unknown member after a flow":    append(flow(a), unknownMember...),
		"unknown member only":            unknownMember,
		"empty response":                 nil,
		"node name and time only":        marshal(t, &observerpb.GetFlowsResponse{NodeName: "x", Time: timestamppb.Now()}),
	}
	inner := append(append(marshal(t, a), wrongType...), group...)
	cases["a field of the wrong wire type"] = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), inner)
	for name, bs := range cases {
		checkAgree(t, name, bs)
	}
	// The merge is seen: the second flow's workload does not replace the
	// first's, its UDP replaces the first's TCP.
	got, _, _ := DecodeResponse(cases["two flows merge"])
	if got.Src.Workload != "bert-slow" || got.Proto != protoUDP || got.SrcPort != 0 || got.DstPort != 9 || got.DstIP != a.GetIP().GetDestination() {
		t.Errorf("merged flow %+v", got)
	}
}

// Messages the generated decoder refuses are refused, not half-read.
func TestWireDecoderRefusesMalformed(t *testing.T) {
	good := marshal(t, responseOf(typicalFlow()))
	badUTF8 := responseOf(maskedFlow(t))
	badUTF8.GetFlow().NodeName = "gpu\xff"
	for name, b := range map[string][]byte{
		"truncated":         good[:len(good)-3],
		"field number 0":    append([]byte{0x02, 0x00}, good...),
		"stray end group":   append(bytes.Clone(good), 0x0c),
		"bad node name":     mustMarshalInvalid(t, badUTF8),
		"overlong varint":   append(bytes.Clone(good), 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f),
		"length past end":   {0x0a, 0x7f, 0x01},
		"invalid wire type": {0x0f},
	} {
		if _, _, err := DecodeResponse(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
		var resp observerpb.GetFlowsResponse
		if proto.Unmarshal(b, &resp) == nil {
			t.Errorf("%s: the generated decoder takes it: not a malformed case", name)
		}
	}
}

// mustMarshalInvalid marshals a message with an invalid UTF-8 string
// (proto.Marshal refuses; the wire has no such check).
func mustMarshalInvalid(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.MarshalOptions{}.Marshal(m)
	if err == nil {
		return b
	}
	// Build it by hand: node_name (11) inside the flow (1).
	f := protowire.AppendString(protowire.AppendTag(nil, flowNodeName, protowire.BytesType), "gpu\xff")
	return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), f)
}

// realResponses are the held-in real Hubble lines as the wire carries
// them: each JSON line marshalled as a GetFlowsResponse (a bare flow
// wrapped), whole and under the field mask.
func realResponses(t *testing.T) map[string][]byte {
	dir := testenv.RealData(t, "hubble")
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) == 0 {
		t.Fatalf("no Hubble capture in %s", dir)
	}
	out := map[string][]byte{}
	for _, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			if len(bytes.TrimSpace(sc.Bytes())) == 0 {
				continue
			}
			resp := &observerpb.GetFlowsResponse{}
			if err := jsonOpts.Unmarshal(sc.Bytes(), resp); err != nil || resp.GetResponseTypes() == nil {
				f := &flowpb.Flow{}
				if err := jsonOpts.Unmarshal(sc.Bytes(), f); err != nil {
					t.Fatalf("%s:%d: %v", path, n, err)
				}
				resp = responseOf(f)
			}
			name := fmt.Sprintf("%s:%d", filepath.Base(path), n)
			out[name] = marshal(t, resp)
			if f := resp.GetFlow(); f != nil {
				m, err := sim.MaskFlow(f, FieldMaskPaths)
				if err != nil {
					t.Fatal(err)
				}
				out[name+"-masked"] = marshal(t, responseOf(m))
			}
		}
	}
	return out
}

func TestWireDecoderAgreesOnRealData(t *testing.T) {
	rs := realResponses(t)
	flows := 0
	for name, b := range rs {
		checkAgree(t, name, b)
		if _, ok, _ := DecodeResponse(b); ok {
			flows++
		}
	}
	if flows == 0 {
		t.Fatal("no flow in the real data")
	}
	t.Logf("%d real responses, %d flows, decoded alike", len(rs), flows)
}

// rawCodec hands a test the bytes of each message as received.
type rawCodec struct{ encoding.CodecV2 }

type rawMessage struct{ b []byte }

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawMessage); ok {
		r.b = data.Materialize()
		return nil
	}
	return c.CodecV2.Unmarshal(data, v)
}

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*rawMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(r.b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// capture follows sock with req and returns the first n responses'
// bytes, as the server encoded them.
func capture(t *testing.T, sock string, req *observerpb.GetFlowsRequest, n int) [][]byte {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := observerpb.NewObserverClient(conn).GetFlows(ctx, req, grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)}))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for len(out) < n {
		var m rawMessage
		if err := stream.RecvMsg(&m); err != nil {
			t.Fatalf("after %d responses: %v", len(out), err)
		}
		out = append(out, m.b)
	}
	return out
}

// The simulation's flows, as its Observer sends them over gRPC with and
// without the mask, decode alike.
func TestWireDecoderAgreesOnTheSimulatedStream(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	n := h.Generate(t0, 10*time.Second)
	h.SendLost(flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, 2)
	for _, mask := range []bool{true, false} {
		// No filter: every flow the simulation makes, and the lost event.
		req := &observerpb.GetFlowsRequest{Since: timestamppb.New(t0.Add(-time.Second))}
		if mask {
			req.FieldMask = &fieldmaskpb.FieldMask{Paths: FieldMaskPaths}
		}
		flows := 0
		for i, b := range capture(t, sock, req, n+1) {
			checkAgree(t, fmt.Sprintf("mask=%v response %d", mask, i), b)
			if _, ok, _ := DecodeResponse(b); ok {
				flows++
			}
		}
		if flows != n {
			t.Errorf("mask=%v: %d flows decoded, want %d", mask, flows, n)
		}
	}
}

// rawObserver serves GetFlows with the bytes it is given, as a server
// with a bug or of a newer version might send them.
func rawObserver(t *testing.T, responses ...[]byte) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "zwr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "h.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)}))
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "observer.Observer", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "GetFlows", ServerStreams: true, Handler: func(_ any, stream grpc.ServerStream) error {
			var req rawMessage
			if err := stream.RecvMsg(&req); err != nil {
				return err
			}
			for _, b := range responses {
				if err := stream.SendMsg(&rawMessage{b}); err != nil {
					return err
				}
			}
			<-stream.Context().Done()
			return nil
		}}}}, nil)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return sock
}

// A malformed message or a response type the client does not know is
// counted and skipped; the stream goes on and the flows around it count.
func TestWireCodecSkipsMalformedAndUnknownResponses(t *testing.T) {
	flow := func(sec int) []byte {
		f := trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
		f.Time = timestamppb.New(t0.Add(time.Duration(sec) * time.Second))
		return marshal(t, responseOf(f))
	}
	malformed := flow(2)
	malformed = malformed[:len(malformed)-1] // truncated
	unknown := protowire.AppendBytes(protowire.AppendTag(nil, 9, protowire.BytesType), []byte{8, 1})
	sock := rawObserver(t, flow(1), malformed, unknown, flow(3))
	agg := NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
	c := NewClient(Config{Address: "unix://" + sock, Since: t0, BackoffMin: time.Minute, BackoffMax: time.Minute}, agg)
	runClient(t, c)
	m := agg.Metrics()
	waitFor(t, "both flows and both skipped responses", func() bool {
		return testutil.ToFloat64(m.Processed) == 2 && testutil.ToFloat64(m.Malformed) == 1 && testutil.ToFloat64(m.Unknown) == 1
	})
	if !c.Up() || testutil.ToFloat64(m.Reconnects) != 0 {
		t.Errorf("the stream broke on a skipped response: up %v, reconnects %v", c.Up(), testutil.ToFloat64(m.Reconnects))
	}
	var events float64
	agg.Events().Each(func(_ EventKey, v float64) { events += v })
	if events != 2 {
		t.Errorf("%v flow events counted, want the 2 valid flows", events)
	}
}

// The stream's path from gRPC's buffers to the counters allocates nothing
// once the strings are interned and the series exist, masked or whole.
func TestWireReceiveDoesNotAllocate(t *testing.T) {
	drop := policyDrop("gpu-b1", llmWorker, llmMaster)
	drop.Time = timestamppb.New(t0)
	for name, f := range map[string]*flowpb.Flow{"typical": typicalFlow(), "masked": maskedFlow(t), "heavy": heavyFlow(), "policy-drop": drop} {
		cl := NewClient(Config{}, NewAggregator(indexOf(testScenario()), "", time.Minute, nil))
		codec := newWireCodec()
		resp := &wireResponse{}
		data := mem.BufferSlice{mem.SliceBuffer(wireBytes(t, f))}
		receive := func() {
			if err := codec.Unmarshal(data, resp); err != nil || resp.kind != respFlow {
				t.Fatalf("%s: kind %d, %v", name, resp.kind, resp.err)
			}
			cl.receive(resp)
		}
		receive()
		if n := testing.AllocsPerRun(100, receive); n != 0 {
			t.Errorf("%s: %v allocations per flow", name, n)
		}
	}
}
