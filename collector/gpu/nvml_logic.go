package gpu

// NVML GPM metric ids (nvmlGpmMetricId_t) the NVML adapter asks for. All
// are percentages 0..100.
const (
	gpmGraphicsUtil  = 1 // NVML_GPM_METRIC_GRAPHICS_UTIL: graphics engine busy; the MIG utilization
	gpmSMUtil        = 2 // NVML_GPM_METRIC_SM_UTIL: SMs busy (DCGM SM_ACTIVE)
	gpmAnyTensorUtil = 5 // NVML_GPM_METRIC_ANY_TENSOR_UTIL: any tensor pipe active (DCGM PIPE_TENSOR_ACTIVE)
)

// gpmMetricIDs is the order the adapter requests GPM metrics in.
//
//lint:ignore U1000 used by nvml.go, which only builds with -tags nvml
var gpmMetricIDs = [3]uint32{gpmGraphicsUtil, gpmSMUtil, gpmAnyTensorUtil}

// gpmResult is one metric of an nvmlGpmMetricsGet reply.
type gpmResult struct {
	ID    uint32
	Ret   uint32 // nvmlReturn_t; 0 is success
	Value float64
}

// gpmRatios reads graphics, SM and tensor activity from GPM results;
// a metric that failed or is out of range is NA.
func gpmRatios(rs []gpmResult) (graphics, sm, tensor float64) {
	graphics, sm, tensor = NA, NA, NA
	for _, r := range rs {
		if r.Ret != 0 {
			continue
		}
		switch r.ID {
		case gpmGraphicsUtil:
			graphics = ratio(r.Value, 100)
		case gpmSMUtil:
			sm = ratio(r.Value, 100)
		case gpmAnyTensorUtil:
			tensor = ratio(r.Value, 100)
		}
	}
	return graphics, sm, tensor
}

// nvmlSample builds the sample of a whole GPU (mig empty) or of one MIG
// device. NVML has no utilization rate for a MIG device, so its
// utilization is GPM graphics activity, as PROF_GR_ENGINE_ACTIVE is in DCGM.
func nvmlSample(uuid string, index int, util float64, mig string, gi int, graphics, sm, tensor float64) Sample {
	s := Sample{UUID: uuid, Index: index, GI: NoInstance, Util: util, GraphicsActive: graphics, SMActive: sm, TensorActive: tensor}
	if mig != "" {
		s.GI, s.MIGUUID = gi, mig
		s.Util = NA
	}
	s.Util = utilization(s.Util, graphics)
	return s
}
