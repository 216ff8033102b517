package gpu

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"testing"
	"time"
)

// fakeDCGM behaves like go-dcgm over a host engine: any call but Init
// while not initialized "kills the process" (fails the test), as the real
// library does after a failed Init.
type fakeDCGM struct {
	t        *testing.T
	inited   bool
	initErr  error
	noDCP    bool
	engineUp bool
	calls    map[string]int
	gpus     []dcgmGPU
	mig      []dcgmMIG
	values   map[dcgmWatch][]dcgmValue
	watches  int
}

func (f *fakeDCGM) check(name string) {
	f.calls[name]++
	if !f.inited {
		f.t.Fatalf("%s called on an uninitialized DCGM: the process would die", name)
	}
}

func (f *fakeDCGM) Init() error {
	f.calls["Init"]++
	if f.initErr != nil {
		return f.initErr
	}
	f.inited = true
	return nil
}

func (f *fakeDCGM) Shutdown() error {
	f.check("Shutdown")
	f.inited = false
	return nil
}

func (f *fakeDCGM) GPUs() ([]dcgmGPU, error)      { f.check("GPUs"); return f.gpus, nil }
func (f *fakeDCGM) Hierarchy() ([]dcgmMIG, error) { f.check("Hierarchy"); return f.mig, nil }

func (f *fakeDCGM) Watch(fields []uint16, _ []dcgmEntity, _ time.Duration) (dcgmWatch, error) {
	f.check("Watch")
	if fields[0] != dcgmFieldGPUUtil && f.noDCP {
		return 0, errors.New("profiling is not supported for this group of GPUs")
	}
	f.watches++
	return dcgmWatch(f.watches), nil
}

func (f *fakeDCGM) Latest(w dcgmWatch) ([]dcgmValue, error) {
	f.check("Latest")
	if !f.engineUp {
		return nil, errors.New("host engine connection invalid")
	}
	return f.values[w], nil
}

const gpuA, gpuB = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"

func newFakeDCGM(t *testing.T) *fakeDCGM {
	gi := func(id, parent, inst uint) dcgmMIG {
		return dcgmMIG{Entity: dcgmEntity{dcgmFEGPUI, id}, Parent: dcgmEntity{dcgmFEGPU, parent}, GPUUUID: gpuB, GPUIndex: 1, InstanceID: inst}
	}
	f := &fakeDCGM{t: t, engineUp: true, calls: map[string]int{},
		gpus: []dcgmGPU{{ID: 0, UUID: gpuA, Index: 0}, {ID: 1, UUID: gpuB, Index: 1}},
		mig: []dcgmMIG{gi(0, 1, 1), gi(1, 1, 2),
			// a compute instance under GPU instance 0: not a separate sample
			{Entity: dcgmEntity{5, 0}, Parent: dcgmEntity{dcgmFEGPUI, 0}, GPUUUID: gpuB, InstanceID: 1, ComputeID: 0}},
	}
	gpu := func(id uint) dcgmEntity { return dcgmEntity{dcgmFEGPU, id} }
	mig := func(id uint) dcgmEntity { return dcgmEntity{dcgmFEGPUI, id} }
	f.values = map[dcgmWatch][]dcgmValue{
		1: { // GPU_UTIL
			{Entity: gpu(0), Field: dcgmFieldGPUUtil, Int: 87},
			{Entity: gpu(1), Field: dcgmFieldGPUUtil, Int: dcgmInt32Blank}, // MIG mode: blank
			{Entity: mig(0), Field: dcgmFieldGPUUtil, Int: dcgmInt32Blank + 2},
			{Entity: mig(1), Field: dcgmFieldGPUUtil, Int: 0x7ffffffffffffff0},
		},
		2: { // profiling
			{Entity: gpu(0), Field: dcgmFieldGrEngineActive, Float: true, Double: 0.9},
			{Entity: gpu(0), Field: dcgmFieldSMActive, Float: true, Double: 0.45},
			{Entity: gpu(0), Field: dcgmFieldTensorActive, Float: true, Double: dcgmFP64Blank},
			{Entity: gpu(1), Field: dcgmFieldSMActive, Float: true, Double: dcgmFP64Blank + 3},
			{Entity: mig(0), Field: dcgmFieldGrEngineActive, Float: true, Double: 0.25},
			{Entity: mig(0), Field: dcgmFieldSMActive, Float: true, Double: 0.2},
			{Entity: mig(0), Field: dcgmFieldTensorActive, Float: true, Double: 0.1, Status: 0},
			{Entity: mig(1), Field: dcgmFieldGrEngineActive, Float: true, Double: 0.6, Status: -5}, // a failed read
		},
	}
	return f
}

