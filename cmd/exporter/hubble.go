package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/sim"
)

func init() { register(&hubblePart{}) }

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
}

func (p *hubblePart) flags(cmd *kingpin.CmdClause) {
	p.enabled = flagOf(cmd, "hubble.enabled", "Follow Hubble flows for policy drops and flow events (--no-hubble.enabled turns the source off).").Default("true").Bool()
	p.address = flagOf(cmd, "hubble.address", "Hubble Observer address: unix:///path for the node's socket (DaemonSet), or host:port of Hubble Relay (one replica, empty --node-name).").Default(hubble.DefaultAddress).String()
	p.tls = flagOf(cmd, "hubble.tls", "Use TLS to the Hubble address (Relay with TLS).").Bool()
	p.tlsCA = flagOf(cmd, "hubble.tls.ca-file", "CA bundle to verify the Hubble server; empty uses the system roots.").Default("").String()
	p.tlsCert = flagOf(cmd, "hubble.tls.cert-file", "Client certificate for mutual TLS to Hubble Relay.").Default("").String()
	p.tlsKey = flagOf(cmd, "hubble.tls.key-file", "Client key for mutual TLS to Hubble Relay.").Default("").String()
	p.tlsServerName = flagOf(cmd, "hubble.tls.server-name", "Server name to verify (e.g. *.hubble-relay.cilium.io); empty uses the address host.").Default("").String()
	p.grace = flagOf(cmd, "hubble.series-grace", "How long the flow counters of a job that is gone are still exported before they are removed.").Default("5m").Duration()
}

func (p *hubblePart) start(ctx context.Context, rt *runtime) error {
	if !*p.enabled {
		rt.logger.Info("hubble source off")
		return nil
	}
	cfg := hubble.Config{
		Address: *p.address,
		TLS: hubble.TLSConfig{Enabled: *p.tls, CAFile: *p.tlsCA, CertFile: *p.tlsCert, KeyFile: *p.tlsKey,
			ServerName: *p.tlsServerName},
		Logger: rt.logger,
	}
	if rt.scenario != nil {
		// The fake Observer serves this node's flows, or every node's like
		// Relay when the node name is empty.
		srv := sim.NewHubble(rt.scenario, rt.nodeName, 0)
		sock := filepath.Join(rt.dir, "hubble.sock")
		if err := srv.Start(sock); err != nil {
			return fmt.Errorf("starting simulated hubble: %w", err)
		}
		go func() {
			<-ctx.Done()
			srv.Stop()
		}()
		go srv.Run(ctx, 250*time.Millisecond)
		cfg.Address, cfg.TLS = "unix://"+sock, hubble.TLSConfig{}
	}
	agg := hubble.NewAggregator(rt.index, rt.nodeName, *p.grace, hubble.NewMetrics(rt.self))
	client := hubble.NewClient(cfg, agg)
	rt.exporter.Add("hubble", agg)
	rt.exporter.AddSource("hubble", client)
	go client.Run(ctx)
	rt.logger.Info("following hubble flows", "address", cfg.Address, "node", rt.nodeName)
	return nil
}
