package analyze

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/schedlab"
)

// Capacity cases of the gang test: the bed as in TestFixOnRealScheduler
// (one zone holds the job); one GPU node per zone (no zone holds it);
// the bed, and another team's 8-GPU pod takes half of the roomy zone while
// the job is being created (after the advice was computed).
var capacities = []string{"room", "no zone fits", "zone fills"}

// Advice conditions of the gang test, in the order each cell runs them.
// The pin is docs/runbooks.md's manual recipe (analyze gave it until issue
// 43), held to the roomy zone: beside the gang, it shows why analyze no
// longer gives it.
var gangConditions = []string{"pin (runbook)", "native gang + topology", "admission policy (preferences)"}

// joinLabel opts a namespace into the PodGroup policy.
const joinLabel = "zonewatch.io/join-pod-groups"

// gangOutcome is how a job's pods ended: all bound in one zone, all bound
// across zones, none bound (waits whole), some bound and some Pending.
type gangOutcome string

const (
	oneZone    gangOutcome = "one zone"
	splitZones gangOutcome = "split"
	waitsWhole gangOutcome = "waits whole"
	halfPlaced gangOutcome = "half-placed"
)

func classify(p schedlab.Placement, zoneOf map[string]string) gangOutcome {
	zones := map[string]bool{}
	for _, node := range p {
		if node != "" {
			zones[zoneOf[node]] = true
		}
	}
	switch pending := p.Pending(); {
	case pending == len(p):
		return waitsWhole
	case pending > 0:
		return halfPlaced
	case len(zones) == 1:
		return oneZone
	default:
		return splitZones
	}
}

// TestGangOnRealScheduler runs every controller shape x creation order x
// capacity case on the real kube-scheduler v1.37.2 with gang and topology
// scheduling on, with three pieces of advice side by side: the runbook's
// nodeAffinity pin to the roomy zone (analyze's advice until issue 43),
// analyze's
// native gang + topology advice (a PodGroup and the templates joined to it,
// as printed with --podgroups=on; the PodGroup policy joins the pods of
// controllers whose templates cannot carry spec.schedulingGroup), and the
// chart's preference admission policy. The gang advice must leave every job
// whole in one zone or waiting whole, never half-placed (LeaderWorkerSet
// and Volcano Job get no PodGroup: Kueue's advice, which needs Kueue and
// runs in internal/trainlab, and the Volcano pin, which needs Volcano's
// gang; reported apart);
// a job that waits whole is placed whole once room appears.
func TestGangOnRealScheduler(t *testing.T) {
	t.Parallel() // its own apiserver (scheduler, Kueue where used); mostly waits (docs/development.md)
	snippets := runbookSnippets(t)
	lab := schedlab.StartGang(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	installPolicy(ctx, t, lab)
	installPodGroupPolicy(ctx, t, lab)

	type key struct{ shape, order, capacity string }
	var mu sync.Mutex
	results := map[key]map[string]gangOutcome{}
	var messages []string
	var wg sync.WaitGroup
	cell := 0
	for _, shape := range labShapes() {
		for _, order := range orders {
			for _, capacity := range capacities {
				cell++
				name := fmt.Sprintf("g%03d", cell)
				roomyFirst := cell%2 == 1
				wg.Add(1)
				go func() {
					defer wg.Done()
					got, msg, err := runGangCell(ctx, lab, name, shape, order, capacity, roomyFirst, snippets)
					if err != nil {
						t.Errorf("%s %s %s (%s): %v", shape.Name, order, capacity, name, err)
					}
					mu.Lock()
					defer mu.Unlock()
					results[key{shape.Name, order, capacity}] = got
					if msg != "" && len(messages) < 3 {
						messages = append(messages, msg)
					}
				}()
			}
		}
	}
	wg.Wait()

	var b strings.Builder
	b.WriteString("kube-scheduler v1.37.2, gates " + schedlab.GangFeatureGates + ": where each job ended (one zone / waits whole / half-placed / split)\n\n| shape | order | capacity |")
	for _, c := range gangConditions {
		b.WriteString(" " + c + " |")
	}
	b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(gangConditions)) + "\n")
	totals := map[string]map[string]int{}
	apart := map[string]int{}
	for _, shape := range labShapes() {
		ownAdvice := shape.Kind == "LeaderWorkerSet" || shape.Kind == "VolcanoJob"
		for _, order := range orders {
			for _, capacity := range capacities {
				fmt.Fprintf(&b, "| %s | %s | %s |", shape.Name, order, capacity)
				for _, c := range gangConditions {
					o := results[key{shape.Name, order, capacity}][c]
					if o == "" {
						o = "error"
					}
					fmt.Fprintf(&b, " %s |", o)
					if c == "native gang + topology" && ownAdvice {
						apart[string(o)]++
						continue
					}
					if totals[c] == nil {
						totals[c] = map[string]int{}
					}
					totals[c][string(o)]++
					if c == "native gang + topology" && o != oneZone && o != waitsWhole {
						t.Errorf("%s %s %s with the gang advice: %s; want one zone or waiting whole", shape.Name, order, capacity, o)
					}
					if c == "pin (runbook)" && capacity == "room" && o != oneZone {
						t.Errorf("%s %s with room and the pin: %s; want one zone", shape.Name, order, o)
					}
				}
				b.WriteString("\n")
			}
		}
	}
	b.WriteString("| all but LeaderWorkerSet and Volcano Job | | |")
	for _, c := range gangConditions {
		fmt.Fprintf(&b, " %s |", summary(totals[c]))
	}
	fmt.Fprintf(&b, "\n\nLeaderWorkerSet and Volcano Job (no PodGroup: the gang column places their advice without Kueue, which LeaderWorkerSet's needs, or Volcano's gang, which the Volcano pin's needs): %s\n", summary(apart))
	fmt.Fprintf(&b, "%d cells, %s; a gang waiting for a zone: %q\n", cell, time.Since(start).Round(time.Second), messages)
	t.Log("\n" + b.String())
}

