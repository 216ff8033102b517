package gpu

import (
	"math"
	"testing"
)

func TestGPMRatios(t *testing.T) {
	g, sm, tensor := gpmRatios([]gpmResult{
		{ID: gpmGraphicsUtil, Value: 93},
		{ID: gpmSMUtil, Value: 12.5},
		{ID: gpmAnyTensorUtil, Ret: 3, Value: 50}, // NVML_ERROR_NOT_SUPPORTED
	})
	if g != 0.93 || sm != 0.125 || !math.IsNaN(tensor) {
		t.Errorf("got %v %v %v", g, sm, tensor)
	}
	g, sm, tensor = gpmRatios([]gpmResult{{ID: gpmSMUtil, Value: 100.5}, {ID: gpmGraphicsUtil, Value: -1}, {ID: 99, Value: 1}})
	if !math.IsNaN(g) || !math.IsNaN(sm) || !math.IsNaN(tensor) {
		t.Errorf("out-of-range or unknown metrics read as %v %v %v", g, sm, tensor)
	}
}

func TestNVMLSample(t *testing.T) {
	const u, m = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "MIG-cccccccc-0000-4000-8000-000000000000"
	s := nvmlSample(u, 3, 0.9, "", NoInstance, 0.8, 0.5, 0.2)
	if s.MIG() || s.Util != 0.9 || s.SMActive != 0.5 || s.TensorActive != 0.2 || s.Index != 3 {
		t.Errorf("whole GPU: %+v", s)
	}
	s = nvmlSample(u, 3, NA, "", NoInstance, NA, NA, NA)
	if !math.IsNaN(s.Util) {
		t.Errorf("no readings: %+v", s)
	}
	s = nvmlSample(u, 3, 0.9, m, 4, 0.3, 0.25, NA)
	if !s.MIG() || s.GI != 4 || s.MIGUUID != m || s.UUID != u || s.Util != 0.3 || s.SMActive != 0.25 {
		t.Errorf("MIG device: %+v; want parent UUID, instance 4, utilization from GPM graphics", s)
	}
}
