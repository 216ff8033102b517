package gpu_test

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/zonewatch/zonewatch/collector"
	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

// socketPath returns a unix socket path under a test folder, short enough
// for sun_path (108 bytes).
func socketPath(t *testing.T) string {
	dir := t.TempDir()
	if len(dir) > 80 {
		var err error
		if dir, err = os.MkdirTemp("", "zwgpu"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	return filepath.Join(dir, "kubelet.sock")
}

func gpuUUID(node, i int) string {
	return "GPU-0000000" + string(rune('0'+node)) + "-000" + string(rune('0'+i)) + "-4000-8000-000000000000"
}

// scenario is a small cluster: two GPU nodes in two zones, a healthy job,
// a blocked split job and an idle GPU.
func scenario() *sim.Scenario {
	s := &sim.Scenario{Region: "us-east-1", Zones: []string{"us-east-1a", "us-east-1b"}}
	for n, z := range s.Zones {
		node := sim.Node{Name: "gpu-" + string(rune('a'+n)) + "1", Zone: z, IP: netip.MustParseAddr("172.18.0.1")}
		for i := range 4 {
			node.GPUs = append(node.GPUs, sim.GPU{Index: i, UUID: gpuUUID(n+1, i)})
		}
		s.Nodes = append(s.Nodes, node)
	}
	pod := func(ns, name, node, role string, gpus ...string) sim.Pod {
		return sim.Pod{Namespace: ns, Name: name, Node: node, Role: role, GPUs: gpus}
	}
	s.Jobs = []sim.Job{
		{Namespace: "ml", Name: "resnet", Kind: "PyTorchJob",
			Pods:      []sim.Pod{pod("ml", "resnet-master-0", "gpu-a1", "coordinator", gpuUUID(1, 0), gpuUUID(1, 1))},
			Behaviour: sim.Behaviour{GPUUtil: 0.93, SMActive: 0.81, TensorActive: 0.55}},
		{Namespace: "ml", Name: "llm", Kind: "PyTorchJob",
			Pods: []sim.Pod{pod("ml", "llm-master-0", "gpu-b1", "coordinator", gpuUUID(2, 0)),
				pod("ml", "llm-worker-0", "gpu-a1", "worker", gpuUUID(1, 2))},
			Behaviour: sim.Behaviour{GPUUtil: 0.01}},
	}
	s.Others = []sim.Pod{pod("shop", "frontend-0", "gpu-a1", "")}
	return s
}

func index(s *sim.Scenario) *topology.Index {
	x := topology.NewIndex()
	for _, n := range s.Nodes {
		x.UpsertNode(topology.Node{Name: n.Name, Zone: n.Zone, Region: s.Region})
	}
	for _, j := range s.Jobs {
		for _, p := range j.Pods {
			x.UpsertPod(0, topology.Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Node,
				Identity: topology.Identity{Kind: j.Kind, Name: j.Name, Role: p.Role}})
		}
	}
	return x
}

func read(t *testing.T, c *gpu.PodResources) *gpu.Allocations {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("podresources read: %v", err)
	}
	return a
}

func pods(a *gpu.Allocations, s gpu.Sample) string {
	var out []string
	for _, p := range a.Lookup(&s) {
		out = append(out, p.Namespace+"/"+p.Pod)
	}
	return strings.Join(out, ",")
}

