package analyze

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/topology"
)

// The scheduling bed: the seed's cluster in each cell. The roomy zone's
// GPUs hold the whole job (16 GPUs), the small zone's hold half of it, the
// CPU nodes are in a third zone. GPU nodes are tainted as GPU clusters
// taint them. The job: a CPU-only coordinator (where the controller has
// one) and four workers of 4 GPUs.
//
// kube-scheduler v1.37.2 does not break ties between nodes of equal score
// at random: without extenders it leaves NodePluginScores.Randomizer at 0
// (pkg/scheduler/schedule_one.go prioritizeNodes) and takes the first of
// the equal nodes (framework/sorted_nodes.go), in its node list order:
// zones round-robin in the order the zones appeared (backend/cache
// node_tree.go), from a start index that moves only in clusters where it
// stops searching early. So which zone a cluster registered first decides
// where the first pod goes. Each cell has zones of its own, and the
// repeats alternate which of its GPU zones is created first.
type bed struct {
	small, roomy, cpu string
	nodes             []schedlab.Node
}

func newBed(cell string, roomyGPUNodes int, roomyFirst bool) bed {
	b := bed{small: cell + "-us-east-1a", roomy: cell + "-us-east-1b", cpu: cell + "-us-east-1c"}
	lbl := map[string]string{schedlab.LabelCell: cell}
	gpu := func(zone string, i int) schedlab.Node {
		return schedlab.Node{Name: fmt.Sprintf("%s-gpu-%s-%d", cell, zone[len(zone)-1:], i), Zone: zone, Region: "us-east-1",
			CPU: "32", Memory: "256Gi", GPUs: 8, Labels: lbl, Taints: []corev1.Taint{schedlab.GPUTaint}}
	}
	small := []schedlab.Node{gpu(b.small, 0)}
	var roomy []schedlab.Node
	for i := 0; i < roomyGPUNodes; i++ {
		roomy = append(roomy, gpu(b.roomy, i))
	}
	if roomyFirst {
		b.nodes = append(roomy, small...)
	} else {
		b.nodes = append(small, roomy...)
	}
	for i := 0; i < 2; i++ {
		b.nodes = append(b.nodes, schedlab.Node{Name: fmt.Sprintf("%s-cpu-c-%d", cell, i), Zone: b.cpu, Region: "us-east-1",
			CPU: "64", Memory: "512Gi", Labels: lbl})
	}
	return b
}

// settleGap separates two conditions on the same nodes: the scheduler's
// cache drops the deleted pods a moment after our informer does.
var settleGap = time.Second

var bedSize = schedlab.Size{Workers: 4, WorkerGPUs: 4, WorkerCPU: "4", WorkerMem: "32Gi", CoordCPU: "2", CoordMem: "8Gi"}

// Creation orders that matter: the coordinator (rank 0 where every pod
// has GPUs) scheduled before any worker exists, after every worker, and
// created among them at once.
var orders = []string{"coordinator first", "workers first", "interleaved"}

// Conditions, in the order each cell runs them.
// analyze's advice is Kueue's (issue 43: no pin alone), checked on the
// dump of "none" here and placed on the real Kueue in TestKueueTAS and
// internal/trainlab; the runbook's pin is the manual recipe for capacity
// that does not move.
var conditions = []string{"none", "self podAffinity (old advice)", "runbook YAML", "admission policy"}

type outcome struct {
	zones   int
	pending int
	note    string
}

func (o outcome) String() string {
	switch {
	case o.note != "":
		return o.note
	case o.pending > 0:
		return "pending"
	case o.zones == 1:
		return "one zone"
	default:
		return "split"
	}
}

