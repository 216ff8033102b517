package hubble

// Tests of the five points where the client differed from Cilium's Hubble
// server (issue 17). The fake Observer (sim) applies Cilium's own field
// mask (pkg/hubble/parser/fieldmask, v1.20.2), starts a follow two entries
// back and replays stored lost events like pkg/hubble/observer; the
// module internal/hubblepeer runs the same cases against Cilium's
// observer itself.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	relaypb "github.com/cilium/cilium/api/v1/relay"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
)

func lostTotal(m *Metrics) (v float64) {
	for _, c := range m.lost {
		v += testutil.ToFloat64(c)
	}
	return v
}

// Hubble stores perf-ring and events-queue LostEvents in its ring and
// sends them again to a since request with no time filter
// (local_observer.go eventsReader.Next); a reconnect must not count them
// twice.
func TestLostEventsNotRecountedAfterReconnect(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "gpu-a1", 0)
	agg := NewAggregator(indexOf(s), "gpu-a1", time.Minute, nil)
	c := follow(t, sock, agg, true)
	h.Generate(t0, 2*time.Second)
	h.SendLost(flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, 7)
	h.SendLost(flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE, 3)
	m := agg.Metrics()
	waitFor(t, "lost events", func() bool { return lostTotal(m) == 10 })

	h.Stop()
	waitFor(t, "the client to notice", func() bool { return !c.Up() })
	h.SendLost(flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, 2) // during the gap
	if err := h.Start(sock); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reconnect", c.Up)
	h.Generate(t0.Add(2*time.Second), time.Second)
	// The stream is in ring order: once the flows after the gap are in,
	// every lost event before them is too.
	waitFor(t, "the gap's lost events and the flows after them", func() bool { return lostTotal(m) >= 12 && delivered([]*sim.Hubble{h}, c) })
	if got := lostTotal(m); got != 12 {
		t.Errorf("lost events = %v after the reconnect, want 12 (10 + 2 in the gap)", got)
	}
	if testutil.ToFloat64(c.m.SkippedLostReplayed) == 0 {
		t.Error("no lost event was replayed: the test does not exercise the replay")
	}
}

