package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector"
	"github.com/zonewatch/zonewatch/collector/conntrack"
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
	p.layout = flagOf(cmd, "conntrack.layout", "Cilium ct_entry layout: auto (decide from the entries), split (Cilium before 1.16: rx/tx counters) or combined (1.16 and later: one packets/bytes pair).").Default("auto").Enum("auto", "split", "combined")
	p.version = flagOf(cmd, "conntrack.cilium-version", "Cilium version on the nodes (e.g. 1.16.3), to give the exact way to turn conntrack accounting on; empty tells it from the map layout (1.14/1.15 or 1.16 and later).").Default("").String()
}

func (p *conntrackPart) input(in *inputs) { in.conntrack = conntrack.BPFSource{Dir: *p.bpffs} }

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
	poller, err := conntrack.New(in.conntrack, w.index, conntrack.Config{
		Node: w.nodeName, Layout: layout, Logger: w.logger, Self: w.self,
		Ready: informersSynced(w.exporter), CiliumVersion: *p.version,
	})
	if err != nil {
		return fmt.Errorf("conntrack self-metrics: %w", err)
	}
	w.exporter.Add("conntrack", poller)
	w.exporter.AddSource("conntrack", poller)
	go poller.Run(ctx, *p.interval)
	return nil
}

// informersSynced reports whether the kubernetes source (the informers)
// is up, i.e. has synced. Nodes in the index are not enough: nodes that
// arrive before the job pods would send those pods' bytes to no_job for
// good.
func informersSynced(e *collector.Exporter) func() bool {
	return func() bool {
		_, down := e.SourcesUp()
		return !slices.Contains(down, kubernetesSource)
	}
}

// kubernetesSource is the name main gives the informers' source.
const kubernetesSource = "kubernetes"
