package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// DCGM field ids the DCGM adapter watches.
const (
	dcgmFieldGPUUtil        = 203  // DCGM_FI_DEV_GPU_UTIL, int, percent; not reported for MIG
	dcgmFieldGrEngineActive = 1001 // DCGM_FI_PROF_GR_ENGINE_ACTIVE, double, ratio
	dcgmFieldSMActive       = 1002 // DCGM_FI_PROF_SM_ACTIVE, double, ratio
	dcgmFieldTensorActive   = 1004 // DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, double, ratio
)

// The two field groups are watched apart: a GPU without profiling (DCP)
// support fails the second watch, and must still report GPU_UTIL.
var (
	dcgmUtilFields = []uint16{dcgmFieldGPUUtil}
	dcgmProfFields = []uint16{dcgmFieldGrEngineActive, dcgmFieldSMActive, dcgmFieldTensorActive}
)

// DCGM "blank" sentinels (dcgm_structs.h): values at or above them mean
// no data (not watched yet, not supported, not found), never a reading.
const (
	dcgmInt32Blank = 0x7ffffff0        // 2147483632
	dcgmFP64Blank  = 140737488355328.0 // 2^47
)

// DCGM entity groups (dcgm_field_entity_group_t).
const (
	dcgmFEGPU  = 1
	dcgmFEGPUI = 4 // GPU instance (MIG); compute instances (5) are not read
)

// dcgmEntity is a DCGM entity: group and id.
type dcgmEntity struct {
	Group uint
	ID    uint
}

// dcgmGPU is a GPU DCGM manages.
type dcgmGPU struct {
	ID    uint // DCGM GPU id
	UUID  string
	Index int // NVML index
}

// dcgmMIG is one row of DCGM's MIG hierarchy (MigHierarchyInfo_v2).
type dcgmMIG struct {
	Entity, Parent dcgmEntity
	GPUUUID        string // parent GPU
	GPUIndex       uint   // parent's NVML index
	InstanceID     uint   // NVML GPU instance id
	ComputeID      uint   // NVML compute instance id
}

// dcgmValue is one latest value of a watched field.
type dcgmValue struct {
	Entity dcgmEntity
	Field  uint16
	Float  bool // a double; else an int64
	Int    int64
	Double float64
	Status int // DCGM_ST_OK is 0
}

// dcgmWatch is a watched field group.
type dcgmWatch uint

// dcgmAPI is the part of go-dcgm the DCGM adapter calls. Its binding needs
// cgo and github.com/NVIDIA/go-dcgm (build tag dcgm); everything else
// about DCGM lives here, library-free, so it is tested without libdcgm.
// go-dcgm's Init fails cleanly without libdcgm.so.4, but any other call
// after a failed Init kills the process: dcgmConn guards that.
type dcgmAPI interface {
	Init() error // connect to nv-hostengine, or start an embedded one
	Shutdown() error
	GPUs() ([]dcgmGPU, error)
	Hierarchy() ([]dcgmMIG, error)
	Watch(fields []uint16, entities []dcgmEntity, every time.Duration) (dcgmWatch, error)
	Latest(w dcgmWatch) ([]dcgmValue, error)
}

var errDCGMNotReady = errors.New("dcgm: not initialized")

// dcgmConn owns the library's lifecycle: nothing but Init is ever called
// unless Init succeeded, and a failed call shuts down so that the next
// poll reconnects (the host engine restarted).
type dcgmConn struct {
	api   dcgmAPI
	ready bool
}

func (c *dcgmConn) connect() error {
	if c.ready {
		return nil
	}
	if err := c.api.Init(); err != nil {
		return fmt.Errorf("dcgm init: %w", err)
	}
	c.ready = true
	return nil
}

// do runs fn only on an initialized library.
func (c *dcgmConn) do(fn func(dcgmAPI) error) error {
	if !c.ready {
		return errDCGMNotReady
	}
	return fn(c.api)
}

// reset shuts an initialized library down; after a failed Init it calls
// nothing.
func (c *dcgmConn) reset() {
	if c.ready {
		_ = c.api.Shutdown()
		c.ready = false
	}
}

// dcgmSource reads GPU_UTIL and the profiling fields from DCGM.
type dcgmSource struct {
	conn   dcgmConn
	every  time.Duration
	logger *slog.Logger
	now    func() time.Time

	// set up after each connect
	places map[dcgmEntity]Sample // entity -> identity (values NA)
	order  []dcgmEntity
	util   dcgmWatch
	prof   dcgmWatch
	hasDCP bool
	// noDCPLogged keeps a GPU without profiling from logging every reconnect.
	noDCPLogged bool
}

func newDCGMSource(api dcgmAPI, every time.Duration, logger *slog.Logger) *dcgmSource {
	return &dcgmSource{conn: dcgmConn{api: api}, every: every, logger: logger, now: time.Now}
}

// Read implements Source.
func (d *dcgmSource) Read(context.Context) ([]Sample, error) {
	if !d.conn.ready {
		if err := d.conn.connect(); err != nil {
			return nil, err
		}
		if err := d.setup(); err != nil {
			d.conn.reset()
			return nil, err
		}
	}
	ss, err := d.read()
	if err != nil {
		d.conn.reset()
		return nil, err
	}
	return ss, nil
}