// Cilium's fieldmask.New fails the whole GetFlows call for a path its
// Flow lacks ("invalid fieldmask"); the client falls back to whole flows
// at once, logs and counts it once.
func TestFieldMaskRefusedFallsBackToWholeFlows(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	var logs testenv.SyncBuffer
	c := NewClient(Config{Address: "unix://" + sock, Since: t0.Add(-time.Second), FieldMask: []string{"time", "verdict_v2"},
		BackoffMin: time.Second, BackoffMax: 2 * time.Second, Logger: newTestLogger(&logs)}, agg)
	runClient(t, c)
	h.Generate(t0, 5*time.Second)
	settle(t, 5, []*sim.Hubble{h}, c) // within the 20 s wait: no backoff, no retry loop
	if got := testutil.ToFloat64(agg.Metrics().FieldMaskRefused); got != 1 {
		t.Errorf("field mask refusals = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "refused the field mask"); n != 1 {
		t.Errorf("logged the refusal %d times, want once:\n%s", n, logs.String())
	}
	if got := testutil.ToFloat64(agg.Metrics().Reconnects); got != 0 {
		t.Errorf("reconnects = %v, want 0", got)
	}
}

// A follow without since starts two ring entries back in Cilium
// (container.Ring.LastWriteParallel), and so in the fake: a restarted
// exporter must not count those again.
func TestFirstConnectionSkipsTheRingsNewestOldFlows(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	// Two counted-looking flows from before the exporter started.
	for range 2 {
		f := trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
		f.Time = timestamppb.Now()
		h.Publish(f)
	}
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	c := NewClient(Config{Address: "unix://" + sock, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, agg)
	runClient(t, c)
	// The server has placed the stream (two entries back) and sent them.
	waitFor(t, "the stream and the two older flows it starts with", func() bool {
		return h.Streams().Flows == 2 && delivered([]*sim.Hubble{h}, c)
	})
	h.Generate(time.Now().Add(time.Second), time.Second)
	settle(t, 1, []*sim.Hubble{h}, c) // bert's worker -> coordinator events: the second's only
	if testutil.ToFloat64(c.m.SkippedEarly) != 2 {
		t.Errorf("%v flows from before the start skipped, want the 2 the server sent first", testutil.ToFloat64(c.m.SkippedEarly))
	}
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// runClient runs c until the test ends.
func runClient(t *testing.T, c *Client) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// World is decided the same live (masked flows: no labels) and offline
// (whole flows from a file): a local-scope identity (CIDR, FQDN,
// kube-apiserver peers) is outside the cluster.
func TestWorldSameMaskedAndWhole(t *testing.T) {
	s := testScenario()
	x := indexOf(s)
	for _, peer := range []*flowpb.Endpoint{
		{Identity: 1<<24 | 5, Labels: []string{"cidr:198.51.100.77/32", "reserved:world-ipv4"}},                            // CIDR
		{Identity: 1<<24 | 9, Labels: []string{"fqdn:*.s3.amazonaws.com", "reserved:world"}},                               // FQDN
		{Identity: 1<<24 | 11, Labels: []string{"reserved:kube-apiserver", "cidr:203.0.113.10/32", "reserved:world-ipv4"}}, // managed control plane
		{Identity: 2, Labels: []string{"reserved:world"}},
	} {
		f := flowOf("gpu-a1", bertWorker, bertCoord, flowpb.Verdict_FORWARDED, eventTrace)
		f.IP.Destination = "198.51.100.77"
		f.Destination = peer
		f.TraceObservationPoint = flowpb.TraceObservationPoint_TO_STACK
		masked, err := sim.MaskFlow(f, FieldMaskPaths)
		if err != nil {
			t.Fatal(err)
		}
		if len(masked.GetDestination().GetLabels()) != 0 {
			t.Fatal("the mask kept the labels")
		}
		// Offline: the whole flow through the file reader.
		line, _ := protojson.Marshal(&observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: f}})
		var whole Result
		if _, err := ReadFlows(bytes.NewReader(line), func(f *flowpb.Flow) { whole = NewClassifier(x, "").Classify(f) }); err != nil {
			t.Fatal(err)
		}
		live := NewClassifier(x, "").Classify(masked)
		if live.DstUnresolved || whole.DstUnresolved || live != whole {
			t.Errorf("identity %d: live %+v\noffline %+v", peer.GetIdentity(), live, whole)
		}
	}
	// A cluster identity the index cannot place stays unresolved, and a
	// remote-node identity (scope 2<<24) is not the world.
	for _, id := range []uint32{48213, 2<<24 | 3} {
		f := flowOf("gpu-a1", bertWorker, bertCoord, flowpb.Verdict_FORWARDED, eventTrace)
		f.IP.Destination, f.Destination = "10.250.0.9", &flowpb.Endpoint{Identity: id}
		if r := NewClassifier(x, "").Classify(f); !r.DstUnresolved {
			t.Errorf("identity %d: not unresolved", id)
		}
	}
}

// L7 denials (type 129, verdict DROPPED, no drop reason: HTTP 403 or DNS
// refused by an L7 policy) are requests the proxy refused on a forwarded
// connection, not dropped packets: not asked for, not counted.
func TestL7DenialNotCounted(t *testing.T) {
	s := testScenario()
	f := flowOf("gpu-a1", bertWorker, bertCoord, flowpb.Verdict_DROPPED, eventL7)
	f.Type = flowpb.FlowType_L7
	f.L7 = &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{Code: 403, Method: "GET"}}}
	if r := NewClassifier(indexOf(s), "").Classify(f); r.Count != NotCounted {
		t.Errorf("an L7 denial counted as %v", r.Count)
	}
	// The whitelist does not ask for them (the fake applies event types
	// like Cilium's filters).
	h, sock := startHubble(t, s, "", 0)
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	c := follow(t, sock, agg, true)
	f.Time = timestamppb.New(t0)
	drop := flowOf("gpu-c1", bertWorker, bertCoord, flowpb.Verdict_DROPPED, eventDrop)
	drop.Time = timestamppb.New(t0.Add(time.Second))
	h.Publish(f, drop)
	waitFor(t, "the drop and every flow sent", func() bool {
		return testutil.ToFloat64(agg.Metrics().Processed) >= 1 && delivered([]*sim.Hubble{h}, c)
	})
	if got := testutil.ToFloat64(agg.Metrics().Processed); got != 1 {
		t.Errorf("processed %v flows, want 1 (the drop, not the L7 denial)", got)
	}
}

