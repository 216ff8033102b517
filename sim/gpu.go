package sim

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/zonewatch/zonewatch/collector/gpu"
)

// ErrGPUSourceDown is what a GPUSource returns while it is set down.
var ErrGPUSourceDown = errors.New("simulated GPU source down")

// GPUSource is a fake GPU source (as DCGM would read it) for one node, or
// every node when node is empty: each GPU reads its job's Behaviour, an
// unallocated GPU reads idle. It implements gpu.Source.
type GPUSource struct {
	s    *Scenario
	node string
	down atomic.Bool
	now  func() time.Time
}

// NewGPUSource returns the fake source for node ("" for all nodes).
func NewGPUSource(s *Scenario, node string) *GPUSource {
	return &GPUSource{s: s, node: node, now: time.Now}
}

// SetDown makes every read fail (true) or succeed again (false), for the
// "GPU source down" end-to-end case.
func (g *GPUSource) SetDown(down bool) { g.down.Store(down) }

// Read implements gpu.Source.
func (g *GPUSource) Read(context.Context) ([]gpu.Sample, error) {
	if g.down.Load() {
		return nil, ErrGPUSourceDown
	}
	busy := map[string]Behaviour{}
	for _, j := range g.s.Jobs {
		for _, p := range j.Pods {
			for _, u := range p.GPUs {
				busy[u] = j.Behaviour
			}
		}
	}
	at := g.now()
	var out []gpu.Sample
	for _, n := range g.s.Nodes {
		if g.node != "" && n.Name != g.node {
			continue
		}
		for _, d := range n.GPUs {
			b := busy[d.UUID] // the zero Behaviour is an idle GPU
			out = append(out, gpu.Sample{
				UUID: d.UUID, Index: d.Index, GI: gpu.NoInstance, Node: n.Name,
				// The graphics engine counts as active while any kernel runs,
				// NCCL's spinning ones too: it follows GPU_UTIL, not SM activity.
				Util: b.GPUUtil, GraphicsActive: b.GPUUtil, SMActive: b.SMActive, TensorActive: b.TensorActive, Time: at,
			})
		}
	}
	return out, nil
}
