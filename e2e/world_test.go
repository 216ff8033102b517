package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
)

// world is the simulated cluster the per-node fakes serve. The scenario
// changes when a fix is applied, so everything that reads it holds mu: the
// traffic driver, the dcgm-exporter pages and the PodResources updates.
type world struct {
	mu     sync.Mutex
	s      *sim.Scenario
	nodes  []*nodeFakes // GPU nodes, in scenario order
	paused bool
	last   time.Time // end of the traffic generated so far
	ct     *ctState

	// firstDrop is when a Hubble client first saw a dropped flow.
	firstDrop atomic.Pointer[time.Time]
}

// nodeFakes are one node's fakes, each speaking its real protocol.
type nodeFakes struct {
	name       string
	hubble     *sim.Hubble
	hubbleSock string
	podres     *sim.PodResourcesServer
	podresSock string
	gpu        *sim.GPUSource
	gpuDown    atomic.Bool
	bpfDir     string // where this node's CT maps are pinned
}

func (w *world) node(name string) *nodeFakes {
	for _, n := range w.nodes {
		if n.name == name {
			return n
		}
	}
	panic("e2e: no fakes for node " + name)
}

func (w *world) job(namespace, name string) *sim.Job {
	for i := range w.s.Jobs {
		if j := &w.s.Jobs[i]; j.Namespace == namespace && j.Name == name {
			return j
		}
	}
	panic("e2e: no job " + namespace + "/" + name)
}

// newWorld starts the fakes of every GPU node of the default scenario under
// dir: a Hubble Observer and a kubelet PodResources server on unix sockets,
// and the node's conntrack maps pinned in a BPF filesystem mounted at
// bpffs. Traffic starts with run.
func newWorld(t *testing.T, dir, bpffs string) *world {
	t.Helper()
	w := &world{s: sim.Default()}
	ct, err := newCTState(bpffs)
	if err != nil {
		t.Fatal(err)
	}
	w.ct = ct
	t.Cleanup(ct.close)
	for _, n := range w.s.Nodes {
		if len(n.GPUs) == 0 {
			continue // CPU nodes run no training pods and no exporter here
		}
		nd := filepath.Join(dir, n.Name)
		if err := os.MkdirAll(nd, 0o755); err != nil {
			t.Fatal(err)
		}
		f := &nodeFakes{
			name:       n.Name,
			hubble:     sim.NewHubble(w.s, n.Name, 0),
			hubbleSock: filepath.Join(nd, "hubble.sock"),
			podresSock: filepath.Join(nd, "kubelet.sock"),
			gpu:        sim.NewGPUSource(w.s, n.Name),
			bpfDir:     filepath.Join(bpffs, n.Name),
		}
		if err := f.hubble.Start(f.hubbleSock); err != nil {
			t.Fatal(err)
		}
		testenv.CiliumSocket(t, f.hubbleSock) // 0660, group cilium where it exists
		t.Cleanup(f.hubble.Stop)
		if f.podres, err = sim.StartPodResources(w.s, n.Name, f.podresSock); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.podres.Close)
		if err := ct.addNode(n.Name, f.bpfDir); err != nil {
			t.Fatal(err)
		}
		w.nodes = append(w.nodes, f)
	}
	return w
}

// watchFirstDrop follows node's Hubble like `hubble observe --verdict
// DROPPED -f` and records when the first dropped flow arrives.
func (w *world) watchFirstDrop(ctx context.Context, t *testing.T, node string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+w.node(node).hubbleSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := observerpb.NewObserverClient(conn).GetFlows(ctx, &observerpb.GetFlowsRequest{
		Follow:    true,
		Whitelist: []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}},
	})
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	go func() {
		defer conn.Close()
		if _, err := stream.Recv(); err == nil {
			now := time.Now()
			w.firstDrop.Store(&now)
		}
	}()
}

// run generates traffic every tick until ctx ends: each node's Hubble
// flows and conntrack counters, from the scenario as it is at that moment.
func (w *world) run(ctx context.Context, t *testing.T, tick time.Duration) {
	w.mu.Lock()
	w.last = time.Now()
	w.mu.Unlock()
	tk := time.NewTicker(tick)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tk.C:
			if err := w.step(now); err != nil && ctx.Err() == nil {
				t.Errorf("generating traffic: %v", err)
				return
			}
		}
	}
}

func (w *world) step(now time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.paused {
		return nil // the flows of the pause come out on resume
	}
	for _, n := range w.nodes {
		n.hubble.Generate(w.last, now.Sub(w.last))
	}
	w.last = now
	for _, n := range w.nodes {
		if err := w.ct.update(w.s, n.name, now); err != nil {
			return err
		}
	}
	return nil
}

