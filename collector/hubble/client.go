package hubble

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	relaypb "github.com/cilium/cilium/api/v1/relay"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// streamWindow is the flow stream's HTTP/2 flow-control window: about
// 14,000 masked flows.
const streamWindow = 4 << 20

// streamReadBuffer is the connection's read buffer (gRPC's default is 32
// KiB). A read of the stream costs wake-ups of the runtime's threads
// whatever it carries: at high rates a 32 KiB buffer filled in a few
// milliseconds and the coalescing wait (coalesce.go) was cut to match.
// With four times the buffer, the client's thread sleeps per flow about
// halved and its CPU per flow fell by about a fifth at 12,000 flows/s
// and at full speed (BenchmarkRealPath, docs/performance.md); what a
// wait gathers stays within a Unix socket's default send buffer (208
// KiB).
const streamReadBuffer = 128 << 10

// DefaultAddress is the node-local Hubble socket of a Cilium agent.
const DefaultAddress = "unix:///var/run/cilium/hubble.sock"

// TLSConfig is the client side of TLS to Hubble Relay.
type TLSConfig struct {
	Enabled    bool
	CAFile     string // empty: the system roots
	CertFile   string // client certificate, for mutual TLS
	KeyFile    string
	ServerName string // empty: the host of the address
}

// Config configures a Client.
type Config struct {
	// Address is unix:///path for the node socket or host:port for Relay.
	Address string
	TLS     TLSConfig
	// NoFieldMask asks for whole flows (benchmarks; the mask is what a
	// server older than field_mask support ignores anyway).
	NoFieldMask bool
	// FieldMask replaces FieldMaskPaths (tests: a path the server does not
	// know). A server that refuses the mask ("invalid fieldmask") gets no
	// mask from then on.
	FieldMask []string
	// BackoffMin and BackoffMax bound the reconnect delay (defaults 500ms
	// and 30s); each failed try doubles it, with jitter.
	BackoffMin, BackoffMax time.Duration
	// Since replays the server's buffered flows from this time on the
	// first connection; zero starts with new flows only, so a restarted
	// exporter does not count the buffer again. Flows and lost events
	// stamped before Since (zero: before the first connection) are never
	// counted: Hubble starts a follow without since two ring entries back
	// (container.Ring.LastWriteParallel), and replays stored lost events
	// on since without a time filter.
	Since  time.Time
	Logger *slog.Logger
	// Nodes, when set, restricts the stream to its nodes (Relay shards,
	// shard.go); the stream restarts when they change.
	Nodes NodeFilter
	// ReadCoalesce is the longest wait after a read that emptied the
	// socket (coalesce.go; 0: DefaultReadCoalesce; negative: none).
	ReadCoalesce time.Duration
}

// Whitelist is the server-side filter: forwarded trace events that are
// not replies (the candidates for the sending-side count) and the drop
// events of packets (drop notifications and policy-verdict denials).
// Policy-verdict "allowed", socket events and L7 events never reach the
// exporter: an L7 denial (type 129, verdict DROPPED: an HTTP 403 or a DNS
// refusal by an L7 policy) is a request refused by the proxy on a
// connection that was forwarded, not a dropped packet, and is not counted
// (see docs/hubble.md).
func Whitelist() []*flowpb.FlowFilter {
	return []*flowpb.FlowFilter{
		{
			Verdict:   []flowpb.Verdict{flowpb.Verdict_FORWARDED},
			EventType: []*flowpb.EventTypeFilter{{Type: eventTrace}},
			Reply:     []bool{false},
		},
		{
			Verdict:   []flowpb.Verdict{flowpb.Verdict_DROPPED},
			EventType: []*flowpb.EventTypeFilter{{Type: eventDrop}, {Type: eventPolicyVerdict}},
		},
	}
}

// FieldMaskPaths are the Flow fields classification reads; the server
// sends nothing else.
var FieldMaskPaths = []string{
	"time", "verdict", "drop_reason", "drop_reason_desc", "IP.source", "IP.destination", "l4",
	"source.ID", "source.identity", "source.namespace", "source.pod_name", "source.workloads",
	"destination.ID", "destination.identity", "destination.namespace", "destination.pod_name", "destination.workloads",
	"node_name", "event_type", "traffic_direction", "trace_observation_point", "is_reply",
	"ingress_denied_by", "egress_denied_by",
}

