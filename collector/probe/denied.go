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
// Relay it would be).
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
	_, p, err := net.SplitHostPort(peer.Addr)
	if err != nil {
		return "", false, fmt.Errorf("peer address %q: %w", peer.Addr, err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", false, fmt.Errorf("peer address %q: %w", peer.Addr, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := h.Client.GetFlows(ctx, &observerpb.GetFlowsRequest{
		Since: timestamppb.New(since),
		Whitelist: []*flowpb.FlowFilter{{
			Verdict:        []flowpb.Verdict{flowpb.Verdict_DROPPED},
			DropReasonDesc: []flowpb.DropReason{flowpb.DropReason_POLICY_DENIED, flowpb.DropReason_POLICY_DENY},
			DestinationPod: []string{peer.Pod},
		}},
	})
	if err != nil {
		return "", false, fmt.Errorf("hubble drop events toward %s: %w", peer.Pod, err)
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("hubble drop events toward %s: %w", peer.Pod, err)
		}
		f := resp.GetFlow()
		if tcp := f.GetL4().GetTCP(); tcp == nil || tcp.GetDestinationPort() != uint32(port) {
			continue
		}
		return policyOf(f), true, nil
	}
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
