package trainlab_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/analyze"
	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/trainlab"
)

// TestAdviceCellsJobSet (issue 43 item 3, JobSet first): the zone pin that
// `analyze` gives for a split JobSet, applied as the runbook says (its
// patch merged into the JobSet, the JobSet re-created), on the bed with
// the real JobSet v0.11.1, Job controller and kube-scheduler v1.37.2.
// Each cell has nodes of its own: a small GPU zone (one node of 8 GPUs),
// a roomy one (two), a CPU zone; the JobSet a CPU-only leader and four
// workers of 4 GPUs (16 GPUs). Unfixed, the leader lands in the CPU zone:
// split. Cases: one zone has room (the pin must give one zone); no zone
// fits (the roomy zone has one node too: analyze must give no pin and
// say why); a zone fills while the job starts (a pod takes a roomy node
// between the advice and the re-creation: the pin must never split).
// Each cell prints `advice-cell: kind=JobSet advice=pin case=C result=R`.
func TestAdviceCellsJobSet(t *testing.T) {
	bed := trainlab.Start(t)
	bed.StartJobSet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	for _, c := range []struct {
		name       string
		roomyNodes int
		fill       bool
	}{{"room", 2, false}, {"no-zone-fits", 1, false}, {"zone-fills", 2, true}} {
		t.Run(c.name, func(t *testing.T) {
			cell := adviceCell{t: t, bed: bed, name: c.name}
			result := cell.run(ctx, c.roomyNodes, c.fill)
			t.Logf("advice-cell: kind=JobSet advice=pin case=%s result=%s", c.name, result)
			switch {
			case c.name == "room" && result != "one-zone":
				t.Errorf("with room in one zone the pinned JobSet is %s, want one-zone", result)
			case c.name == "no-zone-fits" && result != "not-given":
				t.Errorf("with no zone that fits, the pin was given and the JobSet is %s", result)
			case result == "split" || result == "stuck":
				t.Errorf("the pinned JobSet is %s", result)
			}
		})
	}
}

// adviceCell is one cell's nodes, namespace and JobSet.
type adviceCell struct {
	t    *testing.T
	bed  *trainlab.Bed
	name string
}

func (c *adviceCell) zone(z string) string { return c.name + "-" + z }

// run places the JobSet unfixed, asks analyze, applies its pin, places
// the JobSet again and returns the cell's result: one-zone, waits-whole,
// split, half-placed, stuck, or not-given (analyze gave no pin).
func (c *adviceCell) run(ctx context.Context, roomyNodes int, fill bool) string {
	t := c.t
	lbl := map[string]string{schedlab.LabelCell: c.name}
	gpu := func(z string, i int) schedlab.Node {
		return schedlab.Node{Name: fmt.Sprintf("%s-gpu-%s-%d", c.name, z, i), Zone: c.zone(z), CPU: "32", Memory: "256Gi", GPUs: 8,
			Labels: lbl, Taints: []corev1.Taint{schedlab.GPUTaint}}
	}
	nodes := []schedlab.Node{gpu("a", 0)}
	for i := range roomyNodes {
		nodes = append(nodes, gpu("b", i))
	}
	nodes = append(nodes, schedlab.Node{Name: c.name + "-cpu-c-0", Zone: c.zone("c"), CPU: "64", Memory: "512Gi", Labels: lbl})
	if err := c.bed.AddNodes(ctx, nodes...); err != nil {
		t.Fatal(err)
	}
	zoneOf := map[string]string{}
	for _, n := range nodes {
		zoneOf[n.Name] = n.Zone
	}
	ns := c.name
	if err := c.bed.EnsureNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	js := adviceJobSet(ns)
	c.create(ctx, js)
	p := c.settle(ctx, ns, 5)
	if zones := zonesOf(p, zoneOf); len(zones) < 2 || p.Pending() > 0 {
		t.Fatalf("unfixed, the JobSet is placed %v (zones %v), want split and bound", p, zones)
	}
	fix := c.analyze(ctx, ns)
	if strings.HasPrefix(fix, "# No zone") {
		if strings.Contains(fix, "nodeAffinity") {
			t.Errorf("analyze says no zone fits and pins all the same:\n%s", fix)
		}
		first, _, _ := strings.Cut(fix, "\n")
		t.Logf("analyze: %s", first)
		return "not-given"
	}
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(fix), &patch); err != nil {
		t.Fatalf("the fix is not YAML: %v\n%s", err, fix)
	}
	if !strings.Contains(fix, c.zone("b")) {
		t.Fatalf("the fix does not pin the roomy zone %s:\n%s", c.zone("b"), fix)
	}
	// The runbook: merge the patch, re-create the job.
	c.deleteJobSet(ctx, ns)
	if fill {
		c.fillNode(ctx, ns, c.name+"-gpu-b-0")
	}
	schedlab.Merge(js, patch)
	c.create(ctx, js)
	want := 5
	if fill {
		want++ // the filler
	}
	p = c.settle(ctx, ns, want)
	delete(p, "filler")
	t.Logf("pinned: %v", p)
	if len(p) < 5 {
		return "stuck"
	}
	switch zones, pending := zonesOf(p, zoneOf), p.Pending(); {
	case len(zones) > 1:
		return "split"
	case pending == 0:
		return "one-zone"
	case pending == len(p):
		c.reasonVisible(ctx, ns)
		return "waits-whole"
	default:
		return "half-placed"
	}
}

