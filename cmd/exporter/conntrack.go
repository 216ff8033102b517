package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/collector/hubble"
)

func init() { register("conntrack", &conntrackPart{}) }

// conntrackPart counts job bytes from Cilium's conntrack accounting maps.
type conntrackPart struct {
	enabled  *bool
	bpffs    *string
	interval *time.Duration
	layout   *string
	version  *string
}

func (p *conntrackPart) flags(cmd *kingpin.CmdClause) {
	p.enabled = flagOf(cmd, "conntrack.enabled", "Count job bytes from Cilium's conntrack maps (needs Cilium's conntrack accounting, which depends on the version: see docs/conntrack.md; and the host's /sys/fs/bpf mounted). Disable with --no-conntrack.enabled.").Default("true").Bool()
	p.bpffs = flagOf(cmd, "conntrack.bpffs-path", "Folder of the BPF filesystem where Cilium pins its global conntrack maps.").Default("/sys/fs/bpf/tc/globals").String()
	p.interval = flagOf(cmd, "conntrack.poll-interval", "How often to read the conntrack maps; bytes an entry moves after the last read before it is deleted are missed.").Default("10s").Duration()
	p.layout = flagOf(cmd, "conntrack.layout", "Cilium ct_entry layout: auto (from the Cilium version, else from the entries), split (Cilium before 1.16: rx/tx counters) or combined (1.16 and later: one packets/bytes pair).").Default("auto").Enum("auto", "split", "combined")
	p.version = flagOf(cmd, "conntrack.cilium-version", "Cilium version on the nodes (e.g. 1.16.3): decides the ct_entry layout with --conntrack.layout=auto and gives the exact way to turn conntrack accounting on; empty asks the agent (Hubble's ServerStatus on a unix --hubble.address), else tells it from the entries.").Default("").String()
}

func (p *conntrackPart) input(in *inputs) {
	in.conntrack = conntrack.BPFSource{Dir: *p.bpffs, Load: in.loadPin}
}

func (p *conntrackPart) start(ctx context.Context, w *wiring, in *inputs) error {
	if !*p.enabled {
		return nil
	}
	if *p.interval <= 0 {
		return fmt.Errorf("--conntrack.poll-interval must be positive, got %s", *p.interval)
	}
	layout, err := conntrack.ParseLayout(*p.layout)
	if err != nil {
		return err
	}
	// Absent or unreadable maps are not fatal: the source reports itself
	// down and logs once what to fix.
	poller, err := conntrack.New(in.conntrack, w.index, conntrackConfig(w, layout, *p.version))
	if err != nil {
		return fmt.Errorf("conntrack self-metrics: %w", err)
	}
	w.exporter.Add("conntrack", poller)
	w.exporter.AddSource("conntrack", poller)
	if layout == conntrack.LayoutAuto && *p.version == "" {
		go followCiliumVersion(ctx, in.hubble, poller, w.logger)
	}
	go poller.Run(ctx, *p.interval)
	return nil
}

// followCiliumVersion asks the node's Cilium agent its version (Hubble's
// ServerStatus on the agent's socket), which tells the conntrack layout
// without waiting for entries; again every so often, as an upgrade
// restarts the agent but not the exporter. Only a local unix socket names
// this node's agent: a Relay's version is the Relay's.
func followCiliumVersion(ctx context.Context, cfg hubble.Config, p *conntrack.Poller, logger *slog.Logger) {
	if !strings.HasPrefix(cfg.Address, "unix://") || cfg.TLS.Enabled {
		logger.Debug("the Hubble address is no local agent socket: the conntrack layout is told from the entries", "address", cfg.Address)
		return
	}
	last, wait := "", time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		v, err := ciliumVersion(ctx, cfg.Address)
		switch {
		case err != nil:
			// The agent may be starting: nothing to count is lost, the
			// entries wait (and egress entries count meanwhile).
			logger.Debug("asking the Cilium agent its version", "address", cfg.Address, "err", err)
			wait = 10 * time.Second
			continue
		case v != last:
			last = v
			p.SetCiliumVersion(v)
		}
		wait = 10 * time.Minute
	}
}

// ciliumVersion returns the version in Hubble's ServerStatus ("cilium
// v1.20.2+g...").
func ciliumVersion(ctx context.Context, address string) (string, error) {
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", fmt.Errorf("hubble client for %s: %w", address, err)
	}
	defer conn.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := observerpb.NewObserverClient(conn).ServerStatus(sctx, &observerpb.ServerStatusRequest{})
	if err != nil {
		return "", fmt.Errorf("hubble server status at %s: %w", address, err)
	}
	return st.GetVersion(), nil
}

// conntrackConfig is the poller's configuration on w: it holds growth until
// the pod and node informers have synced (w.synced).
func conntrackConfig(w *wiring, layout conntrack.Layout, ciliumVersion string) conntrack.Config {
	return conntrack.Config{Node: w.nodeName, Layout: layout, Logger: w.logger, Self: w.self,
		Ready: w.synced, CiliumVersion: ciliumVersion}
}
