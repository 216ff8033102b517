package analyze

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/schedlab"
)

// TestGangStepsOnRealScheduler: jobs whose controller creates their pods
// in steps (schedlab.StepShapes: a TrainJob with initializers, a JobSet
// whose workers dependsOn its leader Ready, an MPIJob with
// launcherCreationPolicy WaitForWorkersReady, a RayJob and its submitter),
// with the advice analyze printed (--podgroups=on) for the dump of the
// job run unfixed, on the real kube-scheduler v1.37.2 with gang and
// topology scheduling: the test creates each step as the controller does,
// once the step before is bound (Ready) or, for initializers, has
// succeeded. A step that stays unbound while a zone has room for it is
// stuck (the next step is never created); the job's pods that joined the
// advice must end in one zone, or wait whole until room appears and then
// run in one zone. Before the fix, each of these gangs waited for pods
// created only after it ran.
func TestGangStepsOnRealScheduler(t *testing.T) {
	t.Parallel() // its own apiserver (scheduler, Kueue where used); mostly waits (docs/development.md)
	lab := schedlab.StartGang(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	installPodGroupPolicy(ctx, t, lab)

	capacities := []string{"room", "no zone fits"}
	type key struct{ shape, capacity string }
	var mu sync.Mutex
	results := map[key]string{}
	var wg sync.WaitGroup
	cell := 0
	for _, shape := range schedlab.StepShapes() {
		for _, capacity := range capacities {
			cell++
			name := fmt.Sprintf("s%03d", cell)
			roomyFirst := cell%2 == 1
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := runStepsCell(ctx, lab, name, shape, capacity, roomyFirst)
				if err != nil {
					t.Errorf("%s %s (%s): %v", shape.Name, capacity, name, err)
					got += " (error)"
				}
				mu.Lock()
				results[key{shape.Name, capacity}] = got
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	var b strings.Builder
	b.WriteString("kube-scheduler v1.37.2, gates " + schedlab.GangFeatureGates + ", pods created in steps with analyze's advice:\n\n| shape | advice |")
	for _, c := range capacities {
		b.WriteString(" " + c + " |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(capacities)) + "\n")
	for _, shape := range schedlab.StepShapes() {
		fmt.Fprintf(&b, "| %s |", shape.Name)
		for i, c := range capacities {
			r := results[key{shape.Name, c}]
			advice, outcome, _ := strings.Cut(r, ": ")
			if i == 0 {
				fmt.Fprintf(&b, " %s |", advice)
			}
			fmt.Fprintf(&b, " %s |", outcome)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\n%d cells, %s\n", cell, time.Since(start).Round(time.Second))
	t.Log("\n" + b.String())
}

// runStepsCell returns "ADVICE: OUTCOME".
func runStepsCell(ctx context.Context, lab *schedlab.Lab, cell string, shape *schedlab.StepShape, capacity string, roomyFirst bool) (string, error) {
	roomyNodes := 2
	if capacity == "no zone fits" {
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
	job := shape.New("", "train", bedSize)

	// The job unfixed, every step run, for the dump.
	ns := cell + "-none"
	if err := lab.EnsureNamespace(ctx, ns, nil); err != nil {
		return "", err
	}
	j := job.Copy()
	j.Namespace = ns
	if _, err := runSteps(ctx, lab, cell, shape, j, "", nil); err != nil {
		return "", fmt.Errorf("unfixed: %w", err)
	}
	fix, err := analyzeFix(ctx, lab, cell, ns, j, PodGroupsOn)
	if err != nil {
		return "", err
	}
	if os.Getenv("ZONEWATCH_SCHEDLAB_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "%s %s %s:\n%s\n", cell, shape.Name, capacity, fix)
	}
	if err := lab.DeletePods(ctx, ns); err != nil {
		return "", err
	}

	ns = cell + "-fixed"
	if err := lab.EnsureNamespace(ctx, ns, map[string]string{joinLabel: "true"}); err != nil {
		return "", err
	}
	j = job.Copy()
	j.Namespace = ns
	var advice string
	var pg *schedulingv1beta1.PodGroup
	switch docs := strings.Split(fix, "\n---\n"); {
	case len(docs) == 2:
		pg = &schedulingv1beta1.PodGroup{}
		if err := yaml.Unmarshal([]byte(docs[0]), pg); err != nil {
			return "gang", fmt.Errorf("the PodGroup of the advice: %v\n%s", err, fix)
		}
		pg.Namespace = ns
		if err := mergeFix(j, docs[1]); err != nil {
			return "gang", err
		}
		if err := lab.CreatePodGroup(ctx, pg); err != nil {
			return "gang", err
		}
		advice = fmt.Sprintf("gang, minCount %d", pg.Spec.SchedulingPolicy.Gang.MinCount)
	case strings.HasPrefix(fix, "# No gang advice: ") && strings.Contains(fix, KueueQueueLabel):
		// Kueue's advice: TestKueueTAS and internal/trainlab run it on
		// the real Kueue.
		return "no gang, Kueue: not run here (TestKueueTAS)", nil
	default:
		return "", fmt.Errorf("the advice is neither a gang nor, after the reason why not, Kueue's:\n%s", fix)
	}
	got, err := runSteps(ctx, lab, cell, shape, j, capacity, &b)
	if err != nil {
		return advice + ": " + got, err
	}
	out := advice + ": " + got
	if err := lab.DeletePods(ctx, ns); err != nil {
		return out, err
	}
	if err := lab.DeletePodGroups(ctx, ns); err != nil {
		return out, err
	}
	return out, nil
}

// runSteps creates the job's steps as its controller does, each once the
// one before is bound (or has succeeded, marked so here: no kubelet), and
// says where the job's running pods ended. With a bed (the fixed job), a
// step left unbound is a gang waiting whole until room appears (one GPU
// node joins the roomy zone, "no zone fits") or stuck; only the pods that
// joined the advice (its label) must be in one zone, the others
// are named.
func runSteps(ctx context.Context, lab *schedlab.Lab, cell string, shape *schedlab.StepShape, j *schedlab.Job, capacity string, b *bed) (string, error) {
	steps, err := shape.Steps(j)
	if err != nil {
		return "", err
	}
	var notes []string
	created, roomMade := 0, false
	for i, st := range steps {
		if err := createInCell(ctx, lab, cell, st.Pods...); err != nil {
			return "", err
		}
		created += len(st.Pods)
		settle := func() (int, error) {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			p, err := lab.SettleQuiet(sctx, j.Namespace, created, 5*time.Second)
			if err != nil {
				return 0, err
			}
			unbound := 0
			for _, pod := range st.Pods {
				if p[pod.Name] == "" {
					unbound++
				}
			}
			return unbound, nil
		}
		unbound, err := settle()
		if err != nil {
			return "", err
		}
		if unbound > 0 && b != nil && capacity == "no zone fits" && !roomMade {
			if unbound != len(st.Pods) {
				return "half-placed", fmt.Errorf("step %d: %d of %d pods bound, no zone has room", i, len(st.Pods)-unbound, len(st.Pods))
			}
			notes = append(notes, "waits whole")
			if err := lab.AddNodes(ctx, extraNode(cell, *b)); err != nil {
				return "", err
			}
			roomMade = true
			if unbound, err = settle(); err != nil {
				return "", err
			}
		}
		if unbound > 0 {
			if b == nil {
				return "", fmt.Errorf("unfixed: step %d: %d pods unbound", i, unbound)
			}
			return "stuck", fmt.Errorf("step %d: %d of %d pods unbound with room for them: the next step is never created", i, unbound, len(st.Pods))
		}
		if st.Complete {
			for _, pod := range st.Pods {
				cur, err := lab.Client.CoreV1().Pods(j.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return "", err
				}
				cur.Status.Phase = corev1.PodSucceeded
				if _, err := lab.Client.CoreV1().Pods(j.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
					return "", fmt.Errorf("marking %s succeeded: %w", pod.Name, err)
				}
			}
		}
	}
	if b == nil {
		return "", nil
	}
	pods, err := lab.Client.CoreV1().Pods(j.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	zones := map[string]bool{}
	var apart []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		zone := ""
		for _, n := range b.nodes {
			if n.Name == p.Spec.NodeName {
				zone = n.Zone
			}
		}
		if p.Spec.NodeName == extraNode(cell, *b).Name {
			zone = b.roomy
		}
		if p.Labels[PodGroupLabel] == "" && p.Spec.Affinity == nil {
			apart = append(apart, fmt.Sprintf("%s in %s", p.Name, zone))
			continue
		}
		zones[zone] = true
	}
	out := "one zone"
	if len(zones) != 1 {
		out = "split"
	}
	if len(notes) > 0 {
		out = strings.Join(notes, ", ") + ", then " + out
	}
	if len(apart) > 0 {
		sort.Strings(apart)
		out += " (not in the advice: " + strings.Join(apart, ", ") + ")"
	}
	if len(zones) != 1 {
		return out, fmt.Errorf("the advice's pods in zones %v", zones)
	}
	return out, nil
}