// TestFixOnRealScheduler creates the pods of every controller shape as
// the controller creates them, in each order, repeated with either GPU
// zone registered first (the scheduler gives ties to the first equal node,
// see bed), on the real kube-scheduler, without a fix, with
// the advice zonewatch gave before (a required self podAffinity), with the
// pin of docs/runbooks.md, and with the opt-in admission policy; and logs
// where the pods landed. analyze's fix, computed from the dump of the
// unfixed run, must be Kueue's and name the roomy zone (checkRoomAdvice);
// the runbook's pin must give one zone and no Pending pod every time (the
// zone has room); the policy must leave no pod Pending.
func TestFixOnRealScheduler(t *testing.T) {
	t.Parallel() // its own apiserver (scheduler, Kueue where used); mostly waits (docs/development.md)
	snippets := runbookSnippets(t)
	lab := schedlab.Start(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	reps := 2
	if s := os.Getenv("ZONEWATCH_SCHEDLAB_REPEAT"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("ZONEWATCH_SCHEDLAB_REPEAT=%q is not a count", s)
		}
		reps = n
	}
	installPolicy(ctx, t, lab)

	type key struct{ shape, order string }
	var mu sync.Mutex
	results := map[key]map[string][]outcome{}
	var wg sync.WaitGroup
	cell := 0
	for _, shape := range schedlab.Shapes() {
		for _, order := range orders {
			for r := 0; r < reps; r++ {
				cell++
				name := fmt.Sprintf("c%03d", cell)
				wg.Add(1)
				go func() {
					defer wg.Done()
					got, err := runCell(ctx, lab, newBed(name, 2, r%2 == 1), name, shape, order, snippets)
					if err != nil {
						t.Errorf("%s %s (%s): %v", shape.Name, order, name, err)
					}
					mu.Lock()
					defer mu.Unlock()
					k := key{shape.Name, order}
					if results[k] == nil {
						results[k] = map[string][]outcome{}
					}
					for c, o := range got {
						results[k][c] = append(results[k][c], o)
					}
				}()
			}
		}
	}
	// A cluster where no zone can hold the job: the advice says so.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := noRoomCell(ctx, lab); err != nil {
			t.Error(err)
		}
	}()
	wg.Wait()

	var b strings.Builder
	fmt.Fprintf(&b, "placements on kube-scheduler, %d runs per row, alternating which GPU zone is registered first (one zone / split / pending):\n\n| shape | order |", reps)
	for _, c := range conditions {
		b.WriteString(" " + c + " |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(conditions)) + "\n")
	totals := map[string]map[string]int{}
	for _, shape := range schedlab.Shapes() {
		for _, order := range orders {
			fmt.Fprintf(&b, "| %s | %s |", shape.Name, order)
			for _, c := range conditions {
				count := map[string]int{}
				for _, o := range results[key{shape.Name, order}][c] {
					count[o.String()]++
					if totals[c] == nil {
						totals[c] = map[string]int{}
					}
					totals[c][o.String()]++
					switch {
					case c == "runbook YAML" && o.note == "" && (o.pending > 0 || o.zones != 1):
						t.Errorf("%s %s with %s: %d zones, %d pods Pending; want one zone, none Pending", shape.Name, order, c, o.zones, o.pending)
					case c == "admission policy" && o.pending > 0:
						t.Errorf("%s %s with the admission policy: %d pods Pending", shape.Name, order, o.pending)
					}
				}
				fmt.Fprintf(&b, " %s |", summary(count))
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("| all | |")
	for _, c := range conditions {
		fmt.Fprintf(&b, " %s |", summary(totals[c]))
	}
	fmt.Fprintf(&b, "\n\n%d cells, %s\n", cell, time.Since(start).Round(time.Second))
	t.Log("\n" + b.String())
}

func summary(count map[string]int) string {
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, count[k]))
	}
	return strings.Join(parts, ", ")
}

// runCell runs every condition for one job on its own nodes.
func runCell(ctx context.Context, lab *schedlab.Lab, b bed, cell string, shape *schedlab.Shape, order string, snippets map[string]string) (map[string]outcome, error) {
	if err := lab.AddNodes(ctx, b.nodes...); err != nil {
		return nil, err
	}
	zoneOf := map[string]string{}
	for _, n := range b.nodes {
		zoneOf[n.Name] = n.Zone
	}
	job := shape.New("", "train", bedSize)
	out := map[string]outcome{}
	for i, cond := range conditions {
		ns := fmt.Sprintf("%s-%d", cell, i)
		var lbl map[string]string
		if cond == "admission policy" {
			lbl = map[string]string{AdmissionNamespaceLabel: "true"}
		}
		if err := lab.EnsureNamespace(ctx, ns, lbl); err != nil {
			return out, err
		}
		j := job.Copy()
		j.Namespace = ns
		switch cond {
		case "self podAffinity (old advice)":
			oldAdvice(j)
		case "runbook YAML":
			runbookPin(j, snippets, b.roomy)
		}
		p, err := place(ctx, lab, j, cell, order)
		if err != nil {
			return out, fmt.Errorf("%s: %w", cond, err)
		}
		o := outcome{pending: p.Pending()}
		zones := map[string]bool{}
		for _, node := range p {
			if node != "" {
				zones[zoneOf[node]] = true
			}
		}
		o.zones = len(zones)
		out[cond] = o
		if os.Getenv("ZONEWATCH_SCHEDLAB_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "%s %s %s %s: %v\n", cell, shape.Name, order, cond, p)
		}
		pods, err := lab.Pods(ns)
		if err != nil {
			return out, err
		}
		switch cond {
		case "none":
			// The seed's split: a coordinator without GPUs cannot go on
			// the tainted GPU nodes and lands in the CPU zone.
			if !shape.AllGPU {
				coords, _, _, err := j.Pods()
				if err != nil {
					return out, err
				}
				for _, c := range coords {
					if z := zoneOf[p[c.Name]]; z != b.cpu {
						return out, fmt.Errorf("without a fix the coordinator %s landed in %q, want %s", c.Name, z, b.cpu)
					}
				}
			}
			// Not opted in: the policy leaves the pods as created.
			for _, pod := range pods {
				if a := pod.Spec.Affinity; a != nil && (a.PodAffinity != nil && len(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0) {
					return out, fmt.Errorf("pod %s/%s outside an opted-in namespace was mutated: %+v", ns, pod.Name, a)
				}
			}
			fix, err := analyzeFix(ctx, lab, cell, ns, j)
			if err != nil {
				return out, err
			}
			if os.Getenv("ZONEWATCH_SCHEDLAB_DEBUG") != "" {
				fmt.Fprintf(os.Stderr, "%s %s %s fix:\n%s\n", cell, shape.Name, order, fix)
			}
			if err := checkRoomAdvice(fix, b.roomy, shape.Kind); err != nil {
				return out, err
			}
		case "admission policy":
			for _, pod := range pods {
				if a := pod.Spec.Affinity; a == nil || a.PodAffinity == nil || len(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
					return out, fmt.Errorf("pod %s/%s of an opted-in namespace was not mutated", ns, pod.Name)
				}
			}
		}
		if err := lab.DeletePods(ctx, ns); err != nil {
			return out, err
		}
		time.Sleep(settleGap)
	}
	return out, nil
}

// zoneValue is a zone in a nodeAffinity's values (the beds' zones).
var zoneValue = regexp.MustCompile(`(?m)^\s*- (\S+-us-east-1[a-z])$`)

// checkRoomAdvice checks analyze's fix for a split job with room in zone:
// Kueue TAS (the required topology on the templates, the job queued), the
// zone named as the one with room, no pin to it alone, and said why; a
// nodeAffinity (a job of three pod sets or more, for Kueue) holds only
// that zone. A Volcano Job's fix is its pin to zone with minAvailable of
// every pod (Volcano's gang; Kueue has no integration of it).
func checkRoomAdvice(fix, zone, kind string) error {
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(fix), &patch); err != nil || patch["spec"] == nil {
		return fmt.Errorf("the fix is not a YAML fragment (%v):\n%s", err, fix)
	}
	want := []string{KueueTopologyAnnotation + ": topology.kubernetes.io/zone", KueueQueueLabel + ":",
		"# " + zone + " has room for the whole job now", "# No pin to " + zone + " is given"}
	if kind == "VolcanoJob" {
		want = []string{"minAvailable: ", "- " + zone + "\n", "# " + zone + " has room for the whole job now"}
	}
	for _, s := range want {
		if !strings.Contains(fix, s) {
			return fmt.Errorf("the fix lacks %q:\n%s", s, fix)
		}
	}
	for _, m := range zoneValue.FindAllStringSubmatch(fix, -1) {
		if m[1] != zone {
			return fmt.Errorf("the fix holds the job to %s, not %s:\n%s", m[1], zone, fix)
		}
	}
	return nil
}

// createInCell creates pods on the cell's nodes only (each cell of a
// scheduler test has nodes of its own).
func createInCell(ctx context.Context, lab *schedlab.Lab, cell string, pods ...*corev1.Pod) error {
	for _, p := range pods {
		if p.Spec.NodeSelector == nil {
			p.Spec.NodeSelector = map[string]string{}
		}
		p.Spec.NodeSelector[schedlab.LabelCell] = cell
		if _, err := lab.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating pod %s: %w", p.Name, err)
		}
	}
	return nil
}

