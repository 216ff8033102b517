package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	relaypb "github.com/cilium/cilium/api/v1/relay"
	"github.com/cilium/cilium/pkg/hubble/parser/fieldmask"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// HubbleVersion is what the fake Observer reports in ServerStatus.
const HubbleVersion = "1.20.2-zonewatch-sim"

// Hubble is a fake Hubble Observer: a real gRPC server that keeps flows in
// a ring buffer like Hubble's and streams them to GetFlows clients with
// follow, since/until/number, whitelist/blacklist filters (the fields
// zonewatch uses), the field mask, lost_events for clients that fall
// behind the ring, and ServerStatus. It serves one node's flows, or every
// node's (Relay-like) when node is empty. It can be stopped and started
// again; the ring survives, as it does when only the connection breaks.
type Hubble struct {
	scenario *Scenario
	node     string
	started  time.Time

	mu    sync.Mutex
	ring  []*observerpb.GetFlowsResponse
	next  uint64 // sequence number of the next response
	wake  chan struct{}
	stamp int64 // last flow time handed out (unix ns), strictly increasing
	gen   generator
	// streams holds each open GetFlows stream's progress, opened counts
	// the streams and sent the flows every stream has sent, so that a
	// test can wait until nothing is on its way (Streams) instead of
	// sleeping.
	streams map[*streamState]struct{}
	opened  int
	sent    uint64

	srvMu sync.Mutex
	srv   *grpc.Server
	path  string
}

// NewHubble returns a fake Observer for node ("" for every node) keeping
// capacity flows (4096 when <= 0). It serves nothing until Start.
func NewHubble(s *Scenario, node string, capacity int) *Hubble {
	if capacity <= 0 {
		capacity = 4096
	}
	return &Hubble{scenario: s, node: node, started: time.Now(), ring: make([]*observerpb.GetFlowsResponse, capacity), wake: make(chan struct{}),
		streams: map[*streamState]struct{}{}}
}

// Start serves the Observer API on a unix socket at path.
func (h *Hubble) Start(path string) error {
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("sim: hubble listen on %s: %w", path, err)
	}
	if err := h.Serve(lis); err != nil {
		lis.Close()
		return err
	}
	h.srvMu.Lock()
	h.path = path
	h.srvMu.Unlock()
	return nil
}

// Serve serves the Observer API on lis (e.g. TCP with TLS credentials in
// opts, like Relay) until Stop.
func (h *Hubble) Serve(lis net.Listener, opts ...grpc.ServerOption) error {
	h.srvMu.Lock()
	defer h.srvMu.Unlock()
	if h.srv != nil {
		return errors.New("sim: hubble server already started")
	}
	srv := grpc.NewServer(opts...)
	observerpb.RegisterObserverServer(srv, &observer{h: h})
	h.srv, h.path = srv, ""
	go func() { _ = srv.Serve(lis) }()
	return nil
}

// Stop stops serving: open streams end, the socket goes away.
func (h *Hubble) Stop() {
	h.srvMu.Lock()
	defer h.srvMu.Unlock()
	if h.srv == nil {
		return
	}
	h.srv.Stop()
	if h.path != "" {
		_ = os.Remove(h.path)
	}
	h.srv = nil
}

// Publish appends flows to the ring, as the agent does when it sees them.
// Their node_name and time are kept as given.
func (h *Hubble) Publish(flows ...*flowpb.Flow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range flows {
		if t := f.GetTime(); t != nil {
			h.stamp = max(h.stamp, t.AsTime().UnixNano())
		}
		h.appendLocked(&observerpb.GetFlowsResponse{
			ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: f},
			NodeName:      f.GetNodeName(), Time: f.GetTime(),
		})
	}
	h.wakeLocked()
}

