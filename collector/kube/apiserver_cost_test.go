package kube_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/collector/fence"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// traffic counts what the exporter asks of and receives from the
// apiserver, per resource: requests, watches opened and the bytes of the
// response bodies it reads (after any gzip: what it decodes).
type traffic struct {
	mu      sync.Mutex
	lists   map[string]int
	watches map[string]int
	bytes   map[string]*atomic.Int64
}

func (tr *traffic) resource(r *http.Request) string {
	p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	return p[len(p)-1]
}

func (tr *traffic) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		res := tr.resource(r)
		tr.mu.Lock()
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
			tr.watches[res]++
		} else {
			tr.lists[res]++
		}
		n := tr.bytes[res]
		if n == nil {
			n = &atomic.Int64{}
			tr.bytes[res] = n
		}
		tr.mu.Unlock()
		resp, err := rt.RoundTrip(r)
		if err == nil {
			resp.Body = &countingBody{resp.Body, n}
		}
		return resp, err
	})
}

func (tr *traffic) total(res string) int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if n := tr.bytes[res]; n != nil {
		return n.Load()
	}
	return 0
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// realisticNode is a GPU node as a cloud provider's kubelet reports it:
// provider, GPU operator and node-feature-discovery labels, the
// annotations of kubelet, the CSI driver and Cilium, capacity with GPUs,
// the five conditions with their messages, addresses, the daemon
// endpoint, node info and the images it pulled (kubelet reports up to 50).
func realisticNode(i, zones int) *corev1.Node {
	name := fmt.Sprintf("node-%05d", i)
	labels := map[string]string{
		kube.LabelZone: fmt.Sprintf("zone-%d", i%zones), kube.LabelRegion: "us-east-1", kube.LabelZoneLegacy: fmt.Sprintf("zone-%d", i%zones),
		"failure-domain.beta.kubernetes.io/region": "us-east-1", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "p5.48xlarge",
		"node.kubernetes.io/instance-type": "p5.48xlarge", "eks.amazonaws.com/nodegroup": "gpu-p5", "eks.amazonaws.com/capacityType": "ON_DEMAND",
		"eks.amazonaws.com/nodegroup-image": "ami-0abcdef1234567890", "k8s.io/cloud-provider-aws": "a1b2c3d4e5f60718293a4b5c6d7e8f90",
		"topology.k8s.aws/network-node-layer-1": "nn-1a2b3c4d5e6f", "topology.k8s.aws/network-node-layer-2": "nn-2b3c4d5e6f7a",
		"topology.k8s.aws/network-node-layer-3": "nn-3c4d5e6f7a8b", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.machine": "p5.48xlarge",
		"nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "90", "nvidia.com/cuda.driver.rev": "07", "nvidia.com/cuda.runtime.major": "12",
		"nvidia.com/cuda.runtime.minor": "4", "nvidia.com/gfd.timestamp": "1733097600", "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "single",
		"nvidia.com/gpu.deploy.container-toolkit": "true", "nvidia.com/gpu.deploy.dcgm": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true",
		"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.driver": "pre-installed", "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
		"nvidia.com/gpu.deploy.node-status-exporter": "true", "nvidia.com/gpu.deploy.operator-validator": "true",
		"feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true", "feature.node.kubernetes.io/cpu-cpuid.AMXTILE": "true",
		"feature.node.kubernetes.io/cpu-model.family": "6", "feature.node.kubernetes.io/cpu-model.id": "143", "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
		"feature.node.kubernetes.io/kernel-version.full": "6.1.115-126.197.amzn2023.x86_64", "feature.node.kubernetes.io/pci-10de.present": "true",
		"feature.node.kubernetes.io/pci-1d0f.present": "true", "feature.node.kubernetes.io/system-os_release.ID": "amzn",
		"feature.node.kubernetes.io/system-os_release.VERSION_ID": "2023", "vpc.amazonaws.com/efa.present": "true",
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{
		"alpha.kubernetes.io/provided-node-ip":                   fmt.Sprintf("10.%d.%d.%d", 20+i/65536, i/256%256, i%256),
		"csi.volume.kubernetes.io/nodeid":                        fmt.Sprintf(`{"ebs.csi.aws.com":"i-0%016x","efs.csi.aws.com":"i-0%016x"}`, i, i),
		"node.alpha.kubernetes.io/ttl":                           "0",
		"volumes.kubernetes.io/controller-managed-attach-detach": "true",
		"nfd.node.kubernetes.io/feature-labels":                  "cpu-cpuid.AVX512F,cpu-cpuid.AMXTILE,cpu-model.family,cpu-model.id,cpu-model.vendor_id,kernel-version.full,pci-10de.present,pci-1d0f.present,system-os_release.ID,system-os_release.VERSION_ID",
		"network.cilium.io/ipv4-cilium-host":                     fmt.Sprintf("10.%d.%d.1", i/256, i%256),
	}},
		Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256), PodCIDRs: []string{fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)},
			ProviderID: fmt.Sprintf("aws:///us-east-1a/i-0%016x", i)}}
	return n
}

