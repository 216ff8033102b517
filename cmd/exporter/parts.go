package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"

	"github.com/zonewatch/zonewatch/collector"
	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/topology"
)

// WIRING A NEW SOURCE OR INFORMER: add a file here with a part and
// `func init() { register("name", &namePart{}) }`. Its flags method declares
// its flags, input what it reads on a real node (simulate.go replaces that),
// start builds it from the inputs (in.kube for informers: Services,
// EndpointSlices, CiliumNetworkPolicies; a BPF map reader such as the
// ipcache) and plugs it into the wiring: w.exporter.Add for its series,
// w.exporter.AddSource for zonewatch_source_up, w.index for what it learns
// of the topology, w.synced to wait for the pod and node informers (kube.go).
// Informers that change which pods and nodes are in the index belong to
// kube.NewLive (collector/kube), whose readiness is w.synced. Parts start in
// file-name order, after the Kubernetes feed; none refers to another by name.

// part is one data source (hubble, gpu, conntrack, probe).
type part interface {
	flags(cmd *kingpin.CmdClause)
	// input fills in, from the part's flags, what it reads on a real node.
	input(in *inputs)
	start(ctx context.Context, w *wiring, in *inputs) error
}

type namedPart struct {
	name string
	part
}

var parts []namedPart

// register adds a part; name is its component key in the logs.
func register(name string, p part) { parts = append(parts, namedPart{name, p}) }

// wiring is what a part plugs itself into.
type wiring struct {
	logger   *slog.Logger
	index    *topology.Index
	exporter *collector.Exporter
	// self registers the exporter's own counters (flows processed,
	// reconnects, ...); the job metrics are served from the same registry.
	self prometheus.Registerer
	// synced reports whether the pod and node informers have synced (the
	// Kubernetes feed's source_up). Nodes in the index are not enough:
	// nodes that arrive before the job pods would send those pods' bytes
	// to no_job for good.
	synced   func() bool
	nodeName string
	// shard is this replica's share of the nodes in Relay mode (one shard
	// of one: every node).
	shard hubble.Shard
}

// newWiring checks the node and shard flags and builds the root collector
// and the one registry that serves it with the exporter's own metrics.
func newWiring(o *options, logger *slog.Logger) (*wiring, *prometheus.Registry, error) {
	w := &wiring{logger: logger, index: topology.NewIndex(), nodeName: *o.nodeName,
		shard: hubble.Shard{Index: *o.shard, Total: *o.totalShards, Cluster: "default"}}
	if err := w.shard.Validate(); err != nil {
		return nil, nil, fmt.Errorf("bad --shard/--total-shards: %w", err)
	}
	if w.shard.Sharded() && w.nodeName != "" {
		return nil, nil, fmt.Errorf("--total-shards shards Relay mode: --node-name must be empty (it is %q)", w.nodeName)
	}
	w.exporter = collector.New(logger)
	// One registry serves the job metrics and the exporter's own: merged
	// through prometheus.Gatherers every series would be checked a second
	// time (24k allocations more per Relay scrape at 2,000 jobs,
	// docs/performance.md).
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector("zonewatch"), w.exporter)
	w.self = reg
	return w, reg, nil
}

// startParts starts every registered part, each logging under its name.
func startParts(ctx context.Context, w *wiring, in *inputs) error {
	for _, p := range parts {
		pw := *w
		pw.logger = w.logger.With("component", p.name)
		if err := p.start(ctx, &pw, in); err != nil {
			return fmt.Errorf("starting source %s: %w", p.name, err)
		}
	}
	return nil
}
