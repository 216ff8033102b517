package main

import (
	"context"
	"fmt"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector/conntrack"
)

func init() { register("conntrack", &conntrackPart{}) }

// conntrackPart counts job bytes from Cilium's conntrack accounting maps.
type conntrackPart struct {
	enabled  *bool
	bpffs    *string
	interval *time.Duration
	layout   *string
}

func (p *conntrackPart) flags(cmd *kingpin.CmdClause) {
	p.enabled = flagOf(cmd, "conntrack.enabled", "Count job bytes from Cilium's conntrack maps (needs bpf.ctAccounting=true in Cilium and the host's /sys/fs/bpf mounted). Disable with --no-conntrack.enabled.").Default("true").Bool()
	p.bpffs = flagOf(cmd, "conntrack.bpffs-path", "Folder of the BPF filesystem where Cilium pins its global conntrack maps.").Default("/sys/fs/bpf/tc/globals").String()
	p.interval = flagOf(cmd, "conntrack.poll-interval", "How often to read the conntrack maps; bytes an entry moves after the last read before it is deleted are missed.").Default("10s").Duration()
	p.layout = flagOf(cmd, "conntrack.layout", "Cilium ct_entry layout: auto (decide from the entries), split (Cilium before 1.16: rx/tx counters) or combined (1.16 and later: one packets/bytes pair).").Default("auto").Enum("auto", "split", "combined")
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
		// Every cluster has nodes: none means the informers have not synced.
		Ready: func() bool { n, _, _ := w.index.Counts(); return n > 0 },
	})
	if err != nil {
		return fmt.Errorf("conntrack self-metrics: %w", err)
	}
	w.exporter.Add("conntrack", poller)
	w.exporter.AddSource("conntrack", poller)
	go poller.Run(ctx, *p.interval)
	return nil
}