// runGangCell runs the unfixed job (for the dump), then each advice, on
// the cell's own nodes.
func runGangCell(ctx context.Context, lab *schedlab.Lab, cell string, shape *schedlab.Shape, order, capacity string, roomyFirst bool, snippets map[string]string) (map[string]gangOutcome, string, error) {
	roomyNodes := 2
	if capacity == "no zone fits" {
		roomyNodes = 1
	}
	b := newBed(cell, roomyNodes, roomyFirst)
	if err := lab.AddNodes(ctx, b.nodes...); err != nil {
		return nil, "", err
	}
	zoneOf := map[string]string{}
	for _, n := range b.nodes {
		zoneOf[n.Name] = n.Zone
	}
	job := shape.New("", "train", bedSize)
	out := map[string]gangOutcome{}
	var msg string

	// The unfixed job, for the dump the gang advice is computed from.
	ns := cell + "-none"
	if err := lab.EnsureNamespace(ctx, ns, nil); err != nil {
		return out, "", err
	}
	j := job.Copy()
	j.Namespace = ns
	if _, err := place(ctx, lab, j, cell, "interleaved"); err != nil {
		return out, "", fmt.Errorf("unfixed: %w", err)
	}
	gang, err := analyzeFix(ctx, lab, cell, ns, j, PodGroupsOn)
	if err != nil {
		return out, "", err
	}
	if os.Getenv("ZONEWATCH_SCHEDLAB_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "%s %s %s %s gang:\n%s\n", cell, shape.Name, order, capacity, gang)
	}
	if err := lab.DeletePods(ctx, ns); err != nil {
		return out, "", err
	}
	time.Sleep(settleGap)

	for i, cond := range gangConditions {
		ns := fmt.Sprintf("%s-%d", cell, i)
		lbl := map[string]string{}
		switch cond {
		case "admission policy (preferences)":
			lbl[AdmissionNamespaceLabel] = "true"
		case "native gang + topology":
			lbl[joinLabel] = "true"
		}
		if err := lab.EnsureNamespace(ctx, ns, lbl); err != nil {
			return out, msg, err
		}
		j := job.Copy()
		j.Namespace = ns
		var pg *schedulingv1beta1.PodGroup
		switch cond {
		case "pin (runbook)":
			runbookPin(j, snippets, b.roomy)
		case "native gang + topology":
			docs := strings.Split(gang, "\n---\n")
			if len(docs) == 2 {
				pg = &schedulingv1beta1.PodGroup{}
				if err := yaml.Unmarshal([]byte(docs[0]), pg); err != nil {
					return out, msg, fmt.Errorf("the PodGroup of the gang advice: %v\n%s", err, gang)
				}
				pg.Namespace = ns
				if err := mergeFix(j, docs[1]); err != nil {
					return out, msg, err
				}
			} else if strings.Contains(gang, "\n  schedulerName: volcano\n") {
				// A Volcano Job with no zone of room: Volcano's gang in
				// one HyperNode, which only Volcano's scheduler places.
				out[cond] = "not run (Volcano's scheduler)"
				continue
			} else if err := mergeFix(j, gang); err != nil { // LeaderWorkerSet, Volcano Job: their own advice
				return out, msg, err
			}
		}
		p, err := placeGang(ctx, lab, j, cell, order, capacity, pg, b)
		if err != nil {
			return out, msg, fmt.Errorf("%s: %w", cond, err)
		}
		o := classify(p, zoneOf)
		out[cond] = o
		if os.Getenv("ZONEWATCH_SCHEDLAB_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "%s %s %s %s %s: %s %v\n", cell, shape.Name, order, capacity, cond, o, p)
		}
		if pg != nil {
			if err := lab.CheckSchedulingGroups(ctx, ns, pg.Name); err != nil {
				return out, msg, err
			}
			if o == waitsWhole {
				msg = lab.Unschedulable(ns)
				// Room appears (the other team's pod ends; a node is
				// added): the gang is placed, whole, in one zone.
				if err := makeRoom(ctx, lab, cell, capacity, b); err != nil {
					return out, msg, err
				}
				zoneOf[extraNode(cell, b).Name] = b.roomy
				sctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
				p, err := lab.SettleQuiet(sctx, ns, len(p), time.Hour) // until all are bound
				cancel()
				if err != nil {
					return out, msg, fmt.Errorf("after room appeared: %w", err)
				}
				if got := classify(p, zoneOf); got != oneZone {
					return out, msg, fmt.Errorf("the waiting gang, once room appeared: %s %v", got, p)
				}
			}
		}
		if err := lab.DeletePods(ctx, ns); err != nil {
			return out, msg, err
		}
		if pg != nil {
			if err := lab.DeletePodGroups(ctx, ns); err != nil {
				return out, msg, err
			}
		}
		if err := clearRoom(ctx, lab, cell, capacity, &b); err != nil {
			return out, msg, err
		}
		time.Sleep(settleGap)
	}
	return out, msg, nil
}

