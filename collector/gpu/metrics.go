package gpu

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the GPU part's own counters (the exporter's self registry).
type Metrics struct {
	// ReadErrors counts failed reads by feed: gpu, podresources.
	ReadErrors *prometheus.CounterVec
	// Skipped counts input that could not be placed on a GPU: dcgm-exporter
	// series without a UUID (gpu), device ids not understood (podresources),
	// DRA GPUs no ResourceSlice maps to a UUID (dra).
	Skipped *prometheus.CounterVec
}

// NewMetrics creates the counters and registers them with reg (nil:
// unregistered, for tests), as every source package does with the self
// registry the exporter hands it.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ReadErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zonewatch_gpu_read_errors_total",
			Help: "Failed reads of a GPU feed (gpu: the GPU source; podresources: the kubelet PodResources API).",
		}, []string{"source"}),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zonewatch_gpu_inputs_skipped_total",
			Help: "Input a GPU feed could not place on a GPU and skipped (gpu: dcgm-exporter series without UUID; podresources: device ids not understood; dra: DRA-allocated GPUs no ResourceSlice maps to a UUID), counted on every read.",
		}, []string{"source"}),
	}
	for _, s := range []string{"gpu", "podresources"} {
		m.ReadErrors.WithLabelValues(s)
		m.Skipped.WithLabelValues(s)
	}
	m.Skipped.WithLabelValues("dra")
	if reg != nil {
		reg.MustRegister(m.ReadErrors, m.Skipped)
	}
	return m
}