func (d *dcgmSource) setup() error {
	return d.conn.do(func(api dcgmAPI) error {
		gpus, err := api.GPUs()
		if err != nil {
			return fmt.Errorf("dcgm: listing GPUs: %w", err)
		}
		h, err := api.Hierarchy()
		if err != nil {
			return fmt.Errorf("dcgm: reading the MIG hierarchy: %w", err)
		}
		d.places, d.order = dcgmPlaces(gpus, h)
		if d.util, err = api.Watch(dcgmUtilFields, d.order, d.every); err != nil {
			return fmt.Errorf("dcgm: watching GPU_UTIL: %w", err)
		}
		d.prof, err = api.Watch(dcgmProfFields, d.order, d.every)
		d.hasDCP = err == nil
		if err != nil && !d.noDCPLogged {
			d.noDCPLogged = true
			d.logger.Info("dcgm: no profiling metrics (SM and tensor activity); exporting GPU_UTIL only", "err", err)
		}
		return nil
	})
}

func (d *dcgmSource) read() ([]Sample, error) {
	var util, prof []dcgmValue
	err := d.conn.do(func(api dcgmAPI) error {
		var err error
		if util, err = api.Latest(d.util); err != nil {
			return fmt.Errorf("dcgm: reading GPU_UTIL: %w", err)
		}
		if d.hasDCP {
			if prof, err = api.Latest(d.prof); err != nil {
				return fmt.Errorf("dcgm: reading profiling fields: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return dcgmSamples(d.places, d.order, d.now(), util, prof), nil
}

// dcgmPlaces maps every GPU and MIG GPU instance entity to its sample
// identity. A MIG instance carries its parent's UUID and index and its own
// NVML instance id; compute instances are not separate (a pod is allocated
// a GPU instance).
func dcgmPlaces(gpus []dcgmGPU, h []dcgmMIG) (map[dcgmEntity]Sample, []dcgmEntity) {
	places := map[dcgmEntity]Sample{}
	var order []dcgmEntity
	byID := map[uint]dcgmGPU{}
	for _, g := range gpus {
		byID[g.ID] = g
		e := dcgmEntity{Group: dcgmFEGPU, ID: g.ID}
		places[e] = Sample{UUID: g.UUID, Index: g.Index, GI: NoInstance}
		order = append(order, e)
	}
	for _, m := range h {
		if m.Entity.Group != dcgmFEGPUI || m.Parent.Group != dcgmFEGPU {
			continue
		}
		uuid, index := m.GPUUUID, int(m.GPUIndex)
		if g, ok := byID[m.Parent.ID]; ok {
			if uuid == "" {
				uuid = g.UUID
			}
			index = g.Index
		}
		if uuid == "" {
			continue
		}
		places[m.Entity] = Sample{UUID: uuid, Index: index, GI: int(m.InstanceID)}
		order = append(order, m.Entity)
	}
	return places, order
}

// dcgmSamples turns latest values into samples. A GPU in MIG mode has no
// activity of its own (its instances do), so it is left out when its
// instances are present and it has no reading.
func dcgmSamples(places map[dcgmEntity]Sample, order []dcgmEntity, at time.Time, util, prof []dcgmValue) []Sample {
	accs := make(map[dcgmEntity]*Sample, len(order))
	for _, e := range order {
		s := places[e]
		s.Util, s.GraphicsActive, s.SMActive, s.TensorActive, s.Time = NA, NA, NA, NA, at
		accs[e] = &s
	}
	for _, vs := range [][]dcgmValue{util, prof} {
		for _, v := range vs {
			a := accs[v.Entity]
			if a == nil {
				continue
			}
			x := dcgmReading(v)
			switch v.Field {
			case dcgmFieldGPUUtil:
				a.Util = ratio(x, 100)
			case dcgmFieldGrEngineActive:
				a.GraphicsActive = ratio(x, 1)
			case dcgmFieldSMActive:
				a.SMActive = ratio(x, 1)
			case dcgmFieldTensorActive:
				a.TensorActive = ratio(x, 1)
			}
		}
	}
	hasInstances := map[string]bool{}
	for _, e := range order {
		if e.Group == dcgmFEGPUI {
			hasInstances[places[e].UUID] = true
		}
	}
	out := make([]Sample, 0, len(order))
	for _, e := range order {
		a := accs[e]
		a.Util = utilization(a.Util, a.GraphicsActive)
		if !a.MIG() && hasInstances[a.UUID] && isNaN(a.Util) && isNaN(a.SMActive) && isNaN(a.TensorActive) {
			continue
		}
		out = append(out, *a)
	}
	return normalize(out)
}

// dcgmReading returns a value as a float, NA for a failed read or a blank
// sentinel.
func dcgmReading(v dcgmValue) float64 {
	if v.Status != 0 {
		return NA
	}
	if v.Float {
		if v.Double >= dcgmFP64Blank {
			return NA
		}
		return v.Double
	}
	// GPU_UTIL is an int32 field widened to int64: the int32 sentinel (and
	// the larger int64 one) bound it.
	if v.Int >= dcgmInt32Blank {
		return NA
	}
	return float64(v.Int)
}

func isNaN(f float64) bool { return f != f }