// place creates the job's pods in the given order and waits until the
// scheduler is done with them.
func place(ctx context.Context, lab *schedlab.Lab, j *schedlab.Job, cell, order string) (schedlab.Placement, error) {
	coords, workers, _, err := j.Pods()
	if err != nil {
		return nil, err
	}
	create := func(pods ...*corev1.Pod) error { return createInCell(ctx, lab, cell, pods...) }
	const quiet = 4 * time.Second
	settle := func(n int) (schedlab.Placement, error) {
		sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		return lab.Settle(sctx, j.Namespace, n, quiet)
	}
	switch order {
	case "coordinator first", "workers first":
		first, then := coords, workers
		if order == "workers first" {
			first, then = workers, coords
		}
		if err := create(first...); err != nil {
			return nil, err
		}
		if _, err := settle(len(first)); err != nil {
			return nil, err
		}
		if err := create(then...); err != nil {
			return nil, err
		}
	default:
		all := append([]*corev1.Pod{workers[0]}, coords...)
		if err := create(append(all, workers[1:]...)...); err != nil {
			return nil, err
		}
	}
	return settle(len(coords) + len(workers))
}

// lwsExclusiveAnnotation keeps each LeaderWorkerSet group in one domain
// (sigs.k8s.io/lws api/leaderworkerset/v1 ExclusiveKeyAnnotationKey): the
// LeaderWorkerSet's advice before issue 43, which half-places a group when
// the zone fills before its workers are placed.
const lwsExclusiveAnnotation = "leaderworkerset.sigs.k8s.io/exclusive-topology"