func ExampleWhitelist() {
	for _, f := range Whitelist() {
		fmt.Println(f.GetVerdict(), f.GetEventType(), f.GetReply())
	}
	// Output:
	// [FORWARDED] [type:4] [false]
	// [DROPPED] [type:1 type:5] []
}

// relayRefusingMask answers GetFlows as Relay does when one node refuses
// the mask (v1.20.2 pkg/hubble/relay/observer/observer.go nodeStatusError:
// a NODE_ERROR status with the node's error message; the other nodes'
// flows go on): with a mask, a flow of gpu-a1 then gpu-b1's error, and
// the stream stays open; without, both nodes' flows.
type relayRefusingMask struct {
	observerpb.UnimplementedObserverServer
	calls atomic.Int32
}

func (r *relayRefusingMask) GetFlows(req *observerpb.GetFlowsRequest, stream grpc.ServerStreamingServer[observerpb.GetFlowsResponse]) error {
	r.calls.Add(1)
	flow := func(node string, sec int) *observerpb.GetFlowsResponse {
		f := trace(node, bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
		if node == "gpu-c1" {
			f = trace(node, bertCoord, bertWorker, flowpb.TraceObservationPoint_TO_OVERLAY, false)
		}
		f.Time = timestamppb.New(t0.Add(time.Duration(sec) * time.Second))
		return &observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: f}, NodeName: f.NodeName, Time: f.Time}
	}
	if len(req.GetFieldMask().GetPaths()) > 0 {
		if err := stream.Send(flow("gpu-a1", 1)); err != nil {
			return err
		}
		if err := stream.Send(&observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_NodeStatus{NodeStatus: &relaypb.NodeStatusEvent{
			StateChange: relaypb.NodeState_NODE_ERROR, NodeNames: []string{"prod/gpu-c1"}, Message: "invalid fieldmask"}}}); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	for _, resp := range []*observerpb.GetFlowsResponse{flow("gpu-a1", 1), flow("gpu-c1", 2), flow("gpu-a1", 3)} {
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
	<-stream.Context().Done()
	return nil
}

// Through Relay a node's refusal arrives as a node status, not as the
// call's error: the client drops the mask, restarts the stream and
// resumes after what it counted.
func TestFieldMaskRefusedThroughRelay(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	relay := &relayRefusingMask{}
	observerpb.RegisterObserverServer(srv, relay)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	agg := NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
	c := NewClient(Config{Address: lis.Addr().String(), Since: t0, BackoffMin: time.Minute, BackoffMax: time.Minute}, agg)
	runClient(t, c)
	// The fake sends four flows in all: one masked, three whole.
	waitFor(t, "the four flows", func() bool { return received(c) == 4 })
	if got := testutil.ToFloat64(agg.Metrics().FieldMaskRefused); got != 1 {
		t.Errorf("field mask refusals = %v, want 1", got)
	}
	if relay.calls.Load() != 2 {
		t.Errorf("%d GetFlows calls, want 2 (masked, then whole)", relay.calls.Load())
	}
	// gpu-a1's first flow came on both streams and counted once.
	if got := agg.Events().Len(); got != 2 {
		t.Errorf("%d event series, want 2", got)
	}
	if testutil.ToFloat64(c.m.SkippedReplayed) != 1 {
		t.Errorf("%v flows skipped as replayed, want 1", testutil.ToFloat64(c.m.SkippedReplayed))
	}
	if got := testutil.ToFloat64(agg.Metrics().Reconnects); got != 0 {
		t.Errorf("reconnects = %v, want 0 (the restart without the mask is not a broken stream)", got)
	}
}
