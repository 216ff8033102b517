package main

import (
	"context"
	"fmt"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
)

func init() { register("gpu", &gpuPart{}) }

// gpuPart exports GPU utilization per job: a GPU source joined with the
// kubelet's PodResources allocations.
type gpuPart struct {
	source    *string
	interval  *time.Duration
	url       *string
	selectors *[]string
	port      *int
	socket    *string
	resources *[]string
}

func (p *gpuPart) flags(cmd *kingpin.CmdClause) {
	p.source = flagOf(cmd, "gpu.source", "GPU source: auto (NVML where built in, else this node's dcgm-exporter found through the API; only on nodes the API says have GPUs; the fake source under --simulate), nvml, dcgm-exporter (DCGM is read through its page), none.").Default(gpu.SourceAuto).Enum(gpu.Sources...)
	p.interval = flagOf(cmd, "gpu.interval", "How often the GPU source and PodResources are read.").Default("10s").Duration()
	p.url = flagOf(cmd, "gpu.dcgm-exporter-url", "URL of a dcgm-exporter /metrics page to read instead of this node's dcgm-exporter pod found through the API (e.g. http://$(HOST_IP):9400/metrics with hostNetwork).").Default("").String()
	p.selectors = flagOf(cmd, "gpu.dcgm-exporter-selector", "Label selector of dcgm-exporter pods, searched on this node in every namespace; any one matches. Repeatable; replaces the defaults.").Default(gpu.DefaultDCGMExporterSelectors...).Strings()
	p.port = flagOf(cmd, "gpu.dcgm-exporter-port", "Port of a dcgm-exporter pod that names no container port \"metrics\".").Default(fmt.Sprint(gpu.DefaultDCGMExporterPort)).Int()
	p.socket = flagOf(cmd, "gpu.podresources-socket", "Kubelet PodResources socket mapping GPUs to pods; empty exports every GPU without job labels.").Default(gpu.DefaultPodResourcesSocket).String()
	p.resources = flagOf(cmd, "gpu.resource-name", "Extra extended resource name that is an NVIDIA GPU (besides nvidia.com/gpu and nvidia.com/mig-*), e.g. a renamed time-sliced nvidia.com/gpu.shared. Repeatable.").Strings()
}

// input leaves open empty for auto on a real cluster: start then finds the
// source through the API. The simulation sets open to its fake.
func (p *gpuPart) input(in *inputs) {
	in.gpu = gpuInput{source: *p.source, podResources: *p.socket}
	switch *p.source {
	case gpu.SourceNone, gpu.SourceAuto:
	default:
		name := *p.source
		in.gpu.open = func(_ context.Context, o gpu.Options) (gpu.Source, string, error) {
			s, err := gpu.Open(name, o)
			return s, name, err
		}
	}
}

func (p *gpuPart) start(ctx context.Context, w *wiring, in *inputs) error {
	if in.gpu.source == gpu.SourceNone {
		w.logger.Info("gpu source off")
		return nil
	}
	filter := gpu.ResourceFilter{Extra: *p.resources}

	// This node through the API: where its dcgm-exporter is, whether it has
	// GPUs, its DRA slices and which of its pods are gone.
	var d *gpu.Discovery
	if w.nodeName != "" && in.kube != nil {
		slices := gpu.NewSlices()
		filter.Slices = slices
		var err error
		d, err = startDiscovery(ctx, in.kube, w, *p.selectors, *p.port, filter, slices)
		if err != nil {
			return err
		}
	}

	if d != nil && in.gpu.open == nil {
		// auto on a node: the GPU counters too wait for the API to say the
		// node has GPUs, so a CPU node exports no zonewatch_gpu_* at all.
		go p.whenGPUNode(ctx, w, d, in.gpu.podResources, filter)
		return nil
	}
	m := gpu.NewMetrics(w.self)
	opts := p.options(w, m)
	if in.gpu.source == gpu.SourceDCGMExporter && *p.url == "" && d != nil && in.gpu.open != nil {
		// Named, with no URL: this node's dcgm-exporter pod, GPU node or not.
		return p.wire(ctx, w, m, gpu.NewDiscoveredDCGMExporter(d, opts), gpu.SourceDCGMExporter+" pod", in.gpu.podResources, filter, d)
	}
	if in.gpu.open != nil { // named on the command line, or simulated
		src, name, err := in.gpu.open(ctx, opts)
		if err != nil {
			return fmt.Errorf("gpu source: %w", err)
		}
		return p.wire(ctx, w, m, src, name, in.gpu.podResources, filter, d)
	}
	return p.probe(ctx, w, m, opts, in.gpu.podResources, filter)
}

func (p *gpuPart) options(w *wiring, m *gpu.Metrics) gpu.Options {
	return gpu.Options{DCGMExporterURL: *p.url, Skipped: m.Skipped.WithLabelValues("gpu"), Logger: w.logger}
}