// oldAdvice is the fix zonewatch printed before issue 27: a required
// podAffinity on the zone selecting the job's name label on every
// template, and tolerations of the GPU taint for templates without GPUs
// (the LeaderWorkerSet: its exclusive-topology annotation).
func oldAdvice(j *schedlab.Job) {
	if j.Shape.Kind == "LeaderWorkerSet" {
		schedlab.Merge(j.Manifest, map[string]any{"metadata": map[string]any{"annotations": map[string]any{lwsExclusiveAnnotation: "topology.kubernetes.io/zone"}}})
		return
	}
	coords, _, _, _ := j.Pods()
	var sel string
	for _, r := range topology.DefaultRules() {
		if v := coords[0].Labels[r.NameLabel]; v != "" {
			sel = r.NameLabel
			break
		}
	}
	for _, tm := range j.Templates() {
		schedlab.Merge(tm.T, map[string]any{"spec": map[string]any{"affinity": map[string]any{"podAffinity": map[string]any{
			"requiredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{
				"labelSelector": map[string]any{"matchLabels": map[string]any{sel: coords[0].Labels[sel]}},
				"topologyKey":   "topology.kubernetes.io/zone"}}}}}})
		if !tm.GPU {
			schedlab.Merge(tm.T, map[string]any{"spec": map[string]any{"tolerations": []any{
				map[string]any{"key": GPUTaintKey, "operator": "Exists", "effect": "NoSchedule"}}}})
		}
	}
}

// analyzeFix dumps the cell's nodes and the namespace's pods (with the
// intermediate objects the controllers made) as kubectl would, runs
// analyze on them and returns the job's suggested fix ("" when it is not
// split).
func analyzeFix(ctx context.Context, lab *schedlab.Lab, cell, ns string, j *schedlab.Job, podGroups ...PodGroups) (string, error) {
	return analyzeFixOf(ctx, lab, cell, ns, j, false, podGroups...)
}

