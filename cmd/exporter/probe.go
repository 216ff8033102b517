package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zonewatch/zonewatch/collector/probe"
	"github.com/zonewatch/zonewatch/topology"
)

func init() { register("probe", &probePart{}) }

// probePart measures the round trip to peer exporters in every zone.
type probePart struct {
	enabled  *bool
	listen   *string
	port     *int
	selector *string
	perZone  *int
	count    *int
	interval *time.Duration
	timeout  *time.Duration
}

func (p *probePart) flags(cmd *kingpin.CmdClause) {
	p.enabled = flagOf(cmd, "probe.enabled", "Serve the probe echo and probe peer exporters in every zone for zonewatch_zone_rtt_seconds (--no-probe.enabled turns it off).").Default("true").Bool()
	p.listen = flagOf(cmd, "probe.listen-address", "Address of the probe echo server (TCP, on the pod network).").Default(":" + strconv.Itoa(probe.DefaultPort)).String()
	p.port = flagOf(cmd, "probe.port", "The peers' probe port.").Default(strconv.Itoa(probe.DefaultPort)).Int()
	p.selector = flagOf(cmd, "probe.peer-selector", "Label selector of the exporter pods to probe (any namespace).").Default(probe.DefaultSelector).String()
	p.perZone = flagOf(cmd, "probe.peers-per-zone", "At most this many peers of each zone are probed per interval, rotating through them.").Default("2").Int()
	p.count = flagOf(cmd, "probe.count", "Frames of 16 bytes echoed per probed peer.").Default("5").Int()
	p.interval = flagOf(cmd, "probe.interval", "How often a round of probes runs.").Default("30s").Duration()
	p.timeout = flagOf(cmd, "probe.timeout", "Timeout of one peer's probe (connect and every echo).").Default("2s").Duration()
}

func (p *probePart) input(*inputs) {}

func (p *probePart) start(ctx context.Context, w *wiring, in *inputs) error {
	if !*p.enabled {
		w.logger.Info("probes off")
		return nil
	}
	l, err := net.Listen("tcp", *p.listen)
	if err != nil {
		return fmt.Errorf("probe listener on %s: %w", *p.listen, err)
	}
	go probe.Serve(ctx, l, w.logger)
	node, peers := in.probe.node, in.probe.peers
	if node == "" {
		node = w.nodeName
	}
	if node == "" {
		// One replica for the whole cluster (Relay mode) has no zone of its
		// own to measure from: it serves, but does not probe.
		w.logger.Info("probe echo served; not probing (no --node-name)", "address", l.Addr().String())
		return nil
	}
	zoneOf := func(node string) string {
		z, _, ok := w.index.NodeZone(node)
		if !ok {
			return topology.UnknownZone
		}
		return z
	}
	if peers == nil {
		pp := probe.NewPodPeers(in.kube, *p.selector, *p.port, zoneOf, w.logger)
		w.exporter.AddSource("probe", pp)
		pp.Start(ctx)
		peers = pp
	}
	prober := probe.NewProber(probe.Config{
		Node: node, Zone: func() string {
			if z, _, ok := w.index.NodeZone(node); ok {
				return z
			}
			return ""
		},
		PerZone: *p.perZone, Count: *p.count, Interval: *p.interval, Timeout: *p.timeout,
		Drops: policyDrops(ctx, in.hubble.Address, w),
	}, peers, probe.NewMetrics(w.self), w.logger)
	go prober.Run(ctx)
	w.logger.Info("probing peer exporters", "address", l.Addr().String(), "selector", *p.selector, "peers_per_zone", *p.perZone, "interval", *p.interval)
	return nil
}

// policyDrops asks the node's Hubble socket, the one the hubble part
// follows, whether a probe that timed out was dropped by a policy (the
// socket alone cannot tell). Nil without a local socket: through Relay the
// exporter does not probe.
func policyDrops(ctx context.Context, address string, w *wiring) probe.PolicyDrops {
	if !strings.HasPrefix(address, "unix://") {
		return nil
	}
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		w.logger.Warn("probe failures will not tell policy drops from timeouts", "address", address, "err", err)
		return nil
	}
	go func() {
		<-ctx.Done()
		_ = conn.Close()
	}()
	return probe.HubbleDrops{Client: observerpb.NewObserverClient(conn)}
}
