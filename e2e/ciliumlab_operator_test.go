package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/zonewatch/zonewatch/internal/ciliumlab"
	"github.com/zonewatch/zonewatch/internal/kueuelab"
	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/trainlab"
)

// labOperator is the Kubeflow training operator (v1.9.3, started by
// internal/trainlab with its CRDs and webhooks) against the Cilium lab's
// apiserver: `make demo`'s llm-blocked is a PyTorchJob whose pods it
// makes, the real kube-scheduler binds and the lab wires with cilium-cni
// as a kubelet would (ciliumlab.RunPods). No kube-controller-manager runs
// here (its garbage collector would delete the lab's control pods, whose
// owners the lab names but never creates): the demo deletes a deleted
// job's pods and Services itself, as the garbage collector and the
// kubelet would. Beside it, Kueue v0.17.0 (internal/kueuelab, its
// PyTorchJob integration) with the administrator's one-time setup:
// analyze's fix queues the job to Kueue's topology-aware scheduling.
type labOperator struct {
	bed   *trainlab.Bed
	lab   *ciliumlab.Lab
	kueue *kueuelab.Lab
}

// labQueue is the LocalQueue of a TAS ResourceFlavor (the lab's GPU nodes)
// that the fix's job is queued to in its namespace.
const labQueue = "gpu"

func startLabOperator(t *testing.T, lab *ciliumlab.Lab, sl *schedlab.Lab, namespace string) *labOperator {
	t.Helper()
	began := time.Now()
	bed := trainlab.On(t, sl)
	bed.StartTrainingOperator(t)
	t.Logf("training-operator v1.9.3 up, its webhooks called, in %s", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	kq := kueuelab.Attach(t, sl, kueuelab.FrameworkPyTorchJob)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sl.EnsureNamespace(ctx, namespace, map[string]string{kueuelab.NamespaceLabel: "true"}); err != nil {
		t.Fatal(err)
	}
	if ns, err := sl.Client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); err != nil || ns.Labels[kueuelab.NamespaceLabel] != "true" {
		t.Fatalf("namespace %s is not under Kueue (made before the operator?): %v %v", namespace, err, ns.GetLabels())
	}
	if err := kq.QueuesOn(ctx, "lab", namespace, gpuNodeLabels); err != nil {
		t.Fatal(err)
	}
	t.Logf("Kueue v0.17.0 up (PyTorchJob integration, TAS LocalQueue %s/%s of the GPU nodes) in %s", namespace, labQueue, time.Since(began).Round(time.Millisecond))
	return &labOperator{bed: bed, lab: lab, kueue: kq}
}

// place creates the PyTorchJob and returns its pods once the operator
// made them all, the scheduler bound them and the lab wired them: the
// master first, then the workers by index.
func (o *labOperator) place(ctx context.Context, t *testing.T, j *schedlab.Job) *labJob {
	t.Helper()
	if err := o.lab.EnsureNamespace(ctx, j.Namespace); err != nil {
		t.Fatal(err)
	}
	u, err := trainlab.Unstructured(j.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.bed.Dyn.Resource(trainlab.PyTorchJobGVR).Namespace(j.Namespace).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating PyTorchJob %s/%s: %v", j.Namespace, j.Name, err)
	}
	coords, workers, _, err := j.Pods()
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	pods, err := o.lab.RunPods(ctx, j.Namespace, jobNameLabel+"="+j.Name, len(coords)+len(workers), map[string]string{"zone": schedlab.LabelZone}, 2*time.Minute)
	if err != nil {
		t.Fatalf("the training operator's pods of %s/%s: %v", j.Namespace, j.Name, err)
	}
	t.Logf("%s/%s: %d pods made by training-operator v1.9.3, bound by kube-scheduler and wired in %s", j.Namespace, j.Name, len(pods), time.Since(began).Round(time.Millisecond))
	out := &labJob{ns: j.Namespace, name: j.Name}
	for _, p := range pods {
		if p.ScheduledBy != "default-scheduler" {
			t.Errorf("pod %s on %s: Scheduled event by %q, want default-scheduler's", p.Ref(), p.Node.Name, p.ScheduledBy)
		}
		if p.Spec.Labels["training.kubeflow.org/job-role"] == "master" {
			out.coordinator = p
		} else {
			out.workers = append(out.workers, p)
		}
	}
	if out.coordinator == nil {
		t.Fatalf("the operator made no master of %s/%s among %d pods", j.Namespace, j.Name, len(pods))
	}
	slices.SortFunc(out.workers, func(a, b *ciliumlab.Pod) int {
		ia, _ := strconv.Atoi(a.Spec.Labels["training.kubeflow.org/replica-index"])
		ib, _ := strconv.Atoi(b.Spec.Labels["training.kubeflow.org/replica-index"])
		return ia - ib
	})
	return out
}

// replace does what the runbook tells a user (delete the job, re-create
// it with the fix) and returns the new job's pods: the PyTorchJob
// deleted, its pods ended as their kubelet ends them and its Services
// deleted (the garbage collector's part), the fixed one created.
func (o *labOperator) replace(ctx context.Context, t *testing.T, old *labJob, fixed *schedlab.Job) *labJob {
	t.Helper()
	res := o.bed.Dyn.Resource(trainlab.PyTorchJobGVR).Namespace(old.ns)
	if err := res.Delete(ctx, old.name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting PyTorchJob %s/%s: %v", old.ns, old.name, err)
	}
	for {
		_, err := res.Get(ctx, old.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("PyTorchJob %s/%s not gone: %v", old.ns, old.name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range old.pods() {
		if err := p.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	svcs := o.lab.Client.CoreV1().Services(old.ns)
	list, err := svcs.List(ctx, metav1.ListOptions{LabelSelector: jobNameLabel + "=" + old.name})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		if err := svcs.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(fmt.Errorf("deleting Service %s/%s: %w", old.ns, s.Name, err))
		}
	}
	return o.place(ctx, t, fixed)
}

const jobNameLabel = "training.kubeflow.org/job-name"

// logWorkloads logs how Kueue came to admit the namespace's jobs: each
// Workload's conditions, seconds after the Workload was made.
func (o *labOperator) logWorkloads(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	wls, err := o.kueue.Workloads(ctx, ns)
	if err != nil {
		t.Errorf("Kueue's Workloads in %s: %v", ns, err)
		return
	}
	for _, wl := range wls {
		made := wl.GetCreationTimestamp().Time
		conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
		var lines []string
		for _, c := range conds {
			c, _ := c.(map[string]any)
			at, _ := time.Parse(time.RFC3339, fmt.Sprint(c["lastTransitionTime"]))
			lines = append(lines, fmt.Sprintf("%v=%v at +%s (%v: %v)", c["type"], c["status"], at.Sub(made).Round(time.Second), c["reason"], c["message"]))
		}
		t.Logf("Kueue Workload %s/%s: %s", ns, wl.GetName(), strings.Join(lines, "; "))
	}

}
