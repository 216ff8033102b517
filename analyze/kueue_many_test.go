package analyze

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/kueuelab"
	"github.com/zonewatch/zonewatch/internal/schedlab"
)

// TestKueueManyPodSetsOnRealKueue: jobs of three pod sets
// (schedlab.ManyPodSetShapes) on Kueue v0.17.0's real manager and the real
// kube-scheduler. Another team's 8-GPU pod holds half of the zone with
// room, so no zone has room now and analyze gives Kueue's advice: no
// podset group (Kueue groups two pod sets only), every template held to
// the zone that holds the job once that room is free. The job must wait
// whole (gated, none bound) and, once a GPU node joins that zone, run
// whole there. The advice analyze gave before, a required zone per
// pod set and no group, runs beside it on nodes of its own, its outcome
// reported.
func TestKueueManyPodSetsOnRealKueue(t *testing.T) {
	t.Parallel() // its own apiserver (scheduler, Kueue where used); mostly waits (docs/development.md)
	lab := kueuelab.Start(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	variants := []string{"analyze's advice", "a zone per pod set (before)"}
	type key struct{ shape, variant string }
	var mu sync.Mutex
	results := map[key]string{}
	var wg sync.WaitGroup
	cell := 0
	for _, shape := range schedlab.ManyPodSetShapes() {
		for _, v := range variants {
			cell++
			name := fmt.Sprintf("m%03d", cell)
			roomyFirst := cell%2 == 1
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := runKueueManyCell(ctx, lab, name, shape, v == variants[0], roomyFirst)
				if err != nil {
					t.Errorf("%s, %s (%s): %v", shape.Name, v, name, err)
					got += " (error)"
				}
				mu.Lock()
				results[key{shape.Name, v}] = got
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	var b strings.Builder
	b.WriteString("Kueue v0.17.0 TAS + kube-scheduler v1.37.2, jobs of three pod sets, no zone with room until a GPU node joins the zone that would hold the job:\n\n| shape |")
	for _, v := range variants {
		b.WriteString(" " + v + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(variants)) + "\n")
	for _, shape := range schedlab.ManyPodSetShapes() {
		fmt.Fprintf(&b, "| %s |", shape.Name)
		for _, v := range variants {
			fmt.Fprintf(&b, " %s |", results[key{shape.Name, v}])
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\n%d cells, %s\n", cell, time.Since(start).Round(time.Second))
	t.Log("\n" + b.String())
}

func runKueueManyCell(ctx context.Context, lab *kueuelab.Lab, cell string, shape *schedlab.Shape, fixed, roomyFirst bool) (string, error) {
	b := newBed(cell, 2, roomyFirst)
	if err := lab.AddNodes(ctx, b.nodes...); err != nil {
		return "", err
	}
	zoneOf := map[string]string{}
	for _, n := range b.nodes {
		zoneOf[n.Name] = n.Zone
	}
	if err := fill(ctx, lab.Lab, cell, b); err != nil {
		return "", err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err := lab.Settle(sctx, fillerNS(cell), 1, time.Second)
	cancel()
	if err != nil {
		return "", err
	}

	// The job unfixed (no Kueue), for the dump analyze reads: its pods and
	// the other team's.
	ns := cell + "-unfixed"
	if err := lab.EnsureNamespace(ctx, ns, nil); err != nil {
		return "", err
	}
	j := shape.New(ns, "train", bedSize)
	if _, err := place(ctx, lab.Lab, j, cell, "interleaved"); err != nil {
		return "", err
	}
	advice, err := analyzeCellDump(ctx, lab.Lab, cell, ns, j)
	if err != nil {
		return "", err
	}
	if err := lab.DeletePods(ctx, ns); err != nil {
		return "", err
	}
	if !strings.HasPrefix(advice, "# No zone can hold") || strings.Contains(advice, KueueGroupAnnotation) ||
		!strings.Contains(advice, "values:\n") || !strings.Contains(advice, "- "+b.roomy+"\n") {
		return "", fmt.Errorf("analyze's advice is not Kueue's held to %s, without a podset group:\n%s", b.roomy, advice)
	}
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(strings.ReplaceAll(advice, KueueQueuePlaceholder, "gpu")), &patch); err != nil {
		return "", fmt.Errorf("the advice is not YAML: %v\n%s", err, advice)
	}
	if !fixed {
		dropKey(patch, "affinity")
	}

	ns = cell + "-kueue"
	if err := lab.EnsureNamespace(ctx, ns, map[string]string{kueuelab.NamespaceLabel: "true"}); err != nil {
		return "", err
	}
	if err := lab.Queues(ctx, cell, ns); err != nil {
		return "", err
	}
	j = shape.New(ns, "train", bedSize)
	schedlab.Merge(j.Manifest, patch)
	coords, workers, _, err := j.Pods()
	if err != nil {
		return "", err
	}
	pods := append(append([]*corev1.Pod{}, coords...), workers...)
	for _, p := range pods {
		p.Labels[kueuelab.QueueLabel] = "gpu"
		p.Labels[kueuelab.PodGroupNameLabel] = "train"
		p.Annotations[kueuelab.PodGroupTotalAnnotation] = strconv.Itoa(len(pods))
		for i := range p.OwnerReferences {
			p.OwnerReferences[i].Controller = nil
		}
	}
	if err := createInCell(ctx, lab.Lab, cell, pods...); err != nil {
		return "", err
	}
	sctx, cancel = context.WithTimeout(ctx, 3*time.Minute)
	p, err := lab.SettleQuiet(sctx, ns, len(pods), 15*time.Second)
	cancel()
	if err != nil {
		return "", err
	}
	first := classify(p, zoneOf)
	if os.Getenv("ZONEWATCH_SCHEDLAB_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "%s %s fixed=%v: %s %v\n", cell, shape.Name, fixed, first, p)
	}
	zonesOf := func(p schedlab.Placement) string {
		zs := map[string]int{}
		for _, node := range p {
			zs[strings.TrimPrefix(zoneOf[node], cell+"-")]++
		}
		return fmt.Sprintf(" %v", zs)
	}
	if first != waitsWhole {
		if !fixed { // reported: what the advice before did
			return string(first) + zonesOf(p), nil
		}
		return string(first), fmt.Errorf("with no zone room: %s %v", first, p)
	}
	// A GPU node joins the zone the advice holds the job to: it has room
	// now. (The other team's pod ending is no event Kueue v0.17.0 requeues
	// a waiting Workload on: in a first run, none was admitted 90 s after
	// it was deleted, with or without the advice.)
	x := extraNode(cell, b)
	zoneOf[x.Name] = b.roomy
	if err := lab.AddNodes(ctx, x); err != nil {
		return string(first), err
	}
	sctx, cancel = context.WithTimeout(ctx, 3*time.Minute)
	p, err = lab.SettleQuiet(sctx, ns, len(pods), 15*time.Second)
	cancel()
	if err != nil {
		return string(first), err
	}
	then := classify(p, zoneOf)
	out := fmt.Sprintf("%s, then %s", first, then)
	if then == splitZones {
		out += zonesOf(p)
	}
	if fixed && then != oneZone {
		return out, fmt.Errorf("once room appeared: %s %v", then, p)
	}
	return out, nil
}

// analyzeCellDump is analyzeFix with the other team's pods in the dump
// (they hold room).
func analyzeCellDump(ctx context.Context, lab *schedlab.Lab, cell, ns string, j *schedlab.Job) (string, error) {
	nodeItems, podItems, err := schedlab.ListItems(ctx, lab.Client, schedlab.LabelCell+"="+cell, ns)
	if err != nil {
		return "", err
	}
	_, other, err := schedlab.ListItems(ctx, lab.Client, schedlab.LabelCell+"="+cell, fillerNS(cell))
	if err != nil {
		return "", err
	}
	podItems = append(podItems, other...)
	_, _, owners, err := j.Pods()
	if err != nil {
		return "", err
	}
	for _, o := range owners {
		podItems = append(podItems, o)
	}
	rep, err := analyzeItems(nodeItems, podItems, PodGroupsOff)
	if err != nil {
		return "", err
	}
	for _, job := range rep.Jobs {
		if job.Namespace == ns {
			return job.SuggestedFix, nil
		}
	}
	return "", fmt.Errorf("analyze reports no job in %s: %+v", ns, rep.Jobs)
}

// dropKey deletes key from every map under m.
func dropKey(m map[string]any, key string) {
	delete(m, key)
	for _, v := range m {
		switch x := v.(type) {
		case map[string]any:
			dropKey(x, key)
		case []any:
			for _, it := range x {
				if mm, ok := it.(map[string]any); ok {
					dropKey(mm, key)
				}
			}
		}
	}
}