func TestDCGMReadingSentinels(t *testing.T) {
	for _, tc := range []struct {
		v    dcgmValue
		want float64
	}{
		{dcgmValue{Int: 0}, 0},
		{dcgmValue{Int: 100}, 100},
		{dcgmValue{Int: 2147483631}, 2147483631},
		{dcgmValue{Int: 2147483632}, NA}, // DCGM_INT32_BLANK
		{dcgmValue{Int: 2147483633}, NA}, // NOT_FOUND
		{dcgmValue{Int: 0x7ffffffffffffff0}, NA},
		{dcgmValue{Float: true, Double: 0.5}, 0.5},
		{dcgmValue{Float: true, Double: 140737488355328.0}, NA}, // DCGM_FP64_BLANK
		{dcgmValue{Float: true, Double: 140737488355330.0}, NA},
		{dcgmValue{Int: 50, Status: -3}, NA},
	} {
		got := dcgmReading(tc.v)
		if got != tc.want && !(math.IsNaN(got) && math.IsNaN(tc.want)) {
			t.Errorf("dcgmReading(%+v) = %v, want %v", tc.v, got, tc.want)
		}
	}
}

func TestDCGMSourceMIGAndSentinels(t *testing.T) {
	f := newFakeDCGM(t)
	d := newDCGMSource(f, time.Second, slog.New(slog.DiscardHandler))
	ss, err := d.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// GPU A whole; GPU B is in MIG mode: its two GPU instances, not itself.
	if len(ss) != 3 {
		t.Fatalf("%d samples, want 3: %+v", len(ss), ss)
	}
	a, i1, i2 := ss[0], ss[1], ss[2]
	if a.UUID != gpuA || a.MIG() || a.Util != 0.87 || a.SMActive != 0.45 || !math.IsNaN(a.TensorActive) {
		t.Errorf("GPU A = %+v", a)
	}
	if i1.UUID != gpuB || i1.Index != 1 || i1.GI != 1 || i1.Util != 0.25 || i1.SMActive != 0.2 || i1.TensorActive != 0.1 {
		t.Errorf("GPU B instance 1 = %+v; want utilization from GR_ENGINE_ACTIVE", i1)
	}
	if i2.GI != 2 || !math.IsNaN(i2.Util) || !math.IsNaN(i2.SMActive) {
		t.Errorf("GPU B instance 2 = %+v; want every value NA (blank, failed read)", i2)
	}
}

func TestDCGMSourceNoProfilingKeepsGPUUtil(t *testing.T) {
	f := newFakeDCGM(t)
	f.noDCP = true
	d := newDCGMSource(f, time.Second, slog.New(slog.DiscardHandler))
	ss, err := d.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ss[0].Util != 0.87 || !math.IsNaN(ss[0].SMActive) {
		t.Errorf("GPU A = %+v; want GPU_UTIL without profiling", ss[0])
	}
}

func TestDCGMSourceNeverCallsAfterFailedInit(t *testing.T) {
	f := newFakeDCGM(t)
	f.initErr = errors.New("libdcgm.so.4: cannot open shared object file")
	d := newDCGMSource(f, time.Second, slog.New(slog.DiscardHandler))
	for range 3 {
		if _, err := d.Read(context.Background()); err == nil {
			t.Fatal("read succeeded without DCGM")
		}
	}
	if f.calls["Init"] != 3 || len(f.calls) != 1 {
		t.Errorf("calls = %v; want only Init, once per read", f.calls)
	}
	if err := d.conn.do(func(dcgmAPI) error { return nil }); !errors.Is(err, errDCGMNotReady) {
		t.Errorf("do on a failed Init = %v", err)
	}
	d.conn.reset() // must not call Shutdown either
}

func TestDCGMSourceReconnectsAfterHostEngineRestart(t *testing.T) {
	f := newFakeDCGM(t)
	d := newDCGMSource(f, time.Second, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	if _, err := d.Read(ctx); err != nil {
		t.Fatal(err)
	}
	f.engineUp = false
	if _, err := d.Read(ctx); err == nil {
		t.Fatal("read through a dead host engine succeeded")
	}
	if f.inited || f.calls["Shutdown"] != 1 {
		t.Fatalf("after a failed read: inited=%v shutdowns=%d; want shut down once", f.inited, f.calls["Shutdown"])
	}
	// Still restarting: Init fails, nothing else is called.
	f.initErr = errors.New("connection refused")
	if _, err := d.Read(ctx); err == nil {
		t.Fatal("read while the host engine is down succeeded")
	}
	f.initErr, f.engineUp = nil, true
	ss, err := d.Read(ctx)
	if err != nil || len(ss) != 3 {
		t.Fatalf("after the restart: %d samples, %v", len(ss), err)
	}
	if f.calls["Init"] != 3 || f.calls["GPUs"] != 2 {
		t.Errorf("calls = %v; want a fresh Init and setup after the restart", f.calls)
	}
}
