package gpu

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/zonewatch/zonewatch/topology"
)

// benchNode is a busy 8-GPU node: four job pods with two GPUs each, two
// of them time-sliced with a notebook, plus a MIG GPU with 7 instances.
func benchNode() (*Collector, int) {
	x := topology.NewIndex()
	x.UpsertNode(topology.Node{Name: "gpu-a1", Zone: "us-east-1a", Region: "us-east-1"})
	var prs []*podresourcesv1.PodResources
	var samples []Sample
	for i := range 8 {
		u := fmt.Sprintf("GPU-%08x-0000-4000-8000-000000000000", i)
		samples = append(samples, Sample{UUID: u, Index: i, GI: NoInstance, Util: 0.9, SMActive: 0.5, TensorActive: 0.3})
		if i%2 == 0 {
			name := fmt.Sprintf("job-%d-worker-0", i/2)
			x.UpsertPod(0, topology.Pod{Namespace: "ml", Name: name, Node: "gpu-a1", Identity: topology.Identity{Kind: "PyTorchJob", Name: fmt.Sprintf("job-%d", i/2), Role: topology.RoleWorker}})
			prs = append(prs, &podresourcesv1.PodResources{Namespace: "ml", Name: name, Containers: []*podresourcesv1.ContainerResources{{
				Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{u + "::0", fmt.Sprintf("GPU-%08x-0000-4000-8000-000000000000::0", i+1)}}},
			}}})
		}
		if i < 4 {
			prs = append(prs, &podresourcesv1.PodResources{Namespace: "lab", Name: fmt.Sprintf("notebook-%d", i), Containers: []*podresourcesv1.ContainerResources{{
				Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{u + "::1"}}},
			}}})
		}
	}
	for gi := 1; gi <= 7; gi++ {
		m := fmt.Sprintf("MIG-%08x-0000-4000-8000-000000000000", gi)
		samples = append(samples, Sample{UUID: "GPU-ffffffff-0000-4000-8000-000000000000", Index: 8, GI: gi, MIGUUID: m, Util: 0.4, SMActive: 0.3, TensorActive: NA})
		prs = append(prs, &podresourcesv1.PodResources{Namespace: "ml", Name: fmt.Sprintf("mig-%d", gi), Containers: []*podresourcesv1.ContainerResources{{
			Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/mig-1g.18gb", DeviceIds: []string{m}}},
		}}})
	}
	a := BuildAllocations(&podresourcesv1.ListPodResourcesResponse{PodResources: prs}, ResourceFilter{})
	c := NewCollector(fixed[[]Sample]{normalize(samples), true}, fixed[*Allocations]{a, true}, x, "gpu-a1")
	rows, _ := c.Join(nil)
	return c, len(rows)
}

// BenchmarkJoin is the scrape-time join alone: samples x allocations x
// index, no label formatting for whole GPUs.
func BenchmarkJoin(b *testing.B) {
	c, n := benchNode()
	b.ReportAllocs()
	rows := make([]Row, 0, n)
	for b.Loop() {
		rows, _ = c.Join(rows[:0])
	}
	b.ReportMetric(float64(n), "rows/op")
}

// BenchmarkUpdate is the whole scrape of the GPU part, const metrics
// included.
func BenchmarkUpdate(b *testing.B) {
	c, _ := benchNode()
	ch := make(chan prometheus.Metric, 1024)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Update(ch); err != nil {
			b.Fatal(err)
		}
		for len(ch) > 0 {
			<-ch
		}
	}
}

// BenchmarkJoinSkipGone is the join with the node's pod watch consulted for
// every allocated pod (one of them finished), as the exporter runs it.
func BenchmarkJoinSkipGone(b *testing.B) {
	c, _ := benchNode()
	d := &Discovery{pods: map[PodRef]*nodePod{{Namespace: "lab", Pod: "notebook-0"}: {gone: true}}}
	c.SkipGone(d)
	rows, _ := c.Join(nil)
	n := len(rows)
	b.ReportAllocs()
	for b.Loop() {
		rows, _ = c.Join(rows[:0])
	}
	b.ReportMetric(float64(n), "rows/op")
}