// pause stops traffic generation until the returned func is called.
func (w *world) pause() (resume func()) {
	w.mu.Lock()
	w.paused = true
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.paused = false
		w.mu.Unlock()
	}
}

// serveGPUPage serves each node's dcgm-exporter page at /<node>/metrics:
// what dcgm-exporter (without its Kubernetes mapping) prints for the
// node's GPUs, read from the fake GPU source. A node whose GPU source is
// down answers 503, as dcgm-exporter does when DCGM fails.
func (w *world) serveGPUPage(rw http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/metrics")
	var f *nodeFakes
	for _, n := range w.nodes {
		if n.name == name {
			f = n
		}
	}
	if !ok || f == nil {
		http.NotFound(rw, r)
		return
	}
	if f.gpuDown.Load() {
		http.Error(rw, "DCGM: host engine not reachable", http.StatusServiceUnavailable)
		return
	}
	w.mu.Lock()
	samples, err := f.gpu.Read(r.Context())
	w.mu.Unlock()
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	writeDCGMPage(rw, f.name, samples)
}

// writeDCGMPage prints samples as dcgm-exporter's page for node (its
// default counters, without its Kubernetes mapping).
func writeDCGMPage(rw io.Writer, node string, samples []gpu.Sample) {
	for _, m := range []struct {
		name, help string
		value      func(u, sm, tensor float64) string
	}{
		{"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", func(u, _, _ float64) string { return fmt.Sprint(math.Round(u * 100)) }},
		{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", func(u, _, _ float64) string { return fmt.Sprint(u) }},
		{"DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", func(_, sm, _ float64) string { return fmt.Sprint(sm) }},
		{"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", func(_, _, tc float64) string { return fmt.Sprint(tc) }},
	} {
		fmt.Fprintf(rw, "# HELP %s %s\n# TYPE %s gauge\n", m.name, m.help, m.name)
		for _, s := range samples {
			fmt.Fprintf(rw, "%s{gpu=\"%d\",UUID=\"%s\",pci_bus_id=\"00000000:%02X:00.0\",device=\"nvidia%d\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"%s\",DCGM_FI_DRIVER_VERSION=\"570.124.06\"} %s\n",
				m.name, s.Index, s.UUID, 0x18+s.Index, s.Index, node, m.value(s.Util, s.SMActive, s.TensorActive))
		}
	}
}

// ctState keeps every node's Cilium conntrack maps (IPv4 only, like an
// IPv4 cluster: cilium_ct4_global for TCP, cilium_ct_any4_global for the
// rest) as real BPF hash maps pinned where the exporter reads them, with
// entries in Cilium 1.16+'s combined layout. Each connection's counters
// grow from when the connection first appeared, so a pod recreated by the
// fix opens new connections that start from zero.
type ctState struct {
	maps   map[string]map[string]*ebpf.Map // node -> map name -> map
	keys   map[string]map[string]bool      // node -> keys written last round
	starts map[ctKey]time.Time
}

type ctKey struct {
	node             string
	src, dst         netip.Addr
	srcPort, dstPort uint16
	proto            uint8
	ingress, service bool
}

func newCTState(bpffs string) (*ctState, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("raising the memlock limit for BPF maps: %w", err)
	}
	return &ctState{maps: map[string]map[string]*ebpf.Map{}, keys: map[string]map[string]bool{}, starts: map[ctKey]time.Time{}}, nil
}

func (c *ctState) addNode(node, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c.maps[node] = map[string]*ebpf.Map{}
	c.keys[node] = map[string]bool{}
	for _, name := range []string{conntrack.MapTCP4, conntrack.MapAny4} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: conntrack.KeySize4, ValueSize: conntrack.ValueSize, MaxEntries: 4096})
		if err != nil {
			return fmt.Errorf("creating BPF map %s for %s: %w", name, node, err)
		}
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			m.Close()
			return fmt.Errorf("pinning BPF map %s for %s: %w", name, node, err)
		}
		c.maps[node][name] = m
	}
	return nil
}

func (c *ctState) close() {
	for _, ms := range c.maps {
		for _, m := range ms {
			_ = m.Unpin()
			m.Close()
		}
	}
}

