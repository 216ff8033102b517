package main

import (
	"context"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector/fence"
)

// "fence" sorts before "hubble": the set exists when the hubble part
// starts and names default-deny drops from it.
func init() { register("fence", &fencePart{}) }

// fencePart watches CiliumNetworkPolicies, CiliumClusterwideNetworkPolicies,
// Kubernetes NetworkPolicies and CiliumIdentities (the per-node view reads
// identities by name, as drops and lookups name them), so that a default-deny drop, which Cilium names no
// policy of, is counted with the policies that select the denying endpoint
// and allow none of the peer (policy_source="selected").
type fencePart struct {
	enabled *bool
	resync  *time.Duration
}

func (p *fencePart) flags(cmd *kingpin.CmdClause) {
	p.enabled = flagOf(cmd, "fence.enabled", "Name the policies behind default-deny drops from the cluster's CiliumNetworkPolicies, CiliumClusterwideNetworkPolicies, Kubernetes NetworkPolicies and CiliumIdentities (--no-fence.enabled: such drops name no policy).").Default("true").Bool()
	p.resync = flagOf(cmd, "fence.resync", "Resync period of the policy and identity informers (0: none; the per-node view reads identities by name and has no identity informer).").Default("0s").Duration()
}

func (p *fencePart) input(*inputs) {}

func (p *fencePart) start(ctx context.Context, w *wiring, in *inputs) error {
	if !*p.enabled {
		w.logger.Info("fence naming off: default-deny drops name no policy")
		return nil
	}
	m := fence.NewMetrics(w.self)
	if in.dyn == nil {
		w.logger.Info("no Cilium policies to read (simulation): default-deny drops name no policy")
		return nil
	}
	set := fence.NewSet()
	// The per-node view (startKube set in.identities) reads an identity
	// by name when a drop or a lookup names one: its cost is its node's
	// peers', not every identity of the cluster. The cluster-wide view
	// (Relay) names every job's drops and keeps the informer.
	var opts []fence.Option
	if in.identities != nil {
		opts = append(opts, fence.OnDemandIdentities(fence.DefaultIdentityReads))
	}
	live, err := fence.NewLive(in.dyn, set, *p.resync, m, w.logger, opts...)
	if err != nil {
		return err
	}
	in.fences = set
	if in.identities != nil {
		in.identities.set.Store(set)
	}
	go func() {
		if live.Run(ctx) {
			n, ids := set.Len()
			w.logger.Info("policies and identities synced", "policies", n, "identities", ids)
		}
	}()
	return nil
}
