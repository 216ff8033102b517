package gpu_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

// servePage serves a dcgm-exporter page at addr (host:port) until the test
// ends.
func servePage(t *testing.T, addr, page string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(page))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// operatorPod is a dcgm-exporter pod as the GPU Operator's DaemonSet makes
// it (NVIDIA/gpu-operator v25.10.0..v26.7.0 assets/state-dcgm-exporter/
// 0800_daemonset.yaml, 0900_daemonset.yaml before: label
// app=nvidia-dcgm-exporter, container nvidia-dcgm-exporter, port "metrics"
// 9400, no hostNetwork, no hostPort), bound to node.
func operatorPod(name, node string, port int32) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpu-operator", Labels: map[string]string{"app": "nvidia-dcgm-exporter"}},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: "nvidia-dcgm-exporter",
			Tolerations:        []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name: "nvidia-dcgm-exporter", Image: "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.2-4.8.1-distroless",
				Env:   []corev1.EnvVar{{Name: "DCGM_EXPORTER_LISTEN", Value: ":9400"}, {Name: "DCGM_EXPORTER_KUBERNETES", Value: "true"}},
				Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: port}},
			}},
		},
	}
}

func createRunning(t *testing.T, c kubernetes.Interface, p *corev1.Pod, ip string) {
	t.Helper()
	ctx := context.Background()
	created, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createNode(t *testing.T, c kubernetes.Interface, name string, capacity corev1.ResourceList) {
	t.Helper()
	ctx := context.Background()
	n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"topology.kubernetes.io/zone": "us-east-1a"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if capacity != nil {
		n.Status.Capacity, n.Status.Allocatable = capacity, capacity
		if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func startDiscovery(t *testing.T, c kubeapi.Interface, o gpu.DiscoveryOptions) *gpu.Discovery {
	t.Helper()
	o.Logger = slog.New(slog.DiscardHandler)
	d, err := gpu.NewDiscovery(c, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if !d.Run(ctx) {
		t.Fatal("discovery informers did not sync")
	}
	return d
}

// On the real kube-apiserver: this node's dcgm-exporter is found through
// its pod object, read at the pod IP, and followed when the DaemonSet
// replaces the pod with one at a new IP. The pod IPs are loopback
// addresses where the test serves dcgm-exporter 4.x pages.
func TestDiscoveryFindsAndFollowsOperatorDCGMExporter(t *testing.T) {
	testenv.Integration(t)
	api := testenv.StartAPIServer(t)
	c := kubernetes.NewForConfigOrDie(api.Config)
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu-operator"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createNode(t, c, "gpu-node-1", corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2"), corev1.ResourceCPU: resource.MustParse("96")})
	createNode(t, c, "gpu-node-2", nil)
	createNode(t, c, "cpu-node-1", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16")})

	// One port on two loopback addresses: the old and the new pod IP.
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("127.0.0.2 is not bindable here: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	page, err := os.ReadFile(filepath.Join("testdata", "dcgm-exporter-4.x-mig.txt"))
	if err != nil {
		t.Fatal(err)
	}
	servePage(t, fmt.Sprintf("127.0.0.2:%d", port), string(page))
	servePage(t, fmt.Sprintf("127.0.0.3:%d", port), strings.ReplaceAll(string(page), "} 87\n", "} 55\n"))

	// A dcgm-exporter of the same DaemonSet on another node must not be
	// picked: the watch is of this node's pods only.
	createRunning(t, c, operatorPod("nvidia-dcgm-exporter-zzzzz", "gpu-node-2", int32(port)), "127.0.0.9")

	d := startDiscovery(t, kubeapi.NewForConfigOrDie(api.Config), gpu.DiscoveryOptions{Node: "gpu-node-1"})
	if ok, why := d.GPUNode(); !ok || why != "node capacity nvidia.com/gpu=2" {
		t.Errorf("GPUNode() = %v, %q; want the node's capacity", ok, why)
	}
	src := gpu.NewDiscoveredDCGMExporter(d, gpu.Options{})
	if _, err := src.Read(ctx); err == nil || !strings.Contains(err.Error(), "no Running dcgm-exporter pod on node gpu-node-1") {
		t.Errorf("read before the pod exists: %v; want what to change", err)
	}

	createRunning(t, c, operatorPod("nvidia-dcgm-exporter-abcde", "gpu-node-1", int32(port)), "127.0.0.2")
	readUtil := func(want float64) func() error {
		return func() error {
			ss, err := src.Read(ctx)
			if err != nil {
				return err
			}
			if len(ss) != 3 || ss[0].Util != want || ss[0].Pod != "llm-worker-0" || ss[0].GraphicsActive != 0.912345 {
				return fmt.Errorf("samples %+v; want 3 with GPU 0 at %v, pod llm-worker-0", ss, want)
			}
			return nil
		}
	}
	eventually(t, "reading the dcgm-exporter pod at 127.0.0.2", readUtil(0.87))
	if p, _ := d.DCGMExporter(); p.URL != fmt.Sprintf("http://127.0.0.2:%d/metrics", port) || p.Name != "nvidia-dcgm-exporter-abcde" {
		t.Errorf("found %+v", p)
	}

	// The DaemonSet replaces the pod (upgrade, eviction): the old one goes,
	// a new one with another name and IP comes.
	if err := c.CoreV1().Pods("gpu-operator").Delete(ctx, "nvidia-dcgm-exporter-abcde", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	createRunning(t, c, operatorPod("nvidia-dcgm-exporter-fghij", "gpu-node-1", int32(port)), "127.0.0.3")
	eventually(t, "following the replaced pod to 127.0.0.3", readUtil(0.55))

	// A CPU node: no GPU resource, no GPU pod, nothing to export; a pod
	// requesting a GPU bound to it makes it a GPU node.
	cpu := startDiscovery(t, kubeapi.NewForConfigOrDie(api.Config), gpu.DiscoveryOptions{Node: "cpu-node-1"})
	if ok, why := cpu.GPUNode(); ok {
		t.Errorf("cpu node: GPUNode() = true (%s)", why)
	}
	gpuPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Namespace: "default"}, Spec: corev1.PodSpec{NodeName: "cpu-node-1",
		Containers: []corev1.Container{{Name: "main", Image: "pytorch", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("1")}}}}}}
	if _, err := c.CoreV1().Pods("default").Create(ctx, gpuPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a GPU-requesting pod makes a GPU node", func() error {
		if ok, why := cpu.GPUNode(); !ok || why != "pod default/trainer-0 requests nvidia.com/mig-1g.10gb" {
			return fmt.Errorf("GPUNode() = %v, %q", ok, why)
		}
		return nil
	})
}