// realisticStatus fills what kubelet reports of the node.
func realisticStatus(n *corev1.Node, i int, beat time.Time) {
	q := resource.MustParse
	capacity := corev1.ResourceList{"cpu": q("192"), "memory": q("2097152Mi"), "ephemeral-storage": q("30Ti"), "pods": q("110"),
		"hugepages-1Gi": q("0"), "hugepages-2Mi": q("0"), "nvidia.com/gpu": q("8"), "vpc.amazonaws.com/efa": q("32")}
	alloc := capacity.DeepCopy()
	alloc["cpu"], alloc["memory"] = q("191450m"), q("2060000Mi")
	hb := metav1.NewTime(beat)
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, LastHeartbeatTime: hb, LastTransitionTime: metav1.NewTime(beat.Add(-72 * time.Hour)), Reason: reason, Message: msg}
	}
	var images []corev1.ContainerImage
	for k := range 40 {
		repo := fmt.Sprintf("123456789012.dkr.ecr.us-east-1.amazonaws.com/ml-platform/image-%02d", k)
		images = append(images, corev1.ContainerImage{Names: []string{
			repo + "@sha256:" + fmt.Sprintf("%064x", k*7919+1), repo + ":v1." + fmt.Sprint(k)}, SizeBytes: int64(1e9 + k*1e7)})
	}
	ip := fmt.Sprintf("10.%d.%d.%d", 20+i/65536, i/256%256, i%256)
	n.Status = corev1.NodeStatus{Capacity: capacity, Allocatable: alloc,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
			cond("NetworkUnavailable", corev1.ConditionFalse, "CiliumIsUp", "Cilium is running on this node"),
		},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip},
			{Type: corev1.NodeHostName, Address: fmt.Sprintf("ip-%s.ec2.internal", strings.ReplaceAll(ip, ".", "-"))},
			{Type: corev1.NodeInternalDNS, Address: fmt.Sprintf("ip-%s.ec2.internal", strings.ReplaceAll(ip, ".", "-"))}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		NodeInfo: corev1.NodeSystemInfo{MachineID: fmt.Sprintf("ec2%029x", i), SystemUUID: fmt.Sprintf("ec2%05x-0000-0000-0000-000000000000", i),
			BootID: fmt.Sprintf("%08x-1111-2222-3333-444455556666", i), KernelVersion: "6.1.115-126.197.amzn2023.x86_64",
			OSImage: "Amazon Linux 2023.6.20241121", ContainerRuntimeVersion: "containerd://1.7.23", KubeletVersion: "v1.37.2",
			KubeProxyVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"},
		Images: images}
}

