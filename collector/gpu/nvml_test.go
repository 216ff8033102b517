//go:build nvml

package gpu

import (
	"context"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeNVML is go-nvml's generated mock wired as a small node: GPU 0 whole
// with GPM (Hopper), GPU 1 in MIG mode with two MIG devices, GPU 2 whole
// without GPM. Unset functions panic, so an unexpected call fails the test.
type fakeNVML struct {
	lib       *mock.Interface
	owner     map[nvml.GpmSample]string // sample -> device (UUID or MIG UUID)
	values    map[string][3]float64     // device -> graphics, SM, tensor percent
	allocated int
	freed     int
	shutdown  int
}

const (
	nvU0, nvU1, nvU2 = "GPU-00000000-0000-4000-8000-000000000000", "GPU-11111111-0000-4000-8000-000000000000", "GPU-22222222-0000-4000-8000-000000000000"
	nvM1, nvM2       = "MIG-11111111-0001-4000-8000-000000000000", "MIG-11111111-0002-4000-8000-000000000000"
)

func newFakeNVML() *fakeNVML {
	f := &fakeNVML{owner: map[nvml.GpmSample]string{}, values: map[string][3]float64{
		nvU0: {90, 45, 30}, nvM1: {40, 35, 0}, nvM2: {10, 5, 1},
	}}
	gpm := func(ok bool) func() (nvml.GpmSupport, nvml.Return) {
		return func() (nvml.GpmSupport, nvml.Return) {
			s := nvml.GpmSupport{}
			if ok {
				s.IsSupportedDevice = 1
			}
			return s, nvml.SUCCESS
		}
	}
	migOff := func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS }
	d0 := &mock.Device{
		GetUUIDFunc:               func() (string, nvml.Return) { return nvU0, nvml.SUCCESS },
		GpmQueryDeviceSupportFunc: gpm(true),
		GetMigModeFunc:            migOff,
		GetUtilizationRatesFunc:   func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 87, Memory: 40}, nvml.SUCCESS },
	}
	d0.GpmSampleGetFunc = func(s nvml.GpmSample) nvml.Return { f.owner[s] = nvU0; return nvml.SUCCESS }
	migDev := func(uuid string, gi int) *mock.Device {
		return &mock.Device{
			GetUUIDFunc:          func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
			GetGpuInstanceIdFunc: func() (int, nvml.Return) { return gi, nvml.SUCCESS },
		}
	}
	migs := map[int]nvml.Device{0: migDev(nvM1, 1), 2: migDev(nvM2, 5)}
	byGI := map[int]string{1: nvM1, 5: nvM2}
	d1 := &mock.Device{
		GetUUIDFunc:               func() (string, nvml.Return) { return nvU1, nvml.SUCCESS },
		GpmQueryDeviceSupportFunc: gpm(true),
		GetMigModeFunc:            func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS },
		GetMaxMigDeviceCountFunc:  func() (int, nvml.Return) { return 7, nvml.SUCCESS },
		GetMigDeviceHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if d, ok := migs[i]; ok {
				return d, nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		GpmMigSampleGetFunc: func(gi int, s nvml.GpmSample) nvml.Return { f.owner[s] = byGI[gi]; return nvml.SUCCESS },
	}
	d2 := &mock.Device{
		GetUUIDFunc:               func() (string, nvml.Return) { return nvU2, nvml.SUCCESS },
		GpmQueryDeviceSupportFunc: gpm(false),
		GetMigModeFunc:            func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }, // no MIG on this GPU
		GetUtilizationRatesFunc:   func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 3}, nvml.SUCCESS },
	}
	devs := []nvml.Device{d0, d1, d2}
	f.lib = &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { f.shutdown++; return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return devs[i], nvml.SUCCESS
		},
		GpmSampleAllocFunc: func() (nvml.GpmSample, nvml.Return) {
			f.allocated++
			return &mock.GpmSample{FreeFunc: func() nvml.Return { f.freed++; return nvml.SUCCESS }}, nvml.SUCCESS
		},
		GpmMetricsGetFunc: func(mg *nvml.GpmMetricsGetType) nvml.Return {
			v := f.values[f.owner[mg.Sample2]]
			for k := range mg.NumMetrics {
				m := &mg.Metrics[k]
				switch m.MetricId {
				case uint32(nvml.GPM_METRIC_GRAPHICS_UTIL):
					m.Value = v[0]
				case uint32(nvml.GPM_METRIC_SM_UTIL):
					m.Value = v[1]
				case uint32(nvml.GPM_METRIC_ANY_TENSOR_UTIL):
					m.Value = v[2]
				default:
					m.NvmlReturn = uint32(nvml.ERROR_INVALID_ARGUMENT)
				}
			}
			return nvml.SUCCESS
		},
	}
	return f
}