func mergeFix(j *schedlab.Job, fix string) error {
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(fix), &patch); err != nil {
		return fmt.Errorf("the fix is not YAML: %v\n%s", err, fix)
	}
	schedlab.Merge(j.Manifest, patch)
	return nil
}

// fillerNS holds the other team's pod of a cell.
func fillerNS(cell string) string { return cell + "-other-team" }

// fill creates the other team's pod: 8 GPUs in the roomy zone, which
// leaves it room for half the job.
func fill(ctx context.Context, lab *schedlab.Lab, cell string, b bed) error {
	ns := fillerNS(cell)
	if err := lab.EnsureNamespace(ctx, ns, nil); err != nil {
		return err
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "inference", Namespace: ns}, Spec: corev1.PodSpec{
		NodeSelector: map[string]string{schedlab.LabelCell: cell, schedlab.LabelZone: b.roomy},
		Tolerations:  []corev1.Toleration{{Key: string(schedlab.GPUResource), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Containers: []corev1.Container{{Name: "serve", Image: "registry.example.com/serve:1", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{schedlab.GPUResource: *resource.NewQuantity(8, resource.DecimalSI)}}}}}}
	_, err := lab.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	return err
}

// makeRoom: in "zone fills" the other team's pod ends; in "no zone fits"
// a second GPU node joins the roomy zone.
func makeRoom(ctx context.Context, lab *schedlab.Lab, cell, capacity string, b bed) error {
	switch capacity {
	case "zone fills":
		return lab.DeletePods(ctx, fillerNS(cell))
	case "no zone fits":
		return lab.AddNodes(ctx, extraNode(cell, b))
	}
	return fmt.Errorf("%s: the gang waits with room in a zone", capacity)
}

