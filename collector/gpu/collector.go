package gpu

import (
	"errors"
	"math"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/topology"
)

var labels = []string{"node", "zone", "gpu", "uuid", "namespace", "job_name", "pod"}

var (
	utilDesc = prometheus.NewDesc("zonewatch_gpu_utilization_ratio",
		"GPU utilization 0..1 (DCGM GPU_UTIL; PROF_GR_ENGINE_ACTIVE for MIG instances), with the pod and training job it is allocated to; empty job labels when unallocated.",
		labels, nil)
	graphicsDesc = prometheus.NewDesc("zonewatch_gpu_graphics_engine_active_ratio",
		"Fraction of time 0..1 the graphics or compute engine was active (DCGM PROF_GR_ENGINE_ACTIVE, on in dcgm-exporter's default counters; NVML GPM graphics utilization); only where the source has it.",
		labels, nil)
	smDesc = prometheus.NewDesc("zonewatch_gpu_sm_active_ratio",
		"Fraction of time 0..1 at least one warp was resident on an SM, averaged over SMs (DCGM PROF_SM_ACTIVE, NVML GPM SM utilization); only where the source has it.",
		labels, nil)
	tensorDesc = prometheus.NewDesc("zonewatch_gpu_tensor_active_ratio",
		"Fraction of cycles 0..1 a tensor pipe was active (DCGM PROF_PIPE_TENSOR_ACTIVE, NVML GPM any-tensor utilization); only where the source has it.",
		labels, nil)
)

// Index is what the GPU join needs from the topology index.
type Index interface {
	LookupPod(namespace, name string) (topology.Endpoint, bool)
	NodeZone(node string) (zone, region string, ok bool)
}

// Getter is a feed's latest good reading (see Feed).
type Getter[T any] interface {
	Get() (T, bool)
}

// Collector exports GPU utilization joined with pods and jobs, computed
// at scrape time from the feeds' latest readings: a gone pod or a failed
// source leaves no series.
type Collector struct {
	samples Getter[[]Sample]
	allocs  Getter[*Allocations] // nil: no PodResources, every GPU unallocated
	index   Index
	node    string
	gone    Gone // nil: every listed pod holds its GPUs

	mu        sync.Mutex
	migLabels map[[2]int]string // gpu label of MIG instances, made once
}

// NewCollector joins samples with allocs (nil to run without PodResources)
// and index. node is this exporter's node; empty takes each sample's Node.
func NewCollector(samples Getter[[]Sample], allocs Getter[*Allocations], index Index, node string) *Collector {
	return &Collector{samples: samples, allocs: allocs, index: index, node: node, migLabels: map[[2]int]string{}}
}

// Gone says which pods are finished or terminating; *Discovery is one.
type Gone interface {
	PodGone(namespace, name string) bool
}

// SkipGone makes the join drop pods g reports gone: kubelets before 1.34
// list terminal pods with their devices (kubernetes/kubernetes#119423,
// #132020), and a pod being deleted overlaps its replacement.
func (c *Collector) SkipGone(g Gone) { c.gone = g }

// Row is one exported GPU series: its labels and values.
type Row struct {
	Node, Zone, GPU, UUID, Namespace, JobName, Pod string
	Util, GraphicsActive, SMActive, TensorActive   float64
}

// Join computes the rows for the current readings, appending to out. It
// returns false when a feed it needs is down (nothing may be exported).
func (c *Collector) Join(out []Row) ([]Row, bool) {
	samples, ok := c.samples.Get()
	if !ok {
		return out, false
	}
	var allocs *Allocations
	if c.allocs != nil {
		if allocs, ok = c.allocs.Get(); !ok {
			// Without PodResources every GPU would look unallocated: export
			// nothing rather than wrong job labels.
			return out, false
		}
	}
	lastNode, zone := "", ""
	var own [1]PodRef
	for i := range samples {
		s := &samples[i]
		node := c.node
		if node == "" {
			node = s.Node
		}
		if node != lastNode || zone == "" {
			zone, _, _ = c.index.NodeZone(node)
			lastNode = node
		}
		r := Row{Node: node, Zone: zone, GPU: c.gpuLabel(s), UUID: s.UUID, Util: s.Util, GraphicsActive: s.GraphicsActive, SMActive: s.SMActive, TensorActive: s.TensorActive}
		n := len(out)
		pods := allocs.Lookup(s)
		if len(pods) == 0 && s.Pod != "" {
			own[0] = PodRef{Namespace: s.Namespace, Pod: s.Pod}
			pods = own[:]
		}
		for _, p := range pods {
			if c.gone != nil && c.gone.PodGone(p.Namespace, p.Pod) {
				continue
			}
			out = append(out, c.withPod(r, p))
		}
		if len(out) == n { // unallocated, or only gone pods held it
			out = append(out, r)
		}
	}
	return out, true
}

func (c *Collector) withPod(r Row, p PodRef) Row {
	r.Namespace, r.Pod = p.Namespace, p.Pod
	if ep, ok := c.index.LookupPod(p.Namespace, p.Pod); ok && ep.Job != nil {
		r.JobName = ep.Job.Name
	}
	return r
}

// gpuLabel is the gpu label: the NVML index, "<index>/gi<id>" for a MIG
// instance. Values are made once so the join does not format.
func (c *Collector) gpuLabel(s *Sample) string {
	if s.Index >= 0 && s.Index < len(indexLabels) && !s.MIG() {
		return indexLabels[s.Index]
	}
	k := [2]int{s.Index, s.GI}
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.migLabels[k]
	if !ok {
		l = formatGPULabel(s)
		c.migLabels[k] = l
	}
	return l
}

func formatGPULabel(s *Sample) string {
	idx := "unknown"
	if s.Index >= 0 {
		idx = strconv.Itoa(s.Index)
	}
	if !s.MIG() {
		return idx
	}
	return idx + "/gi" + strconv.Itoa(s.GI)
}

var indexLabels = func() []string {
	l := make([]string, 64)
	for i := range l {
		l[i] = strconv.Itoa(i)
	}
	return l
}()

// Update implements the root collector's Collector.
// Without a current GPU and PodResources reading it exports nothing and
// fails (zonewatch_scrape_collector_success 0).
func (c *Collector) Update(ch chan<- prometheus.Metric) error {
	rows, ok := c.Join(nil)
	for i := range rows {
		r := &rows[i]
		emit(ch, utilDesc, r.Util, r)
		emit(ch, graphicsDesc, r.GraphicsActive, r)
		emit(ch, smDesc, r.SMActive, r)
		emit(ch, tensorDesc, r.TensorActive, r)
	}
	if !ok {
		return errNoReading
	}
	return nil
}

var errNoReading = errors.New("no current GPU and PodResources reading: GPU series withheld")

func emit(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, r *Row) {
	if math.IsNaN(v) {
		return
	}
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, r.Node, r.Zone, r.GPU, r.UUID, r.Namespace, r.JobName, r.Pod)
}