// analyzeFixOf is analyzeFix; anyKind takes the job of the namespace
// whatever kind analyze names it.
func analyzeFixOf(ctx context.Context, lab *schedlab.Lab, cell, ns string, j *schedlab.Job, anyKind bool, podGroups ...PodGroups) (string, error) {
	nodeItems, podItems, err := schedlab.ListItems(ctx, lab.Client, schedlab.LabelCell+"="+cell, ns)
	if err != nil {
		return "", err
	}
	_, _, owners, err := j.Pods()
	if err != nil {
		return "", err
	}
	for _, o := range owners {
		podItems = append(podItems, o)
	}
	pg := PodGroupsOff
	if len(podGroups) > 0 {
		pg = podGroups[0]
	}
	rep, err := analyzeItems(nodeItems, podItems, pg)
	if err != nil {
		return "", err
	}
	for _, job := range rep.Jobs {
		if job.Namespace == ns {
			if job.JobKind != j.Shape.Kind && !anyKind {
				return "", fmt.Errorf("analyze names the job %s %s, want kind %s", job.JobKind, job.JobName, j.Shape.Kind)
			}
			return job.SuggestedFix, nil
		}
	}
	return "", fmt.Errorf("analyze reports no job in %s: %+v", ns, rep.Jobs)
}

// analyzeItems runs analyze on nodes and pods listed from the bed, as a
// user runs it on kubectl's lists (written to files of their own).
func analyzeItems(nodeItems, podItems []any, pg PodGroups) (*Report, error) {
	dir, err := os.MkdirTemp("", "schedlab-analyze")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	write := func(name string, items []any) (string, error) {
		b, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
		if err != nil {
			return "", err
		}
		path := filepath.Join(dir, name)
		return path, os.WriteFile(path, b, 0o644)
	}
	np, err := write("nodes.json", nodeItems)
	if err != nil {
		return nil, err
	}
	pp, err := write("pods.json", podItems)
	if err != nil {
		return nil, err
	}
	return Run(Input{Nodes: np, Pods: pp, PodGroups: pg})
}

// noRoomCell: one GPU node per zone, a job of 16 GPUs: no zone can hold
// it, and the advice says so instead of pinning it.
func noRoomCell(ctx context.Context, lab *schedlab.Lab) error {
	const cell = "noroom"
	if err := lab.AddNodes(ctx, newBed(cell, 1, false).nodes...); err != nil {
		return err
	}
	shape := schedlab.Shapes()[0]
	j := shape.New(cell, "train", bedSize)
	if err := lab.EnsureNamespace(ctx, cell, nil); err != nil {
		return err
	}
	p, err := place(ctx, lab, j, cell, "interleaved")
	if err != nil {
		return err
	}
	fix, err := analyzeFix(ctx, lab, cell, cell, j)
	if err != nil {
		return err
	}
	if p.Pending() > 0 || !strings.HasPrefix(fix, "# No zone can hold every pod of PyTorchJob noroom/train now (16 GPUs in 5 pods") ||
		strings.Contains(fix, "nodeAffinity") || !strings.Contains(fix, KueueTopologyAnnotation) || !strings.Contains(fix, KueueGroupAnnotation) {
		return fmt.Errorf("no zone has room (placement %v); the advice:\n%s", p, fix)
	}
	// The cluster holds the job split; the admission policy must not make
	// it wait.
	if err := lab.DeletePods(ctx, cell); err != nil {
		return err
	}
	const opted = cell + "-policy"
	if err := lab.EnsureNamespace(ctx, opted, map[string]string{AdmissionNamespaceLabel: "true"}); err != nil {
		return err
	}
	j.Namespace = opted
	if p, err = place(ctx, lab, j, cell, "coordinator first"); err != nil {
		return err
	}
	if p.Pending() > 0 {
		return fmt.Errorf("no zone has room: with the admission policy %d pods stay Pending: %v", p.Pending(), p)
	}
	return nil
}

