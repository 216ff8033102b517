// Package gpu reads per-GPU utilization from a GPU source (DCGM, NVML or a
// dcgm-exporter page), maps each GPU to the pods it is allocated to through
// the kubelet PodResources API, and exports both joined with the pods'
// training jobs.
package gpu

import (
	"context"
	"math"
	"sort"
	"time"
)

// NA marks a value the source does not have (no profiling, MIG without
// GPU_UTIL, first GPM sample). Test it with math.IsNaN.
var NA = math.NaN()

// NoInstance is Sample.GI for a whole GPU.
const NoInstance = -1

// Sample is one GPU, or one MIG GPU instance, at one point in time.
type Sample struct {
	// UUID is the physical GPU's UUID (GPU-...), also for a MIG instance.
	UUID string
	// Index is the GPU's NVML index (the gpu label); -1 when unknown.
	Index int
	// Device is the GPU's device node name, nvidia<minor> (/dev/nvidiaN),
	// which GKE's device plugin names devices by; empty when unknown (the
	// NVML index stands in).
	Device string
	// GI is the MIG GPU instance id; NoInstance for a whole GPU.
	GI int
	// MIGUUID is the MIG device's UUID (MIG-...) when the source knows it.
	MIGUUID string
	// Node is the host the source names; used only when the exporter
	// serves every node (no --node-name).
	Node string
	// Util, GraphicsActive, SMActive and TensorActive are 0..1, NA when
	// unavailable. GraphicsActive is DCGM PROF_GR_ENGINE_ACTIVE (NVML GPM
	// graphics utilization): on in dcgm-exporter's default counters, where
	// SM_ACTIVE is not.
	Util, GraphicsActive, SMActive, TensorActive float64
	// Namespace and Pod are the source's own attribution (a dcgm-exporter
	// with its Kubernetes mapping on), used only when PodResources has none.
	Namespace, Pod string
	Time           time.Time
}

// MIG reports whether the sample is a MIG GPU instance.
func (s *Sample) MIG() bool { return s.GI != NoInstance }

// Source reads the current samples of every GPU it sees.
type Source interface {
	Read(ctx context.Context) ([]Sample, error)
}

// ratio turns a 0..scale reading into 0..1. Anything outside the range
// (DCGM blank sentinels, NVML garbage, NaN) is not a reading: NA.
func ratio(v, scale float64) float64 {
	if math.IsNaN(v) || v < 0 || v > scale {
		return NA
	}
	return v / scale
}

// utilization is GPU_UTIL, or the graphics engine activity where the
// source has no GPU_UTIL (DCGM does not report it for MIG instances).
func utilization(util, grEngine float64) float64 {
	if math.IsNaN(util) {
		return grEngine
	}
	return util
}

// normalize sorts samples and drops duplicates (same GPU and instance), so
// the scrape never emits a series twice.
func normalize(ss []Sample) []Sample {
	sort.SliceStable(ss, func(a, b int) bool {
		x, y := &ss[a], &ss[b]
		if x.Node != y.Node {
			return x.Node < y.Node
		}
		if x.UUID != y.UUID {
			return x.UUID < y.UUID
		}
		return x.GI < y.GI
	})
	out := ss[:0]
	for i := range ss {
		if n := len(out); n > 0 && out[n-1].Node == ss[i].Node && out[n-1].UUID == ss[i].UUID && out[n-1].GI == ss[i].GI {
			continue
		}
		out = append(out, ss[i])
	}
	return out
}