func extraNode(cell string, b bed) schedlab.Node {
	n := b.nodes[0]
	for _, x := range b.nodes {
		if x.Zone == b.roomy {
			n = x
		}
	}
	n.Name = cell + "-gpu-b-extra"
	return n
}

// clearRoom undoes makeRoom and the fill after a condition: the other
// team's pod is gone and the extra node deleted.
func clearRoom(ctx context.Context, lab *schedlab.Lab, cell, capacity string, b *bed) error {
	if capacity == "zone fills" {
		if err := lab.DeletePods(ctx, fillerNS(cell)); err != nil {
			return err
		}
	}
	if capacity == "no zone fits" {
		err := lab.Client.CoreV1().Nodes().Delete(ctx, extraNode(cell, *b).Name, metav1.DeleteOptions{})
		if err != nil && !strings.Contains(err.Error(), "not found") {
			return err
		}
	}
	return nil
}

// placeGang creates the job's pods in the order (with its PodGroup first,
// or, in the interleaved order, after the pods), the other team's pod in
// the middle of it for "zone fills", and waits until the scheduler is
// done. A gang's first pods must not be bound before the rest exist.
func placeGang(ctx context.Context, lab *schedlab.Lab, j *schedlab.Job, cell, order, capacity string, pg *schedulingv1beta1.PodGroup, b bed) (schedlab.Placement, error) {
	coords, workers, _, err := j.Pods()
	if err != nil {
		return nil, err
	}
	create := func(pods ...*corev1.Pod) error { return createInCell(ctx, lab, cell, pods...) }
	const quiet = 5 * time.Second
	settle := func(n int) (schedlab.Placement, error) {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		if pg != nil {
			return lab.SettleQuiet(sctx, j.Namespace, n, quiet)
		}
		return lab.Settle(sctx, j.Namespace, n, quiet)
	}
	midway := func() error {
		if capacity != "zone fills" {
			return nil
		}
		if err := fill(ctx, lab, cell, b); err != nil {
			return err
		}
		// The zone fills: the scheduler binds the other team's pod, or
		// finds it no room (the job's pods were there first).
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		_, err := lab.Settle(sctx, fillerNS(cell), 1, time.Second)
		return err
	}
	if pg != nil && order != "interleaved" {
		if err := lab.CreatePodGroup(ctx, pg); err != nil {
			return nil, err
		}
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
		var p schedlab.Placement
		if pg != nil {
			// Held before the queue: no pod is bound, none is marked.
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			p, err = lab.SettleQuiet(sctx, j.Namespace, len(first), 2*time.Second)
			cancel()
		} else {
			p, err = settle(len(first))
		}
		if err != nil {
			return nil, err
		}
		// Held unless they are the gang's minCount (an MPIJob's workers:
		// its launcher joins the group, uncounted).
		if pg != nil && len(first) < int(pg.Spec.SchedulingPolicy.Gang.MinCount) && p.Pending() != len(p) {
			return nil, fmt.Errorf("%d of the gang's first %d pods were bound before the rest existed: %v", len(p)-p.Pending(), len(p), p)
		}
		if err := midway(); err != nil {
			return nil, err
		}
		if err := create(then...); err != nil {
			return nil, err
		}
	default:
		all := append(append([]*corev1.Pod{workers[0]}, coords...), workers[1:]...)
		half := len(all) / 2
		if err := create(all[:half]...); err != nil {
			return nil, err
		}
		if err := midway(); err != nil {
			return nil, err
		}
		if err := create(all[half:]...); err != nil {
			return nil, err
		}
		if pg != nil {
			if err := lab.CreatePodGroup(ctx, pg); err != nil {
				return nil, err
			}
		}
	}
	return settle(len(coords) + len(workers))
}

