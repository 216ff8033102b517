package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/sim"
)

func init() { register(&gpuPart{}) }

// gpuPart exports GPU utilization per job: a GPU source joined with the
// kubelet's PodResources allocations.
type gpuPart struct {
	source    *string
	interval  *time.Duration
	url       *string
	socket    *string
	resources *[]string
	simDown   *bool
	simPRDown *bool
}

func (p *gpuPart) flags(cmd *kingpin.CmdClause) {
	p.source = flagOf(cmd, "gpu.source", "GPU source: auto (DCGM, then NVML, then the dcgm-exporter page; nothing on a node without GPUs; the fake source under --simulate), dcgm, nvml, dcgm-exporter, none.").Default(gpu.SourceAuto).Enum(gpu.Sources...)
	p.interval = flagOf(cmd, "gpu.interval", "How often the GPU source and PodResources are read.").Default("10s").Duration()
	p.url = flagOf(cmd, "gpu.dcgm-exporter-url", "URL of this node's dcgm-exporter /metrics page (in a DaemonSet: http://$(HOST_IP):9400/metrics).").Default(gpu.DefaultDCGMExporterURL).String()
	p.socket = flagOf(cmd, "gpu.podresources-socket", "Kubelet PodResources socket mapping GPUs to pods; empty exports every GPU without job labels.").Default(gpu.DefaultPodResourcesSocket).String()
	p.resources = flagOf(cmd, "gpu.resource-name", "Extra extended resource name that is an NVIDIA GPU (besides nvidia.com/gpu and nvidia.com/mig-*), e.g. a renamed time-sliced nvidia.com/gpu.shared. Repeatable.").Strings()
	p.simDown = flagOf(cmd, "gpu.simulate.source-down", "Under --simulate, make the fake GPU source fail (end-to-end tests).").Hidden().Bool()
	p.simPRDown = flagOf(cmd, "gpu.simulate.podresources-down", "Under --simulate, do not start the fake kubelet: a dead PodResources socket (end-to-end tests).").Hidden().Bool()
}

func (p *gpuPart) start(ctx context.Context, rt *runtime) error {
	if *p.source == gpu.SourceNone {
		rt.logger.Info("gpu source off")
		return nil
	}
	m := gpu.NewMetrics(rt.self)
	opts := gpu.Options{DCGMExporterURL: *p.url, Skipped: m.Skipped.WithLabelValues("gpu"), Logger: rt.logger}
	socket := *p.socket
	var src gpu.Source
	name := *p.source
	switch {
	case rt.scenario != nil && name == gpu.SourceAuto:
		// The fake source and kubelet serve this node, or every node when
		// the node name is empty; the real PodResources client reads them.
		// A source named explicitly is read for real (hack/gpu-smoke.sh).
		fake := sim.NewGPUSource(rt.scenario, rt.nodeName)
		fake.SetDown(*p.simDown)
		src, name = fake, "simulated"
		socket = filepath.Join(rt.dir, "kubelet.sock")
		if !*p.simPRDown {
			srv, err := sim.StartPodResources(rt.scenario, rt.nodeName, socket)
			if err != nil {
				return fmt.Errorf("starting simulated kubelet: %w", err)
			}
			go func() {
				<-ctx.Done()
				srv.Close()
			}()
		}
	case name == gpu.SourceAuto:
		s, found, err := gpu.Probe(ctx, opts)
		if err != nil {
			// A node without GPUs: nothing to export, and no source_up that
			// would page. Keep looking in case the GPU stack starts later.
			rt.logger.Info("no GPU source found; GPU metrics off until one answers", "tried", err)
			go p.probeLater(ctx, rt, m, opts, socket)
			return nil
		}
		src, name = s, found
	default:
		s, err := gpu.Open(name, opts)
		if err != nil {
			return fmt.Errorf("gpu source: %w", err)
		}
		src = s
	}
	return p.wire(ctx, rt, m, src, name, socket)
}

// probeLater retries auto-detection every minute until a source answers.
func (p *gpuPart) probeLater(ctx context.Context, rt *runtime, m *gpu.Metrics, opts gpu.Options, socket string) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s, name, err := gpu.Probe(ctx, opts)
		if err != nil {
			continue
		}
		if err := p.wire(ctx, rt, m, s, name, socket); err != nil {
			rt.logger.Error("gpu source", "err", err)
		}
		return
	}
}

func (p *gpuPart) wire(ctx context.Context, rt *runtime, m *gpu.Metrics, src gpu.Source, name, socket string) error {
	gpus := gpu.NewFeed("gpu", src.Read, *p.interval, m.ReadErrors.WithLabelValues("gpu"), rt.logger)
	rt.exporter.AddSource("gpu", gpus)
	go gpus.Run(ctx)

	var allocs gpu.Getter[*gpu.Allocations]
	if socket != "" {
		pr, err := gpu.DialPodResources(socket, gpu.ResourceFilter{Extra: *p.resources}, m.Skipped.WithLabelValues("podresources"))
		if err != nil {
			return err
		}
		feed := gpu.NewFeed("podresources", pr.Read, *p.interval, m.ReadErrors.WithLabelValues("podresources"), rt.logger)
		rt.exporter.AddSource("podresources", feed)
		go feed.Run(ctx)
		allocs = feed
		go func() {
			<-ctx.Done()
			_ = pr.Close()
		}()
	}
	rt.exporter.Add("gpu", gpu.NewCollector(gpus, allocs, rt.index, rt.nodeName))
	rt.logger.Info("reading GPUs", "gpu_source", name, "podresources", socket, "node", rt.nodeName)
	return nil
}