// runbookSnippets reads the YAML blocks of docs/runbooks.md marked
// `<!-- schedlab: NAME -->`.
func runbookSnippets(t *testing.T) map[string]string {
	b, err := os.ReadFile(filepath.Join("..", "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- schedlab: ([A-Za-z ]+) -->\\s*```yaml\\n(.*?)```")
	out := map[string]string{}
	for _, m := range re.FindAllSubmatch(b, -1) {
		var v map[string]any
		if err := yaml.Unmarshal(m[2], &v); err != nil {
			t.Fatalf("docs/runbooks.md block %q: %v", m[1], err)
		}
		out[string(m[1])] = string(m[2])
	}
	for _, name := range []string{"every pod template", "pod templates without GPUs"} {
		if out[name] == "" {
			t.Fatalf("docs/runbooks.md has no YAML block marked <!-- schedlab: %s -->", name)
		}
	}
	return out
}

// snippet is a runbook block with ZONE set to the zone with room.
// runbookPin merges docs/runbooks.md's pin to zone into the job's
// templates, as a user follows it.
func runbookPin(j *schedlab.Job, snippets map[string]string, zone string) {
	for _, tm := range j.Templates() {
		schedlab.Merge(tm.T, snippet(snippets["every pod template"], zone))
		if !tm.GPU {
			schedlab.Merge(tm.T, snippet(snippets["pod templates without GPUs"], zone))
		}
	}
}

func snippet(block, zone string) map[string]any {
	var v map[string]any
	_ = yaml.Unmarshal([]byte(strings.ReplaceAll(block, "ZONE", zone)), &v) // parsed once in runbookSnippets
	return v
}

func deepCopyMap(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// installPolicy creates the admission policy and its binding
// (admissionregistration.k8s.io/v1, as the chart renders them on 1.36+)
// and checks what it does on the real apiserver.
func installPolicy(ctx context.Context, t *testing.T, lab *schedlab.Lab) {
	t.Helper()
	policy, binding := AdmissionPolicy(topology.DefaultRules(), "admissionregistration.k8s.io/v1",
		map[string]any{"matchLabels": map[string]any{AdmissionNamespaceLabel: "true"}})
	applyPolicy(ctx, t, lab.API.Config, lab.Client, []map[string]any{policy, binding})
}

// applyPolicy creates the objects and waits until the apiserver applies
// the policy to a pod of a training job in an opted-in namespace; then
// checks that it leaves alone a pod of no training job and a batch Job
// pod without a completion index.
func applyPolicy(ctx context.Context, t *testing.T, cfg *rest.Config, cs kubernetes.Interface, objs []map[string]any) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		gv, err := schema.ParseGroupVersion(obj["apiVersion"].(string))
		if err != nil {
			t.Fatal(err)
		}
		gvr := gv.WithResource(strings.ToLower(obj["kind"].(string)) + "s")
		if strings.HasSuffix(gvr.Resource, "ys") {
			gvr.Resource = strings.TrimSuffix(gvr.Resource, "ys") + "ies"
		}
		if _, err := dyn.Resource(gvr).Create(ctx, &unstructured.Unstructured{Object: deepCopyMap(obj)}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating the %s: %v", gvr.Resource, err)
		}
	}
	const ns = "policy-probe"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{AdmissionNamespaceLabel: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, lbl map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbl},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{schedlab.LabelCell: "none"},
				Containers: []corev1.Container{{Name: "c", Image: "registry.example.com/x:1"}}}}
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		p, err := cs.CoreV1().Pods(ns).Create(ctx, pod(fmt.Sprintf("probe-%d", i), map[string]string{"training.kubeflow.org/job-name": "probe"}), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a := p.Spec.Affinity; a != nil && a.PodAffinity != nil && len(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 1 {
			// A CPU-only pod: it also tolerates the GPU taint and prefers GPU nodes.
			term := a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0]
			if term.Weight != 100 || term.PodAffinityTerm.TopologyKey != "topology.kubernetes.io/zone" ||
				term.PodAffinityTerm.LabelSelector.MatchLabels["training.kubeflow.org/job-name"] != "probe" ||
				len(p.Spec.Tolerations) == 0 || a.NodeAffinity == nil {
				t.Fatalf("the policy made %+v, tolerations %+v", a, p.Spec.Tolerations)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admission policy is not applied after 30s: %+v", p.Spec)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, c := range []struct {
		name string
		lbl  map[string]string
	}{{"plain", map[string]string{"app": "web"}}, {"queue-job", map[string]string{"batch.kubernetes.io/job-name": "queue"}}} {
		p, err := cs.CoreV1().Pods(ns).Create(ctx, pod(c.name, c.lbl), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gpuTol := false
		for _, tl := range p.Spec.Tolerations {
			gpuTol = gpuTol || tl.Key == GPUTaintKey
		}
		if p.Spec.Affinity != nil || gpuTol {
			t.Errorf("the policy changed pod %s of no training job: %+v %+v", c.name, p.Spec.Affinity, p.Spec.Tolerations)
		}
	}
}
