package hubble

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/sim"
)

// refusingObserver answers ServerStatus and fails every GetFlows before
// sending anything, as an agent does to a client it refuses (a denied
// peer, a filter it cannot apply, a Relay with no node to ask).
type refusingObserver struct {
	observerpb.UnimplementedObserverServer
	calls atomic.Int32
}

func (o *refusingObserver) ServerStatus(context.Context, *observerpb.ServerStatusRequest) (*observerpb.ServerStatusResponse, error) {
	// An agent's ring with events in it (an empty one is waited on before
	// GetFlows: awaitFirstEvent).
	return &observerpb.ServerStatusResponse{Version: sim.HubbleVersion, NumFlows: 2, MaxFlows: 4095}, nil
}

func (o *refusingObserver) GetFlows(*observerpb.GetFlowsRequest, grpc.ServerStreamingServer[observerpb.GetFlowsResponse]) error {
	o.calls.Add(1)
	return status.Error(codes.PermissionDenied, "hubble: peer not allowed")
}

// logRecords is a slog handler keeping every record, for tests that read
// what a user would see in the log.
type logRecords struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.records = append(l.records, r.Clone())
	l.mu.Unlock()
	return nil
}

// matching returns the records with message msg.
func (l *logRecords) matching(msg string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.records {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

func attr(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// shortSocket returns a unix socket path short enough for sun_path.
func shortSocket(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "zwh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "h.sock")
}

// A server that accepts GetFlows and fails the stream before its first
// message is not a stream that worked: the client backs off (doubling up
// to BackoffMax), warns once, never reports itself up and never counts a
// reconnect, instead of retrying every BackoffMin for ever.
func TestStreamFailingBeforeFirstMessageBacksOff(t *testing.T) {
	sock := shortSocket(t)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	obs := &refusingObserver{}
	observerpb.RegisterObserverServer(srv, obs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	reg := prometheus.NewPedanticRegistry()
	agg := NewAggregator(indexOf(testScenario()), "", time.Minute, NewMetrics(reg))
	logs := &logRecords{}
	lo, hi := 5*time.Millisecond, 80*time.Millisecond
	c := NewClient(Config{Address: "unix://" + sock, BackoffMin: lo, BackoffMax: hi, Logger: slog.New(logs)}, agg)
	var wasUp atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if c.Up() {
				wasUp.Store(true)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	runClient(t, c)
	waitFor(t, "six refused GetFlows calls", func() bool { return obs.calls.Load() >= 6 })
	cancel()
	<-done

	if got := testutil.ToFloat64(agg.Metrics().Reconnects); got != 0 {
		t.Errorf("zonewatch_hubble_reconnects_total = %v after %d refused streams, want 0: no stream was ever re-established", got, obs.calls.Load())
	}
	if wasUp.Load() {
		t.Error("zonewatch_source_up{source=\"hubble\"} read 1 while every stream was refused")
	}
	warned := logs.matching("hubble flow stream broke; reconnecting")
	if len(warned) != 1 {
		t.Errorf("warned %d times that the stream broke, want once for a server refusing every stream", len(warned))
	}
	// The retry delays grew: the client logs each one.
	var delays []time.Duration
	for _, r := range append(warned, logs.matching("hubble still unreachable")...) {
		delays = append(delays, attr(r, "retry_in").Duration())
	}
	if len(delays) < 5 {
		t.Fatalf("%d retries logged, want at least 5", len(delays))
	}
	if last := delays[len(delays)-1]; last <= lo {
		t.Errorf("retry delays %v: still at most BackoffMin (%v) after %d failures, want doubling up to %v", delays, lo, len(delays), hi)
	}
}

// A healthy stream that carries nothing yet (a quiet node) is up once it
// has stayed open, without a message: only a stream that fails fast is
// held down.
func TestQuietStreamIsUp(t *testing.T) {
	s := testScenario()
	_, sock := startHubble(t, s, "gpu-a1", 0)
	agg := NewAggregator(indexOf(s), "gpu-a1", time.Minute, nil)
	c := NewClient(Config{Address: "unix://" + sock, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, agg)
	c.quietUp = 50 * time.Millisecond
	runClient(t, c)
	waitFor(t, "the quiet stream to count as up", c.Up)
}

// flowAt is a counted forwarded event of bert's worker on node at t.
func flowAt(node string, at time.Time) *flowpb.Flow {
	f := trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
	f.NodeName, f.Time = node, timestamppb.New(at)
	return f
}

// skipped reads zonewatch_hubble_responses_skipped_total{reason}.
func skipped(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "zonewatch_hubble_responses_skipped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// After a reconnect the server replays from the resume point; once the
// replay has passed what was counted, the dedup ends for that node: a
// node whose clock steps back later in the session loses nothing, and
// what was skipped is exported by reason. (Hubble itself drops a
// session's flows stamped before its since, local_observer.go
// eventsReader.Next: the step stays above the resume point here, the
// oldest node's last flow.)
func TestReplayDedupEndsWithTheReplay(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	reg := prometheus.NewPedanticRegistry()
	agg := NewAggregator(indexOf(s), "", time.Minute, NewMetrics(reg))
	c := follow(t, sock, agg, true)
	ev := func() float64 { return agg.Events().Value(bertToCoord) }
	h.Publish(flowAt("gpu-b1", t0)) // another node, quiet since
	for i := range 10 {
		h.Publish(flowAt("gpu-a1", t0.Add(time.Duration(i)*time.Second)))
	}
	waitFor(t, "ten flows", func() bool { return ev() == 10 && delivered([]*sim.Hubble{h}, c) })

	h.Stop()
	waitFor(t, "the client to notice", func() bool { return !c.Up() })
	if err := h.Start(sock); err != nil {
		t.Fatal(err)
	}
	h.Publish(flowAt("gpu-a1", t0.Add(10*time.Second)))
	waitFor(t, "the replay and the new flow", func() bool { return ev() == 11 && delivered([]*sim.Hubble{h}, c) })
	if got := skipped(t, reg, "replayed"); got != 11 {
		t.Errorf(`zonewatch_hubble_responses_skipped_total{reason="replayed"} = %v, want the 11 flows sent again`, got)
	}
	// gpu-a1's clock steps back 5 s (NTP): its flows are new flows.
	for i := range 5 {
		h.Publish(flowAt("gpu-a1", t0.Add(time.Duration(5+i)*time.Second+500*time.Millisecond)))
	}
	waitFor(t, "every flow sent", func() bool { return delivered([]*sim.Hubble{h}, c) })
	if got := ev(); got != 16 {
		t.Errorf("%v flow events after the clock stepped back, want 16: %v lost as replays", got, 16-got)
	}
	if got := testutil.ToFloat64(agg.Metrics().Reconnects); got != 1 {
		t.Errorf("reconnects = %v, want 1", got)
	}
}

// A node whose clock stepped back before the stream broke: the replay
// ends at the last flow counted, in the server's order, not at the
// newest time.
func TestReplayAfterClockStepCountsOnce(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	c := follow(t, sock, agg, true)
	ev := func() float64 { return agg.Events().Value(bertToCoord) }
	for i := range 10 {
		h.Publish(flowAt("gpu-a1", t0.Add(time.Duration(i)*time.Second)))
	}
	for i := range 3 { // stepped back 5 s
		h.Publish(flowAt("gpu-a1", t0.Add(time.Duration(5+i)*time.Second+500*time.Millisecond)))
	}
	waitFor(t, "thirteen flows", func() bool { return ev() == 13 && delivered([]*sim.Hubble{h}, c) })
	h.Stop()
	waitFor(t, "the client to notice", func() bool { return !c.Up() })
	if err := h.Start(sock); err != nil {
		t.Fatal(err)
	}
	h.Publish(flowAt("gpu-a1", t0.Add(8*time.Second+500*time.Millisecond)))
	waitFor(t, "every flow sent", func() bool { return ev() >= 14 && delivered([]*sim.Hubble{h}, c) })
	if got := ev(); got != 14 {
		t.Errorf("%v flow events, want 14 (13 before the break, 1 after)", got)
	}
}

// Marks of nodes that no longer send (autoscaled away, unique names) are
// dropped: through Relay a long session seeing thousands of node names
// keeps only the recent ones.
func TestNodeMarksPruned(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	c := NewClient(Config{Address: "unix://" + sock, Since: t0.Add(-time.Second), BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, agg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	const nodes = 3000
	for i := range nodes {
		// One node every 100 ms: each gone long before the last.
		h.Publish(flowAt(fmt.Sprintf("prod/gpu-%d", i), t0.Add(time.Duration(i)*100*time.Millisecond)))
	}
	waitFor(t, "every flow", func() bool { return received(c) == nodes && delivered([]*sim.Hubble{h}, c) })
	cancel()
	<-done // the marks belong to Run's goroutine
	// The resume window is a minute: 600 nodes sent within it.
	if n := len(c.marks); n > 2*600+64 {
		t.Errorf("%d node marks held after %d nodes came and went, want those of the last minute", n, nodes)
	}
	if got := testutil.ToFloat64(agg.Metrics().Processed); got != nodes {
		t.Errorf("%v flows processed, want %d", got, nodes)
	}
}

// closingListener closes the connections it accepts while refuse is set:
// a Hubble socket whose server is not answering yet (an agent starting on
// a busy node).
type closingListener struct {
	net.Listener
	refuse  atomic.Bool
	refused atomic.Int32
}

func (l *closingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || !l.refuse.Load() {
			return c, err
		}
		c.Close()
		l.refused.Add(1)
	}
}

// TestFlowsWhileHubbleUnreachableAtStartCounted: an exporter that starts
// before its node's Hubble answers counts the flows Hubble buffered after
// the exporter started, however many tries failed before the first
// stream: a failed try that received nothing does not move the replay
// point past flows no stream has delivered.
func TestFlowsWhileHubbleUnreachableAtStartCounted(t *testing.T) {
	s := testScenario()
	sock := shortSocket(t)
	raw, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	lis := &closingListener{Listener: raw}
	lis.refuse.Store(true)
	h := sim.NewHubble(s, "", 0)
	if err := h.Serve(lis); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	c := NewClient(Config{Address: "unix://" + sock, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond}, agg)
	runClient(t, c)

	waitFor(t, "a first try refused", func() bool { return lis.refused.Load() >= 1 })
	// The drop Hubble sees while the exporter's tries fail.
	now := time.Now()
	pair := blockedSYN(0)
	pair[0].Time, pair[1].Time = timestamppb.New(now), timestamppb.New(now.Add(time.Microsecond))
	h.Publish(pair...)
	n := lis.refused.Load()
	waitFor(t, "two more tries refused after the drop", func() bool { return lis.refused.Load() >= n+2 })
	lis.refuse.Store(false)
	waitFor(t, "a stream that has sent all Hubble holds", func() bool {
		st := h.Streams()
		return st.Open > 0 && delivered([]*sim.Hubble{h}, c)
	})
	var drops float64
	agg.Drops().Each(func(k DropKey, v float64) {
		if k.Job == "llm-blocked" {
			drops += v
		}
	})
	if drops != 1 {
		t.Fatalf("drops of llm-blocked counted: %g, want the 1 Hubble buffered after the exporter started (%d tries refused; %d flows received)", drops, lis.refused.Load(), received(c))
	}
}

// TestQuietStreamReconnectCounted: a stream re-established to a restarted
// agent that has nothing to send yet (its ring starts empty, a quiet
// node) counts its reconnect once it has stayed open, when it reads as up,
// not only at its first message.
func TestQuietStreamReconnectCounted(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "gpu-a1", 0)
	agg := NewAggregator(indexOf(s), "gpu-a1", time.Minute, nil)
	c := NewClient(Config{Address: "unix://" + sock, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, agg)
	c.quietUp = 50 * time.Millisecond
	runClient(t, c)
	// The flow is stamped once the stream is open, so after the client's
	// start: one stamped before it is skipped as early, and whether it was
	// depended on when the client's goroutine ran (a loaded machine's cold
	// CI run counted it, and then its replay).
	waitFor(t, "the first stream open", c.Up)
	h.Publish(flowAt("gpu-a1", time.Now()))
	waitFor(t, "the first flow counted", func() bool { return testutil.ToFloat64(c.m.Processed) == 1 })
	// The agent restarts: the stream breaks, and the new agent's Hubble
	// starts with an empty ring (a fresh server on the same socket; the
	// same sim.Hubble restarted would keep its ring and replay the flow,
	// as Hubble does when only the connection broke).
	h.Stop()
	waitFor(t, "the stream to break", func() bool { return !c.Up() })
	h = sim.NewHubble(s, "gpu-a1", 0)
	if err := h.Start(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	waitFor(t, "the quiet re-established stream to count as up", c.Up)
	waitFor(t, "the reconnect counted while up, without a message", func() bool {
		return testutil.ToFloat64(agg.Metrics().Reconnects) == 1
	})
	if n := received(c); n != 1 {
		t.Errorf("%d flows received, want the 1 before the restart: the reconnect was counted at a message", n)
	}
}