// adviceJobSet: a CPU-only leader and four workers of 4 GPUs that
// tolerate the GPU nodes' taint, as users write them.
func adviceJobSet(ns string) map[string]any {
	tmpl := func(n int, gpus int64) map[string]any {
		c := map[string]any{"name": "main", "image": "registry.example.com/train:1",
			"resources": map[string]any{"requests": map[string]any{"cpu": "2", "memory": "8Gi"}}}
		spec := map[string]any{"restartPolicy": "Never", "containers": []any{c}}
		if gpus > 0 {
			c["resources"] = map[string]any{"requests": map[string]any{"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": gpus},
				"limits": map[string]any{"nvidia.com/gpu": gpus}}
			spec["tolerations"] = []any{map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}}
		}
		return map[string]any{"spec": map[string]any{"parallelism": n, "completions": n, "completionMode": "Indexed",
			"template": map[string]any{"spec": spec}}}
	}
	return map[string]any{
		"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": map[string]any{"name": "train", "namespace": ns},
		"spec": map[string]any{"replicatedJobs": []any{
			map[string]any{"name": "leader", "replicas": 1, "template": tmpl(1, 0)},
			map[string]any{"name": "workers", "replicas": 1, "template": tmpl(4, 4)},
		}},
	}
}

func (c *adviceCell) create(ctx context.Context, js map[string]any) {
	c.t.Helper()
	u, err := trainlab.Unstructured(js)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.bed.Dyn.Resource(trainlab.JobSetGVR).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("creating the JobSet: %v", err)
	}
}

// settle waits until the namespace has want pods, all bound or the rest
// unschedulable for a while; fewer pods after two minutes are returned
// as they are (the controller made no more: stuck).
func (c *adviceCell) settle(ctx context.Context, ns string, want int) schedlab.Placement {
	c.t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	p, err := c.bed.Settle(sctx, ns, want, 5*time.Second)
	if err != nil && len(p) >= want {
		c.t.Fatal(err)
	}
	return p
}

// analyze runs analyze on the cell's nodes, the namespace's pods and the
// JobSet, as a user runs it on `kubectl get nodes` and
// `kubectl get pods,jobsets` written to files, and returns its fix.
func (c *adviceCell) analyze(ctx context.Context, ns string) string {
	c.t.Helper()
	nodes, pods, err := schedlab.ListItems(ctx, c.bed.Client, schedlab.LabelCell+"="+c.name, ns)
	if err != nil {
		c.t.Fatal(err)
	}
	js, err := c.bed.Dyn.Resource(trainlab.JobSetGVR).Namespace(ns).Get(ctx, "train", metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	pods = append(pods, js.Object)
	dir := c.t.TempDir()
	write := func(name string, items []any) string {
		b, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
		if err != nil {
			c.t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			c.t.Fatal(err)
		}
		return path
	}
	rep, err := analyze.Run(analyze.Input{Nodes: write("nodes.json", nodes), Pods: write("pods.json", pods), PodGroups: analyze.PodGroupsOff})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, j := range rep.Jobs {
		if j.Namespace == ns {
			if j.JobKind != "JobSet" || j.JobName != "train" {
				c.t.Fatalf("analyze names the job %s %s, want JobSet train", j.JobKind, j.JobName)
			}
			return j.SuggestedFix
		}
	}
	c.t.Fatalf("analyze reports no job in %s: %+v", ns, rep.Jobs)
	return ""
}

// deleteJobSet deletes the JobSet as kubectl does and waits until its
// pods are gone.
func (c *adviceCell) deleteJobSet(ctx context.Context, ns string) {
	c.t.Helper()
	bg := metav1.DeletePropagationForeground
	if err := c.bed.Dyn.Resource(trainlab.JobSetGVR).Namespace(ns).Delete(ctx, "train", metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		c.t.Fatal(err)
	}
	for {
		_, err := c.bed.Dyn.Resource(trainlab.JobSetGVR).Namespace(ns).Get(ctx, "train", metav1.GetOptions{})
		pods, _ := c.bed.Pods(ns)
		if apierrors.IsNotFound(err) && len(pods) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("the JobSet and its pods are not gone: %v, %d pods", err, len(pods))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// fillNode binds a pod that takes all of a node's GPUs: the zone fills
// between the advice and the job's re-creation.
func (c *adviceCell) fillNode(ctx context.Context, ns, node string) {
	c.t.Helper()
	gpus := resource.MustParse("8")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "filler", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever,
			Tolerations: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{Name: "main", Image: "registry.example.com/other:1",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"nvidia.com/gpu": gpus}, Limits: corev1.ResourceList{"nvidia.com/gpu": gpus}}}}}}
	if _, err := c.bed.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// reasonVisible checks that each pending pod says why it waits (its
// PodScheduled condition, as kubectl describe shows it).
func (c *adviceCell) reasonVisible(ctx context.Context, ns string) {
	c.t.Helper()
	pods, _ := c.bed.Pods(ns)
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			continue
		}
		i := slices.IndexFunc(p.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodScheduled })
		if i < 0 || p.Status.Conditions[i].Message == "" {
			c.t.Errorf("pending pod %s/%s shows no reason: %+v", ns, p.Name, p.Status.Conditions)
		}
	}
}

// zonesOf are the distinct zones of a placement's bound pods.
func zonesOf(p schedlab.Placement, zoneOf map[string]string) []string {
	var zones []string
	for _, node := range p {
		if z := zoneOf[node]; node != "" && !slices.Contains(zones, z) {
			zones = append(zones, z)
		}
	}
	slices.Sort(zones)
	return zones
}