// costEnv reads a size from the environment (default def).
func costEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestAPIServerCost measures what one exporter costs the apiserver on the
// real kube-apiserver, in each mode: Relay (the cluster-wide view) and
// DaemonSet (the per-node view, NewLocal: its node's pods and its jobs'
// pods, with the lean node view; and, logged only, without it), each with
// every informer an exporter runs by default (startExporterSet). The
// cluster: realistic GPU nodes (realisticNode) and job pods, PyTorchJobs
// of 10 pods spread one pod a node, besides pods of no job
// (ZONEWATCH_APISERVER_COST_NODES, _JOBPODS; default 1,000 and 5,000);
// Cilium's CRDs with one CiliumIdentity per job pod; a headless Service
// per job and 200 ClusterIP Services, each with an EndpointSlice; 60
// policies. It measures the bytes of each mode's first lists and what its
// watches receive while every job pod's status changes once, every job's
// EndpointSlice once and every node's status once; watch_bytes_per_s is
// that at one update per job pod and per slice per 10 minutes and per
// node per 5 (kubelet's nodeStatusReportFrequency), the round's bytes over
// 600 and 300 s, plus the lean node view's re-reads (its nodes' bytes
// every 30 minutes). Then the exporter binary runs as the
// chart's identity (its ServiceAccount and ClusterRole, its container's
// securityContext) in both modes for its resident set; and, with
// ZONEWATCH_APISERVER_COST_ROLLOUT=N, N exporters of each mode
// (ZONEWATCH_APISERVER_COST_ROLLOUT_MODES: some of daemonset,
// daemonset-allnodes, relay) start at once (a rollout) while the
// apiserver's CPU and memory are read from /proc. The figures are in docs/performance.md. Opt in with
// ZONEWATCH_APISERVER_COST=1 (4 to 20 minutes at the default size on 2
// loaded cores). It asserts what makes a DaemonSet exporter's node and
// Service cost local: it watches no node, reads only the nodes it holds,
// and receives nothing of the jobs' headless Services' slices. One line a
// mode:
//
//	apiserver-cost: mode=<daemonset|relay> nodes=N jobpods=M first_list_bytes=B watch_bytes_per_s=W rss_mib=R pss_mib=P
//
// rss_mib sums the processes' resident sets, so the binary's pages, mapped
// by both, count twice; pss_mib (their proportional sets) counts each page
// once, as the pod's memory cgroup charges it.
func TestAPIServerCost(t *testing.T) {
	if os.Getenv("ZONEWATCH_APISERVER_COST") == "" {
		t.Skip("set ZONEWATCH_APISERVER_COST=1 to measure the apiserver cost (default 1,000 nodes and 5,000 job pods)")
	}
	nodes := costEnv("ZONEWATCH_APISERVER_COST_NODES", 1000)
	jobPods := costEnv("ZONEWATCH_APISERVER_COST_JOBPODS", 5000)
	const perJob, zones = 10, 3
	jobs, others := jobPods/perJob, 2000
	jobPods = jobs * perJob
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(costEnv("ZONEWATCH_APISERVER_COST_MINUTES", 25))*time.Minute)
	defer cancel()
	fast := rest.CopyConfig(api.Config)
	fast.QPS, fast.Burst = 5000, 10000
	fast.ContentType = "application/vnd.kubernetes.protobuf"
	writer := kubernetes.NewForConfigOrDie(fast)
	if _, err := writer.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	parallel := func(n int, fn func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		var failed atomic.Value
		work := make(chan int)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					if err := fn(i); err != nil {
						failed.Store(err)
					}
				}
			}()
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	parallel(nodes, func(i int) error {
		created, err := writer.CoreV1().Nodes().Create(ctx, realisticNode(i, zones), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		realisticStatus(created, i, time.Now())
		_, err = writer.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	})
	// Job j's pod k runs on node (j*perJob+k) mod nodes: one pod of a job a
	// node, each node holding jobPods/nodes pods of as many jobs.
	pod := func(i int, job bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: fmt.Sprintf("other-%d", i), Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%05d", i%nodes), Containers: []corev1.Container{{Name: "c", Image: "nvcr.io/nvidia/pytorch:24.05-py3",
				Env: []corev1.EnvVar{{Name: "NCCL_DEBUG", Value: "INFO"}}}}}}
		if job {
			j, k := i/perJob, i%perJob
			p.Name = fmt.Sprintf("job-%d-worker-%d", j, k)
			p.Labels = map[string]string{"training.kubeflow.org/job-name": fmt.Sprintf("job-%d", j), "training.kubeflow.org/replica-type": "worker",
				"training.kubeflow.org/replica-index": fmt.Sprint(k), "training.kubeflow.org/operator-name": "pytorchjob-controller"}
		}
		return p
	}
	running := func(p *corev1.Pod, i int) error {
		ip := fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256)
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		_, err := writer.CoreV1().Pods("ml").UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	}
	create := func(i int, job bool) error {
		created, err := writer.CoreV1().Pods("ml").Create(ctx, pod(i, job), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		return running(created, i)
	}
	parallel(jobPods, func(i int) error { return create(i, true) })
	parallel(others, func(i int) error { return create(jobPods+i, false) })
	dyn := dynamic.NewForConfigOrDie(fast)
	installCiliumCRDs(ctx, t, dyn)
	// One CiliumIdentity per job pod (the replica index is a label),
	// as the agents allocate them (crd identity allocation mode).
	parallel(jobPods, func(i int) error {
		_, err := dyn.Resource(fence.IdentityResource).Create(ctx, ciliumIdentity(100000+i, i/perJob, i%perJob), metav1.CreateOptions{})
		return err
	})
	// Services: one headless Service a job (its pods' DNS names, as JobSet
	// and the training operator make), with an EndpointSlice of its pods,
	// and 200 ClusterIP Services of 3 backends.
	parallel(jobs+200, func(i int) error { return createService(ctx, writer, i, jobs, perJob) })
	// Policies: a zone fence as CNPs and NetworkPolicies in the namespace,
	// and a few cluster-wide ones.
	parallel(60, func(i int) error { return createPolicy(ctx, dyn, writer, i) })
	t.Logf("created %d nodes, %d job pods, %d other pods, %d identities, %d services, 60 policies in %v", nodes, jobPods, others, jobPods, jobs+200, time.Since(start).Round(time.Second))
	var oneNode int64
	// One node's object as each view would read it: whole (protobuf, as the
	// node informer), metadata only (what a PartialObjectMetadata view
	// reads: no addresses).
	{
		raw, err := writer.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node-00007").
			SetHeader("Accept", "application/vnd.kubernetes.protobuf").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		js, err := writer.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node-00007").SetHeader("Accept", "application/json").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		meta, err := writer.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node-00007").
			SetHeader("Accept", "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		table, err := writer.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node-00007").Param("includeObject", "None").
			SetHeader("Accept", "application/json;as=Table;g=meta.k8s.io;v=v1").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		oneNode = int64(len(raw))
		t.Logf("one realistic node: %d B protobuf, %d B JSON; metadata only %d B protobuf; as a Table row without the object %d B JSON", len(raw), len(js), len(meta), len(table))
	}

	type mode struct {
		name    string
		tr      *traffic
		l       *kube.Live
		set     *fence.Set
		index   *topology.Index
		firstNB int64
		firstPB int64
		first   int64 // every byte of the first lists
	}
	newTraffic := func() *traffic {
		return &traffic{lists: map[string]int{}, watches: map[string]int{}, bytes: map[string]*atomic.Int64{}}
	}
	const localNode = "node-00007"
	var modes []*mode
	// daemonset is the DaemonSet as the chart runs it (its node view,
	// peers); daemonset-allnodes is --kube.node-view=cluster, the default
	// before: logged, no cost line.
	for _, name := range []string{"relay", "daemonset-allnodes", "daemonset"} {
		m := &mode{name: name, tr: newTraffic(), index: topology.NewIndex()}
		syncStart := time.Now()
		var err error
		if m.l, m.set, err = startExporterSet(ctx, api.Config, m.tr.wrap, m.index, name, localNode); err != nil {
			t.Fatal(err)
		}
		n, p, j := m.index.Counts()
		m.tr.mu.Lock()
		t.Logf("%s: sync in %v: %d nodes, %d job pods, %d jobs held; lists %v, watches opened %v", name, time.Since(syncStart).Round(time.Millisecond), n, p, j, m.tr.lists, m.tr.watches)
		m.tr.mu.Unlock()
		if (name != "daemonset" && n != nodes) || (name == "relay" && (p != jobPods || j != jobs)) {
			t.Fatalf("%s: index holds %d nodes, %d job pods, %d jobs", name, n, p, j)
		}
		m.firstNB, m.firstPB, m.first = m.tr.total("nodes"), m.tr.total("pods"), m.tr.all()
		t.Logf("%s: first lists: nodes %d B (%d nodes held), pods %d B (%d a job pod held), identities %d B, services %d B, endpointslices %d B, policies %d B, all %d B",
			name, m.firstNB, n, m.firstPB, m.firstPB/int64(max(p, 1)), m.tr.total("ciliumidentities"), m.tr.total("services"), m.tr.total("endpointslices"),
			m.tr.total("ciliumnetworkpolicies")+m.tr.total("ciliumclusterwidenetworkpolicies")+m.tr.total("networkpolicies"), m.tr.all())
		modes = append(modes, m)
		if name == "daemonset" {
			// The per-node view reads identities by name as drops and
			// lookups name them: what 100 of them cost (a node's peers),
			// read once each and again every 10 minutes while in use.
			const peers = 100
			b0 := m.tr.all()
			for i := range peers {
				m.set.Labels(uint32(100000 + i))
			}
			for _, n := m.set.Len(); n < peers; _, n = m.set.Len() {
				if ctx.Err() != nil {
					t.Fatalf("daemonset: %d of %d identities read by name", n, peers)
				}
				time.Sleep(10 * time.Millisecond)
			}
			read := m.tr.all() - b0
			t.Logf("daemonset: %d identities read by name (GET each): %d B, %d B each; refreshed every 10 minutes while in use: %d B/s", peers, read, read/peers, read/600)
		}
	}

	// Churn, one round: every job pod's status changes once (a kubelet
	// condition update), every other pod's once (selected out: no bytes),
	// every node's status once (kubelet's report: a new heartbeat time).
	settle := func() { time.Sleep(3 * time.Second) }
	before := func(res string) []int64 {
		var out []int64
		for _, m := range modes {
			out = append(out, m.tr.total(res))
		}
		return out
	}
	p0 := before("pods")
	parallel(jobPods, func(i int) error {
		p, err := writer.CoreV1().Pods("ml").Get(ctx, pod(i, true).Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue})
		_, err = writer.CoreV1().Pods("ml").UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	parallel(others, func(i int) error {
		p, err := writer.CoreV1().Pods("ml").Get(ctx, pod(jobPods+i, false).Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue})
		_, err = writer.CoreV1().Pods("ml").UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	settle()
	p1 := before("pods")
	// Each job's EndpointSlice once (its pods' readiness), and the pods'
	// bytes of that round are the pod round's.
	e0 := before("endpointslices")
	parallel(jobs, func(j int) error {
		es, err := writer.DiscoveryV1().EndpointSlices("ml").Get(ctx, fmt.Sprintf("job-%d", j), metav1.GetOptions{})
		if err != nil {
			return err
		}
		es.Endpoints[0].Conditions.Serving = new(true)
		_, err = writer.DiscoveryV1().EndpointSlices("ml").Update(ctx, es, metav1.UpdateOptions{})
		return err
	})
	settle()
	e1 := before("endpointslices")
	n0 := before("nodes")
	parallel(nodes, func(i int) error {
		nd, err := writer.CoreV1().Nodes().Get(ctx, fmt.Sprintf("node-%05d", i), metav1.GetOptions{})
		if err != nil {
			return err
		}
		realisticStatus(nd, i, time.Now())
		_, err = writer.CoreV1().Nodes().UpdateStatus(ctx, nd, metav1.UpdateOptions{})
		return err
	})
	settle()
	n1 := before("nodes")

	// The exporter binary, as the chart runs it, in each mode.
	bin := filepath.Join(t.TempDir(), "zonewatch-exporter")
	build := exec.Command("go", "build", "-o", bin, "./cmd/exporter")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if st, err := os.Stat(bin); err == nil {
		t.Logf("exporter binary: %d bytes", st.Size())
	}
	id := api.ChartIdentity(t, nil)
	variants := []string{""}
	if v := os.Getenv("ZONEWATCH_APISERVER_COST_ENV"); v != "" {
		variants = append(variants, strings.Split(v, ";")...)
	}
	bins := [][2]string{{"this tree", bin}}
	for _, nb := range strings.Split(os.Getenv("ZONEWATCH_APISERVER_COST_BINS"), ";") {
		if name, path, ok := strings.Cut(nb, "="); ok {
			bins = append(bins, [2]string{name, path})
		}
	}
	rss, pssOf := map[string]string{}, map[string]string{}
	for _, b := range bins {
		for _, node := range []string{"", localNode} {
			for _, env := range variants {
				r, pss := runExporter(t, id, b[1], b[0], node, env)
				if b[0] == "this tree" && env == "" {
					m := map[bool]string{true: "relay", false: "daemonset"}[node == ""]
					rss[m], pssOf[m] = r, pss
				}
			}
		}
	}
	for i, m := range modes {
		podRound, sliceRound, nodeRound := p1[i]-p0[i], e1[i]-e0[i], n1[i]-n0[i]
		_, held, _ := m.index.Counts()
		// The lean node view reads its nodes again every 30 minutes
		// (--kube.node-refresh): their first bytes once per 1,800 s.
		var refresh int64
		if m.name == "daemonset" {
			refresh = m.firstNB / 1800
		}
		rate := podRound/600 + sliceRound/600 + nodeRound/300 + refresh
		t.Logf("%s: one round of churn: job pod updates %d B (%d job pods held, %d B an update held), endpointslice updates %d B, node updates %d B (%d a node), node re-reads %d B/s; watches opened in all %v; watch bytes/s %d",
			m.name, podRound, held, podRound/int64(max(held, 1)), sliceRound, nodeRound, nodeRound/int64(nodes), refresh, m.tr.watches, rate)
		if m.name == "daemonset-allnodes" {
			continue
		}
		if m.name == "daemonset" {
			heldNodes, _, _ := m.index.Counts()
			m.tr.mu.Lock()
			nodeWatches := m.tr.watches["nodes"]
			m.tr.mu.Unlock()
			if nodeWatches != 0 || nodeRound != 0 {
				t.Errorf("daemonset: %d node watches, %d B of node status reports; want none (the lean node view)", nodeWatches, nodeRound)
			}
			if limit := int64(heldNodes) * oneNode * 11 / 10; m.firstNB > limit {
				t.Errorf("daemonset: %d B of nodes read for %d nodes held; want at most %d (a node a read)", m.firstNB, heldNodes, limit)
			}
			// A watch bookmark or two may come in the round.
			if sliceRound > 2048 {
				t.Errorf("daemonset: %d B of EndpointSlice updates of the jobs' headless Services; want none", sliceRound)
			}
		}
		fmt.Printf("apiserver-cost: mode=%s nodes=%d jobpods=%d first_list_bytes=%d watch_bytes_per_s=%d rss_mib=%s pss_mib=%s\n",
			m.name, nodes, jobPods, m.first, rate, rss[m.name], pssOf[m.name])
	}
	if n := costEnv("ZONEWATCH_APISERVER_COST_ROLLOUT", 0); n > 0 {
		modes := []string{"daemonset", "daemonset-allnodes", "relay"}
		if m := os.Getenv("ZONEWATCH_APISERVER_COST_ROLLOUT_MODES"); m != "" {
			modes = strings.Split(m, ",") // a Relay rollout holds every job pod 100 times in this process
		}
		for _, name := range modes {
			rollout(ctx, t, api, name, n, nodes)
		}
	}
}

// noIPCache is an ipcache without entries: the apiserver's cost does not
// depend on it.
type noIPCache struct{}

func (noIPCache) Lookup(netip.Addr) (topology.RemoteEntry, bool) {
	return topology.RemoteEntry{}, false
}

// all is every byte received.
func (tr *traffic) all() int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var n int64
	for _, b := range tr.bytes {
		n += b.Load()
	}
	return n
}