// Client follows a Hubble Observer's flows and feeds them to an
// Aggregator, reconnecting for ever.
type Client struct {
	cfg    Config
	agg    *Aggregator
	m      *Metrics
	logger *slog.Logger
	up     atomic.Bool

	// marks holds, per observing node, what was counted of its flows.
	// After a reconnect the stream resumes from the oldest mark, and each
	// node's flows are skipped as counted already until the replay has
	// passed them (nodeMark). Marks of nodes that stopped sending are
	// pruned (autoscaled nodes have unique names).
	marks    map[string]*nodeMark
	lastNode string
	lastMark *nodeMark
	resumed  bool
	// newest is the newest flow or lost-event time seen (unix ns); pruneAt
	// is the number of marks at which the old ones are pruned next.
	newest  int64
	pruneAt int
	// lostMarks holds, per node and source, the time of the latest
	// lost_events response counted: Hubble keeps the perf-ring and queue
	// LostEvents in its ring and sends them again to every since request.
	lostMarks map[lostKey]*lostMark
	// notBefore (unix ns): flows and lost events stamped earlier are not
	// counted (Config.Since, else the first connection's start).
	notBefore int64
	// quietUp: a stream open this long without an error is up (and the
	// backoff resets) even before its first message: a quiet node.
	quietUp time.Duration
	// openedAt (unix ns, 0 while none) is when the current stream opened;
	// up is set once it delivered a message.
	openedAt atomic.Int64
	// noMask: the server refused the field mask; whole flows from then on.
	noMask bool
	// nodeRefusedMask: a Relay node refused the mask; the stream restarts.
	nodeRefusedMask bool
	// clusterWarned: a Relay shard's cluster name was found wrong (shard.go).
	clusterWarned atomic.Bool
}

// nodeMark is what was counted of one node's flows, and, for the session
// after a reconnect, where the server's replay of them ends.
type nodeMark struct {
	last int64 // time of the last flow counted, in the stream's order
	max  int64 // newest flow time counted
	// replaying: this session has not yet passed the flows counted
	// before it. The replay ends at the flow stamped replayLast (the last
	// one counted, sent again) or at one newer than replayMax, so a node
	// whose clock steps back loses nothing once its replay is over.
	replaying             bool
	replayLast, replayMax int64
}

// lostMark is the latest counted lost_events time of one node and source;
// frozen is its value when this session started (replaying until the
// server sends a newer one).
type lostMark struct {
	t, frozen int64
	replaying bool
}

// markWindow is how far the resume point may lie before the newest flow:
// marks older than that are never consulted and are pruned; lost-event
// marks are kept longer (Hubble replays stored lost events without a time
// filter, for as long as its ring holds them).
const (
	markWindow     = time.Minute
	lostMarkWindow = time.Hour
	minPruneAt     = 64
)

// lostKey is a lost_events mark's node and source.
type lostKey struct {
	node   string
	source flowpb.LostEventSource
}

// errMaskRefused ends a session whose server refused the field mask; the
// next one, without the mask, starts at once.
var errMaskRefused = errors.New("hubble server refused the field mask")

// errNodesChanged ends a session whose node filter changed; the next one
// starts at once, resuming after the flows counted.
var errNodesChanged = errors.New("the shard's nodes changed")