func TestPodResourcesClientAgainstFakeKubelet(t *testing.T) {
	s := scenario()
	sock := socketPath(t)
	srv, err := sim.StartPodResources(s, "gpu-a1", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Close() }() // the kubelet restarted below is closed too
	skipped := prometheus.NewCounter(prometheus.CounterOpts{Name: "skipped"})
	c, err := gpu.DialPodResources(sock, gpu.ResourceFilter{}, skipped)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	a := read(t, c)
	whole := func(uuid string, idx int) gpu.Sample { return gpu.Sample{UUID: uuid, Index: idx, GI: gpu.NoInstance} }
	for _, tc := range []struct {
		s    gpu.Sample
		want string
	}{
		{whole(gpuUUID(1, 0), 0), "ml/resnet-master-0"},
		{whole(gpuUUID(1, 1), 1), "ml/resnet-master-0"},
		{whole(gpuUUID(1, 2), 2), "ml/llm-worker-0"},
		{whole(gpuUUID(1, 3), 3), ""},
		{whole(gpuUUID(2, 0), 0), ""}, // another node's kubelet
	} {
		if got := pods(a, tc.s); got != tc.want {
			t.Errorf("%s: pods %q, want %q", tc.s.UUID, got, tc.want)
		}
	}

	// Device ids in every format the NVIDIA device plugins use.
	const mig = "MIG-5c89f1b2-7d3e-5f4a-9b6c-0d1e2f3a4b5c"
	dev := func(res string, ids ...string) *podresourcesv1.ContainerDevices {
		return &podresourcesv1.ContainerDevices{ResourceName: res, DeviceIds: ids}
	}
	pod := func(ns, name string, devs ...*podresourcesv1.ContainerDevices) *podresourcesv1.PodResources {
		return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesv1.ContainerResources{{Name: "main", Devices: devs}}}
	}
	srv.SetPods([]*podresourcesv1.PodResources{
		pod("a", "shared-1", dev("nvidia.com/gpu", gpuUUID(1, 0)+"::0", gpuUUID(1, 0)+"::1")),
		pod("a", "shared-2", dev("nvidia.com/gpu", gpuUUID(1, 0)+"::2")),
		pod("b", "mig", dev("nvidia.com/mig-1g.10gb", mig)),
		pod("b", "gke-mig", dev("nvidia.com/gpu", "nvidia2/gi3")),
		pod("c", "by-index", dev("nvidia.com/gpu", "nvidia3")),
		pod("d", "bad", dev("nvidia.com/gpu", "not-a-gpu")),
	})
	a = read(t, c)
	for _, tc := range []struct {
		s    gpu.Sample
		want string
	}{
		{whole(gpuUUID(1, 0), 0), "a/shared-1,a/shared-2"},
		{gpu.Sample{UUID: gpuUUID(1, 1), Index: 1, GI: 7, MIGUUID: mig}, "b/mig"},
		{gpu.Sample{UUID: gpuUUID(1, 2), Index: 2, GI: 3}, "b/gke-mig"},
		{whole(gpuUUID(1, 3), 3), "c/by-index"},
	} {
		if got := pods(a, tc.s); got != tc.want {
			t.Errorf("%+v: pods %q, want %q", tc.s, got, tc.want)
		}
	}
	if got := testutil.ToFloat64(skipped); got != 1 {
		t.Errorf("skipped device ids = %v, want 1", got)
	}

	// A dead socket fails the read; the kubelet coming back heals it.
	srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if _, err := c.Read(ctx); err == nil {
		t.Error("read through a dead socket succeeded")
	}
	cancel()
	srv, err = sim.StartPodResources(s, "gpu-a1", sock)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Read(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after the kubelet came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestAllocatableResourcesOfFakeKubelet(t *testing.T) {
	s := scenario()
	sock := socketPath(t)
	srv, err := sim.StartPodResources(s, "", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.GetDevices(); len(d) != 1 || len(d[0].GetDeviceIds()) != 8 || d[0].GetResourceName() != "nvidia.com/gpu" {
		t.Errorf("allocatable = %v; want every node's 8 GPUs as nvidia.com/gpu", d)
	}
	got, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "llm-master-0"})
	if err != nil || len(got.GetPodResources().GetContainers()[0].GetDevices()[0].GetDeviceIds()) != 1 {
		t.Errorf("Get = %v, %v", got, err)
	}
	if _, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get of a missing pod = %v, want NotFound", err)
	}
}