// procStat reads a process's CPU seconds (utime+stime) and resident and
// peak memory in MiB.
func procStat(pid int) (cpu float64, rss, hwm float64) {
	cpu, _ = testenv.ProcCPU(pid)
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(status), "\n") {
		var kb float64
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fmt.Sscan(v, &kb)
			rss = kb / 1024
		}
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fmt.Sscan(v, &kb)
			hwm = kb / 1024
		}
	}
	return
}

// apiserverPid finds the test's kube-apiserver by its URL's port.
func apiserverPid(t *testing.T, api *testenv.APIServer) int {
	t.Helper()
	_, port, _ := strings.Cut(strings.TrimPrefix(api.URL, "https://"), ":")
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 0 && strings.HasSuffix(args[0], "kube-apiserver") && slices.Contains(args, port) {
			return pid
		}
	}
	t.Fatal("kube-apiserver process not found")
	return 0
}

// rollout starts n exporters' informers of one mode at once, each its own
// client (its own connection), as a DaemonSet rollout does, and logs the
// apiserver's CPU and memory from the start until they all synced (or 5
// minutes passed: how many did is logged) and then for 10 s of watching.
func rollout(ctx context.Context, t *testing.T, api *testenv.APIServer, mode string, n, nodes int) {
	t.Helper()
	pid := apiserverPid(t, api)
	runtime.GC()
	cpu0, rss0, _ := procStat(pid)
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var synced atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := ""
			if mode != "relay" {
				node = fmt.Sprintf("node-%05d", i*nodes/n)
			}
			_, _, err := startExporterSet(rctx, api.Config, nil, topology.NewIndex(), mode, node)
			if err == nil {
				synced.Add(1)
			}
			errs <- err
		}()
	}
	peak := rss0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(5 * time.Minute)
