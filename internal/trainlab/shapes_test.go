package trainlab_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/trainlab"
)

// handWritten (issue 43 item 2): the pods internal/schedlab writes by hand
// for a shape (shapes.go, controllers.go) are the pods the real controller
// makes of the same manifest: the same labels and annotations (values that
// are UIDs or hashes aside), owner, hostname and subdomain, and the fields
// of the spec that placement reads. Pod names are compared up to the
// random suffix the Job controller adds. The manifest is the shape's own
// (Shape.New), so a shape that drifts from its controller fails here.
func handWritten(ctx context.Context, v *viewer, kind string, desc func(*corev1.Pod) string) {
	v.t.Helper()
	var shape *schedlab.Shape
	for _, s := range schedlab.Shapes() {
		if s.Kind == kind {
			shape = s
		}
	}
	if shape == nil {
		v.t.Fatalf("schedlab has no shape of kind %s", kind)
	}
	ns := "shape-" + strings.ToLower(kind)
	v.namespace(ctx, ns)
	j := shape.New(ns, "shape", schedlab.Size{Workers: 3, WorkerGPUs: 1, WorkerCPU: "1", WorkerMem: "1Gi", CoordCPU: "1", CoordMem: "1Gi"})
	coords, workers, _, err := j.Pods()
	if err != nil {
		v.t.Fatal(err)
	}
	want := map[string]*corev1.Pod{}
	for _, p := range append(coords, workers...) {
		want[desc(p)] = p
	}
	m := j.Copy().Manifest
	m["metadata"].(map[string]any)["namespace"] = ns
	gvr := map[string]schema.GroupVersionResource{"Job": jobGVR, "JobSet": trainlab.JobSetGVR, "LeaderWorkerSet": trainlab.LWSGVR, "MPIJob": trainlab.MPIJobGVR}[kind]
	v.create(ctx, gvr, m)
	got := map[string]*corev1.Pod{}
	v.until(ctx, func() (bool, string) {
		got = map[string]*corev1.Pod{}
		pods, _ := v.bed.Pods(ns)
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning {
				got[desc(p)] = p
			}
		}
		var keys []string
		for k := range got {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return len(got) == len(want), fmt.Sprintf("%s: %d running pods %v, want %d", kind, len(got), keys, len(want))
	})
	for d, w := range want {
		g := got[d]
		if g == nil {
			v.t.Errorf("%s: the controller made no pod %s (hand-written %s)", kind, d, w.Name)
			continue
		}
		gl, wl := podLines(g), podLines(w)
		var only []string
		for _, l := range gl {
			if !slices.Contains(wl, l) {
				only = append(only, "real only:    "+l)
			}
		}
		for _, l := range wl {
			if !slices.Contains(gl, l) {
				only = append(only, "written only: "+l)
			}
		}
		if len(only) > 0 {
			v.t.Errorf("%s pod %s (real %s, hand-written %s) differs:\n  %s", kind, d, g.Name, w.Name, strings.Join(only, "\n  "))
		}
	}
	v.delete(ctx, gvr, ns, "shape")
}

// unstable are the label and annotation keys whose values are UIDs or
// hashes of the objects' contents: compared as present, not by value.
var unstable = map[string]bool{
	"batch.kubernetes.io/controller-uid": true, "controller-uid": true,
	"controller-revision-hash":                           true,
	"leaderworkerset.sigs.k8s.io/template-revision-hash": true,
	"jobset.sigs.k8s.io/jobset-uid":                      true,
}

// podLines renders what is compared of a pod, one line a field.
func podLines(p *corev1.Pod) []string {
	var out []string
	for k, v := range p.Labels {
		if k == "topology.kubernetes.io/zone" || k == "topology.kubernetes.io/region" {
			// Set at binding, from the node, by the apiserver's
			// PodTopologyLabels admission: on the hand-written pods too
			// once the scheduler binds them.
			continue
		}
		if unstable[k] {
			v = "*"
		}
		out = append(out, "label "+k+"="+v)
	}
	for k, v := range p.Annotations {
		if unstable[k] {
			v = "*"
		}
		out = append(out, "annotation "+k+"="+v)
	}
	name := p.Name
	for _, o := range p.OwnerReferences {
		out = append(out, fmt.Sprintf("owner %s %s %s controller=%v", o.APIVersion, o.Kind, o.Name, o.Controller != nil && *o.Controller))
		if o.Kind == "Job" {
			// "<job>-<index>-<random>" (k8s pkg/controller/job).
			if i := strings.LastIndex(name, "-"); i > 0 && strings.HasPrefix(name, o.Name+"-") {
				name = name[:i] + "-*"
			}
		}
	}
	out = append(out, "name "+name, "hostname "+p.Spec.Hostname, "subdomain "+p.Spec.Subdomain, "restartPolicy "+string(p.Spec.RestartPolicy))
	js := func(what string, v any) {
		b, _ := json.Marshal(v)
		out = append(out, what+" "+string(b))
	}
	js("affinity", p.Spec.Affinity)
	js("nodeSelector", p.Spec.NodeSelector)
	js("schedulingGates", p.Spec.SchedulingGates)
	var tol []corev1.Toleration
	for _, t := range p.Spec.Tolerations {
		// The DefaultTolerationSeconds admission plugin's, on every pod.
		if t.TolerationSeconds != nil && (t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable) {
			continue
		}
		tol = append(tol, t)
	}
	js("tolerations", tol)
	for _, c := range p.Spec.Containers {
		js("container "+c.Name+" resources", c.Resources)
	}
	slices.Sort(out)
	return out
}
