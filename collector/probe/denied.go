package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// PolicyDrops tells a probe that timed out from one dropped by a network
// policy. A socket cannot: Cilium drops the SYN without an answer, so both
// read as a timeout. Only the datapath's drop events say which it was.
type PolicyDrops interface {
	// Dropped reports whether TCP packets to peer's probe port were
	// dropped by a policy since then, and the policy's name ("namespace/
	// name") when the drop event carries one.
	Dropped(ctx context.Context, peer Peer, since time.Time) (policy string, dropped bool, err error)
}

// HubbleDrops asks the node's Hubble (the Observer the exporter follows
// already) for the drop events of a failed probe's packets. Through the
// node's own socket it sees the drops on this node: an egress policy of
// the prober's pod, or an ingress policy of a peer on the same node. An
// ingress drop on the peer's node is seen there, not here (through Hubble
// Relay it would be): the peer's exporter counts it (InboundDrops).
type HubbleDrops struct {
	Client observerpb.ObserverClient
}

// Dropped implements PolicyDrops with one bounded GetFlows request (since,
// no follow) filtered on the server: dropped by a policy (POLICY_DENIED,
// POLICY_DENY), toward the peer's pod; the port is checked here.
func (h HubbleDrops) Dropped(ctx context.Context, peer Peer, since time.Time) (string, bool, error) {
	if peer.Pod == "" {
		return "", false, nil
	}
	port, err := portOf(peer.Addr)
	if err != nil {
		return "", false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := h.policyDrops(ctx, peer.Pod, since)
	if err != nil {
		return "", false, err
	}
	// Cilium emits two events per dropped packet: the drop (no policy
	// named) and the policy verdict (naming the policy of a deny rule):
	// read on to a named one.
	policy, dropped := "", false
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return policy, dropped, nil
		}
		if err != nil {
			return policy, dropped, fmt.Errorf("hubble drop events toward %s: %w", peer.Pod, err)
		}
		f := resp.GetFlow()
		if tcp := f.GetL4().GetTCP(); tcp == nil || tcp.GetDestinationPort() != uint32(port) {
			continue
		}
		dropped = true
		if policy = policyOf(f); policy != "" {
			return policy, true, nil
		}
	}
}

// policyVerdict is the monitor's event type of a policy verdict
// (MessageTypePolicyVerdict); a drop is 1 (MessageTypeDrop).
const policyVerdict = 5

// InboundDrops is what a PolicyDrops may also do: count the probes from
// peer exporters to this node's own exporter pod that this node's datapath
// dropped by a policy. A zone fence is usually written as ingress rules,
// enforced on the receiving node: the prober's node sees nothing, and its
// probe reads as a timeout; the peer's node holds the drop (seen on the
// real Cilium lab, e2e TestCiliumLabOwnTraffic).
type InboundDrops interface {
	// DroppedFrom counts, by source pod ("namespace/name"), the packets of
	// TCP to self's probe port dropped by a policy after the given time
	// (drop events; the verdict event of the same packet is not counted again), and returns
	// the time of the newest one (after, when none).
	DroppedFrom(ctx context.Context, self Peer, after time.Time) (map[string]int, time.Time, error)
}

// DroppedFrom implements InboundDrops with one bounded GetFlows request,
// as Dropped does, toward this node's exporter pod.
func (h HubbleDrops) DroppedFrom(ctx context.Context, self Peer, after time.Time) (map[string]int, time.Time, error) {
	if self.Pod == "" {
		return nil, after, nil
	}
	port, err := portOf(self.Addr)
	if err != nil {
		return nil, after, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := h.policyDrops(ctx, self.Pod, after)
	if err != nil {
		return nil, after, err
	}
	out, newest := map[string]int{}, after
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, newest, nil
		}
		if err != nil {
			return out, newest, fmt.Errorf("hubble drop events toward %s: %w", self.Pod, err)
		}
		f := resp.GetFlow()
		t := f.GetTime().AsTime()
		if tcp := f.GetL4().GetTCP(); tcp == nil || tcp.GetDestinationPort() != uint32(port) || !t.After(after) {
			continue
		}
		if f.GetEventType().GetType() == policyVerdict {
			continue // the same packet's drop event is counted
		}
		if src := f.GetSource(); src.GetPodName() != "" {
			out[src.GetNamespace()+"/"+src.GetPodName()]++
		}
		if t.After(newest) {
			newest = t
		}
	}
}

// policyDrops asks for the events of packets toward pod ("namespace/name")
// dropped by a policy since the given time.
func (h HubbleDrops) policyDrops(ctx context.Context, pod string, since time.Time) (observerpb.Observer_GetFlowsClient, error) {
	stream, err := h.Client.GetFlows(ctx, &observerpb.GetFlowsRequest{
		Since: timestamppb.New(since),
		Whitelist: []*flowpb.FlowFilter{{
			Verdict:        []flowpb.Verdict{flowpb.Verdict_DROPPED},
			DropReasonDesc: []flowpb.DropReason{flowpb.DropReason_POLICY_DENIED, flowpb.DropReason_POLICY_DENY},
			DestinationPod: []string{pod},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("hubble drop events toward %s: %w", pod, err)
	}
	return stream, nil
}

func portOf(addr string) (uint64, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("peer address %q: %w", addr, err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("peer address %q: %w", addr, err)
	}
	return port, nil
}

// policyOf names the first policy a drop event names (Cilium 1.16+ on
// policy-verdict events), "" when none.
func policyOf(f *flowpb.Flow) string {
	for _, ps := range [][]*flowpb.Policy{f.GetEgressDeniedBy(), f.GetIngressDeniedBy()} {
		for _, p := range ps {
			if p.GetName() != "" {
				if p.GetNamespace() == "" {
					return p.GetName()
				}
				return p.GetNamespace() + "/" + p.GetName()
			}
		}
	}
	return ""
}
