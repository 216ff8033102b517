package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/ebpf"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/analyze"
	"github.com/zonewatch/zonewatch/internal/ciliumlab"
	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/rules"
	"github.com/zonewatch/zonewatch/sim"
)

// The Cilium lab's cluster: the seed's zones, a node per role. The GPU
// workers' zone has two nodes, so a co-located job also crosses the VXLAN
// tunnel without crossing a zone.
const (
	labRegion = "us-east-1"
	zoneA     = "us-east-1a" // GPU workers
	zoneB     = "us-east-1b" // the CPU node the coordinator lands on
	zoneC     = "us-east-1c" // a third zone
)

var labNodes = []ciliumlab.NodeSpec{
	{Name: "gpu-a1", Zone: zoneA, CPU: "32", Memory: "256Gi", GPUs: 8, Labels: gpuNodeLabels, Taints: gpuTaints},
	{Name: "gpu-a2", Zone: zoneA, CPU: "32", Memory: "256Gi", GPUs: 8, Labels: gpuNodeLabels, Taints: gpuTaints},
	{Name: "cpu-b1", Zone: zoneB, CPU: "64", Memory: "512Gi"},
	{Name: "gpu-c1", Zone: zoneC, CPU: "32", Memory: "256Gi", GPUs: 2, Labels: gpuNodeLabels, Taints: gpuTaints},
}

// zoneFence is the seed's zone fence: in namespace ml-team, a pod accepts
// connections from the namespace's pods in its own zone only. Cilium
// leaves topology.kubernetes.io/* labels out of identities (its default
// label filter), so pods carry the zone in a label of their own, "zone",
// as an admission webhook copying the node's zone would set it.
func zoneFence() string {
	var specs strings.Builder
	for _, z := range []string{zoneA, zoneB, zoneC} {
		fmt.Fprintf(&specs, `
- endpointSelector:
    matchLabels: {zone: %[1]s}
  ingress:
  - fromEntities: [all]
  ingressDeny:
  - fromEndpoints:
    - matchExpressions:
      - {key: zone, operator: NotIn, values: [%[1]s]}`, z)
	}
	return `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: zone-isolation
  namespace: ml-team
specs:` + specs.String() + "\n"
}

// labJob is a PyTorchJob's pods in the lab.
type labJob struct {
	ns, name    string
	coordinator *ciliumlab.Pod
	workers     []*ciliumlab.Pod
}

func (j *labJob) pods() []*ciliumlab.Pod {
	return append([]*ciliumlab.Pod{j.coordinator}, j.workers...)
}

// addPyTorchJob creates the pods the Kubeflow training operator would: a
// master and workers with its labels and owner, bound by the lab itself to
// the given nodes (the controls; llm-blocked is placed by the scheduler,
// scheduleJob). A pod on a GPU node requests 2 GPUs.
func addPyTorchJob(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, ns, name, master string, workers ...string) *labJob {
	t.Helper()
	j := &labJob{ns: ns, name: name}
	add := func(typ string, idx int, node string) *ciliumlab.Pod {
		labels := map[string]string{
			"training.kubeflow.org/job-name":      name,
			"training.kubeflow.org/replica-type":  typ,
			"training.kubeflow.org/replica-index": fmt.Sprint(idx),
			"training.kubeflow.org/operator-name": "pytorchjob-controller",
			"zone":                                lab.Node(node).Zone,
		}
		if typ == "master" {
			labels["training.kubeflow.org/job-role"] = "master"
		}
		p, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: ns, Name: fmt.Sprintf("%s-%s-%d", name, typ, idx), Node: node,
			Labels: labels, OwnerAPIVersion: "kubeflow.org/v1", OwnerKind: "PyTorchJob", OwnerName: name,
			Ports: []int32{ciliumlab.RendezvousPort}, GPUs: min(2, labGPUsOf(node))})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	j.coordinator = add("master", 0, master)
	for i, w := range workers {
		j.workers = append(j.workers, add("worker", i, w))
	}
	return j
}

// startCiliumLab starts etcd, kube-apiserver and the lab's agents, and
// closes the lab at cleanup (failing the test if anything is left).
func startCiliumLab(t *testing.T, relay bool) (*ciliumlab.Lab, *testenv.APIServer, string) {
	t.Helper()
	return startCiliumLabWith(t, ciliumlab.Config{Nodes: labNodes, Relay: relay})
}

// startCiliumLabWith is startCiliumLab with the lab's nodes, agents and
// datapath (routing mode, Service path) from cfg (cfg.Cilium: a folder of
// the tools' bin/, "cilium" when empty; "cilium-1.18" the second version);
// the rest is filled in.
func startCiliumLabWith(t *testing.T, cfg ciliumlab.Config) (*ciliumlab.Lab, *testenv.APIServer, string) {
	t.Helper()
	lab, api, tools, _ := startCiliumLabSched(t, cfg)
	return lab, api, tools
}

// startCiliumLabSched is startCiliumLabWith that also returns the lab's
// scheduler (`make demo` starts the training operator beside it).
func startCiliumLabSched(t *testing.T, cfg ciliumlab.Config) (*ciliumlab.Lab, *testenv.APIServer, string, *schedlab.Lab) {
	t.Helper()
	if cfg.Cilium == "" {
		cfg.Cilium = "cilium"
	}
	tools := testenv.ToolsBin(t, "etcd", "kube-apiserver", "kube-scheduler", cfg.Cilium)
	if cfg.ServiceLB == ciliumlab.ServiceLBKubeProxy {
		testenv.ToolsBin(t, "kube-proxy")
	}
	testenv.Root(t, "the Cilium lab needs root (network and mount namespaces, BPF)")
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg.Cilium, cfg.Dir, cfg.API, cfg.Region, cfg.Logf = filepath.Join(tools, cfg.Cilium), t.TempDir(), api.Config, labRegion, t.Logf
	lab, err := ciliumlab.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range lab.Nodes {
				t.Logf("--- cilium-agent on %s (tail) ---\n%s", n.Name, tailOf(n.Agent().Log, 3000))
			}
		}
		if err := lab.Close(); err != nil {
			t.Errorf("cleaning up the lab: %v", err)
		}
		if left, err := ciliumlab.Leftovers(lab.ID); err != nil || len(left) > 0 {
			t.Errorf("the lab left %v (%v)", left, err)
		}
		if pids := lab.Processes(); len(pids) > 0 {
			t.Errorf("the lab left processes %v", pids)
		}
	})
	// The real kube-scheduler places the pods the lab leaves unbound
	// (stopped at cleanup, before the lab closes).
	began := time.Now()
	sl := schedlab.Attach(t, api)
	t.Logf("kube-scheduler healthy in %s", time.Since(began).Round(time.Millisecond))
	return lab, api, tools, sl
}