// SendLost puts a lost_events response into the stream, as Hubble does
// when the perf ring or its event queue overflowed.
func (h *Hubble) SendLost(source flowpb.LostEventSource, n uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := timestamppb.New(time.Unix(0, h.nextStampLocked(time.Now())))
	h.appendLocked(&observerpb.GetFlowsResponse{
		ResponseTypes: &observerpb.GetFlowsResponse_LostEvents{LostEvents: &flowpb.LostEvent{Source: source, NumEventsLost: n, First: now, Last: now}},
		NodeName:      h.nodeName(h.node), Time: now,
	})
	h.wakeLocked()
}

// Seen returns how many responses were published.
func (h *Hubble) Seen() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.next
}

// StreamStats is what the GetFlows streams have done so far.
type StreamStats struct {
	Started, Open int
	// Flows is how many flows the streams, open or ended, have sent.
	Flows uint64
	// CaughtUp: every open stream has sent all the ring holds. With
	// nothing published since, a client that has received Flows flows has
	// every flow it is going to get (a stream its client cancelled may
	// have sent flows that never arrived).
	CaughtUp bool
}

// Streams returns the streams' progress.
func (h *Hubble) Streams() StreamStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := StreamStats{Started: h.opened, Open: len(h.streams), Flows: h.sent, CaughtUp: true}
	for s := range h.streams {
		if s.done < h.next {
			st.CaughtUp = false
		}
	}
	return st
}

// streamState is an open stream's progress: the responses before done
// are sent or filtered out.
type streamState struct{ done uint64 }

func (h *Hubble) appendLocked(r *observerpb.GetFlowsResponse) {
	h.ring[h.next%uint64(len(h.ring))] = r
	h.next++
}

func (h *Hubble) wakeLocked() {
	close(h.wake)
	h.wake = make(chan struct{})
}

// nextStampLocked returns a flow time at or after t, later than every
// time handed out, so each node's flows have increasing times like
// Hubble's (stamped by one reader when the agent reads them).
func (h *Hubble) nextStampLocked(t time.Time) int64 {
	h.stamp = max(t.UnixNano(), h.stamp+1)
	return h.stamp
}

// firstLocked is the sequence number of the oldest response held.
func (h *Hubble) firstLocked() uint64 {
	if h.next > uint64(len(h.ring)) {
		return h.next - uint64(len(h.ring))
	}
	return 0
}

// nodeName is a node's name as Hubble writes it: prefixed with the
// cluster name in a named cluster.
func (h *Hubble) nodeName(node string) string {
	if node == "" {
		return ""
	}
	return "zonewatch-sim/" + node
}

type observer struct {
	observerpb.UnimplementedObserverServer
	h *Hubble
}

func (o *observer) ServerStatus(context.Context, *observerpb.ServerStatusRequest) (*observerpb.ServerStatusResponse, error) {
	h := o.h
	h.mu.Lock()
	defer h.mu.Unlock()
	up := time.Since(h.started)
	st := &observerpb.ServerStatusResponse{
		NumFlows: h.next - h.firstLocked(), MaxFlows: uint64(len(h.ring)), SeenFlows: h.next,
		UptimeNs: uint64(up), Version: HubbleVersion, FlowsRate: float64(h.next) / up.Seconds(),
	}
	if h.node == "" {
		st.NumConnectedNodes = wrapU32(len(h.scenario.Nodes))
		st.NumUnavailableNodes = wrapU32(0)
	}
	return st, nil
}