// On the real kube-apiserver: a GPU allocated through DRA arrives in
// PodResources dynamic_resources (a fake kubelet here) and is mapped to its
// UUID through the ResourceSlice the NVIDIA DRA driver published for this
// node; the GPU gets its job. A finished pod keeps no GPU.
func TestDRAGPUGetsItsJobThroughResourceSlice(t *testing.T) {
	testenv.Integration(t)
	api := testenv.StartAPIServer(t)
	c := kubernetes.NewForConfigOrDie(api.Config)
	ctx := context.Background()
	createNode(t, c, "gpu-a1", nil)
	const mig = "MIG-5c89f1b2-7d3e-5f4a-9b6c-0d1e2f3a4b5c"
	rs := draSlice("gpu-a1", map[string]string{"gpu-0": gpuUUID(1, 0), "gpu-1": gpuUUID(1, 1)},
		map[string][2]string{"gpu-2-mig-1g10gb-19-0": {mig, gpuUUID(1, 2)}})
	if _, err := c.ResourceV1().ResourceSlices().Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the ResourceSlice: %v", err)
	}
	// Another node's slice is not watched.
	if _, err := c.ResourceV1().ResourceSlices().Create(ctx, draSlice("gpu-b1", map[string]string{"gpu-0": gpuUUID(2, 0)}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	slices := gpu.NewSlices()
	d := startDiscovery(t, kubeapi.NewForConfigOrDie(api.Config), gpu.DiscoveryOptions{Node: "gpu-a1", Slices: slices})
	eventually(t, "slice devices mapped", func() error {
		if slices.Len() != 3 {
			return fmt.Errorf("%d devices", slices.Len())
		}
		return nil
	})
	if ok, why := d.GPUNode(); !ok || !strings.HasPrefix(why, "DRA ResourceSlice gpu-a1-") {
		t.Errorf("GPUNode() = %v, %q; want the DRA slice", ok, why)
	}

	// The pods: a job worker with a DRA GPU, and a finished job pod the
	// kubelet still lists with its GPU.
	for _, p := range []struct {
		name  string
		phase corev1.PodPhase
	}{{"llm-worker-0", corev1.PodRunning}, {"old-worker-0", corev1.PodSucceeded}} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default"}, Spec: corev1.PodSpec{NodeName: "gpu-a1",
			Containers: []corev1.Container{{Name: "main", Image: "pytorch"}}}}
		created, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Phase = p.phase
		if _, err := c.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the finished pod seen", func() error {
		if !d.PodGone("default", "old-worker-0") || d.PodGone("default", "llm-worker-0") {
			return fmt.Errorf("gone: old %v, running %v", d.PodGone("default", "old-worker-0"), d.PodGone("default", "llm-worker-0"))
		}
		return nil
	})

	s := &sim.Scenario{Region: "us-east-1", Zones: []string{"us-east-1a"}}
	sock := socketPath(t)
	kubelet, err := sim.StartPodResources(s, "gpu-a1", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer kubelet.Close()
	withClaim := func(name string, devs ...[3]string) *podresourcesv1.PodResources {
		return &podresourcesv1.PodResources{Namespace: "default", Name: name, Containers: []*podresourcesv1.ContainerResources{{
			Name: "main", DynamicResources: []*podresourcesv1.DynamicResource{claim(name+"-gpu", devs...)}}}}
	}
	kubelet.SetPods([]*podresourcesv1.PodResources{
		withClaim("llm-worker-0", [3]string{gpu.DRADriver, "gpu-a1", "gpu-0"}),
		withClaim("old-worker-0", [3]string{gpu.DRADriver, "gpu-a1", "gpu-1"}),
		withClaim("unmapped-0", [3]string{gpu.DRADriver, "gpu-a1", "gpu-9"}),
	})
	pr, err := gpu.DialPodResources(sock, gpu.ResourceFilter{Slices: slices}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	unmapped := newCounter()
	pr.Unmapped = unmapped
	allocs := read(t, pr)
	if got := testutil.ToFloat64(unmapped); got != 1 {
		t.Errorf("unmapped DRA GPUs = %v, want 1", got)
	}

	idx := topology.NewIndex()
	idx.UpsertNode(topology.Node{Name: "gpu-a1", Zone: "us-east-1a", Region: "us-east-1"})
	for _, name := range []string{"llm-worker-0", "old-worker-0"} {
		idx.UpsertPod(0, topology.Pod{Namespace: "default", Name: name, Node: "gpu-a1",
			Identity: topology.Identity{Kind: "PyTorchJob", Name: strings.TrimSuffix(name, "-worker-0"), Role: topology.RoleWorker}})
	}
	samples := []gpu.Sample{
		{UUID: gpuUUID(1, 0), Index: 0, GI: gpu.NoInstance, Util: 0.9, GraphicsActive: 0.9, SMActive: gpu.NA, TensorActive: gpu.NA},
		{UUID: gpuUUID(1, 1), Index: 1, GI: gpu.NoInstance, Util: 0.0, GraphicsActive: 0.0, SMActive: gpu.NA, TensorActive: gpu.NA},
	}
	col := gpu.NewCollector(fixedFeed[[]gpu.Sample]{samples}, fixedFeed[*gpu.Allocations]{allocs}, idx, "gpu-a1")
	col.SkipGone(d)
	rows, ok := col.Join(nil)
	if !ok || len(rows) != 2 {
		t.Fatalf("rows %+v, %v", rows, ok)
	}
	if r := rows[0]; r.Pod != "llm-worker-0" || r.JobName != "llm" || r.Zone != "us-east-1a" {
		t.Errorf("DRA GPU 0 = %+v; want job llm", r)
	}
	if r := rows[1]; r.Pod != "" || r.JobName != "" {
		t.Errorf("GPU 1 = %+v; want unallocated: its pod has finished", r)
	}
}

type fixedFeed[T any] struct{ v T }

func (f fixedFeed[T]) Get() (T, bool) { return f.v, true }

func newCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "unmapped"})
}
