package gpu_test

import (
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/zonewatch/zonewatch/collector/gpu"
)

// draSlice is a ResourceSlice as the NVIDIA DRA driver publishes it
// (NVIDIA/k8s-dra-driver-gpu v25.12.0, cmd/gpu-kubelet-plugin: driver
// gpu.nvidia.com, one pool named after the node, devices "gpu-<minor>"
// with attributes type, uuid, index, minor; MIG devices type "mig", uuid
// MIG-..., parentUUID).
func draSlice(node string, gpus map[string]string, migs map[string][2]string) *resourcev1.ResourceSlice {
	rs := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.nvidia.com-x7k2p"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   gpu.DRADriver,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
		},
	}
	var i int64
	for name, uuid := range gpus {
		rs.Spec.Devices = append(rs.Spec.Devices, resourcev1.Device{Name: name, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"type":        {StringValue: ptr.To("gpu")},
			"uuid":        {StringValue: ptr.To(uuid)},
			"index":       {IntValue: ptr.To(i)},
			"minor":       {IntValue: ptr.To(i)},
			"productName": {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
		}})
		i++
	}
	for name, u := range migs {
		rs.Spec.Devices = append(rs.Spec.Devices, resourcev1.Device{Name: name, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"type":       {StringValue: ptr.To("mig")},
			"uuid":       {StringValue: ptr.To(u[0])},
			"parentUUID": {StringValue: ptr.To(u[1])},
			"profile":    {StringValue: ptr.To("1g.10gb")},
		}})
	}
	return rs
}

// claim is a container's DRA allocation as the kubelet reports it in
// PodResources v1 (k8s.io/kubelet v0.37.2 api.proto: DynamicResource,
// ClaimResource driver_name / pool_name / device_name).
func claim(name string, devs ...[3]string) *podresourcesv1.DynamicResource {
	dr := &podresourcesv1.DynamicResource{ClaimName: name, ClaimNamespace: "ml"}
	for _, d := range devs {
		dr.ClaimResources = append(dr.ClaimResources, &podresourcesv1.ClaimResource{
			DriverName: d[0], PoolName: d[1], DeviceName: d[2],
			CdiDevices: []*podresourcesv1.CDIDevice{{Name: "k8s." + d[0] + "/gpu=" + d[2]}},
		})
	}
	return dr
}

func TestBuildAllocationsDRA(t *testing.T) {
	const mig = "MIG-5c89f1b2-7d3e-5f4a-9b6c-0d1e2f3a4b5c"
	slices := gpu.NewSlices()
	slices.Upsert(draSlice("gpu-a1", map[string]string{"gpu-0": gpuUUID(1, 0), "gpu-1": gpuUUID(1, 1)},
		map[string][2]string{"gpu-2-mig-1g10gb-19-0": {mig, gpuUUID(1, 2)}}))
	if slices.Len() != 3 {
		t.Fatalf("%d devices with UUIDs, want 3", slices.Len())
	}
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		{Namespace: "ml", Name: "llm-worker-0", Containers: []*podresourcesv1.ContainerResources{{Name: "main",
			DynamicResources: []*podresourcesv1.DynamicResource{claim("llm-worker-0-gpu", [3]string{gpu.DRADriver, "gpu-a1", "gpu-0"})}}}},
		{Namespace: "ml", Name: "eval-0", Containers: []*podresourcesv1.ContainerResources{{Name: "main",
			DynamicResources: []*podresourcesv1.DynamicResource{claim("eval-mig", [3]string{gpu.DRADriver, "gpu-a1", "gpu-2-mig-1g10gb-19-0"})}}}},
		{Namespace: "ml", Name: "late-0", Containers: []*podresourcesv1.ContainerResources{{Name: "main",
			DynamicResources: []*podresourcesv1.DynamicResource{claim("late",
				[3]string{gpu.DRADriver, "gpu-a1", "gpu-7"},         // no slice names it (yet): unmapped
				[3]string{"nic.example.com", "gpu-a1", "eth1"})}}}}, // not a GPU driver: ignored
	}}
	a := gpu.BuildAllocations(resp, gpu.ResourceFilter{Slices: slices})
	for _, tc := range []struct {
		s    gpu.Sample
		want string
	}{
		{gpu.Sample{UUID: gpuUUID(1, 0), Index: 0, GI: gpu.NoInstance}, "ml/llm-worker-0"},
		{gpu.Sample{UUID: gpuUUID(1, 1), Index: 1, GI: gpu.NoInstance}, ""},
		{gpu.Sample{UUID: gpuUUID(1, 2), Index: 2, GI: 3, MIGUUID: mig}, "ml/eval-0"},
	} {
		if got := pods(a, tc.s); got != tc.want {
			t.Errorf("%+v: pods %q, want %q", tc.s, got, tc.want)
		}
	}
	if a.Unmapped != 1 || a.Skipped != 0 {
		t.Errorf("unmapped %d, skipped %d; want 1, 0", a.Unmapped, a.Skipped)
	}
	// Without ResourceSlices every DRA GPU is unmapped.
	if a := gpu.BuildAllocations(resp, gpu.ResourceFilter{}); a.Unmapped != 3 || a.Len() != 0 {
		t.Errorf("without slices: unmapped %d, devices %d; want 3, 0", a.Unmapped, a.Len())
	}
	slices.Delete("gpu-a1-gpu.nvidia.com-x7k2p")
	if _, ok := slices.DeviceUUID(gpu.DRADriver, "gpu-a1", "gpu-0"); ok || slices.Len() != 0 {
		t.Error("a deleted slice still maps devices")
	}
}