func (o *observer) GetFlows(req *observerpb.GetFlowsRequest, stream grpc.ServerStreamingServer[observerpb.GetFlowsResponse]) error {
	h := o.h
	white, err := compileFilters(req.GetWhitelist())
	if err != nil {
		return err
	}
	black, err := compileFilters(req.GetBlacklist())
	if err != nil {
		return err
	}
	// The field mask is Cilium's own (pkg/hubble/parser/fieldmask, the
	// module's version): a path the Flow lacks fails the whole call with
	// "invalid fieldmask", and one Flow is filled again for every send, as
	// in pkg/hubble/observer/local_observer.go GetFlows.
	mask, err := fieldmask.New(req.GetFieldMask())
	if err != nil {
		return err
	}
	var masked *flowpb.Flow
	if mask.Active() {
		masked = new(flowpb.Flow)
		mask.Alloc(masked.ProtoReflect())
	}
	var since, until int64 = -1 << 63, 1<<63 - 1
	if req.GetSince() != nil {
		since = req.GetSince().AsTime().UnixNano()
	}
	if req.GetUntil() != nil {
		until = req.GetUntil().AsTime().UnixNano()
	}

	if h.node == "" {
		names := make([]string, 0, len(h.scenario.Nodes))
		for _, n := range h.scenario.Nodes {
			names = append(names, h.nodeName(n.Name))
		}
		if err := stream.Send(&observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_NodeStatus{
			NodeStatus: &relaypb.NodeStatusEvent{StateChange: relaypb.NodeState_NODE_CONNECTED, NodeNames: names}}}); err != nil {
			return err
		}
	}

	h.mu.Lock()
	// Following without since or number starts two entries back, like
	// Cilium's ring (container.Ring.LastWriteParallel: write-2, the newest
	// entry it is sure was written): a "new flows only" stream gets up to
	// two older ones first.
	pos := max(h.firstLocked(), h.next-min(h.next, 2))
	switch {
	case req.GetSince() != nil || req.GetFirst():
		pos = h.firstLocked()
	case req.GetNumber() > 0:
		pos = max(h.firstLocked(), h.next-min(h.next, req.GetNumber()))
	case !req.GetFollow():
		pos = h.firstLocked()
	}
	st := &streamState{done: pos}
	h.streams[st] = struct{}{}
	h.opened++
	h.mu.Unlock()
	sent := uint64(0) // flows sent and not yet added to h.sent
	defer func() {
		h.mu.Lock()
		h.sent += sent
		delete(h.streams, st)
		h.mu.Unlock()
	}()

	ctx := stream.Context()
	var batch []*observerpb.GetFlowsResponse
	for {
		h.mu.Lock()
		first, next, wake := h.firstLocked(), h.next, h.wake
		var lost uint64
		if pos < first {
			lost, pos = first-pos, first
		}
		batch = batch[:0]
		for ; pos < next && len(batch) < 256; pos++ {
			batch = append(batch, h.ring[pos%uint64(len(h.ring))])
		}
		h.mu.Unlock()

		if lost > 0 {
			now := timestamppb.Now()
			if err := stream.Send(&observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_LostEvents{
				LostEvents: &flowpb.LostEvent{Source: flowpb.LostEventSource_HUBBLE_RING_BUFFER, NumEventsLost: lost, First: now, Last: now}},
				NodeName: h.nodeName(h.node), Time: now}); err != nil {
				return err
			}
		}
		for _, r := range batch {
			f := r.GetFlow()
			if f == nil {
				if err := stream.Send(r); err != nil {
					return err
				}
				continue
			}
			t := f.GetTime().AsTime().UnixNano()
			if t < since {
				continue
			}
			if t > until {
				return nil
			}
			if (len(white) > 0 && !white.match(f)) || (len(black) > 0 && black.match(f)) {
				continue
			}
			if masked != nil {
				mask.Copy(masked.ProtoReflect(), f.ProtoReflect())
				r = &observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: masked},
					NodeName: r.GetNodeName(), Time: r.GetTime()}
			}
			if err := stream.Send(r); err != nil {
				return err
			}
			sent++
		}
		h.mu.Lock()
		h.sent, sent, st.done = h.sent+sent, 0, pos
		h.mu.Unlock()
		if pos < next {
			continue
		}
		if !req.GetFollow() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
	}
}

// filters is a whitelist or blacklist: a flow matches when any filter does.
type filters []func(*flowpb.Flow) bool