// installPodGroupPolicy creates the PodGroup policy for namespaces with
// joinLabel and checks that it joins a labelled pod to its group and
// leaves alone a pod without the label.
func installPodGroupPolicy(ctx context.Context, t *testing.T, lab *schedlab.Lab) {
	t.Helper()
	policy, binding := PodGroupPolicy("admissionregistration.k8s.io/v1", map[string]any{"matchLabels": map[string]any{joinLabel: "true"}})
	applyObjects(ctx, t, lab, policy, binding)
	const ns = "podgroup-probe"
	if err := lab.EnsureNamespace(ctx, ns, map[string]string{joinLabel: "true"}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, lbl map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbl},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{schedlab.LabelCell: "none"},
				Containers: []corev1.Container{{Name: "c", Image: "registry.example.com/x:1"}}}}
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		p, err := lab.Client.CoreV1().Pods(ns).Create(ctx, pod(fmt.Sprintf("probe-%d", i), map[string]string{PodGroupLabel: "probe-gang"}), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sg := p.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
			if *sg.PodGroupName != "probe-gang" {
				t.Fatalf("the PodGroup policy joined %q, want probe-gang", *sg.PodGroupName)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the PodGroup policy is not applied after 30s: %+v", p.Spec)
		}
		time.Sleep(500 * time.Millisecond)
	}
	p, err := lab.Client.CoreV1().Pods(ns).Create(ctx, pod("plain", map[string]string{"training.kubeflow.org/job-name": "x"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.SchedulingGroup != nil {
		t.Errorf("the PodGroup policy joined a pod without %s: %+v", PodGroupLabel, p.Spec.SchedulingGroup)
	}
}

func applyObjects(ctx context.Context, t *testing.T, lab *schedlab.Lab, objs ...map[string]any) {
	t.Helper()
	for _, obj := range objs {
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		resource := strings.ToLower(obj["kind"].(string)) + "s"
		if strings.HasSuffix(resource, "ys") {
			resource = strings.TrimSuffix(resource, "ys") + "ies"
		}
		path := "/apis/" + obj["apiVersion"].(string) + "/" + resource
		if err := lab.Client.CoreV1().RESTClient().Post().AbsPath(path).Body(b).SetHeader("Content-Type", "application/json").Do(ctx).Error(); err != nil {
			t.Fatalf("creating %s: %v", path, err)
		}
	}
}

// labShapes: the shapes to run, all unless ZONEWATCH_SCHEDLAB_SHAPES names
// some (comma-separated, e.g. "PyTorchJob,Indexed Job": to debug one).
func labShapes() []*schedlab.Shape {
	only := os.Getenv("ZONEWATCH_SCHEDLAB_SHAPES")
	if only == "" {
		return schedlab.Shapes()
	}
	var out []*schedlab.Shape
	for _, s := range schedlab.Shapes() {
		for _, name := range strings.Split(only, ",") {
			if s.Name == name {
				out = append(out, s)
			}
		}
	}
	return out
}
