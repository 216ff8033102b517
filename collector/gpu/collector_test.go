package gpu

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/zonewatch/zonewatch/topology"
)

// fixed is a feed reading that never changes; ok false is a feed that is down.
type fixed[T any] struct {
	v  T
	ok bool
}

func (f fixed[T]) Get() (T, bool) { return f.v, f.ok }

const (
	uuid0 = "GPU-00000001-0000-4000-8000-000000000000"
	uuid1 = "GPU-00000001-0001-4000-8000-000000000001"
	uuid2 = "GPU-00000001-0002-4000-8000-000000000002"
	uuid3 = "GPU-00000001-0003-4000-8000-000000000003"
	mig0  = "MIG-11111111-0000-4000-8000-000000000000"
)

func testIndex() *topology.Index {
	x := topology.NewIndex()
	x.UpsertNode(topology.Node{Name: "gpu-a1", Zone: "us-east-1a", Region: "us-east-1"})
	x.UpsertPod(0, topology.Pod{Namespace: "ml", Name: "llm-worker-0", Node: "gpu-a1",
		Identity: topology.Identity{Kind: "PyTorchJob", Name: "llm", Role: topology.RoleWorker}})
	x.UpsertPod(0, topology.Pod{Namespace: "ml", Name: "bert-0", Node: "gpu-a1",
		Identity: topology.Identity{Kind: "JobSet", Name: "bert", Role: topology.RoleCoordinator}})
	return x
}

func testAllocs() *Allocations {
	dev := func(res string, ids ...string) *podresourcesv1.ContainerDevices {
		return &podresourcesv1.ContainerDevices{ResourceName: res, DeviceIds: ids}
	}
	pod := func(ns, name string, devs ...*podresourcesv1.ContainerDevices) *podresourcesv1.PodResources {
		return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesv1.ContainerResources{{Name: "main", Devices: devs}}}
	}
	return BuildAllocations(&podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		pod("ml", "llm-worker-0", dev("nvidia.com/gpu", uuid0)),
		// time-slicing: two replicas of uuid1 to one job pod, one to a notebook
		pod("ml", "bert-0", dev("nvidia.com/gpu", uuid1+"::0", uuid1+"::3")),
		pod("lab", "notebook", dev("nvidia.com/gpu", uuid1+"::1")),
		pod("ml", "llm-worker-0-mig", dev("nvidia.com/mig-1g.10gb", mig0)),
		pod("shop", "frontend", dev("example.com/fpga", "fpga0")),
	}}, ResourceFilter{})
}

func testSamples() []Sample {
	return []Sample{
		{UUID: uuid0, Index: 0, GI: NoInstance, Util: 0.01, GraphicsActive: 0.02, SMActive: 0, TensorActive: 0},
		{UUID: uuid1, Index: 1, GI: NoInstance, Util: 0.96, GraphicsActive: 0.97, SMActive: 0.12, TensorActive: NA},
		{UUID: uuid2, Index: 2, GI: NoInstance, Util: 0, GraphicsActive: NA, SMActive: NA, TensorActive: NA},
		{UUID: uuid3, Index: 3, GI: 2, MIGUUID: mig0, Util: 0.5, GraphicsActive: 0.5, SMActive: 0.4, TensorActive: 0.3},
	}
}