func tailOf(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// chartArgs are the exporter container's args in the committed DaemonSet
// (the chart's defaults), with the given flags replaced.
func chartArgs(t *testing.T, replace map[string]string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "deploy", "manifests", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(b, []byte("\n---")) {
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal(doc, &ds); err != nil || ds.Kind != "DaemonSet" {
			continue
		}
		for _, c := range ds.Spec.Template.Spec.Containers {
			if c.Name != "exporter" {
				continue
			}
			var out []string
			seen := map[string]bool{}
			for _, a := range c.Args {
				name, _, _ := strings.Cut(a, "=")
				if v, ok := replace[name]; ok {
					seen[name] = true
					if v != "" {
						out = append(out, name+"="+v)
					}
					continue
				}
				out = append(out, a)
			}
			for name, v := range replace {
				if !seen[name] && v != "" {
					out = append(out, name+"="+v)
				}
			}
			return out
		}
	}
	t.Fatal("deploy/manifests/daemonset.yaml: no exporter container")
	return nil
}

// labScenario is the seed's lab on the agents: the zone fence and three
// PyTorchJobs.
//
//   - ml-team/llm-blocked: created unbound (blockedJobYAML; its pods made
//     by the real training operator where op is given), placed by the
//     real kube-scheduler: the default scoring (least allocated) puts its
//     CPU-only master on the big CPU node in zone b, the toleration
//     permitting the GPU nodes but not attracting it, and its GPU workers
//     in zone a, the only zone with free GPUs; the fence drops their
//     rendezvous (hard block).
//   - research/bert-slow: master in zone c, workers in zone a; no fence in
//     that namespace: steady cross-zone exchange.
//   - ml-team/resnet-healthy: all in zone a, over two nodes (the control).
type labScenario struct {
	blocked, slow, healthy *labJob
	// blockedJob is llm-blocked's manifest, which the fix changes.
	blockedJob *schedlab.Job
	// op, when set, is the real training operator that makes
	// llm-blocked's pods (`make demo`); else the lab creates them as it
	// would (scheduleJob).
	op *labOperator
}

// pods are every pod of the scenario's three jobs.
func (sc *labScenario) pods() []*ciliumlab.Pod {
	var pods []*ciliumlab.Pod
	for _, j := range []*labJob{sc.blocked, sc.slow, sc.healthy} {
		pods = append(pods, j.pods()...)
	}
	return pods
}

func startLabScenario(ctx context.Context, t *testing.T, lab *ciliumlab.Lab) *labScenario {
	t.Helper()
	return startLabScenarioWith(ctx, t, lab, nil)
}

// startLabScenarioWith is startLabScenario with llm-blocked made by the
// real training operator op (nil: by the lab).
func startLabScenarioWith(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, op *labOperator) *labScenario {
	t.Helper()
	// The fence first, as a cluster has it before the jobs come.
	if _, _, err := lab.ApplyPolicy(ctx, zoneFence()); err != nil {
		t.Fatal(err)
	}
	// The controls first: llm-blocked comes to a cluster where they run.
	sc := &labScenario{
		slow:       addPyTorchJob(ctx, t, lab, "research", "bert-slow", "gpu-c1", "gpu-a1", "gpu-a2"),
		healthy:    addPyTorchJob(ctx, t, lab, "ml-team", "resnet-healthy", "gpu-a1", "gpu-a1", "gpu-a2"),
		blockedJob: pytorchJob(t, blockedJobYAML),
		op:         op,
	}
	if op != nil {
		sc.blocked = op.place(ctx, t, sc.blockedJob)
	} else {
		sc.blocked = scheduleJob(ctx, t, lab, sc.blockedJob)
	}
	// The seed's split, made by the scheduler.
	if z := sc.blocked.coordinator.Node.Zone; z != zoneB {
		t.Errorf("the scheduler put llm-blocked's master in %s, want the CPU node's zone %s: %s", z, zoneB, sc.blocked.placement())
	}
	for _, w := range sc.blocked.workers {
		if w.Node.Zone != zoneA {
			t.Errorf("the scheduler put %s in %s, want the GPU zone %s: %s", w.Ref(), w.Node.Zone, zoneA, sc.blocked.placement())
		}
	}
	t.Logf("llm-blocked placed by kube-scheduler: %s", sc.blocked.placement())
	// The zone fence selects on "zone": every pod's identity carries it
	// on every node before a verdict counts.
	for _, j := range []*labJob{sc.blocked, sc.slow, sc.healthy} {
		for _, p := range j.pods() {
			if _, err := p.SettledIdentity(ctx, "zone"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The coordinator's node enforces zone b's fence with the workers'
	// identities as they are: only then is every rendezvous SYN a policy
	// drop.
	if err := sc.blocked.coordinator.Node.WaitSelects(ctx, sc.blocked.workers, "zone", "NotIn", zoneB); err != nil {
		t.Fatal(err)
	}
	return sc
}

// The simulated GPUs of the lab's jobs, as sim.Default has them: the
// blocked job's idle (waiting on the rendezvous), the cross-zone job's
// busy by GPU_UTIL with little SM activity (NCCL spinning on the network),
// the co-located job's training.
var (
	gpuIdle     = sim.Behaviour{GPUUtil: 0.01}
	gpuSpinning = sim.Behaviour{GPUUtil: 0.96, SMActive: 0.12, TensorActive: 0.05}
	gpuTraining = sim.Behaviour{GPUUtil: 0.93, SMActive: 0.81, TensorActive: 0.55}
)

// simulateGPUs gives the jobs' pods simulated GPUs.
func (sc *labScenario) simulateGPUs(g *labGPUs) {
	g.setJob(sc.blocked, gpuIdle)
	g.setJob(sc.slow, gpuSpinning)
	g.setJob(sc.healthy, gpuTraining)
}

// fix is what an engineer does with the page: run zonewatch's analyze on
// the cluster's nodes and pods (dumped into dir), add the fix it prints to
// llm-blocked's manifest (Kueue's: the LocalQueue it asks for named), and
// re-create the PyTorchJob: Kueue admits it into one zone, the training
// operator makes its pods, the scheduler places them. It fails the test
// unless every pod was bound by the scheduler, in one zone, none Pending.
// It returns the fix and the analyze command line.
func (sc *labScenario) fix(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, gpus *labGPUs, dir string) (fix, cmd string) {
	t.Helper()
	if sc.op == nil {
		t.Fatal("analyze's fix is Kueue's: the scenario needs the training operator and Kueue (startLabOperator)")
	}
	rep, cmd := analyzeLab(ctx, t, lab, dir, sc.blocked.ns, sc.blocked.name)
	if !rep.SplitZone || rep.SuggestedFix == "" {
		t.Fatalf("analyze: %s/%s split %v, verdict %s, no fix", rep.Namespace, rep.JobName, rep.SplitZone, rep.Verdict)
	}
	if !strings.Contains(rep.SuggestedFix, analyze.KueueQueuePlaceholder) {
		t.Fatalf("analyze's fix queues the job to no LocalQueue:\n%s", rep.SuggestedFix)
	}
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(strings.ReplaceAll(rep.SuggestedFix, analyze.KueueQueuePlaceholder, labQueue)), &patch); err != nil {
		t.Fatalf("analyze's fix is not YAML: %v\n%s", err, rep.SuggestedFix)
	}
	fixed := sc.blockedJob.Copy()
	schedlab.Merge(fixed.Manifest, patch)
	sc.blockedJob = fixed
	sc.blocked = sc.op.replace(ctx, t, sc.blocked, fixed)
	sc.op.logWorkloads(ctx, t, sc.blocked.ns)
	if z := sc.blocked.zones(); len(z) != 1 {
		t.Fatalf("with analyze's fix the scheduler placed llm-blocked in %v: %s\nfix:\n%s", z, sc.blocked.placement(), rep.SuggestedFix)
	}
	// As the apiserver has them: every pod of the job bound, none Pending.
	want := map[string]string{}
	for _, p := range sc.blocked.pods() {
		want[p.Spec.Name] = p.Node.Name
	}
	if got := apiPlacement(ctx, t, lab, sc.blocked.ns, sc.blocked.name); !maps.Equal(got, want) {
		t.Fatalf("llm-blocked's pods in the apiserver after the fix: %v, want %v", got, want)
	}
	gpus.setJob(sc.blocked, gpuTraining)
	return rep.SuggestedFix, cmd
}

// loop runs the job's exchange again and again until ctx ends and returns
// what it did in total: the blocked job's workers retrying the rendezvous
// (one attempt each per round, as torchrun retries), the others training.
func (j *labJob) loop(ctx context.Context, ex ciliumlab.Exchange) <-chan ciliumlab.Result {
	out := make(chan ciliumlab.Result, 1)
	go func() {
		total := ciliumlab.Result{Payload: map[string]int64{}, Errors: map[string]int{}}
		for ctx.Err() == nil {
			r := ex.Run(ctx, j.coordinator, j.workers, 1)
			total.Attempts += r.Attempts
			total.Failed += r.Failed
			for k, v := range r.Errors {
				total.Errors[k] += v
			}
			for k, v := range r.Payload {
				total.Payload[k] += v
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
		out <- total
	}()
	return out
}

// labGPUs is the lab's GPU side, simulated (there is no GPU on this
// machine): a dcgm-exporter page per node on the bridge and a kubelet
// PodResources socket per node, both read from a sim.Scenario that mirrors
// the lab's job pods and gives each GPU its job's utilization.
type labGPUs struct {
	mu     sync.Mutex
	s      *sim.Scenario
	podres map[string]*sim.PodResourcesServer
	url    string
}

func newLabGPUs(t *testing.T, lab *ciliumlab.Lab) *labGPUs {
	t.Helper()
	g := &labGPUs{s: &sim.Scenario{Region: labRegion, Zones: []string{zoneA, zoneB, zoneC}}, podres: map[string]*sim.PodResourcesServer{}}
	for i, n := range lab.Nodes {
		node := sim.Node{Name: n.Name, Zone: n.Zone, IP: n.IP, PodCIDR: n.PodCIDR}
		if g := labGPUsOf(n.Name); g > 0 {
			for d := range int(g) {
				node.GPUs = append(node.GPUs, sim.GPU{Index: d, UUID: fmt.Sprintf("GPU-%08x-%04x-4000-8000-%012x", i+1, d, (i+1)*100+d)})
			}
		}
		g.s.Nodes = append(g.s.Nodes, node)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(lab.HostIP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(g.serve)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	g.url = "http://" + ln.Addr().String()
	for _, n := range lab.Nodes {
		pr, err := sim.StartPodResources(g.s, n.Name, filepath.Join(n.Dir, "podresources.sock"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pr.Close)
		g.podres[n.Name] = pr
	}
	return g
}

func (g *labGPUs) serve(rw http.ResponseWriter, r *http.Request) {
	node, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/metrics")
	if !ok {
		http.NotFound(rw, r)
		return
	}
	g.mu.Lock()
	samples, err := sim.NewGPUSource(g.s, node).Read(r.Context())
	g.mu.Unlock()
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	writeDCGMPage(rw, node, samples)
}

// args are the exporter flags that point node's GPU source at the fakes.
func (g *labGPUs) args(node *ciliumlab.Node) map[string]string {
	return map[string]string{
		"--gpu.source":              "dcgm-exporter",
		"--gpu.dcgm-exporter-url":   g.url + "/" + node.Name + "/metrics",
		"--gpu.podresources-socket": filepath.Join(node.Dir, "podresources.sock"),
		"--gpu.interval":            "2s",
	}
}

// setJob gives each of the job's pods the GPUs it requests, behaving as b
// (replacing the job's earlier pods), and tells every kubelet PodResources
// fake.
func (g *labGPUs) setJob(j *labJob, b sim.Behaviour) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.s.Jobs = slices.DeleteFunc(g.s.Jobs, func(x sim.Job) bool { return x.Namespace == j.ns && x.Name == j.name })
	used := map[string]bool{}
	for _, x := range g.s.Jobs {
		for _, p := range x.Pods {
			for _, u := range p.GPUs {
				used[u] = true
			}
		}
	}
	job := sim.Job{Namespace: j.ns, Name: j.name, Kind: "PyTorchJob", Behaviour: b}
	for _, p := range j.pods() {
		sp := sim.Pod{Namespace: j.ns, Name: p.Spec.Name, Node: p.Node.Name, IP: p.IP}
		for _, n := range g.s.Nodes {
			for _, d := range n.GPUs {
				if n.Name == sp.Node && int64(len(sp.GPUs)) < p.Spec.GPUs && !used[d.UUID] {
					used[d.UUID] = true
					sp.GPUs = append(sp.GPUs, d.UUID)
				}
			}
		}
		job.Pods = append(job.Pods, sp)
	}
	g.s.Jobs = append(g.s.Jobs, job)
	for node, pr := range g.podres {
		pods, _ := sim.PodResourcesOf(g.s, node)
		pr.SetPods(pods)
	}
}

// startLabExporters runs one exporter per node inside the node's
// namespaces, with the chart's args (its default paths are the node's real
// Hubble socket and BPF filesystem there), the chart's ServiceAccount and
// RBAC, and its container's securityContext, and waits until each is
// ready. Only the GPU flags differ: they point at the simulated GPUs.
func startLabExporters(t *testing.T, lab *ciliumlab.Lab, api *testenv.APIServer, gpus *labGPUs) map[string]string {
	t.Helper()
	return startChartExporters(t, lab, api, lab.Nodes, gpus.args)
}

// startChartExporters starts a DaemonSet-mode exporter on each of nodes as
// the chart runs it (its args with extra(node) over them, its
// ServiceAccount and RBAC, its securityContext), waits until each is
// ready and returns their metrics addresses by node. The exporters' logs
// are printed when the test fails.
func startChartExporters(t *testing.T, lab *ciliumlab.Lab, api *testenv.APIServer, nodes []*ciliumlab.Node, extra func(*ciliumlab.Node) map[string]string) map[string]string {
	t.Helper()
	return startWrappedExporters(t, lab, api, nodes, extra, nil)
}

// startWrappedExporters is startChartExporters with each node's command
// line passed through wrap (nil: as it is), e.g. to run it in a mount
// namespace of its own.
func startWrappedExporters(t *testing.T, lab *ciliumlab.Lab, api *testenv.APIServer, nodes []*ciliumlab.Node, extra func(*ciliumlab.Node) map[string]string, wrap func(*ciliumlab.Node, []string) []string) map[string]string {
	t.Helper()
	bin := exporterBinary(t)
	id := api.ChartIdentity(t, nil)
	kc, err := lab.Kubeconfig("exporter", id.Config.BearerToken)
	if err != nil {
		t.Fatal(err)
	}
	sc := testenv.ChartSecurityContext(t)
	testenv.CanStartAs(t)
	addrs := map[string]string{}
	for _, n := range nodes {
		args := chartArgs(t, mergeArgs(map[string]string{"--kubeconfig": kc}, extra(n)))
		argv := sc.Args(bin, args...)
		if wrap != nil {
			argv = wrap(n, argv)
		}
		env := []string{"NODE_NAME=" + n.Name}
		if v := os.Getenv("ZONEWATCH_LAB_EXPORTER_ENV"); v != "" {
			// The exporters' environment alone (e.g. GOMAXPROCS=1 for
			// the CPU per flow), not the agents'.
			env = append(env, strings.Split(v, ",")...)
		}
		if _, err := n.Start("exporter", env, argv[0], argv[1:]...); err != nil {
			t.Fatal(err)
		}
		addrs[n.Name] = net.JoinHostPort(n.IP.String(), "19420")
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("--- exporter on %s (tail) ---\n%s", n.Name, tailOf(filepath.Join(n.Dir, "exporter.log"), 2000))
			}
		}
	})
	for node, addr := range addrs {
		if !waitReady(t, exporter{node: node, addr: addr}, 2*time.Minute) {
			t.FailNow()
		}
	}
	return addrs
}

// noGPU is the exporters' GPU source where a test has no GPUs.
func noGPU(*ciliumlab.Node) map[string]string { return map[string]string{"--gpu.source": "none"} }

func mergeArgs(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// startRelayExporters runs the exporter in Relay mode as the chart's
// sharded Deployment does (--node-name= and --shard/--total-shards, Hubble
// through Relay, no per-node sources), one process per shard on the host.
func startRelayExporters(t *testing.T, api *testenv.APIServer, relay string, total int) map[string]string {
	t.Helper()
	bin := exporterBinary(t)
	id := api.ChartIdentity(t, nil)
	dir := t.TempDir()
	addrs := map[string]string{}
	for i := range total {
		addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(testenv.FreePort(t)))
		name := fmt.Sprintf("relay-shard-%d", i)
		testenv.Start(t, dir, name, bin, "--web.listen-address="+addr, "--node-name=",
			fmt.Sprintf("--shard=%d", i), fmt.Sprintf("--total-shards=%d", total),
			"--hubble.enabled", "--hubble.address="+relay, "--hubble.cluster-name=default",
			"--gpu.source=none", "--no-conntrack.enabled", "--no-probe.enabled",
			"--kubeconfig="+id.Kubeconfig)
		addrs[name] = addr
	}
	for name, addr := range addrs {
		if !waitReady(t, exporter{node: name, addr: addr}, 2*time.Minute) {
			t.FailNow()
		}
	}
	return addrs
}

// hubbleSends reads, from Hubble itself (GetFlows on each sender's node
// socket, the ring buffer without following), the trace events of the
// packets the pods sent to peer's port that are not replies: what
// "forwarded flow events on the sender" counts. It returns their number
// and how they break down (observation point and TCP flags).
func hubbleSends(t *testing.T, peer *ciliumlab.Pod, port uint32, senders ...*ciliumlab.Pod) (int, map[string]int) {
	t.Helper()
	kinds := map[string]int{}
	total := 0
	byNode := map[*ciliumlab.Node][]string{}
	for _, p := range senders {
		byNode[p.Node] = append(byNode[p.Node], p.IP.String())
	}
	for n, ips := range byNode {
		nodeFlows(t, n, 30*time.Second, &observerpb.GetFlowsRequest{
			Number: 100000, First: true,
			Whitelist: []*flowpb.FlowFilter{{SourceIp: ips, DestinationIp: []string{peer.IP.String()}, DestinationPort: []string{fmt.Sprint(port)}}},
		}, func(f *flowpb.Flow) {
			if f.GetEventType().GetType() != 4 || f.GetIsReply().GetValue() {
				return
			}
			total++
			flags := f.GetL4().GetTCP().GetFlags()
			kinds[fmt.Sprintf("%s %s", f.GetTraceObservationPoint(), tcpFlags(flags))]++
		})
	}
	return total, kinds
}

func tcpFlags(f *flowpb.TCPFlags) string {
	var out []string
	for _, x := range []struct {
		on   bool
		name string
	}{{f.GetSYN(), "SYN"}, {f.GetACK(), "ACK"}, {f.GetPSH(), "PSH"}, {f.GetFIN(), "FIN"}, {f.GetRST(), "RST"}} {
		if x.on {
			out = append(out, x.name)
		}
	}
	return strings.Join(out, "|")
}

// strangers lists, from a node's Hubble ring, the flows (trace and drop
// events) with an address that is not in known, by what they are.
func strangers(t *testing.T, n *ciliumlab.Node, known map[string]bool) map[string]int {
	t.Helper()
	out := map[string]int{}
	nodeFlows(t, n, 30*time.Second, &observerpb.GetFlowsRequest{Number: 100000, First: true}, func(f *flowpb.Flow) {
		if known[f.GetIP().GetSource()] && known[f.GetIP().GetDestination()] {
			return
		}
		out[fmt.Sprintf("%s(%v) -> %s(%v) %s %s type %d", f.GetIP().GetSource(), f.GetSource().GetIdentity(), f.GetIP().GetDestination(),
			f.GetDestination().GetIdentity(), f.GetVerdict(), f.GetDropReasonDesc(), f.GetEventType().GetType())]++
	})
	return out
}

// nodeFlows calls fn for each flow node n's Hubble (GetFlows on its unix
// socket) answers req with, until the stream ends or timeout passes.
func nodeFlows(t *testing.T, n *ciliumlab.Node, timeout time.Duration, req *observerpb.GetFlowsRequest, fn func(*flowpb.Flow)) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+n.HubbleSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stream, err := observerpb.NewObserverClient(conn).GetFlows(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		if f := resp.GetFlow(); f != nil {
			fn(f)
		}
	}
}

// agentDrops is the sum of the agents' own policy drop counters
// (cilium_drop_count_total, read from the datapath's metrics map at scrape
// time) by reason.
func agentDrops(t *testing.T, lab *ciliumlab.Lab) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, n := range lab.Nodes {
		resp, err := http.Get("http://" + n.AgentMetrics + "/metrics")
		if err != nil {
			t.Fatalf("agent metrics on %s: %v", n.Name, err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("agent metrics on %s: %v", n.Name, err)
		}
		for _, m := range fams["cilium_drop_count_total"].GetMetric() {
			var reason, dir string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "reason":
					reason = l.GetValue()
				case "direction":
					dir = l.GetValue()
				}
			}
			out[n.Name+" "+dir+" "+reason] += m.GetCounter().GetValue()
			out[reason] += m.GetCounter().GetValue()
		}
	}
	return out
}

// sumExporters adds a metric's series matching labels over every exporter.
func sumExporters(t *testing.T, addrs map[string]string, metric string, match map[string]string) float64 {
	t.Helper()
	var s float64
	for node, addr := range addrs {
		fams, err := scrapeExporter(addr)
		if err != nil {
			t.Fatalf("exporter on %s: %v", node, err)
		}
		s += fams[metric].sum(match)
	}
	return s
}

// seriesOf lists a metric's series (labels) over every exporter.
func seriesOf(t *testing.T, addrs map[string]string, metric string, match map[string]string) []string {
	t.Helper()
	var out []string
	eachSeries(t, addrs, metric, match, func(node string, s dtoSeries) {
		out = append(out, fmt.Sprintf("%s %v = %g", node, s.labels, s.value))
	})
	slices.Sort(out)
	return out
}

// eachSeries calls fn with every exporter's series of metric whose labels
// include match.
func eachSeries(t *testing.T, addrs map[string]string, metric string, match map[string]string, fn func(node string, s dtoSeries)) {
	t.Helper()
	for node, addr := range addrs {
		fams, err := scrapeExporter(addr)
		if err != nil {
			t.Fatalf("exporter on %s: %v", node, err)
		}
		f := fams[metric]
		if f == nil {
			continue
		}
	next:
		for _, s := range f.series {
			for k, v := range match {
				if s.labels[k] != v {
					continue next
				}
			}
			fn(node, s)
		}
	}
}

// ctCount is what the datapath's own conntrack entries hold for a set of
// connections: packets and bytes of both directions.
type ctCount struct{ entries, packets, bytes int64 }

// conntrackOf reads every node's cilium_ct4_global (pinned in the node's
// BPF filesystem) and adds up the egress (TUPLE_F_OUT) entries of TCP
// connections between any of the pods and peer's port. The layout is
// Cilium's (bpf/lib/common.h struct ipv4_ct_tuple: daddr, saddr, dport,
// sport, nexthdr, flags; bpf/lib/conntrack.h struct ct_entry: packets at
// byte 16, bytes at 24 with accounting on), read here independently of
// collector/conntrack.
func conntrackOf(t *testing.T, lab *ciliumlab.Lab, peer netip.Addr, port uint16, pods ...*ciliumlab.Pod) ctCount {
	t.Helper()
	ips := map[netip.Addr]bool{}
	for _, p := range pods {
		ips[p.IP] = true
	}
	var c ctCount
	for _, n := range lab.Nodes {
		m, err := ebpf.LoadPinnedMap(n.Path("/sys/fs/bpf/tc/globals/cilium_ct4_global"), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatalf("conntrack map of %s: %v", n.Name, err)
		}
		var k [14]byte
		var v [56]byte
		it := m.Iterate()
		for it.Next(&k, &v) {
			a1, a2 := netip.AddrFrom4([4]byte(k[0:4])), netip.AddrFrom4([4]byte(k[4:8]))
			p1, p2 := binary.BigEndian.Uint16(k[8:10]), binary.BigEndian.Uint16(k[10:12])
			nexthdr, flags := k[12], k[13]
			if nexthdr != 6 || flags != 0 { // TCP, TUPLE_F_OUT only
				continue
			}
			if !((a1 == peer && ips[a2]) || (a2 == peer && ips[a1])) || (p1 != port && p2 != port) {
				continue
			}
			c.entries++
			c.packets += int64(binary.NativeEndian.Uint64(v[16:24]))
			c.bytes += int64(binary.NativeEndian.Uint64(v[24:32]))
		}
		if err := it.Err(); err != nil {
			t.Fatalf("reading conntrack of %s: %v", n.Name, err)
		}
		m.Close()
	}
	return c
}

// TestCiliumLab runs the seed's three symptoms with real packets on real
// Cilium v1.20.2 agents (one per node, VXLAN between them, pods wired by
// cilium-cni) and compares each exporter's counts with the ground truth:
// the test's own traffic and the agents' own counters. llm-blocked's pods
// are made by the real Kubeflow training operator v1.9.3, as in `make
// demo`.
func TestCiliumLab(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts four Cilium agents")
	}
	inLane(t)
	began := time.Now()
	lab, api, tools, sl := startCiliumLabSched(t, ciliumlab.Config{Nodes: labNodes, Relay: true})
	op := startLabOperator(t, lab, sl, "ml-team")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	t.Logf("lab start: %s (apiserver and four agents ready, each knowing every node)", lab.StartTime.Round(time.Millisecond))
	for _, n := range lab.Nodes {
		if rss, err := n.AgentRSS(); err == nil {
			t.Logf("agent RSS on %s: %.0f MB", n.Name, float64(rss)/1e6)
		}
	}

	// The exporters first, as a DaemonSet runs before the jobs come: they
	// see every pod's first packets.
	gpus := newLabGPUs(t, lab)
	addrs := startLabExporters(t, lab, api, gpus)
	// Relay mode beside them: hubble-relay on the coordinator's node and
	// two shards following it.
	relayAddr, _, err := lab.StartRelay(ctx, lab.Node("cpu-b1"))
	if err != nil {
		t.Fatal(err)
	}
	shards := startRelayExporters(t, api, relayAddr, 2)
	sc := startLabScenarioWith(ctx, t, lab, op)
	sc.simulateGPUs(gpus)
	blocked, slow, healthy := sc.blocked, sc.slow, sc.healthy
	t.Logf("exporters up, pods wired and the fence in force %s after the test began", time.Since(began).Round(time.Millisecond))

	run := runLabExchanges(ctx, t, lab, sc)
	res, results, denied, ex := run.block, run.results, run.denied, run.ex

	t.Run("drops", func(t *testing.T) { checkLabDrops(t, addrs, sc, denied) })
	t.Run("bytes", func(t *testing.T) { checkLabBytes(t, lab, addrs, sc, results) })
	t.Run("ipcache names every remote pod's node", func(t *testing.T) { checkIPCacheNodes(ctx, t, lab, sc.pods()) })

	t.Run("flows", func(t *testing.T) {
		for i, j := range []*labJob{slow, healthy} {
			match := map[string]string{"namespace": j.ns, "job_name": j.name, "verdict": "forwarded"}
			got := sumExporters(t, addrs, "zonewatch_job_flow_events_total", match)
			conns := results[i].Attempts - results[i].Failed
			hubble, kinds := hubbleSends(t, j.coordinator, ciliumlab.RendezvousPort, j.workers...)
			t.Logf("%s/%s: exporters %g forwarded flow events, Hubble %d sent (not reply) trace events on the senders %v, for %d connections",
				j.ns, j.name, got, hubble, kinds, conns)
			if got != float64(hubble) {
				t.Errorf("%s/%s: exporters count %g forwarded flow events, the senders' Hubble has %d: %v\nwhere each exporter's flows went:\n%s", j.ns, j.name, got, hubble,
					seriesOf(t, addrs, "zonewatch_job_flow_events_total", match), flowAccounting(t, addrs))
			}
			if got < float64(conns) {
				t.Errorf("%s/%s: %g forwarded flow events, fewer than its %d connections", j.ns, j.name, got, conns)
			}
		}
		// A blocked SYN is one forwarded event where it is sent and one
		// drop where the fence drops it.
		m := map[string]string{"namespace": blocked.ns, "job_name": blocked.name}
		fwd := sumExporters(t, addrs, "zonewatch_job_flow_events_total", mergeArgs(m, map[string]string{"verdict": "forwarded"}))
		drp := sumExporters(t, addrs, "zonewatch_job_flow_events_total", mergeArgs(m, map[string]string{"verdict": "dropped"}))
		hubble, kinds := hubbleSends(t, blocked.coordinator, ciliumlab.RendezvousPort, blocked.workers...)
		t.Logf("%s/%s: exporters %g forwarded + %g dropped flow events; senders' Hubble %d %v; %d SYNs sent", blocked.ns, blocked.name, fwd, drp, hubble, kinds, res.Attempts)
		if fwd != float64(hubble) || drp != denied {
			t.Errorf("%s/%s: %g forwarded and %g dropped flow events, want %d (the senders' Hubble) and %g (the agents' drops)", blocked.ns, blocked.name, fwd, drp, hubble, denied)
		}
	})

	t.Run("relay", func(t *testing.T) {
		for _, j := range []*labJob{blocked, slow, healthy} {
			for _, m := range []string{"zonewatch_job_policy_drops_total", "zonewatch_job_flow_events_total"} {
				match := map[string]string{"namespace": j.ns, "job_name": j.name}
				var perNode, relay float64
				eventually(t, time.Minute, j.name+" "+m+" through Relay as per node", func() (bool, string) {
					perNode, relay = sumExporters(t, addrs, m, match), sumExporters(t, shards, m, match)
					return perNode == relay, fmt.Sprintf("per node %g, Relay shards %g", perNode, relay)
				})
				t.Logf("%s/%s %s: per-node exporters %g, two Relay shards %g", j.ns, j.name, m, perNode, relay)
			}
		}
	})

	// Hubble's ring is lost with the agent, the pinned conntrack maps
	// stay: nothing may be counted twice, through either mode.
	t.Run("agent restart counts nothing twice", func(t *testing.T) {
		type count struct{ drops, flows, bytes, relay float64 }
		read := func() map[string]count {
			out := map[string]count{}
			for _, j := range []*labJob{blocked, slow, healthy} {
				m := map[string]string{"namespace": j.ns, "job_name": j.name}
				out[j.name] = count{
					drops: sumExporters(t, addrs, "zonewatch_job_policy_drops_total", m),
					flows: sumExporters(t, addrs, "zonewatch_job_flow_events_total", m),
					bytes: sumExporters(t, addrs, "zonewatch_job_network_bytes_total", m),
					relay: sumExporters(t, shards, "zonewatch_job_flow_events_total", m),
				}
			}
			return out
		}
		// The counts stand still first: a flow event still on its way
		// from an agent's ring, or bytes a conntrack poll (10 s) has not
		// read yet, would otherwise count after the restart (seen once: a
		// tenth resnet-healthy flow event, late).
		before := read()
		for still, start := time.Now(), time.Now(); time.Since(still) < 12*time.Second; {
			if time.Since(start) > time.Minute {
				t.Fatalf("the counts did not stand still for 12 s in a minute (traffic left running?): %+v", before)
			}
			time.Sleep(2 * time.Second)
			if now := read(); !maps.Equal(now, before) {
				t.Logf("counts still moving before the restart: %+v, then %+v", before, now)
				before, still = now, time.Now()
			}
		}
		reconnects := sumExporters(t, addrs, "zonewatch_hubble_reconnects_total", nil)
		n := lab.Node("gpu-a1") // zone a's first GPU node: most of the workers' flows and egress entries
		began := time.Now()
		if err := n.RestartAgent(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("agent on %s restarted in %s", n.Name, time.Since(began).Round(time.Millisecond))
		eventually(t, time.Minute, "the exporter follows the restarted agent's Hubble again", func() (bool, string) {
			r := sumExporters(t, addrs, "zonewatch_hubble_reconnects_total", nil)
			up := sumExporters(t, addrs, "zonewatch_source_up", map[string]string{"source": "hubble"})
			return r > reconnects && up == float64(len(addrs)), fmt.Sprintf("reconnects %g (before %g), hubble up on %g", r, reconnects, up)
		})
		time.Sleep(12 * time.Second) // a conntrack poll (10 s) after the restart
		after := read()
		for job, b := range before {
			if a := after[job]; a != b {
				t.Errorf("%s after the agent restart: %+v, before %+v", job, a, b)
			}
		}
		t.Logf("counts before and after the restart: %+v", after)
	})

	// Cilium deletes an endpoint's conntrack entries with it: the bytes a
	// pod moved since the last poll (10 s) must still be counted when the
	// pod goes right after a transfer.
	t.Run("pod deleted right after a transfer", func(t *testing.T) {
		w, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: slow.ns, Name: slow.name + "-worker-2", Node: "gpu-a2",
			Labels:          mergeArgs(slow.workers[0].Spec.Labels, map[string]string{"training.kubeflow.org/replica-index": "2", "zone": zoneA}),
			OwnerAPIVersion: "kubeflow.org/v1", OwnerKind: "PyTorchJob", OwnerName: slow.name, Ports: []int32{ciliumlab.RendezvousPort}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.SettledIdentity(ctx, "zone"); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{"namespace": slow.ns, "job_name": slow.name}
		before := sumExporters(t, addrs, "zonewatch_job_network_bytes_total", m)
		big := ex
		big.Steps = 200 // 12.5 MiB up, 3.1 MiB down
		big.DialTimeout = 2 * time.Second
		r := big.Run(ctx, slow.coordinator, []*ciliumlab.Pod{w}, 3)
		if r.Attempts == r.Failed {
			t.Fatalf("the new worker could not connect: %s", r)
		}
		began := time.Now()
		if err := w.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("pod %s deleted %s after its transfer ended (%s)", w.Ref(), time.Since(began).Round(time.Millisecond), r)
		var payload int64
		for _, v := range r.Payload {
			payload += v
		}
		time.Sleep(15 * time.Second) // past the next poll: nothing more is coming
		got := sumExporters(t, addrs, "zonewatch_job_network_bytes_total", m) - before
		t.Logf("bytes of the deleted pod's connection: exporters %g, payload %d B both ways: %.4f of the payload", got, payload, got/float64(payload))
		if got < float64(payload) || got > 1.01*float64(payload) {
			t.Errorf("a pod deleted right after moving %d B: %g B counted, want the payload plus at most 1%% headers", payload, got)
			for _, metric := range []string{"zonewatch_conntrack_unattributed_bytes_total", "zonewatch_conntrack_deleted_entries_total", "zonewatch_job_network_bytes_total"} {
				t.Logf("%s: %v", metric, seriesOf(t, map[string]string{"gpu-a2": addrs["gpu-a2"]}, metric, nil))
			}
		}
	})

	t.Run("nothing unplaced", func(t *testing.T) {
		if u := sumExporters(t, addrs, "zonewatch_hubble_flows_unresolved_total", nil); u != 0 {
			t.Errorf("zonewatch_hubble_flows_unresolved_total = %g, want 0: %v", u, seriesOf(t, addrs, "zonewatch_hubble_flows_unresolved_total", nil))
			known := map[string]bool{}
			for _, j := range []*labJob{blocked, slow, healthy} {
				for _, p := range j.pods() {
					known[p.IP.String()] = true
				}
			}
			for _, n := range lab.Nodes {
				t.Logf("%s: Hubble's flows with an address that is no job pod's: %v", n.Name, strangers(t, n, known))
			}
		}
		if u := sumExporters(t, addrs, "zonewatch_conntrack_unattributed_bytes_total", map[string]string{"reason": "no_job"}); u != 0 {
			t.Errorf("unattributed no_job bytes = %g, want 0: %v", u, seriesOf(t, addrs, "zonewatch_conntrack_unattributed_bytes_total", nil))
		}
		for _, src := range []string{"hubble", "conntrack", "kubernetes"} {
			if up := sumExporters(t, addrs, "zonewatch_source_up", map[string]string{"source": src}); up != float64(len(addrs)) {
				t.Errorf("zonewatch_source_up{source=%q} on %g of %d exporters: %v", src, up, len(addrs), seriesOf(t, addrs, "zonewatch_source_up", nil))
			}
		}
	})
	// The whole loop: Prometheus scrapes the exporters with the rule pack,
	// Alertmanager pages; the job is recreated in one zone and the page
	// resolves. The GPUs are simulated (no GPU here): the blocked job's
	// read 1%, as GPUs waiting on a rendezvous do.
	t.Run("page fires and resolves", func(t *testing.T) {
		testenv.ToolsBin(t, "prometheus", "alertmanager")
		dir := t.TempDir()
		cfg := testRulesConfig()
		hook := newWebhook(t)
		amAddr := startAlertmanager(t, tools, dir, hook.url)
		var exps []exporter
		for node, addr := range addrs {
			exps = append(exps, exporter{node: node, addr: addr})
		}
		p := startPrometheus(t, tools, dir, testRuleFile(t, cfg), amAddr, exps)
		if !eventually(t, time.Minute, "Prometheus scrapes every exporter", func() (bool, string) {
			v, err := p.value(`sum(up{job="zonewatch"})`)
			return err == nil && int(v) == len(exps), fmt.Sprint(v, err)
		}) {
			return
		}
		// The cross-zone job keeps training (symptom 2 needs its traffic
		// in the 5m rates); the blocked workers keep retrying the
		// rendezvous, as torchrun does.
		training, stopTraining := context.WithCancel(ctx)
		trainedSlow := slow.loop(training, ex)
		defer func() { stopTraining(); <-trainedSlow }()
		retry, stop := context.WithCancel(ctx)
		retried := blocked.loop(retry, ex)
		defer func() {
			if stop != nil {
				stop()
				<-retried
			}
		}()
		firing := alertIs(rules.AlertIdleGPUSplitJob, "firing", "namespace", blocked.ns, "job_name", blocked.name)
		var page amAlert
		var pagedAt time.Time
		if !eventually(t, 3*time.Minute, rules.AlertIdleGPUSplitJob+" at the pager", func() (bool, string) {
			var ok bool
			page, pagedAt, ok = hook.find("/pager", firing)
			return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
		}) {
			return
		}
		t.Logf("page at %s: %s | %s", pagedAt.Format(time.RFC3339), page.Annotations["summary"], page.Annotations["description"])
		for _, want := range []string{blocked.ns + "/" + blocked.name, zoneA, zoneB, "policy ml-team/zone-isolation"} {
			if !strings.Contains(page.Annotations["description"], want) {
				t.Errorf("page description does not name %q", want)
			}
		}
		warning := alertIs(rules.AlertCrossZoneSlowdown, "firing", "namespace", slow.ns, "job_name", slow.name)
		if eventually(t, 2*time.Minute, rules.AlertCrossZoneSlowdown+" for "+slow.name+" at the tickets", func() (bool, string) {
			_, _, ok := hook.find("/tickets", warning)
			return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
		}) {
			w, _, _ := hook.find("/tickets", warning)
			t.Logf("warning: %s | %s", w.Annotations["summary"], w.Annotations["description"])
		}
		for _, j := range []*labJob{healthy, slow} {
			if a, _, ok := hook.find("", alertIs(rules.AlertIdleGPUSplitJob, "firing", "namespace", j.ns, "job_name", j.name)); ok {
				t.Errorf("%s/%s paged: %v", j.ns, j.name, a.Labels)
			}
		}
		stop()
		<-retried
		stop = nil

		// The fix: analyze's, on the job's manifest; the scheduler places
		// the re-created pods.
		fix, _ := sc.fix(ctx, t, lab, gpus, dir)
		fixed := sc.blocked
		t.Logf("analyze's fix:\n%s\nllm-blocked re-created with it, placed by kube-scheduler: %s", fix, fixed.placement())
		if _, err := fixed.coordinator.Serve(ex.Up, ex.Down); err != nil {
			t.Fatal(err)
		}
		train, stopTrain := context.WithCancel(ctx)
		trainFrom := time.Now()
		trained := fixed.loop(train, ex)
		dropsFixed := agentDrops(t, lab)
		before := dropsFixed["Policy denied by denylist"]
		windowFrom := time.Now()
		time.Sleep(15 * time.Second)
		dropsLater := agentDrops(t, lab)
		after := dropsLater["Policy denied by denylist"]
		// Which packets, from the nodes' Hubble: every fence drop since the
		// fixed job started training.
		seen, ofFixed := fenceDrops(t, lab, trainFrom, time.Now(), fixed.pods())
		if after != before {
			t.Errorf("the agents dropped %g packets by the fence after the fix; Hubble's fence drops since the fixed job started (window from %s): %s",
				after-before, windowFrom.Format("15:04:05.000"), strings.Join(seen, "; "))
		}
		t.Logf("Hubble's fence drops since the fixed job started: %d %v", len(seen), seen)
		if ofFixed != 0 {
			t.Errorf("Hubble: %d fence drops of the fixed job's pods: %s", ofFixed, strings.Join(seen, "; "))
		}
		t.Logf("agents' drops in the 15 s after the fix, by node, direction and reason: %v", dropDelta(dropsFixed, dropsLater))
		resolved := alertIs(rules.AlertIdleGPUSplitJob, "resolved", "namespace", blocked.ns, "job_name", blocked.name)
		var resolvedAt time.Time
		eventually(t, 3*time.Minute, rules.AlertIdleGPUSplitJob+" resolved at the pager", func() (bool, string) {
			var ok bool
			_, resolvedAt, ok = hook.find("/pager", resolved)
			return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
		})
		stopTrain()
		r := <-trained
		t.Logf("after the fix: %d rendezvous attempts, %d failed (%v); agents' fence drops over 15 s: %g; page resolved %s after it fired",
			r.Attempts, r.Failed, r.Errors, after-before, resolvedAt.Sub(pagedAt).Round(time.Second))
		if r.Attempts-r.Failed < r.Attempts/2 {
			t.Errorf("after the fix only %d of %d rendezvous attempts connected", r.Attempts-r.Failed, r.Attempts)
		}
	})
	t.Logf("test wall time: %s", time.Since(began).Round(time.Millisecond))
}

// fenceDrops lists, from every node's Hubble (GetFlows from..until), the
// drop events of the fence ("Policy denied by denylist"): time, node,
// source and destination pod with identity, whether the source identity
// has the "zone" label, ports, TCP flags; and how many have one of pods
// at either end.
func fenceDrops(t *testing.T, lab *ciliumlab.Lab, from, until time.Time, pods []*ciliumlab.Pod) ([]string, int) {
	t.Helper()
	ips := map[string]bool{}
	for _, p := range pods {
		ips[p.IP.String()] = true
	}
	var out []string
	of := 0
	for _, n := range lab.Nodes {
		nodeFlows(t, n, 30*time.Second, &observerpb.GetFlowsRequest{
			Since: timestamppb.New(from), Until: timestamppb.New(until),
			Whitelist: []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}},
		}, func(f *flowpb.Flow) {
			if f.GetEventType().GetType() != 1 || f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENY {
				return
			}
			src, dst := f.GetSource(), f.GetDestination()
			zone := "no zone label"
			for _, l := range src.GetLabels() {
				if strings.HasPrefix(l, "k8s:zone=") {
					zone = l
				}
			}
			if ips[f.GetIP().GetSource()] || ips[f.GetIP().GetDestination()] {
				of++
			}
			tcp := f.GetL4().GetTCP()
			out = append(out, fmt.Sprintf("%s %s %s: %s/%s %s:%d (id %d, %s) -> %s/%s %s:%d (id %d) %s",
				f.GetTime().AsTime().Format("15:04:05.000"), n.Name, f.GetTrafficDirection(),
				src.GetNamespace(), src.GetPodName(), f.GetIP().GetSource(), tcp.GetSourcePort(), src.GetIdentity(), zone,
				dst.GetNamespace(), dst.GetPodName(), f.GetIP().GetDestination(), tcp.GetDestinationPort(), dst.GetIdentity(), tcpFlags(tcp.GetFlags())))
		})
	}
	slices.Sort(out)
	return out, of
}

func dropDelta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 && strings.Contains(k, " ") {
			out[k] = d
		}
	}
	return out
}