// NewClient returns a client feeding agg.
func NewClient(cfg Config, agg *Aggregator) *Client {
	if cfg.Address == "" {
		cfg.Address = DefaultAddress
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 500 * time.Millisecond
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(30*time.Second, cfg.BackoffMin)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReadCoalesce == 0 {
		cfg.ReadCoalesce = DefaultReadCoalesce
	}
	c := &Client{cfg: cfg, agg: agg, m: agg.Metrics(), logger: cfg.Logger, marks: map[string]*nodeMark{}, lostMarks: map[lostKey]*lostMark{},
		notBefore: -1 << 63, noMask: cfg.NoFieldMask, quietUp: 5 * time.Second, pruneAt: minPruneAt, newest: -1 << 63}
	if !cfg.Since.IsZero() {
		c.notBefore = cfg.Since.UnixNano()
	}
	return c
}

// Up reports whether the flow stream is established (zonewatch_source_up):
// it delivered a message, or has stayed open for quietUp. A stream the
// server fails before its first message is not up.
func (c *Client) Up() bool {
	if c.up.Load() {
		return true
	}
	o := c.openedAt.Load()
	return o != 0 && time.Since(time.Unix(0, o)) >= c.quietUp
}

// Run follows flows until ctx ends.
func (c *Client) Run(ctx context.Context) {
	since := c.cfg.Since
	connected := false // a stream has been established before
	restart := false   // this session replaces one that dropped the mask
	failures := 0
	for {
		start := time.Now()
		if c.notBefore == -1<<63 {
			c.notBefore = start.UnixNano()
		}
		got, err := c.session(ctx, since, connected && !restart)
		restart = false
		c.openedAt.Store(0)
		c.up.Store(false)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errMaskRefused) || errors.Is(err, errNodesChanged) {
			// At once, without the mask. Through Relay other nodes' flows
			// came first: resume after them.
			if got {
				connected = true
				since = c.resumeFrom(start)
				c.resumed = true
			}
			if errors.Is(err, errNodesChanged) {
				since = c.sinceWithNewNodes(since)
			}
			restart = true // not a broken stream: no reconnect counted
			continue
		}
		if got {
			connected = true
			failures = 0
		}
		// A try that received nothing keeps the replay point: moving it to
		// this try's start would skip what Hubble buffered since the last
		// point a stream delivered (an exporter started before its node's
		// Hubble answers loses every flow before its last failed try).
		if got || since.IsZero() {
			since = c.resumeFrom(start)
		}
		c.resumed = true
		delay := backoff(failures, c.cfg.BackoffMin, c.cfg.BackoffMax)
		if failures == 0 {
			c.logger.Warn("hubble flow stream broke; reconnecting", "address", c.cfg.Address, "err", err, "retry_in", delay)
		} else {
			c.logger.Debug("hubble still unreachable", "address", c.cfg.Address, "err", err, "retry_in", delay)
		}
		failures++
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// resumeFrom is the since of the next connection: the oldest node's last
// counted flow (so that the replay shows where each node's count ended),
// but at most markWindow before the newest (a node that went quiet must
// not make the server replay its whole buffer); with no flow seen yet,
// when the last session started.
func (c *Client) resumeFrom(sessionStart time.Time) time.Time {
	if len(c.marks) == 0 {
		return sessionStart
	}
	var lo, hi int64
	first := true
	for _, m := range c.marks {
		if first || m.last < lo {
			lo = m.last
		}
		if first || m.max > hi {
			hi = m.max
		}
		first = false
	}
	lo = max(lo, hi-int64(markWindow))
	return time.Unix(0, lo)
}

// freezeMarks starts a session that resumes: every node replays until the
// flows counted before are passed, every lost-event source until a newer
// loss arrives.
func (c *Client) freezeMarks() {
	for _, m := range c.marks {
		m.replaying, m.replayLast, m.replayMax = true, m.last, m.max
	}
	for _, m := range c.lostMarks {
		m.replaying, m.frozen = true, m.t
	}
}

// prune drops the marks too old to matter, once their number has doubled
// since the last pruning (amortized: the flow path stays O(1)).
func (c *Client) prune() {
	if len(c.marks)+len(c.lostMarks) < c.pruneAt {
		return
	}
	for node, m := range c.marks {
		if m.max < c.newest-int64(markWindow) {
			delete(c.marks, node)
		}
	}
	for k, m := range c.lostMarks {
		if m.t < c.newest-int64(lostMarkWindow) {
			delete(c.lostMarks, k)
		}
	}
	c.lastNode, c.lastMark = "", nil
	c.pruneAt = max(minPruneAt, 2*(len(c.marks)+len(c.lostMarks)))
}

func backoff(failures int, lo, hi time.Duration) time.Duration {
	d := hi
	if failures < 30 && lo<<failures < hi {
		d = lo << failures
	}
	return d/2 + rand.N(d/2+1) // jitter, so a restarted agent is not hit by every client at once
}

// session runs one connection; got reports whether the stream was
// established (a message arrived, or it stayed open for quietUp).
func (c *Client) session(ctx context.Context, since time.Time, reconnect bool) (got bool, err error) {
	creds, err := transportCredentials(c.cfg.TLS)
	if err != nil {
		return false, err
	}
	if c.cfg.ReadCoalesce > 0 {
		creds = coalescingCreds{creds, c.cfg.ReadCoalesce}
	}
	conn, err := grpc.NewClient(c.cfg.Address, grpc.WithTransportCredentials(creds),
		// A static window: gRPC's dynamic one (BDP estimation) answers the
		// first data frame after each ping ack with a window update and a
		// new ping, so at the rates a node sends (a flow at a time) each
		// flow cost a write and a read more, on both sides
		// (BenchmarkRealPath).
		grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(streamWindow),
		grpc.WithReadBufferSize(streamReadBuffer))
	if err != nil {
		return false, fmt.Errorf("hubble client for %s: %w", c.cfg.Address, err)
	}
	defer conn.Close()
	obs := observerpb.NewObserverClient(conn)

	// The session is established once a message arrived or once it has
	// stayed up for quietUp (its wait for a first event included): its
	// reconnect is counted then, once.
	var established atomic.Bool
	var once sync.Once
	establish := func() {
		once.Do(func() {
			established.Store(true)
			if reconnect {
				c.m.Reconnects.Inc()
				c.logger.Info("hubble flow stream re-established", "address", c.cfg.Address, "since", since)
			}
		})
	}

	statusAt := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	st, err := obs.ServerStatus(sctx, &observerpb.ServerStatusRequest{})
	cancel()
	switch {
	case err == nil:
		c.logger.Info("hubble server status", "address", c.cfg.Address, "version", st.GetVersion(),
			"max_flows", st.GetMaxFlows(), "num_flows", st.GetNumFlows(), "seen_flows", st.GetSeenFlows(),
			"flows_rate", st.GetFlowsRate(), "connected_nodes", st.GetNumConnectedNodes().GetValue(),
			"unavailable_nodes", st.GetNumUnavailableNodes().GetValue())
		if n := st.GetNumUnavailableNodes().GetValue(); n > 0 {
			c.logger.Warn("hubble relay cannot reach some nodes; their flows are missing", "count", n, "nodes", st.GetUnavailableNodes())
		}
		if st.GetNumConnectedNodes() == nil && st.GetNumFlows() == 0 {
			// The wait reads as up (awaitFirstEvent sets openedAt): a
			// reconnect to a restarted agent's empty ring is counted once
			// it has lasted quietUp, as a quiet stream's is.
			wait := time.AfterFunc(c.quietUp, establish)
			err := c.awaitFirstEvent(ctx, obs)
			wait.Stop()
			if err != nil {
				return established.Load(), err
			}
			if since.IsZero() {
				// Every event in the ring came after the status that
				// found it empty was asked for: ask for all of them (a
				// follow without since starts two back).
				since = statusAt
			}
		}
	case status.Code(err) == codes.Unimplemented:
		c.logger.Debug("hubble server has no ServerStatus", "err", err)
	default:
		return false, fmt.Errorf("hubble server status at %s: %w", c.cfg.Address, err)
	}

	var nodes []string
	var nodesChanged <-chan struct{}
	if c.cfg.Nodes != nil {
		nodes, nodesChanged = c.cfg.Nodes.NodeNames()
	}
	sctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	if nodesChanged != nil {
		go func() {
			select {
			case <-nodesChanged:
				cancelCause(errNodesChanged)
			case <-sctx.Done():
			}
		}()
	}
	req := c.request(since)
	if nodes != nil {
		req.Whitelist = ShardWhitelist(req.Whitelist, nodes)
	}
	if c.resumed {
		c.freezeMarks()
	}
	stream, err := obs.GetFlows(sctx, req, grpc.ForceCodecV2(newWireCodec()))
	if err != nil {
		return false, fmt.Errorf("hubble GetFlows at %s: %w", c.cfg.Address, err)
	}
	// The call returning says nothing of the server (gRPC sends the
	// request and returns): the stream counts as established once a
	// message arrived, or once it stayed open for quietUp. One that fails
	// first (a refused peer or filter, a Relay with no node) is a failed
	// connection, backed off like one.
	opened := time.Now()
	if !established.Load() {
		c.openedAt.Store(opened.UnixNano())
	}
	// A quiet stream (a restarted agent's empty ring) is established once
	// it has stayed open for quietUp, when Up reads it so: its reconnect
	// is counted then, not at a first message that may not come.
	quiet := time.AfterFunc(c.quietUp, establish)
	defer quiet.Stop()
	healthy := func() bool {
		if !established.Load() && time.Since(opened) >= c.quietUp {
			establish()
		}
		return established.Load()
	}
	resp := &wireResponse{}
	for first := true; ; first = false {
		if err := stream.RecvMsg(resp); err != nil {
			if first && !c.noMask && maskRefused(err) {
				// Cilium's fieldmask.New refuses a path its Flow does not
				// have (an older server than the mask): the whole call
				// fails, so retrying with the mask would fail for ever.
				c.refuseMask(err.Error())
				return false, errMaskRefused
			}
			if errors.Is(context.Cause(sctx), errNodesChanged) {
				return healthy(), errNodesChanged
			}
			return healthy(), fmt.Errorf("receiving hubble flows from %s: %w", c.cfg.Address, err)
		}
		if first {
			c.up.Store(true)
			establish()
		}
		c.receive(resp)
		if c.nodeRefusedMask {
			// Relay turns a node's refusal into a NODE_ERROR status and
			// goes on with the other nodes: that node would send nothing
			// for as long as the mask is asked for.
			c.nodeRefusedMask = false
			return true, errMaskRefused
		}
	}
}

// emptyRingPoll is how often awaitFirstEvent asks an empty ring's
// server again.
const emptyRingPoll = time.Second

// awaitFirstEvent waits until a node's Hubble ring holds an event before
// the stream is asked for. Cilium's ring reader (v1.20.2
// pkg/hubble/observer newRingReader, container.Ring) starts a follow on an
// empty ring at LastWriteParallel() = write-2, which underflows: the
// reader then waits for a slot near the end of the ring and delivers
// nothing until the ring has wrapped once (max_flows events, 4,095 by
// default), and loses those. A freshly started or restarted agent has an
// empty ring: seen on the real agents of the lab (ServerStatus num_flows=0
// seen_flows=0, then a stream that delivered none of the node's flows).
// Once one event is in, since (the resume point, or the exporter's start)
// replays what came meanwhile. The wait counts as an open stream for
// zonewatch_source_up: the server answers, it has nothing to say yet.
// Through Relay (it reports connected nodes) each node's stream is
// Relay's, not waited for here.
func (c *Client) awaitFirstEvent(ctx context.Context, obs observerpb.ObserverClient) error {
	c.openedAt.Store(time.Now().UnixNano())
	logged := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(emptyRingPoll):
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := obs.ServerStatus(sctx, &observerpb.ServerStatusRequest{})
		cancel()
		if err != nil {
			return fmt.Errorf("hubble server status at %s: %w", c.cfg.Address, err)
		}
		if st.GetNumFlows() > 0 {
			if logged {
				c.logger.Info("hubble ring has its first event: following", "address", c.cfg.Address, "num_flows", st.GetNumFlows())
			}
			return nil
		}
		if !logged {
			c.logger.Info("hubble ring empty (a fresh agent): waiting for its first event before following, as Cilium's reader skips a ring's worth of events when a follow starts on an empty ring", "address", c.cfg.Address)
			logged = true
		}
	}
}

// refuseMask switches the field mask off for good after a server refused
// it.
func (c *Client) refuseMask(reason string) {
	c.noMask = true
	c.m.FieldMaskRefused.Inc()
	c.logger.Warn("hubble server refused the field mask; receiving whole flows from now on",
		"address", c.cfg.Address, "err", reason, "paths", c.maskPaths())
}

// maskRefused reports whether err is Hubble's refusal of the field mask
// (pkg/hubble/parser/fieldmask New: "invalid fieldmask", sent as
// codes.Unknown by v1.20; matched by its text, whatever the code).
func maskRefused(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() != codes.OK && strings.Contains(st.Message(), "invalid fieldmask")
}

func (c *Client) maskPaths() []string {
	if c.cfg.FieldMask != nil {
		return c.cfg.FieldMask
	}
	return FieldMaskPaths
}

func (c *Client) request(since time.Time) *observerpb.GetFlowsRequest {
	req := &observerpb.GetFlowsRequest{Follow: true, Whitelist: Whitelist()}
	if !since.IsZero() {
		req.Since = timestamppb.New(since)
	}
	if !c.noMask {
		req.FieldMask = &fieldmaskpb.FieldMask{Paths: c.maskPaths()}
	}
	return req
}

// receive handles one response as the wire decoder left it.
func (c *Client) receive(w *wireResponse) {
	switch w.kind {
	case respFlow:
		c.flow(&w.flow)
	case respOther:
		c.handle(&w.full)
	case respUnknown:
		c.m.Unknown.Inc()
	case respMalformed:
		c.m.Malformed.Inc()
		c.logger.Debug("hubble response skipped", "address", c.cfg.Address, "err", w.err)
	}
}

func (c *Client) flow(f *Fields) {
	if c.seen(f) {
		return
	}
	c.agg.ObserveFields(f)
}

// handle handles a response decoded by the generated decoder.
func (c *Client) handle(resp *observerpb.GetFlowsResponse) {
	switch x := resp.GetResponseTypes().(type) {
	case *observerpb.GetFlowsResponse_Flow:
		f := FieldsOf(x.Flow)
		c.flow(&f)
	case *observerpb.GetFlowsResponse_LostEvents:
		if c.seenLost(resp) {
			return
		}
		c.m.Lost(x.LostEvents.GetSource(), x.LostEvents.GetNumEventsLost())
	case *observerpb.GetFlowsResponse_NodeStatus:
		ns := x.NodeStatus
		level := slog.LevelDebug
		if ns.GetStateChange() == relaypb.NodeState_NODE_UNAVAILABLE || ns.GetStateChange() == relaypb.NodeState_NODE_ERROR {
			level = slog.LevelWarn // that node's flows are missing until it comes back
		}
		c.logger.Log(context.Background(), level, "hubble relay node status", "nodes", ns.GetNodeNames(), "state", ns.GetStateChange().String(), "message", ns.GetMessage())
		c.checkShardCluster(ns.GetNodeNames())
		// Relay (pkg/hubble/relay/observer nodeStatusError) reports a
		// node's failed GetFlows, the refused mask among them, as a
		// NODE_ERROR with the error's message.
		if ns.GetStateChange() == relaypb.NodeState_NODE_ERROR && !c.noMask && strings.Contains(ns.GetMessage(), "invalid fieldmask") {
			c.refuseMask(ns.GetMessage())
			c.nodeRefusedMask = true
		}
	}
}

// seenLost reports whether a lost_events response was counted already
// (the replay of a stored LostEvent after a reconnect, or one from before
// the client started), and otherwise records its time as the mark of its
// node and source. Hubble (pkg/hubble/observer/local_observer.go, v1.20)
// stores perf-ring and events-queue LostEvents in its ring, stamped when
// the agent read the loss, and replays them to a since request without a
// time filter; ring-buffer losses (HUBBLE_RING_BUFFER) are made per
// stream when sent, never replayed.
func (c *Client) seenLost(resp *observerpb.GetFlowsResponse) bool {
	ts := resp.GetTime()
	if ts == nil {
		ts = resp.GetLostEvents().GetLast()
	}
	if ts == nil {
		return false
	}
	t := ts.GetSeconds()*1e9 + int64(ts.GetNanos())
	if t < c.notBefore {
		c.m.SkippedEarly.Inc()
		return true
	}
	src := resp.GetLostEvents().GetSource()
	if src == flowpb.LostEventSource_HUBBLE_RING_BUFFER {
		return false
	}
	c.newest = max(c.newest, t)
	k := lostKey{observingNode(resp.GetNodeName()), src}
	m := c.lostMarks[k]
	if m == nil {
		m = &lostMark{t: t}
		c.lostMarks[k] = m
		c.prune()
		return false
	}
	if m.replaying {
		if t <= m.frozen {
			c.m.SkippedLostReplayed.Inc()
			return true
		}
		m.replaying = false
	}
	m.t = max(m.t, t)
	return false
}

// seen records f as counted on its node and reports whether a previous
// connection counted it already (the server's replay after a resume), or
// it is older than the client.
func (c *Client) seen(f *Fields) bool {
	if !f.HasTime {
		return false
	}
	t := f.Time
	if t < c.notBefore {
		c.m.SkippedEarly.Inc()
		return true
	}
	node := f.NodeName
	m := c.lastMark
	if m == nil || node != c.lastNode {
		m = c.marks[node]
		if m == nil {
			m = &nodeMark{last: t, max: t}
			c.marks[node] = m
			c.newest = max(c.newest, t)
			c.prune()
			return false
		}
		c.lastNode, c.lastMark = node, m
	}
	if m.replaying {
		switch {
		case t > m.replayMax: // newer than anything counted: the replay is over
			m.replaying = false
		case t == m.replayLast: // the last flow counted, sent again: over after it
			m.replaying = false
			c.m.SkippedReplayed.Inc()
			return true
		default:
			c.m.SkippedReplayed.Inc()
			return true
		}
	}
	m.last = t
	if t > m.max {
		m.max = t
		c.newest = max(c.newest, t)
	}
	return false
}

func transportCredentials(cfg TLSConfig) (credentials.TransportCredentials, error) {
	if !cfg.Enabled {
		return insecure.NewCredentials(), nil
	}
	// Files are read on every connection, so rotated certificates apply at
	// the next reconnect.
	tc := &tls.Config{ServerName: cfg.ServerName, MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading hubble TLS CA: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("hubble TLS CA %s: no PEM certificate", cfg.CAFile)
		}
	}
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			return nil, errors.New("hubble TLS: client certificate and key go together")
		}
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading hubble TLS client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(tc), nil
}