func startDiscovery(ctx context.Context, client kubeapi.Interface, w *wiring, selectors []string, port int, filter gpu.ResourceFilter, slices *gpu.Slices) (*gpu.Discovery, error) {
	d, err := gpu.NewDiscovery(client, gpu.DiscoveryOptions{Node: w.nodeName, Selectors: selectors, Port: port,
		Resources: filter, Slices: slices, Logger: w.logger})
	if err != nil {
		return nil, fmt.Errorf("gpu discovery: %w", err)
	}
	// Not waited for: the GPU part starts when the watch says the node has
	// GPUs, and the join only reads what it has so far.
	synced := make(chan bool, 1)
	go func() { synced <- d.Run(ctx) }()
	go func() {
		select {
		case <-synced:
		case <-ctx.Done():
		case <-d.Refused():
			// RBAC: whether this node has GPUs is not known, so the GPU
			// source is down (source_up 0), not absent, until the rule the
			// log names is granted.
			if !d.Up() {
				w.exporter.AddSource("gpu", d)
			}
		case <-time.After(time.Minute):
			// RBAC missing, API slow: the watch keeps trying.
			w.logger.Warn("gpu discovery: this node's pods, node object or ResourceSlices not listed after a minute; check the RBAC (pods, nodes, resource.k8s.io resourceslices: list, watch)")
		}
	}()
	return d, nil
}

// whenGPUNode waits until the API says this node has GPUs, then reads them:
// NVML where built in, else the URL override, else the dcgm-exporter pod
// discovery finds. A CPU node never gets here: no GPU series, no source_up
// that could page. A GPU node without a working source exports
// source_up{source="gpu"} 0, and the feed logs once at warn what to change.
func (p *gpuPart) whenGPUNode(ctx context.Context, w *wiring, d *gpu.Discovery, socket string, filter gpu.ResourceFilter) {
	for {
		if ok, why := d.GPUNode(); ok {
			m := gpu.NewMetrics(w.self)
			src, name := gpu.AutoSource(ctx, d, p.options(w, m))
			w.logger.Info("GPU node", "because", why)
			if err := p.wire(ctx, w, m, src, name, socket, filter, d); err != nil {
				w.logger.Error("gpu source", "err", err)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-d.Changed():
		}
	}
}

// probe is auto without a node (one replica serving every node, or no
// API): NVML or the URL, tried every minute; nothing found is no GPUs.
func (p *gpuPart) probe(ctx context.Context, w *wiring, m *gpu.Metrics, opts gpu.Options, socket string, filter gpu.ResourceFilter) error {
	src, name, err := gpu.Probe(ctx, opts)
	if err == nil {
		return p.wire(ctx, w, m, src, name, socket, filter, nil)
	}
	w.logger.Info("no GPU source found and no node to look up; GPU metrics off until one answers", "tried", err)
	go func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if src, name, err := gpu.Probe(ctx, opts); err == nil {
				if err := p.wire(ctx, w, m, src, name, socket, filter, nil); err != nil {
					w.logger.Error("gpu source", "err", err)
				}
				return
			}
		}
	}()
	return nil
}

func (p *gpuPart) wire(ctx context.Context, w *wiring, m *gpu.Metrics, src gpu.Source, name, socket string, filter gpu.ResourceFilter, d *gpu.Discovery) error {
	gpus := gpu.NewFeed("gpu", src.Read, *p.interval, m.ReadErrors.WithLabelValues("gpu"), w.logger)
	w.exporter.AddSource("gpu", gpus)
	go gpus.Run(ctx)

	var allocs gpu.Getter[*gpu.Allocations]
	if socket != "" {
		checkSocket(w.logger, "podresources", socket, "the kubelet's PodResources socket is root's (mode 0755 under its umask): run as root (the chart does while gpu.podResources.enabled)")
		pr, err := gpu.DialPodResources(socket, filter, m.Skipped.WithLabelValues("podresources"))
		if err != nil {
			return err
		}
		pr.Unmapped = m.Skipped.WithLabelValues("dra")
		feed := gpu.NewFeed("podresources", pr.Read, *p.interval, m.ReadErrors.WithLabelValues("podresources"), w.logger)
		w.exporter.AddSource("podresources", feed)
		go feed.Run(ctx)
		allocs = feed
		go func() {
			<-ctx.Done()
			_ = pr.Close()
		}()
	}
	c := gpu.NewCollector(gpus, allocs, w.index, w.nodeName)
	if d != nil {
		c.SkipGone(d)
	}
	w.exporter.Add("gpu", c)
	w.logger.Info("reading GPUs", "gpu_source", name, "podresources", socket, "node", w.nodeName)
	return nil
}
