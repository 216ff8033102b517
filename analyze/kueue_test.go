package analyze

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/kueuelab"
	"github.com/zonewatch/zonewatch/internal/schedlab"
)

// Kueue's cases: the capacity cases of the gang test, and a job whose pod
// sets ask for a preferred (not required) zone where no zone fits.
var kueueCases = []string{"room", "no zone fits", "zone fills", "preferred, no zone fits"}

// TestKueueTAS runs Kueue's real manager (v0.17.0, plain-pod integration,
// TAS with a Topology of zone and hostname levels) with the real
// kube-scheduler, each controller shape's pods carrying the Kueue advice
// analyze prints for a job no zone can hold (podset-required-topology on
// every template, podset-group-name on a coordinator's and its workers'),
// queued to a LocalQueue, as one Kueue pod group. The job must be admitted
// whole into one zone with room, coordinator with workers, or wait whole
// (gated, none bound). A job asking podset-preferred-topology that Kueue
// admits across zones is split, and analyze names the split Kueue's
// choice; unless the advice also pinned every template to one zone (a job
// of several pod sets of many pods): that job waits whole.
//
// What differs from a cluster: no training controller runs, so Kueue sees
// the pods as a plain pod group (kueue.x-k8s.io/pod-group-name and
// pod-group-total-count, which Kueue's own job integrations replace with a
// Workload built from the manifest's replica specs), the queue label goes
// on the pods rather than the job object, and the pods' owner references
// are not controller references: Kueue's pod webhook walks a controller
// owner of a kind it knows (PyTorchJob, Job, JobSet, ...) with a GET and
// refuses the pod when the owner is not there (jobframework
// FindAncestorJobManagedByKueue, ErrWorkloadOwnerNotFound).
//
// The Volcano Job shape is left out: Kueue has no integration of it, and
// analyze gives it Volcano's own gang (TestVolcanoFix).
func TestKueueTAS(t *testing.T) {
	t.Parallel() // its own apiserver (scheduler, Kueue where used); mostly waits (docs/development.md)
	shapes := slices.DeleteFunc(labShapes(), func(s *schedlab.Shape) bool { return s.Kind == "VolcanoJob" })
	lab := kueuelab.Start(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	type key struct{ shape, capacity string }
	var mu sync.Mutex
	results := map[key]string{}
	var wg sync.WaitGroup
	cell := 0
	for _, shape := range shapes {
		for _, c := range kueueCases {
			cell++
			name := fmt.Sprintf("k%03d", cell)
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := runKueueCell(ctx, lab, name, shape, c, cell%2 == 1)
				if err != nil {
					t.Errorf("%s %s (%s): %v", shape.Name, c, name, err)
				}
				mu.Lock()
				results[key{shape.Name, c}] = got
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	var b strings.Builder
	b.WriteString("Kueue v0.17.0 TAS + kube-scheduler v1.37.2, the job's pods with analyze's Kueue advice (one zone / waits whole / half-placed / split):\n\n| shape |")
	for _, c := range kueueCases {
		b.WriteString(" " + c + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(kueueCases)) + "\n")
	totals := map[string]map[string]int{}
	for _, shape := range shapes {
		fmt.Fprintf(&b, "| %s |", shape.Name)
		for _, c := range kueueCases {
			o := results[key{shape.Name, c}]
			fmt.Fprintf(&b, " %s |", o)
			if totals[c] == nil {
				totals[c] = map[string]int{}
			}
			totals[c][o]++
		}
		b.WriteString("\n")
	}
	b.WriteString("| all |")
	for _, c := range kueueCases {
		fmt.Fprintf(&b, " %s |", summary(totals[c]))
	}
	fmt.Fprintf(&b, "\n\n%d cells, %s\n", cell, time.Since(start).Round(time.Second))
	t.Log("\n" + b.String())
}

func runKueueCell(ctx context.Context, lab *kueuelab.Lab, cell string, shape *schedlab.Shape, capacity string, roomyFirst bool) (string, error) {
	roomyNodes := 2
	if strings.Contains(capacity, "no zone fits") {
		roomyNodes = 1
	}
	b := newBed(cell, roomyNodes, roomyFirst)
	if err := lab.AddNodes(ctx, b.nodes...); err != nil {
		return "", err
	}
	zoneOf := map[string]string{}
	for _, n := range b.nodes {
		zoneOf[n.Name] = n.Zone
	}
	// The advice, from the dump of the job unfixed on one GPU node a zone
	// (no zone can hold it: analyze gives Kueue's).
	advice, err := kueueAdvice(ctx, lab.Lab, cell, shape)
	if err != nil {
		return "", err
	}
	annotation := KueueTopologyAnnotation
	pinned := strings.Contains(advice, "requiredDuringSchedulingIgnoredDuringExecution")
	if strings.HasPrefix(capacity, "preferred") {
		advice = strings.ReplaceAll(advice, KueueTopologyAnnotation, KueuePreferredTopologyAnnotation)
		annotation = KueuePreferredTopologyAnnotation
	}
	ns := cell + "-kueue"
	if err := lab.EnsureNamespace(ctx, ns, map[string]string{kueuelab.NamespaceLabel: "true"}); err != nil {
		return "", err
	}
	if err := lab.Queues(ctx, cell, ns); err != nil {
		return "", err
	}
	j := shape.New(ns, "train", bedSize)
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(advice), &patch); err != nil {
		return "", fmt.Errorf("the advice is not YAML: %v\n%s", err, advice)
	}
	schedlab.Merge(j.Manifest, patch)
	coords, workers, _, err := j.Pods()
	if err != nil {
		return "", err
	}
	pods := append(append([]*corev1.Pod{workers[0]}, coords...), workers[1:]...)
	for _, p := range pods {
		if p.Annotations[annotation] != "topology.kubernetes.io/zone" {
			return "", fmt.Errorf("pod %s does not carry the advice's %s: %v", p.Name, annotation, p.Annotations)
		}
		p.Labels[kueuelab.QueueLabel] = "gpu"
		p.Labels[kueuelab.PodGroupNameLabel] = "train"
		p.Annotations[kueuelab.PodGroupTotalAnnotation] = strconv.Itoa(len(pods))
		for i := range p.OwnerReferences {
			p.OwnerReferences[i].Controller = nil
		}
		if p.Spec.NodeSelector == nil {
			p.Spec.NodeSelector = map[string]string{}
		}
		p.Spec.NodeSelector[schedlab.LabelCell] = cell
	}
	if capacity == "zone fills" {
		if err := fill(ctx, lab.Lab, cell, b); err != nil {
			return "", err
		}
	}
	for i, p := range pods {
		got, err := lab.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return "", fmt.Errorf("creating pod %s: %w", p.Name, err)
		}
		if !kueuelab.Gated(got, kueuelab.AdmissionGate) || !kueuelab.Gated(got, kueuelab.TopologyGate) {
			return "", fmt.Errorf("pod %s not gated by Kueue's webhook: %v", p.Name, got.Spec.SchedulingGates)
		}
		if i == len(pods)/2 && capacity == "zone fills" {
			time.Sleep(time.Second)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	p, err := lab.SettleQuiet(sctx, ns, len(pods), 15*time.Second)
	cancel()
	if err != nil {
		return "", err
	}
	o := classify(p, zoneOf)
	wls, err := lab.Workloads(ctx, ns)
	if err != nil {
		return string(o), err
	}
	if len(wls) != 1 {
		return string(o), fmt.Errorf("%d Workloads for the pod group, want 1", len(wls))
	}
	admitted := kueuelab.Admitted(wls[0])
	if os.Getenv("ZONEWATCH_SCHEDLAB_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "%s %s %s: %s admitted=%v %v\n%s\n", cell, shape.Name, capacity, o, admitted, p, kueuelab.Condition(wls[0], "QuotaReserved"))
	}
	switch {
	case strings.HasPrefix(capacity, "preferred") && pinned:
		// The advice pins every template to one zone by a required
		// nodeAffinity (a job of several pod sets of many pods, which
		// Kueue cannot group): a preferred topology cannot split it, and
		// with no zone of room it waits whole.
		if o != waitsWhole || admitted {
			return string(o), fmt.Errorf("with a preferred zone, the advice's zone pin and no zone with room: %s (admitted %v), want waits whole, not admitted: %v", o, admitted, p)
		}
	case strings.HasPrefix(capacity, "preferred"):
		if o != splitZones || !admitted {
			return string(o), fmt.Errorf("with a preferred zone and no zone with room: %s (admitted %v), want split and admitted: %v", o, admitted, p)
		}
		// The pods' owner references are not controller references here
		// (see the test's comment): analyze names the job by its labels,
		// a TrainJob's as its JobSet.
		fix, err := analyzeFixOf(ctx, lab.Lab, cell, ns, j, true)
		if err != nil {
			return string(o), err
		}
		if !strings.HasPrefix(fix, "# Kueue's choice: ") || !strings.Contains(fix, KueueTopologyAnnotation) {
			return string(o), fmt.Errorf("analyze does not name the split Kueue's choice:\n%s", fix)
		}
	case o == oneZone:
		if !admitted {
			return string(o), fmt.Errorf("bound in one zone but the Workload is not admitted")
		}
	case o == waitsWhole:
		if admitted {
			return string(o), fmt.Errorf("the Workload is admitted but no pod is bound")
		}
	default:
		return string(o), fmt.Errorf("%s with required topology: %v", o, p)
	}
	return string(o), nil
}

// kueueAdvice places the shape's job unfixed on a bed with one GPU node a
// zone and returns analyze's advice for it (Kueue's), with the LocalQueue
// named "gpu".
func kueueAdvice(ctx context.Context, lab *schedlab.Lab, cell string, shape *schedlab.Shape) (string, error) {
	small := cell + "a"
	if err := lab.AddNodes(ctx, newBed(small, 1, false).nodes...); err != nil {
		return "", err
	}
	ns := cell + "-unfixed"
	if err := lab.EnsureNamespace(ctx, ns, nil); err != nil {
		return "", err
	}
	j := shape.New(ns, "train", bedSize)
	if _, err := place(ctx, lab, j, small, "interleaved"); err != nil {
		return "", err
	}
	fix, err := analyzeFix(ctx, lab, small, ns, j)
	if err != nil {
		return "", err
	}
	if err := lab.DeletePods(ctx, ns); err != nil {
		return "", err
	}
	if !strings.HasPrefix(fix, "# No zone can hold") || !strings.Contains(fix, KueueTopologyAnnotation) {
		return "", fmt.Errorf("analyze's advice for a job no zone holds is not Kueue's:\n%s", fix)
	}
	return strings.ReplaceAll(fix, KueueQueuePlaceholder, "gpu"), nil
}
