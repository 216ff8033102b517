package main

import (
	"context"
	"fmt"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector/gpu"
)

func init() { register("gpu", &gpuPart{}) }

// gpuPart exports GPU utilization per job: a GPU source joined with the
// kubelet's PodResources allocations.
type gpuPart struct {
	source    *string
	interval  *time.Duration
	url       *string
	socket    *string
	resources *[]string
}

func (p *gpuPart) flags(cmd *kingpin.CmdClause) {
	p.source = flagOf(cmd, "gpu.source", "GPU source: auto (DCGM, then NVML, then the dcgm-exporter page; nothing on a node without GPUs; the fake source under --simulate), dcgm, nvml, dcgm-exporter, none.").Default(gpu.SourceAuto).Enum(gpu.Sources...)
	p.interval = flagOf(cmd, "gpu.interval", "How often the GPU source and PodResources are read.").Default("10s").Duration()
	p.url = flagOf(cmd, "gpu.dcgm-exporter-url", "URL of this node's dcgm-exporter /metrics page (in a DaemonSet: http://$(HOST_IP):9400/metrics).").Default(gpu.DefaultDCGMExporterURL).String()
	p.socket = flagOf(cmd, "gpu.podresources-socket", "Kubelet PodResources socket mapping GPUs to pods; empty exports every GPU without job labels.").Default(gpu.DefaultPodResourcesSocket).String()
	p.resources = flagOf(cmd, "gpu.resource-name", "Extra extended resource name that is an NVIDIA GPU (besides nvidia.com/gpu and nvidia.com/mig-*), e.g. a renamed time-sliced nvidia.com/gpu.shared. Repeatable.").Strings()
}

func (p *gpuPart) input(in *inputs) {
	in.gpu = gpuInput{source: *p.source, podResources: *p.socket}
	switch *p.source {
	case gpu.SourceNone:
	case gpu.SourceAuto:
		in.gpu.open = gpu.Probe
	default:
		name := *p.source
		in.gpu.open = func(_ context.Context, o gpu.Options) (gpu.Source, string, error) {
			s, err := gpu.Open(name, o)
			return s, name, err
		}
	}
}

func (p *gpuPart) start(ctx context.Context, w *wiring, in *inputs) error {
	if in.gpu.open == nil {
		w.logger.Info("gpu source off")
		return nil
	}
	m := gpu.NewMetrics(w.self)
	opts := gpu.Options{DCGMExporterURL: *p.url, Skipped: m.Skipped.WithLabelValues("gpu"), Logger: w.logger}
	src, name, err := in.gpu.open(ctx, opts)
	switch {
	case err != nil && in.gpu.source == gpu.SourceAuto:
		// A node without GPUs: nothing to export, and no source_up that
		// would page. Keep looking in case the GPU stack starts later.
		w.logger.Info("no GPU source found; GPU metrics off until one answers", "tried", err)
		go p.probeLater(ctx, w, m, in.gpu, opts)
		return nil
	case err != nil:
		return fmt.Errorf("gpu source: %w", err)
	}
	return p.wire(ctx, w, m, src, name, in.gpu.podResources)
}

// probeLater retries auto-detection every minute until a source answers.
func (p *gpuPart) probeLater(ctx context.Context, w *wiring, m *gpu.Metrics, in gpuInput, opts gpu.Options) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s, name, err := in.open(ctx, opts)
		if err != nil {
			continue
		}
		if err := p.wire(ctx, w, m, s, name, in.podResources); err != nil {
			w.logger.Error("gpu source", "err", err)
		}
		return
	}
}

func (p *gpuPart) wire(ctx context.Context, w *wiring, m *gpu.Metrics, src gpu.Source, name, socket string) error {
	gpus := gpu.NewFeed("gpu", src.Read, *p.interval, m.ReadErrors.WithLabelValues("gpu"), w.logger)
	w.exporter.AddSource("gpu", gpus)
	go gpus.Run(ctx)

	var allocs gpu.Getter[*gpu.Allocations]
	if socket != "" {
		pr, err := gpu.DialPodResources(socket, gpu.ResourceFilter{Extra: *p.resources}, m.Skipped.WithLabelValues("podresources"))
		if err != nil {
			return err
		}
		feed := gpu.NewFeed("podresources", pr.Read, *p.interval, m.ReadErrors.WithLabelValues("podresources"), w.logger)
		w.exporter.AddSource("podresources", feed)
		go feed.Run(ctx)
		allocs = feed
		go func() {
			<-ctx.Done()
			_ = pr.Close()
		}()
	}
	w.exporter.Add("gpu", gpu.NewCollector(gpus, allocs, w.index, w.nodeName))
	w.logger.Info("reading GPUs", "gpu_source", name, "podresources", socket, "node", w.nodeName)
	return nil
}