func TestCollectorJoin(t *testing.T) {
	c := NewCollector(fixed[[]Sample]{testSamples(), true}, fixed[*Allocations]{testAllocs(), true}, testIndex(), "gpu-a1")
	want := `
# HELP zonewatch_gpu_graphics_engine_active_ratio Fraction of time 0..1 the graphics or compute engine was active (DCGM PROF_GR_ENGINE_ACTIVE, on in dcgm-exporter's default counters; NVML GPM graphics utilization); only where the source has it.
# TYPE zonewatch_gpu_graphics_engine_active_ratio gauge
zonewatch_gpu_graphics_engine_active_ratio{gpu="0",job_name="llm",namespace="ml",node="gpu-a1",pod="llm-worker-0",uuid="GPU-00000001-0000-4000-8000-000000000000",zone="us-east-1a"} 0.02
zonewatch_gpu_graphics_engine_active_ratio{gpu="1",job_name="",namespace="lab",node="gpu-a1",pod="notebook",uuid="GPU-00000001-0001-4000-8000-000000000001",zone="us-east-1a"} 0.97
zonewatch_gpu_graphics_engine_active_ratio{gpu="1",job_name="bert",namespace="ml",node="gpu-a1",pod="bert-0",uuid="GPU-00000001-0001-4000-8000-000000000001",zone="us-east-1a"} 0.97
zonewatch_gpu_graphics_engine_active_ratio{gpu="3/gi2",job_name="",namespace="ml",node="gpu-a1",pod="llm-worker-0-mig",uuid="GPU-00000001-0003-4000-8000-000000000003",zone="us-east-1a"} 0.5
# HELP zonewatch_gpu_sm_active_ratio Fraction of time 0..1 at least one warp was resident on an SM, averaged over SMs (DCGM PROF_SM_ACTIVE, NVML GPM SM utilization); only where the source has it.
# TYPE zonewatch_gpu_sm_active_ratio gauge
zonewatch_gpu_sm_active_ratio{gpu="0",job_name="llm",namespace="ml",node="gpu-a1",pod="llm-worker-0",uuid="GPU-00000001-0000-4000-8000-000000000000",zone="us-east-1a"} 0
zonewatch_gpu_sm_active_ratio{gpu="1",job_name="",namespace="lab",node="gpu-a1",pod="notebook",uuid="GPU-00000001-0001-4000-8000-000000000001",zone="us-east-1a"} 0.12
zonewatch_gpu_sm_active_ratio{gpu="1",job_name="bert",namespace="ml",node="gpu-a1",pod="bert-0",uuid="GPU-00000001-0001-4000-8000-000000000001",zone="us-east-1a"} 0.12
zonewatch_gpu_sm_active_ratio{gpu="3/gi2",job_name="",namespace="ml",node="gpu-a1",pod="llm-worker-0-mig",uuid="GPU-00000001-0003-4000-8000-000000000003",zone="us-east-1a"} 0.4
# HELP zonewatch_gpu_tensor_active_ratio Fraction of cycles 0..1 a tensor pipe was active (DCGM PROF_PIPE_TENSOR_ACTIVE, NVML GPM any-tensor utilization); only where the source has it.
# TYPE zonewatch_gpu_tensor_active_ratio gauge
zonewatch_gpu_tensor_active_ratio{gpu="0",job_name="llm",namespace="ml",node="gpu-a1",pod="llm-worker-0",uuid="GPU-00000001-0000-4000-8000-000000000000",zone="us-east-1a"} 0
zonewatch_gpu_tensor_active_ratio{gpu="3/gi2",job_name="",namespace="ml",node="gpu-a1",pod="llm-worker-0-mig",uuid="GPU-00000001-0003-4000-8000-000000000003",zone="us-east-1a"} 0.3
# HELP zonewatch_gpu_utilization_ratio GPU utilization 0..1 (DCGM GPU_UTIL; PROF_GR_ENGINE_ACTIVE for MIG instances), with the pod and training job it is allocated to; empty job labels when unallocated.
# TYPE zonewatch_gpu_utilization_ratio gauge
zonewatch_gpu_utilization_ratio{gpu="0",job_name="llm",namespace="ml",node="gpu-a1",pod="llm-worker-0",uuid="GPU-00000001-0000-4000-8000-000000000000",zone="us-east-1a"} 0.01
zonewatch_gpu_utilization_ratio{gpu="1",job_name="",namespace="lab",node="gpu-a1",pod="notebook",uuid="GPU-00000001-0001-4000-8000-000000000001",zone="us-east-1a"} 0.96
zonewatch_gpu_utilization_ratio{gpu="1",job_name="bert",namespace="ml",node="gpu-a1",pod="bert-0",uuid="GPU-00000001-0001-4000-8000-000000000001",zone="us-east-1a"} 0.96
zonewatch_gpu_utilization_ratio{gpu="2",job_name="",namespace="",node="gpu-a1",pod="",uuid="GPU-00000001-0002-4000-8000-000000000002",zone="us-east-1a"} 0
zonewatch_gpu_utilization_ratio{gpu="3/gi2",job_name="",namespace="ml",node="gpu-a1",pod="llm-worker-0-mig",uuid="GPU-00000001-0003-4000-8000-000000000003",zone="us-east-1a"} 0.5
`
	if err := testutil.CollectAndCompare(updater{c}, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// updater adapts a root-collector part to prometheus.Collector for tests.
type updater struct {
	c interface {
		Update(chan<- prometheus.Metric) error
	}
}

func (u updater) Describe(chan<- *prometheus.Desc) {}
func (u updater) Collect(ch chan<- prometheus.Metric) {
	if err := u.c.Update(ch); err != nil {
		panic(err)
	}
}

func TestCollectorFeedsDown(t *testing.T) {
	idx := testIndex()
	for name, c := range map[string]*Collector{
		"gpu source down":   NewCollector(fixed[[]Sample]{nil, false}, fixed[*Allocations]{testAllocs(), true}, idx, "gpu-a1"),
		"podresources down": NewCollector(fixed[[]Sample]{testSamples(), true}, fixed[*Allocations]{nil, false}, idx, "gpu-a1"),
	} {
		ch := make(chan prometheus.Metric, 64)
		err := c.Update(ch)
		if n := len(ch); n != 0 {
			t.Errorf("%s: %d series, want none (no stale or unattributed values)", name, n)
		}
		if err == nil {
			t.Errorf("%s: Update succeeded; want an error (zonewatch_scrape_collector_success 0)", name)
		}
	}
}

func TestCollectorWithoutPodResources(t *testing.T) {
	c := NewCollector(fixed[[]Sample]{testSamples(), true}, nil, testIndex(), "gpu-a1")
	rows, ok := c.Join(nil)
	if !ok || len(rows) != 4 {
		t.Fatalf("rows = %d, %v; want 4 GPUs", len(rows), ok)
	}
	for _, r := range rows {
		if r.Namespace != "" || r.Pod != "" || r.JobName != "" {
			t.Errorf("row %+v has job labels without PodResources", r)
		}
	}
}

func TestCollectorAllNodesAndSourceAttribution(t *testing.T) {
	idx := testIndex()
	idx.UpsertNode(topology.Node{Name: "gpu-b1", Zone: "us-east-1b", Region: "us-east-1"})
	samples := []Sample{
		{UUID: uuid0, Index: 0, GI: NoInstance, Node: "gpu-a1", Util: 0.5, SMActive: NA, TensorActive: NA},
		// dcgm-exporter's own mapping is used when PodResources has none
		{UUID: uuid2, Index: 0, GI: NoInstance, Node: "gpu-b1", Util: 0.7, SMActive: NA, TensorActive: NA, Namespace: "ml", Pod: "bert-0"},
		{UUID: uuid3, Index: 1, GI: NoInstance, Node: "gpu-x9", Util: 0.2, SMActive: NA, TensorActive: NA},
	}
	c := NewCollector(fixed[[]Sample]{samples, true}, fixed[*Allocations]{testAllocs(), true}, idx, "")
	rows, _ := c.Join(nil)
	got := map[string]string{}
	for _, r := range rows {
		got[r.UUID] = fmt.Sprintf("%s/%s %s/%s/%s", r.Node, r.Zone, r.Namespace, r.JobName, r.Pod)
	}
	want := map[string]string{
		uuid0: "gpu-a1/us-east-1a ml/llm/llm-worker-0",
		uuid2: "gpu-b1/us-east-1b ml/bert/bert-0",
		uuid3: "gpu-x9/unknown //",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %q, want %q", k, got[k], w)
		}
	}
}

func TestBuildAllocationsExtrasAndSkipped(t *testing.T) {
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{{
		Namespace: "ml", Name: "p",
		Containers: []*podresourcesv1.ContainerResources{
			{Name: "a", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu.shared", DeviceIds: []string{uuid0 + "::2"}}}},
			{Name: "b", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"garbage", uuid0}}}},
		},
	}}}
	a := BuildAllocations(resp, ResourceFilter{})
	if a.Len() != 1 || a.Skipped != 1 {
		t.Errorf("without extras: %d devices, %d skipped; want 1, 1", a.Len(), a.Skipped)
	}
	a = BuildAllocations(resp, ResourceFilter{Extra: []string{"nvidia.com/gpu.shared"}})
	s := Sample{UUID: uuid0, Index: 0, GI: NoInstance}
	if pods := a.Lookup(&s); len(pods) != 1 || pods[0] != (PodRef{"ml", "p"}) {
		t.Errorf("pods of %s = %v; want the one pod once", uuid0, pods)
	}
}
