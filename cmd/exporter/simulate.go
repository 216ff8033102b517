package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/collector/probe"
	"github.com/zonewatch/zonewatch/sim"
)

// simulate builds the inputs of the built-in simulated cluster (--simulate):
// a fake clientset whose batch jobs come and go, a fake Hubble Observer and
// kubelet PodResources on sockets in a private folder, a fake GPU source and
// generated conntrack tables in Cilium's combined (1.16+) layout. They serve
// node, or every node when node is empty (like Hubble Relay). The parts read
// them through the same clients as a real node's. stop ends the fakes.
//
// A GPU source named with --gpu.source (hack/gpu-smoke.sh: nvml) is read
// for real on the simulated cluster; auto reads the fake.
func simulate(ctx context.Context, o *options, logger *slog.Logger) (in *inputs, stop func(), err error) {
	in = &inputs{}
	for _, p := range parts {
		p.input(in) // what the simulation does not replace comes from the flags
	}
	s, node := sim.Default(), *o.nodeName
	dir, err := os.MkdirTemp("", "zonewatch-sim-")
	if err != nil {
		return nil, nil, fmt.Errorf("creating the simulation's folder: %w", err)
	}
	var stops []func()
	stop = func() {
		for _, f := range stops {
			f()
		}
		_ = os.RemoveAll(dir)
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()

	cluster := sim.NewCluster(s)
	in.kube = cluster
	go sim.Churn(ctx, cluster, s, 30*time.Second, logger)

	h := sim.NewHubble(s, node, 0)
	sock := filepath.Join(dir, "hubble.sock")
	if err := h.Start(sock); err != nil {
		return nil, nil, fmt.Errorf("starting the simulated Hubble: %w", err)
	}
	stops = append(stops, h.Stop)
	go h.Run(ctx, 250*time.Millisecond)
	in.hubble = hubble.Config{Address: "unix://" + sock}

	if in.gpu.source == gpu.SourceAuto {
		fake := sim.NewGPUSource(s, node)
		in.gpu.open = func(context.Context, gpu.Options) (gpu.Source, string, error) { return fake, "simulated", nil }
		in.gpu.podResources = filepath.Join(dir, "kubelet.sock")
		kubelet, err := sim.StartPodResources(s, node, in.gpu.podResources)
		if err != nil {
			return nil, nil, fmt.Errorf("starting the simulated kubelet: %w", err)
		}
		stops = append(stops, kubelet.Close)
	}

	in.conntrack = s.ConntrackSource(node, conntrack.LayoutCombined, time.Now())
	if in.ipcache != nil {
		in.ipcache = s.IPCacheSource(node)
	}

	// Peer exporters on the other nodes, cross-zone ones a little farther.
	from, peers, err := s.ProbePeers(ctx, node)
	if err != nil {
		return nil, nil, fmt.Errorf("starting the simulated probe peers: %w", err)
	}
	in.probe = probeInput{node: from, peers: staticPeers(peers)}
	logger.Info("running on the simulated cluster", "zones", len(s.Zones), "nodes", len(s.Nodes), "jobs", len(s.Jobs))
	return in, stop, nil
}

// staticPeers is a fixed peer list.
type staticPeers []probe.Peer

func (s staticPeers) Peers() []probe.Peer { return s }