func (fs filters) match(f *flowpb.Flow) bool {
	for _, fn := range fs {
		if fn(f) {
			return true
		}
	}
	return false
}

// compileFilters supports the FlowFilter fields zonewatch and its tests
// use; any other field set is an error rather than a silent mismatch.
func compileFilters(in []*flowpb.FlowFilter) (filters, error) {
	var out filters
	for _, ff := range in {
		var unsupported []string
		ff.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			switch fd.Name() {
			case "verdict", "event_type", "reply", "node_name", "drop_reason_desc", "traffic_direction", "source_pod", "destination_pod":
			default:
				unsupported = append(unsupported, string(fd.Name()))
			}
			return true
		})
		if len(unsupported) > 0 {
			return nil, status.Errorf(codes.InvalidArgument, "sim: unsupported flow filter fields %v", unsupported)
		}
		out = append(out, func(f *flowpb.Flow) bool {
			return matchAny(ff.GetVerdict(), f.GetVerdict()) &&
				matchAny(ff.GetDropReasonDesc(), f.GetDropReasonDesc()) &&
				matchAny(ff.GetTrafficDirection(), f.GetTrafficDirection()) &&
				matchEventType(ff.GetEventType(), f.GetEventType()) &&
				matchReply(ff.GetReply(), f) &&
				matchNode(ff.GetNodeName(), f.GetNodeName()) &&
				matchPod(ff.GetSourcePod(), f.GetSource()) &&
				matchPod(ff.GetDestinationPod(), f.GetDestination())
		})
	}
	return out, nil
}

func matchAny[T comparable](want []T, got T) bool {
	if len(want) == 0 {
		return true
	}
	for _, w := range want {
		if w == got {
			return true
		}
	}
	return false
}

func matchEventType(want []*flowpb.EventTypeFilter, got *flowpb.CiliumEventType) bool {
	if len(want) == 0 {
		return true
	}
	for _, w := range want {
		if w.GetType() == got.GetType() && (!w.GetMatchSubType() || w.GetSubType() == got.GetSubType()) {
			return true
		}
	}
	return false
}

// matchReply follows Hubble: a flow whose reply state is unknown matches
// no reply filter.
func matchReply(want []bool, f *flowpb.Flow) bool {
	if len(want) == 0 {
		return true
	}
	if f.GetIsReply() == nil {
		return false
	}
	return matchAny(want, f.GetIsReply().GetValue())
}

func matchNode(want []string, got string) bool {
	if len(want) == 0 {
		return true
	}
	short := got[strings.LastIndexByte(got, '/')+1:]
	for _, w := range want {
		if w == got || w == short {
			return true
		}
	}
	return false
}

// matchPod matches "namespace/" or "namespace/pod-prefix", like Hubble.
func matchPod(want []string, ep *flowpb.Endpoint) bool {
	if len(want) == 0 {
		return true
	}
	for _, w := range want {
		ns, pod, _ := strings.Cut(w, "/")
		if ns == ep.GetNamespace() && strings.HasPrefix(ep.GetPodName(), pod) {
			return true
		}
	}
	return false
}

func wrapU32(n int) *wrapperspb.UInt32Value { return wrapperspb.UInt32(uint32(n)) }

// MaskFlow returns what a Hubble server sends for f under a field mask
// (Cilium's fieldmask package): a copy with only the fields named by
// paths; whole fields are shared with f.
func MaskFlow(f *flowpb.Flow, paths []string) (*flowpb.Flow, error) {
	mask, err := fieldmask.New(&fieldmaskpb.FieldMask{Paths: paths})
	if err != nil {
		return nil, err
	}
	out := new(flowpb.Flow)
	if !mask.Active() {
		return proto.Clone(f).(*flowpb.Flow), nil
	}
	mask.Alloc(out.ProtoReflect())
	mask.Copy(out.ProtoReflect(), f.ProtoReflect())
	return out, nil
}