wait:
	for {
		select {
		case <-done:
			break wait
		case <-limit:
			break wait
		case <-tick.C:
			if _, r, _ := procStat(pid); r > peak {
				peak = r
			}
		}
	}
	took := time.Since(start)
	cpu1, rss1, _ := procStat(pid)
	time.Sleep(10 * time.Second)
	cpu2, rss2, _ := procStat(pid)
	t.Logf("rollout of %d %s exporters: %d synced in %v; kube-apiserver CPU %.1f s until then, %.2f s in the 10 s after; resident %.0f MiB before, peak %.0f MiB, %.0f MiB then, %.0f MiB 10 s later",
		n, mode, synced.Load(), took.Round(time.Millisecond), cpu1-cpu0, cpu2-cpu1, rss0, peak, rss1, rss2)
	cancel()
	wg.Wait()
}

// runExporter runs the exporter binary on the test's cluster, as the
// chart's identity, with the
// settings of env ("K=V,K=V") and logs its memory after sync and 20
// scrapes: the resident set and its parts (/proc: anonymous, file-backed
// pages of the binary, the peak), and the Go runtime's own figures from
// its go_* metrics (heap in use, idle and released, the next GC's goal,
// stacks, all the runtime holds). It returns its processes' resident and
// proportional sets, each summed, in MiB.
func runExporter(t *testing.T, id *testenv.Identity, bin, build, node, env string) (string, string) {
	t.Helper()
	for _, kv := range strings.Split(env, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			t.Setenv(k, v)
			defer os.Unsetenv(k)
		}
	}
	// A fresh copy of the binary, written 32 KiB at a time as a container
	// runtime extracts an image layer: how many of its pages the process
	// maps depends on how the page cache holds the file (the kernel maps
	// a faulting page's whole folio and cached neighbours; one write of
	// the whole file made 9-10 MiB more of them resident, the linker's
	// output 14-19 MiB less), so every build runs from a copy written the
	// same way.
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(t.TempDir(), "zonewatch-exporter")
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	for len(data) > 0 {
		n, err := out.Write(data[:min(len(data), 32<<10)])
		if err != nil {
			t.Fatal(err)
		}
		data = data[n:]
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	// As the chart runs it: its ServiceAccount and ClusterRole, its
	// container's securityContext (not admin, not the test's root).
	cmd := testenv.StartAs(t, t.TempDir(), "exporter", testenv.ChartSecurityContext(t), bin, "--kubeconfig="+id.Kubeconfig, "--node-name="+node,
		"--web.listen-address="+addr, "--no-hubble.enabled", "--gpu.source=none", "--no-conntrack.enabled", "--no-probe.enabled")
	defer func() { _ = cmd.Process.Kill() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("exporter (node %q) not ready", node)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var page []byte
	for range 20 {
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		page, _ = io.ReadAll(res.Body)
		res.Body.Close()
	}
	metric := func(name string) string {
		for _, line := range strings.Split(string(page), "\n") {
			if strings.HasPrefix(line, name+" ") {
				return strings.TrimPrefix(line, name+" ")
			}
		}
		return "?"
	}
	mib := func(name string) string {
		var v float64
		if _, err := fmt.Sscan(metric(name), &v); err != nil {
			return "?"
		}
		return fmt.Sprintf("%.1f", v/(1<<20))
	}
	// With --bpf.confine (the default) the exporter is two processes, a
	// supervisor and the confined child doing the work: the pod pays both,
	// so every figure below is their sum (the child's alone logged too).
	pids := []int{cmd.Process.Pid}
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", cmd.Process.Pid))
	for _, task := range tasks { // any of its threads may have started the child
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", cmd.Process.Pid, task.Name()))
		for _, f := range strings.Fields(string(kids)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	var statuses, rollups []string
	for _, pid := range pids {
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		statuses = append(statuses, string(status))
		rollup, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		rollups = append(rollups, string(rollup))
	}
	field := func(text, name string) (float64, bool) {
		for _, line := range strings.Split(text, "\n") {
			if f, ok := strings.CutPrefix(line, name+":"); ok {
				var kb float64
				fmt.Sscan(f, &kb)
				return kb / 1024, true
			}
		}
		return 0, false
	}
	// The pages it still uses: clear the referenced bits, scrape for 5 s,
	// count the pages touched again (most of the binary's resident pages
	// were touched once, at start and during the first sync).
	referenced := "?"
	cleared := true
	for _, pid := range pids {
		cleared = cleared && os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("1"), 0) == nil
	}
	if cleared {
		for range 20 {
			if res, err := http.Get("http://" + addr + "/metrics"); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			time.Sleep(250 * time.Millisecond)
		}
		var sum float64
		for _, pid := range pids {
			rollup, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
			v, _ := field(string(rollup), "Referenced")
			sum += v
		}
		referenced = fmt.Sprintf("%.1f", sum)
	}
	// sum adds a field of each process's text (/proc/PID/status or
	// smaps_rollup), in MiB.
	sum := func(texts []string, name string) string {
		var total float64
		for _, text := range texts {
			v, ok := field(text, name)
			if !ok {
				return "?"
			}
			total += v
		}
		return fmt.Sprintf("%.1f", total)
	}
	proc := func(name string) string { return sum(statuses, name) }
	pss := sum(rollups, "Pss")
	child := "none"
	if len(statuses) > 1 {
		v, _ := field(statuses[len(statuses)-1], "VmRSS")
		child = fmt.Sprintf("%.1f MiB", v)
	}
	mode := "Relay (all nodes)"
	if node != "" {
		mode = "DaemonSet (" + node + ")"
	}
	if env == "" {
		env = "chart env"
	}
	t.Logf("exporter (%s) %s, %s: %d processes, RSS %s MiB, PSS %s MiB (the confined child %s; anon %s, file %s, peak %s, referenced in 5 s of scrapes %s); Go heap in use %s, idle %s, released %s, next GC %s, stacks %s, runtime total %s MiB; CPU %s s (sync and 20 scrapes); page %d bytes",
		build, mode, env, len(pids), proc("VmRSS"), pss, child, proc("RssAnon"), proc("RssFile"), proc("VmHWM"), referenced,
		mib("go_memstats_heap_inuse_bytes"), mib("go_memstats_heap_idle_bytes"), mib("go_memstats_heap_released_bytes"),
		mib("go_memstats_next_gc_bytes"), mib("go_memstats_stack_inuse_bytes"), mib("go_memstats_sys_bytes"),
		metric("process_cpu_seconds_total"), len(page))
	return proc("VmRSS"), pss
}

// chartNodeView is the node view (--kube.node-view) the chart's rendered
// DaemonSet runs: the daemonset mode's cost line measures it.
func chartNodeView() (string, error) {
	path := filepath.Join(testenv.ManifestsDir(), "daemonset.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "- --kube.node-view="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s sets no --kube.node-view", path)
}

// startExporterSet starts the informers an exporter runs by default in a
// mode, as cmd/exporter wires them (startKube, the fence part), and waits
// for their first sync: relay (the cluster-wide view), daemonset (the
// per-node view with the chart's node view: --kube.pod-view=node and the
// rendered DaemonSet's --kube.node-view, peers) or daemonset-allnodes
// (--kube.node-view=cluster);
// each with the owner informers (metadata only), the Service and
// EndpointSlice informers and the fence's policy informers and, in relay
// mode, its identity informer (the per-node view reads identities by name).
// Clients speak protobuf as cmd/exporter's do (the metadata and dynamic
// clients JSON); wrap (nil: none) sees every request.
func startExporterSet(ctx context.Context, base *rest.Config, wrap func(http.RoundTripper) http.RoundTripper, index *topology.Index, mode, node string) (*kube.Live, *fence.Set, error) {
	cfg := rest.CopyConfig(base)
	cfg.WrapTransport = wrap
	cfg.QPS, cfg.Burst = 50, 100
	meta := metadata.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf" // as cmd/exporter/kube.go
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client := kubeapi.NewForConfigOrDie(cfg)
	logger := slog.New(slog.DiscardHandler)
	rules := topology.DefaultRules()
	var l *kube.Live
	var fs kubeapi.Informers
	var err error
	switch mode {
	case "relay":
		l, fs, err = kube.NewLive(client, index, rules, 0, logger)
	case "daemonset", "daemonset-allnodes":
		index.SetRemote(node, noIPCache{}, nil, rules)
		view := "cluster"
		if mode == "daemonset" {
			if view, err = chartNodeView(); err != nil {
				return nil, nil, err
			}
		}
		var opts []kube.LocalOption
		if view == "peers" {
			opts = append(opts, kube.PeerNodes(0))
		}
		l, fs, err = kube.NewLocal(client, index, rules, node, 0, logger, opts...)
	default:
		return nil, nil, fmt.Errorf("no mode %q", mode)
	}
	if err != nil {
		return nil, nil, err
	}
	l.WithOwners(meta, client)
	svcs, sf, err := kube.NewServices(client, index, 0, logger)
	if err != nil {
		return nil, nil, err
	}
	var fopts []fence.Option
	if mode != "relay" {
		// The per-node view reads identities by name (cmd/exporter/fence.go):
		// no identity informer, and no read without a flow naming one.
		fopts = append(fopts, fence.OnDemandIdentities(fence.DefaultIdentityReads))
	}
	set := fence.NewSet()
	fl, err := fence.NewLive(dyn, set, 0, nil, logger, fopts...)
	if err != nil {
		return nil, nil, err
	}
	errs := make(chan error, 3)
	go func() { errs <- l.Run(ctx, fs) }()
	go func() { errs <- svcs.Run(ctx, sf) }()
	go func() {
		if !fl.Run(ctx) {
			errs <- fmt.Errorf("fence informers: %w", ctx.Err())
			return
		}
		errs <- nil
	}()
	for range 3 {
		if err := <-errs; err != nil {
			return nil, nil, err
		}
	}
	return l, set, nil
}

// installCiliumCRDs creates the CRDs of Cilium's policies and identities
// from Cilium's own files (.tools/bin/cilium/crds, v1.20.2) and waits
// until the apiserver serves them.
func installCiliumCRDs(ctx context.Context, t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	dir := filepath.Join(testenv.ToolsBin(t, "cilium"), "cilium", "crds")
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, name := range []string{"ciliumnetworkpolicies", "ciliumclusterwidenetworkpolicies", "ciliumidentities"} {
		b, err := os.ReadFile(filepath.Join(dir, name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(b, &obj.Object); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := dyn.Resource(crds).Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, gvr := range []schema.GroupVersionResource{fence.CNPResource, fence.CCNPResource, fence.IdentityResource} {
		for {
			if _, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s not served", gvr.Resource)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// ciliumIdentity is the identity the agents allocate for a job pod (job
// j, replica k), as Cilium v1.20 writes it: its security labels, and the
// same as object labels.
func ciliumIdentity(id, j, k int) *unstructured.Unstructured {
	labels := map[string]string{
		"io.kubernetes.pod.namespace": "ml", "io.cilium.k8s.policy.cluster": "default", "io.cilium.k8s.policy.serviceaccount": "default",
		"io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": "ml",
		"training.kubeflow.org/job-name":                             fmt.Sprintf("job-%d", j), "training.kubeflow.org/replica-type": "worker",
		"training.kubeflow.org/replica-index": fmt.Sprint(k), "training.kubeflow.org/operator-name": "pytorchjob-controller",
	}
	meta, sec := map[string]any{}, map[string]any{}
	for k, v := range labels {
		meta[k] = v
		sec["k8s:"+k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
		"metadata": map[string]any{"name": fmt.Sprint(id), "labels": meta}, "security-labels": sec}}
}

// createService creates Service i: for i < jobs job i's headless Service
// and an EndpointSlice of its pods' addresses, else a ClusterIP Service
// with an EndpointSlice of 3 backends.
func createService(ctx context.Context, c kubernetes.Interface, i, jobs, perJob int) error {
	name, clusterIP, n := fmt.Sprintf("job-%d", i), corev1.ClusterIPNone, perJob
	sel := map[string]string{"training.kubeflow.org/job-name": name}
	if i >= jobs {
		name, clusterIP, n = fmt.Sprintf("svc-%d", i-jobs), "", 3
		sel = map[string]string{"app": name}
	}
	if _, err := c.CoreV1().Services("ml").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: sel},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Selector: sel, Ports: []corev1.ServicePort{{Name: "c", Port: 23456}}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name,
		discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: new("c"), Port: new(int32(23456))}}}
	for k := range n {
		ip := fmt.Sprintf("10.%d.%d.%d", 100+(i*n+k)/65536, (i*n+k)/256%256, (i*n+k)%256)
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: new(fmt.Sprintf("node-%05d", k)),
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: fmt.Sprintf("%s-worker-%d", name, k)}})
	}
	if clusterIP == corev1.ClusterIPNone {
		es.Labels[corev1.IsHeadlessService] = "" // as the EndpointSlice controller labels it
	}
	_, err := c.DiscoveryV1().EndpointSlices("ml").Create(ctx, es, metav1.CreateOptions{})
	return err
}

// createPolicy creates policy i of 60: 30 CiliumNetworkPolicies (a zone
// fence of ingress rules), 20 NetworkPolicies, 10 cluster-wide policies.
func createPolicy(ctx context.Context, dyn dynamic.Interface, c kubernetes.Interface, i int) error {
	switch {
	case i < 30:
		cnp := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
			"metadata": map[string]any{"name": fmt.Sprintf("fence-%d", i), "namespace": "ml"},
			"spec": map[string]any{"endpointSelector": map[string]any{"matchLabels": map[string]any{"training.kubeflow.org/job-name": fmt.Sprintf("job-%d", i)}},
				"ingress": []any{map[string]any{"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{"training.kubeflow.org/job-name": fmt.Sprintf("job-%d", i)}}},
					"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "23456", "protocol": "TCP"}}}}}}}}}
		_, err := dyn.Resource(fence.CNPResource).Namespace("ml").Create(ctx, cnp, metav1.CreateOptions{})
		return err
	case i < 50:
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np-%d", i), Namespace: "ml"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("svc-%d", i)}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		_, err := c.NetworkingV1().NetworkPolicies("ml").Create(ctx, np, metav1.CreateOptions{})
		return err
	default:
		ccnp := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cilium.io/v2", "kind": "CiliumClusterwideNetworkPolicy",
			"metadata": map[string]any{"name": fmt.Sprintf("zone-%d", i)},
			"spec": map[string]any{"endpointSelector": map[string]any{"matchLabels": map[string]any{"k8s:io.kubernetes.pod.namespace": "ml"}},
				"ingress": []any{map[string]any{"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{"k8s:io.kubernetes.pod.namespace": "ml"}}}}}}}}
		_, err := dyn.Resource(fence.CCNPResource).Create(ctx, ccnp, metav1.CreateOptions{})
		return err
	}
}
