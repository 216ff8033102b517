//go:build nvml

package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLBuiltIn reports whether this binary has the NVML adapter.
const NVMLBuiltIn = true

// gpmMinInterval is the least time between the two GPM samples a metric is
// computed from ("should be greater than 100ms", nvml.h on nvmlGpmMetricsGet).
const gpmMinInterval = 100 * time.Millisecond

// gpmPairGap is what a first read waits between a device's two samples:
// more than the minimum, as NVML asks.
const gpmPairGap = gpmMinInterval + 10*time.Millisecond

// nvmlSource reads utilization rates and, on GPUs with GPM (Hopper and
// newer), graphics, SM and tensor activity from NVML. GPM metrics are
// computed between two samples: a read that meets a device for the first
// time samples it twice, gpmMinInterval apart, so even the first reading
// has them.
type nvmlSource struct {
	lib    nvml.Interface
	logger *slog.Logger
	now    func() time.Time
	sleep  func(time.Duration)
	fresh  bool // a device got its first GPM sample in this pass

	mu  sync.Mutex
	gpm map[string]*gpmState // by GPU or MIG UUID
}

// gpmState is a device's previous and current GPM samples.
type gpmState struct {
	prev, cur nvml.GpmSample
	at        time.Time // when prev was taken
	primed    bool      // prev holds a sample
	seen      bool      // touched in this read
}

// openNVML loads libnvidia-ml (dlopen) and checks that it sees a GPU.
func openNVML(logger *slog.Logger) (Source, error) {
	return newNVMLSource(nvml.New(), logger)
}

func newNVMLSource(lib nvml.Interface, logger *slog.Logger) (*nvmlSource, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml init: %w", ret)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		lib.Shutdown()
		return nil, fmt.Errorf("nvml: counting GPUs: %w", ret)
	}
	if n == 0 {
		lib.Shutdown()
		return nil, errors.New("nvml: no GPUs")
	}
	return &nvmlSource{lib: lib, logger: logger, now: time.Now, sleep: time.Sleep, gpm: map[string]*gpmState{}}, nil
}

// Read implements Source.
func (s *nvmlSource) Read(context.Context) ([]Sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.gpm {
		g.seen = false
	}
	s.fresh = false
	out, err := s.readAll()
	if err == nil && s.fresh {
		// New GPM devices (first read, MIG reconfigured): their first
		// sample pair, NVML's minimum apart, gives this read its metrics.
		s.sleep(gpmPairGap)
		out, err = s.readAll()
	}
	for k, g := range s.gpm {
		if !g.seen { // MIG reconfigured: the device is gone
			g.free()
			delete(s.gpm, k)
		}
	}
	return out, err
}

func (s *nvmlSource) readAll() ([]Sample, error) {
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml: counting GPUs: %w", ret)
	}
	at := s.now()
	var out []Sample
	var firstErr error
	for i := 0; i < n; i++ {
		ss, err := s.readDevice(i)
		if err != nil {
			// A GPU that fell off the bus loses its series; the others stay.
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		for _, x := range ss {
			x.Time = at
			out = append(out, x)
		}
	}
	if len(out) == 0 && firstErr != nil {
		return nil, firstErr
	}
	return normalize(out), nil
}

func (s *nvmlSource) readDevice(i int) ([]Sample, error) {
	dev, ret := s.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml: GPU %d: %w", i, ret)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml: GPU %d UUID: %w", i, ret)
	}
	gpmOK := false
	if sup, ret := dev.GpmQueryDeviceSupport(); ret == nvml.SUCCESS && sup.IsSupportedDevice != 0 {
		gpmOK = true
	}
	if mode, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS && mode == nvml.DEVICE_MIG_ENABLE {
		return s.readMIG(dev, uuid, i, gpmOK), nil
	}
	util := NA
	if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		util = ratio(float64(u.Gpu), 100)
	}
	graphics, sm, tensor := NA, NA, NA
	if gpmOK {
		graphics, sm, tensor = s.gpmRead(uuid, func(smp nvml.GpmSample) nvml.Return { return dev.GpmSampleGet(smp) })
	}
	return []Sample{nvmlSample(uuid, i, util, "", NoInstance, graphics, sm, tensor)}, nil
}

// readMIG reads each MIG device of a GPU in MIG mode; utilization rates
// are not supported there, GPM per GPU instance is.
func (s *nvmlSource) readMIG(dev nvml.Device, uuid string, index int, gpmOK bool) []Sample {
	max, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []Sample
	for j := 0; j < max; j++ {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret != nvml.SUCCESS { // ERROR_NOT_FOUND: slot not in use
			continue
		}
		migUUID, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		gi, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			continue
		}
		graphics, sm, tensor := NA, NA, NA
		if gpmOK {
			graphics, sm, tensor = s.gpmRead(migUUID, func(smp nvml.GpmSample) nvml.Return { return dev.GpmMigSampleGet(gi, smp) })
		}
		out = append(out, nvmlSample(uuid, index, NA, migUUID, gi, graphics, sm, tensor))
	}
	return out
}

// gpmRead takes a GPM sample with get and computes the metrics since the
// previous one.
func (s *nvmlSource) gpmRead(key string, get func(nvml.GpmSample) nvml.Return) (graphics, sm, tensor float64) {
	g := s.gpm[key]
	if g == nil {
		g = &gpmState{}
		var ret nvml.Return
		if g.prev, ret = s.lib.GpmSampleAlloc(); ret != nvml.SUCCESS {
			return NA, NA, NA
		}
		if g.cur, ret = s.lib.GpmSampleAlloc(); ret != nvml.SUCCESS {
			g.prev.Free()
			return NA, NA, NA
		}
		s.gpm[key] = g
	}
	g.seen = true
	now := s.now()
	if ret := get(g.cur); ret != nvml.SUCCESS {
		g.primed = false
		return NA, NA, NA
	}
	graphics, sm, tensor = NA, NA, NA
	if !g.primed {
		s.fresh = true
	} else if now.Sub(g.at) < gpmMinInterval {
		// Too close to prev for a valid metric: keep prev, drop this one.
		return NA, NA, NA
	} else {
		mg := &nvml.GpmMetricsGetType{NumMetrics: uint32(len(gpmMetricIDs)), Sample1: g.prev, Sample2: g.cur}
		for k, id := range gpmMetricIDs {
			mg.Metrics[k].MetricId = id
		}
		if ret := s.lib.GpmMetricsGet(mg); ret == nvml.SUCCESS {
			rs := make([]gpmResult, 0, len(gpmMetricIDs))
			for k := range gpmMetricIDs {
				m := mg.Metrics[k]
				rs = append(rs, gpmResult{ID: m.MetricId, Ret: m.NvmlReturn, Value: m.Value})
			}
			graphics, sm, tensor = gpmRatios(rs)
		}
	}
	g.prev, g.cur, g.primed, g.at = g.cur, g.prev, true, now
	return graphics, sm, tensor
}

func (g *gpmState) free() {
	g.prev.Free()
	g.cur.Free()
}

// Close frees GPM samples and unloads NVML.
func (s *nvmlSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, g := range s.gpm {
		g.free()
		delete(s.gpm, k)
	}
	if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %w", ret)
	}
	return nil
}
