package main

import (
	"context"
	"fmt"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector/hubble"
)

func init() { register("hubble", &hubblePart{}) }

// hubblePart follows Hubble flows: per-job policy drops and flow events.
type hubblePart struct {
	enabled       *bool
	address       *string
	tls           *bool
	tlsCA         *string
	tlsCert       *string
	tlsKey        *string
	tlsServerName *string
	grace         *time.Duration
	clusterName   *string
}

func (p *hubblePart) flags(cmd *kingpin.CmdClause) {
	p.enabled = flagOf(cmd, "hubble.enabled", "Follow Hubble flows for policy drops and flow events (--no-hubble.enabled turns the source off).").Default("true").Bool()
	p.address = flagOf(cmd, "hubble.address", "Hubble Observer address: unix:///path for the node's socket (DaemonSet), or host:port of Hubble Relay (one replica, empty --node-name).").Default(hubble.DefaultAddress).String()
	p.tls = flagOf(cmd, "hubble.tls", "Use TLS to the Hubble address (Relay with TLS).").Bool()
	p.tlsCA = flagOf(cmd, "hubble.tls.ca-file", "CA bundle to verify the Hubble server; empty uses the system roots.").Default("").String()
	p.tlsCert = flagOf(cmd, "hubble.tls.cert-file", "Client certificate for mutual TLS to Hubble Relay.").Default("").String()
	p.tlsKey = flagOf(cmd, "hubble.tls.key-file", "Client key for mutual TLS to Hubble Relay.").Default("").String()
	p.tlsServerName = flagOf(cmd, "hubble.tls.server-name", "Server name to verify (e.g. *.hubble-relay.cilium.io); empty uses the address host.").Default("").String()
	p.clusterName = flagOf(cmd, "hubble.cluster-name", "Cilium's cluster-name, which prefixes node names in Hubble; a Relay shard (--total-shards > 1) names its nodes with it in the server-side filter.").Default("default").String()
	p.grace = flagOf(cmd, "hubble.series-grace", "How long the flow counters of a job that is gone are still exported before they are removed.").Default("5m").Duration()
}

func (p *hubblePart) input(in *inputs) {
	in.hubble = hubble.Config{
		Address: *p.address,
		TLS: hubble.TLSConfig{Enabled: *p.tls, CAFile: *p.tlsCA, CertFile: *p.tlsCert, KeyFile: *p.tlsKey,
			ServerName: *p.tlsServerName},
	}
}

func (p *hubblePart) start(ctx context.Context, w *wiring, in *inputs) error {
	if !*p.enabled {
		w.logger.Info("hubble source off")
		return nil
	}
	cfg := in.hubble
	cfg.Logger = w.logger
	if w.shard.Sharded() {
		shard := w.shard
		shard.Cluster = *p.clusterName
		if err := shard.Validate(); err != nil {
			return fmt.Errorf("--hubble.cluster-name: %w", err)
		}
		nodes := hubble.NewNodeShard(shard, w.index.NodeNames)
		go nodes.Run(ctx, 10*time.Second)
		cfg.Nodes = nodes
	}
	checkSocket(w.logger, "hubble", cfg.Address, "the Hubble socket is root's, mode 0660, group cilium where that group exists: run as root, or set the chart's hubble.socketGroup to that group's gid")
	agg := hubble.NewAggregator(w.index, w.nodeName, *p.grace, hubble.NewMetrics(w.self))
	if in.fences != nil {
		agg.SetFences(in.fences)
	}
	// A live view catches up with new pods: hold what it cannot yet place.
	agg.SetHold(hubble.DefaultHold)
	go agg.Run(ctx)
	client := hubble.NewClient(cfg, agg)
	w.exporter.Add("hubble", agg)
	w.exporter.AddSource("hubble", client)
	go client.Run(ctx)
	w.logger.Info("following hubble flows", "address", cfg.Address, "node", w.nodeName)
	return nil
}