func TestNVMLMetricIDsMatchGoNVML(t *testing.T) {
	if gpmGraphicsUtil != int(nvml.GPM_METRIC_GRAPHICS_UTIL) || gpmSMUtil != int(nvml.GPM_METRIC_SM_UTIL) || gpmAnyTensorUtil != int(nvml.GPM_METRIC_ANY_TENSOR_UTIL) {
		t.Error("GPM metric ids differ from go-nvml's")
	}
}

func TestNVMLSourceWithGoNVMLMock(t *testing.T) {
	f := newFakeNVML()
	s, err := newNVMLSource(f.lib, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Unix(1000, 0)
	var slept []time.Duration
	s.now = func() time.Time { return clock }
	s.sleep = func(d time.Duration) { slept = append(slept, d); clock = clock.Add(d) }
	ctx := context.Background()
	ss, err := s.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 4 {
		t.Fatalf("%d samples, want GPU 0, two MIG devices of GPU 1, GPU 2: %+v", len(ss), ss)
	}
	byKey := func(ss []Sample) map[string]Sample {
		m := map[string]Sample{}
		for _, x := range ss {
			k := x.UUID
			if x.MIG() {
				k = x.MIGUUID
			}
			m[k] = x
		}
		return m
	}
	// First read: GPM needs a sample pair at least 100 ms apart (NVML's
	// nvmlGpmMetricsGet, go-nvml v0.13 pkg/nvml/nvml.h), taken in this read.
	first := byKey(ss)
	if len(slept) != 1 || slept[0] <= 100*time.Millisecond || slept[0] > 200*time.Millisecond {
		t.Errorf("first read slept %v, want once just over 100ms between the GPM samples", slept)
	}
	if g := first[nvU0]; g.Util != 0.87 || g.GraphicsActive != 0.90 || g.SMActive != 0.45 || g.Index != 0 {
		t.Errorf("GPU 0, first read = %+v; want GPM metrics already", g)
	}
	if m := first[nvM1]; m.UUID != nvU1 || m.Index != 1 || m.GI != 1 || m.Util != 0.40 {
		t.Errorf("MIG 1, first read = %+v; want parent UUID and index, instance 1, utilization from GPM", m)
	}
	// A read too soon after the last sample has no valid GPM metric.
	clock = clock.Add(50 * time.Millisecond)
	ss, err = s.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g := byKey(ss)[nvU0]; !math.IsNaN(g.SMActive) || g.Util != 0.87 {
		t.Errorf("GPU 0, 50ms later = %+v; want no GPM metric, utilization rate kept", g)
	}
	clock = clock.Add(10 * time.Second)
	ss, err = s.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second := byKey(ss)
	if g := second[nvU0]; g.Util != 0.87 || g.SMActive != 0.45 || g.TensorActive != 0.30 {
		t.Errorf("GPU 0 = %+v; want utilization rate 0.87, SM 0.45, tensor 0.30", g)
	}
	if m := second[nvM1]; m.Util != 0.40 || m.SMActive != 0.35 || m.TensorActive != 0 {
		t.Errorf("MIG 1 = %+v; want utilization from GPM graphics", m)
	}
	if m := second[nvM2]; m.GI != 5 || m.Util != 0.10 || m.SMActive != 0.05 {
		t.Errorf("MIG 2 = %+v", m)
	}
	if g := second[nvU2]; g.Util != 0.03 || !math.IsNaN(g.SMActive) || !math.IsNaN(g.TensorActive) {
		t.Errorf("GPU 2 (no GPM) = %+v", g)
	}
	if len(slept) != 1 {
		t.Errorf("later reads slept: %v", slept)
	}
	if f.allocated != 6 {
		t.Errorf("allocated %d GPM samples, want 2 per GPM device (3)", f.allocated)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if f.freed != f.allocated || f.shutdown != 1 {
		t.Errorf("freed %d of %d samples, shutdowns %d", f.freed, f.allocated, f.shutdown)
	}
}

func TestNVMLInitFailure(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	if _, err := newNVMLSource(lib, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("init without the library succeeded")
	}
}