// The whole GPU part as the exporter wires it under --simulate: the fake
// source and the fake kubelet read through the real client, the feeds, the
// join and the root collector.
func TestSimulatedGPUPartEndToEnd(t *testing.T) {
	s := scenario()
	sock := socketPath(t)
	srv, err := sim.StartPodResources(s, "gpu-a1", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	logger := slog.New(slog.DiscardHandler)
	src := sim.NewGPUSource(s, "gpu-a1")
	pr, err := gpu.DialPodResources(sock, gpu.ResourceFilter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	gpus := gpu.NewFeed("gpu", src.Read, time.Second, nil, logger)
	allocs := gpu.NewFeed("podresources", pr.Read, time.Second, nil, logger)
	exp := collector.New(logger)
	exp.Add("gpu", gpu.NewCollector(gpus, allocs, index(s), "gpu-a1"))
	exp.AddSource("gpu", gpus)
	exp.AddSource("podresources", allocs)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(exp)
	ctx := context.Background()
	poll := func() { gpus.Poll(ctx); allocs.Poll(ctx) }

	poll()
	want := `
# HELP zonewatch_gpu_utilization_ratio GPU utilization 0..1 (DCGM GPU_UTIL; PROF_GR_ENGINE_ACTIVE for MIG instances), with the pod and training job it is allocated to; empty job labels when unallocated.
# TYPE zonewatch_gpu_utilization_ratio gauge
zonewatch_gpu_utilization_ratio{gpu="0",job_name="resnet",namespace="ml",node="gpu-a1",pod="resnet-master-0",uuid="GPU-00000001-0000-4000-8000-000000000000",zone="us-east-1a"} 0.93
zonewatch_gpu_utilization_ratio{gpu="1",job_name="resnet",namespace="ml",node="gpu-a1",pod="resnet-master-0",uuid="GPU-00000001-0001-4000-8000-000000000000",zone="us-east-1a"} 0.93
zonewatch_gpu_utilization_ratio{gpu="2",job_name="llm",namespace="ml",node="gpu-a1",pod="llm-worker-0",uuid="GPU-00000001-0002-4000-8000-000000000000",zone="us-east-1a"} 0.01
zonewatch_gpu_utilization_ratio{gpu="3",job_name="",namespace="",node="gpu-a1",pod="",uuid="GPU-00000001-0003-4000-8000-000000000000",zone="us-east-1a"} 0
# HELP zonewatch_source_up Whether a data source (kubernetes, hubble, gpu, podresources, conntrack, ipcache, probe) is connected and delivering (1) or not (0).
# TYPE zonewatch_source_up gauge
zonewatch_source_up{source="gpu"} 1
zonewatch_source_up{source="podresources"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "zonewatch_gpu_utilization_ratio", "zonewatch_source_up"); err != nil {
		t.Fatal(err)
	}

	count := func() int {
		n, err := testutil.GatherAndCount(reg, "zonewatch_gpu_utilization_ratio", "zonewatch_gpu_sm_active_ratio", "zonewatch_gpu_tensor_active_ratio")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 12 {
		t.Errorf("%d GPU series, want 4 GPUs x 3 metrics", n)
	}

	// GPU source down: source_up 0 and no stale values.
	src.SetDown(true)
	poll()
	if n := count(); n != 0 {
		t.Errorf("GPU source down: %d GPU series remain", n)
	}
	if ok, down := exp.SourcesUp(); ok || strings.Join(down, ",") != "gpu" {
		t.Errorf("sources down = %v, want gpu", down)
	}
	src.SetDown(false)
	poll()
	if n := count(); n != 12 {
		t.Errorf("after recovery: %d GPU series", n)
	}

	// Kubelet gone: no series with guessed job labels.
	srv.Close()
	poll()
	if n := count(); n != 0 {
		t.Errorf("PodResources down: %d GPU series remain", n)
	}
	if ok, down := exp.SourcesUp(); ok || strings.Join(down, ",") != "podresources" {
		t.Errorf("sources down = %v, want podresources", down)
	}
}