// update writes node's entries as they are at now and deletes the entries
// of connections that are gone, as Cilium's CT garbage collector does.
func (c *ctState) update(s *sim.Scenario, node string, now time.Time) error {
	byStart := map[time.Time]map[ctKey]bool{}
	for _, e := range s.ConntrackEntries(node, 0) {
		k := ctKey{e.Node, e.Src, e.Dst, e.SrcPort, e.DstPort, e.Proto, e.Ingress, e.Service}
		st, ok := c.starts[k]
		if !ok {
			st = now
			c.starts[k] = st
		}
		if byStart[st] == nil {
			byStart[st] = map[ctKey]bool{}
		}
		byStart[st][k] = true
	}
	seen := map[string]bool{}
	for st, keys := range byStart {
		for _, e := range s.ConntrackEntries(node, now.Sub(st)) {
			if !keys[ctKey{e.Node, e.Src, e.Dst, e.SrcPort, e.DstPort, e.Proto, e.Ingress, e.Service}] {
				continue
			}
			tu, v := e.Encode(conntrack.LayoutCombined)
			key, val := conntrack.AppendKey(nil, tu), conntrack.AppendValue(nil, v)
			name := conntrack.MapAny4
			if e.Proto == 6 {
				name = conntrack.MapTCP4
			}
			if err := c.maps[node][name].Put(key, val); err != nil {
				return fmt.Errorf("writing CT entry on %s: %w", node, err)
			}
			seen[name+"\x00"+string(key)] = true
		}
	}
	for k := range c.keys[node] {
		if seen[k] {
			continue
		}
		name, key, _ := strings.Cut(k, "\x00")
		if err := c.maps[node][name].Delete([]byte(key)); err != nil {
			return fmt.Errorf("deleting CT entry on %s: %w", node, err)
		}
	}
	c.keys[node] = seen
	return nil
}

// bpffsIn mounts a BPF filesystem at dir/bpffs for the simulated Cilium
// maps; without the privilege the test skips, unless tools are required.
func bpffsIn(t *testing.T, dir string) string {
	t.Helper()
	bpffs := filepath.Join(dir, "bpffs")
	if err := os.Mkdir(bpffs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := mountBPFFS(t, bpffs); err != nil {
		if os.Getenv("ZONEWATCH_REQUIRE_TOOLS") != "" || os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return bpffs
}

// mountBPFFS mounts a BPF filesystem at dir for the test's lifetime.
func mountBPFFS(t *testing.T, dir string) error {
	if err := syscall.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting a BPF filesystem at %s (needs root): %w", dir, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return nil
}

// freeGPUs returns the GPUs of node no pod holds, in index order.
func freeGPUs(s *sim.Scenario, node string) []string {
	used := map[string]bool{}
	for _, p := range s.AllPods() {
		for _, g := range p.GPUs {
			used[g] = true
		}
	}
	var out []string
	for _, g := range s.NodeByName(node).GPUs {
		if !used[g.UUID] {
			out = append(out, g.UUID)
		}
	}
	return out
}

// freeIP returns the next pod IP of node's CIDR that no pod uses.
func freeIP(s *sim.Scenario, node string) netip.Addr {
	cidr := s.NodeByName(node).PodCIDR
	used := map[netip.Addr]bool{}
	for _, p := range s.AllPods() {
		used[p.IP] = true
	}
	ip := cidr.Addr().Next() // .1 is the router
	for used[ip] || ip == cidr.Addr().Next() {
		ip = ip.Next()
	}
	return ip
}

// setBehaviour changes how a job's traffic and GPUs behave.
func (w *world) setBehaviour(namespace, name string, b sim.Behaviour) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.job(namespace, name).Behaviour = b
}

// moveWorkersToCoordinatorZone is the fix, as podAffinity on the zone key
// would place the job: every worker outside the coordinator's zone is
// rescheduled onto the GPU node of that zone with the most free GPUs (a
// new IP, new GPUs). It returns the workers as they were and as they are
// now.
func (w *world) moveWorkersToCoordinatorZone(namespace, name string) (before, after []sim.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	j := w.job(namespace, name)
	zone := w.s.NodeByName(j.Coordinator().Node).Zone
	var candidates []string
	for _, n := range w.s.Nodes {
		if n.Zone == zone && len(n.GPUs) > 0 {
			candidates = append(candidates, n.Name)
		}
	}
	c := j.Coordinator()
	for i := range j.Pods {
		p := &j.Pods[i]
		if p == c || w.s.NodeByName(p.Node).Zone == zone {
			continue
		}
		before = append(before, *p)
		sort.SliceStable(candidates, func(a, b int) bool {
			return len(freeGPUs(w.s, candidates[a])) > len(freeGPUs(w.s, candidates[b]))
		})
		target := candidates[0]
		free := freeGPUs(w.s, target)
		if len(free) < len(p.GPUs) {
			panic(fmt.Sprintf("e2e: no room for %s in zone %s", p.Name, zone))
		}
		p.Node, p.IP, p.GPUs = target, freeIP(w.s, target), slices.Clone(free[:len(p.GPUs)])
		after = append(after, *p)
	}
	for _, n := range w.nodes {
		pods, _ := sim.PodResourcesOf(w.s, n.name)
		n.podres.SetPods(pods)
	}
	return before, after
}
