package trainlab_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/trainlab"
	"github.com/zonewatch/zonewatch/topology"
)

// TestRealControllers (issue 43 item 2): the exporter's job
// identity — the live feed (kube.Live with its owner informers) into the
// topology index, read back as the placements the exporter exports — on
// the pods that the real controllers make: kube-controller-manager's Job
// and StatefulSet controllers, JobSet v0.11.1 and LeaderWorkerSet v0.8.0,
// through each job's lifecycle. Each step waits until the view equals the
// expectation (job kind and name; each scheduled pod, named by the
// controller's own labels, with its role); finished and terminating pods
// are left out of it. The Shape subtests hold internal/schedlab's
// hand-written pods to the pods these controllers make (handWritten).
func TestRealControllers(t *testing.T) {
	bed := trainlab.Start(t)
	bed.StartJobSet(t)
	bed.StartLWS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var nodes []schedlab.Node
	for _, z := range []string{"a", "b"} {
		for i := 1; i <= 2; i++ {
			nodes = append(nodes, schedlab.Node{Name: fmt.Sprintf("node-%s%d", z, i), Zone: "zone-" + z, CPU: "32", Memory: "256Gi", GPUs: 8})
		}
	}
	if err := bed.AddNodes(ctx, nodes...); err != nil {
		t.Fatal(err)
	}
	meta, err := metadata.NewForConfig(bed.API.Config)
	if err != nil {
		t.Fatal(err)
	}
	idx := topology.NewIndex()
	live, fs, err := kube.NewLive(kubeapi.NewForConfigOrDie(bed.API.Config), idx, topology.DefaultRules(), 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	live.WithOwners(meta, kubeapi.NewForConfigOrDie(bed.API.Config))
	if err := live.Run(ctx, fs); err != nil {
		t.Fatal(err)
	}
	v := &viewer{t: t, bed: bed, idx: idx}

	t.Run("IndexedJob", func(t *testing.T) { v.t = t; indexedJob(ctx, v) })
	t.Run("JobSetDependsOn", func(t *testing.T) { v.t = t; jobSetDependsOn(ctx, v) })
	t.Run("LeaderWorkerSet", func(t *testing.T) { v.t = t; leaderWorkerSet(ctx, v) })
	t.Run("ShapeIndexedJob", func(t *testing.T) { v.t = t; handWritten(ctx, v, "Job", jobDesc) })
	t.Run("ShapeJobSet", func(t *testing.T) { v.t = t; handWritten(ctx, v, "JobSet", jobSetDesc) })
	t.Run("ShapeLeaderWorkerSet", func(t *testing.T) { v.t = t; handWritten(ctx, v, "LeaderWorkerSet", lwsDesc) })
}

// indexedJob: a batch Job, Indexed, of three pods. Index 0 is the
// coordinator (rank 0). A Job of one pod beside it is held but is no
// training job (the rule's minimum of two pods). A failed pod is re-created by the Job controller
// with its index; once index 0 succeeded the job has no coordinator left;
// deleting the Job (background propagation, as kubectl deletes) deletes
// its pods.
func indexedJob(ctx context.Context, v *viewer) {
	const ns = "batch"
	v.namespace(ctx, ns)
	job := map[string]any{"apiVersion": "batch/v1", "kind": "Job", "metadata": map[string]any{"name": "train", "namespace": ns}}
	for k, val := range jobTemplate(3) {
		job[k] = val
	}
	v.create(ctx, jobGVR, job)
	// In a namespace of its own: its pod is "i0" too.
	const singleNS = "batch-single"
	v.namespace(ctx, singleNS)
	single := map[string]any{"apiVersion": "batch/v1", "kind": "Job", "metadata": map[string]any{"name": "single", "namespace": singleNS}}
	for k, val := range jobTemplate(1) {
		single[k] = val
	}
	v.create(ctx, jobGVR, single)
	desc := jobDesc
	v.until(ctx, func() (bool, string) {
		pods, _ := v.bed.Pods(singleNS)
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning {
				return v.idx.JobExists(singleNS, "single"), "the index does not hold Job single"
			}
		}
		return false, "no running pod of Job single"
	})
	v.want(ctx, singleNS, desc)
	v.want(ctx, ns, desc, "Job/train i0=coordinator i1=worker i2=worker")

	failed := v.pod(ns, desc, "i1")
	v.exit(ctx, failed, 1)
	v.want(ctx, ns, desc, "Job/train i0=coordinator i1=worker i2=worker")
	v.replaced(ctx, ns, desc, "i1", failed)

	v.exit(ctx, v.pod(ns, desc, "i0"), 0)
	v.want(ctx, ns, desc, "Job/train i1=worker i2=worker")

	v.delete(ctx, jobGVR, ns, "train")
	v.delete(ctx, jobGVR, singleNS, "single")
	v.gone(ctx, ns, "train")
	v.gone(ctx, singleNS, "single")
}

// jobSetDependsOn: a JobSet of three replicated jobs, each step created
// only once the one before it is done: a dataset initializer; a leader,
// after the initializer completed; two worker jobs of two pods, once the
// leader is ready. spec.coordinator names the leader.
func jobSetDependsOn(ctx context.Context, v *viewer) {
	const ns = "jobset"
	v.namespace(ctx, ns)
	v.create(ctx, trainlab.JobSetGVR, map[string]any{
		"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": map[string]any{"name": "llm", "namespace": ns},
		"spec": map[string]any{
			"coordinator": map[string]any{"replicatedJob": "leader", "jobIndex": 0, "podIndex": 0},
			"replicatedJobs": []any{
				map[string]any{"name": "dataset-initializer", "replicas": 1, "template": jobTemplate(1)},
				map[string]any{"name": "leader", "replicas": 1, "template": jobTemplate(1),
					"dependsOn": []any{map[string]any{"name": "dataset-initializer", "status": "Complete"}}},
				map[string]any{"name": "workers", "replicas": 2, "template": jobTemplate(2),
					"dependsOn": []any{map[string]any{"name": "leader", "status": "Ready"}}},
			},
		},
	})
	desc := jobSetDesc
	// Only the initializer exists: not a coordinator (topology's rank-0
	// guess leaves initializers out), and no pod of the leader yet.
	v.want(ctx, ns, desc, "JobSet/llm dataset-initializer-0-0=worker")
	jobs, err := v.bed.Client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		v.t.Fatal(err)
	}
	if len(jobs.Items) != 1 || jobs.Items[0].Name != "llm-dataset-initializer-0" {
		var names []string
		for _, j := range jobs.Items {
			names = append(names, j.Name)
		}
		v.t.Fatalf("before the initializer completed, JobSet made Jobs %v; want only llm-dataset-initializer-0", names)
	}
	v.exit(ctx, v.pod(ns, desc, "dataset-initializer-0-0"), 0)
	// The initializer completed: the leader is created, runs, is Ready;
	// then the workers.
	all := "JobSet/llm leader-0-0=coordinator workers-0-0=worker workers-0-1=worker workers-1-0=worker workers-1-1=worker"
	v.want(ctx, ns, desc, all)
	v.owner(ctx, jobGVR, ns, "llm-workers-1", "JobSet/llm")

	failed := v.pod(ns, desc, "workers-1-0")
	v.exit(ctx, failed, 1)
	v.want(ctx, ns, desc, all)
	v.replaced(ctx, ns, desc, "workers-1-0", failed)

	v.delete(ctx, trainlab.JobSetGVR, ns, "llm")
	v.gone(ctx, ns, "llm")
}

// leaderWorkerSet: two groups of three (a leader and two workers). Each
// group is a job of its own, "<lws>-<group>", its leader the coordinator.
// A worker deleted (evicted) restarts its whole group
// (RecreateGroupOnPodRestart, LWS's default): new pods, same identity.
func leaderWorkerSet(ctx context.Context, v *viewer) {
	const ns = "lws"
	v.namespace(ctx, ns)
	v.create(ctx, trainlab.LWSGVR, map[string]any{
		"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": map[string]any{"name": "serve", "namespace": ns},
		"spec": map[string]any{"replicas": 2, "leaderWorkerTemplate": map[string]any{"size": 3,
			"workerTemplate": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "main", "image": "registry.example.com/serve:1"}},
			}}}},
	})
	desc := lwsDesc
	all := []string{"LeaderWorkerSet/serve-0 0/0=coordinator 0/1=worker 0/2=worker", "LeaderWorkerSet/serve-1 1/0=coordinator 1/1=worker 1/2=worker"}
	v.want(ctx, ns, desc, all...)
	// The chain of owners (docs/topology.md): LeaderWorkerSet -> leader
	// StatefulSet -> leader pod -> the group's worker StatefulSet -> worker pods.
	v.owner(ctx, stsGVR, ns, "serve", "LeaderWorkerSet/serve")
	v.owner(ctx, podGVR, ns, "serve-1", "StatefulSet/serve")
	v.owner(ctx, stsGVR, ns, "serve-1", "Pod/serve-1")
	v.owner(ctx, podGVR, ns, "serve-1-2", "StatefulSet/serve-1")

	var group0 []*corev1.Pod
	for _, d := range []string{"0/0", "0/1", "0/2"} {
		group0 = append(group0, v.pod(ns, desc, d))
	}
	zero := int64(0)
	if err := v.bed.Client.CoreV1().Pods(ns).Delete(ctx, group0[1].Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		v.t.Fatal(err)
	}
	v.want(ctx, ns, desc, all...)
	for i, d := range []string{"0/0", "0/1", "0/2"} {
		v.replaced(ctx, ns, desc, d, group0[i])
	}

	v.delete(ctx, trainlab.LWSGVR, ns, "serve")
	v.gone(ctx, ns, "serve-0")
	v.gone(ctx, ns, "serve-1")
}

// The pods of each controller, named by the controller's own labels:
// "i<completion index>" of a batch Job; "<replicated job>-<job
// index>-<completion index>" of a JobSet; "<group>/<worker index>" of a
// LeaderWorkerSet.
func jobDesc(p *corev1.Pod) string { return "i" + p.Labels["batch.kubernetes.io/job-completion-index"] }

func jobSetDesc(p *corev1.Pod) string {
	return p.Labels["jobset.sigs.k8s.io/replicatedjob-name"] + "-" + p.Labels["jobset.sigs.k8s.io/job-index"] + "-" + p.Labels["batch.kubernetes.io/job-completion-index"]
}

func lwsDesc(p *corev1.Pod) string {
	return p.Labels["leaderworkerset.sigs.k8s.io/group-index"] + "/" + p.Labels["leaderworkerset.sigs.k8s.io/worker-index"]
}

// jobTemplate is a batch Job template of n Indexed pods that do not
// restart in place (a failed pod is replaced by the Job controller).
func jobTemplate(n int) map[string]any {
	return map[string]any{"spec": map[string]any{
		"parallelism": n, "completions": n, "completionMode": "Indexed", "backoffLimit": 6,
		"template": map[string]any{"spec": map[string]any{
			"restartPolicy": "Never",
			"containers":    []any{map[string]any{"name": "main", "image": "registry.example.com/train:1"}},
		}},
	}}
}

var (
	jobGVR = schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}
	stsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}
	podGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// owner checks the object's controller reference: "Kind/name".
func (v *viewer) owner(ctx context.Context, gvr schema.GroupVersionResource, ns, name, want string) {
	v.t.Helper()
	u, err := v.bed.Dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		v.t.Fatal(err)
	}
	got := "none"
	if o := metav1.GetControllerOf(u); o != nil {
		got = o.Kind + "/" + o.Name
	}
	if got != want {
		v.t.Errorf("%s %s/%s is controlled by %s, want %s", gvr.Resource, ns, name, got, want)
	}
}

// viewer reads the exporter's view of the bed's jobs.
type viewer struct {
	t   testing.TB
	bed *trainlab.Bed
	idx *topology.Index
}

func (v *viewer) namespace(ctx context.Context, ns string) {
	v.t.Helper()
	if err := v.bed.EnsureNamespace(ctx, ns, nil); err != nil {
		v.t.Fatal(err)
	}
}

func (v *viewer) create(ctx context.Context, gvr schema.GroupVersionResource, obj map[string]any) {
	v.t.Helper()
	u, err := trainlab.Unstructured(obj)
	if err != nil {
		v.t.Fatal(err)
	}
	if _, err := v.bed.Dyn.Resource(gvr).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		v.t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// delete deletes an object as kubectl does: its dependents in the
// background, by the garbage collector.
func (v *viewer) delete(ctx context.Context, gvr schema.GroupVersionResource, ns, name string) {
	v.t.Helper()
	bg := metav1.DeletePropagationBackground
	if err := v.bed.Dyn.Resource(gvr).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		v.t.Fatal(err)
	}
}

// view is the exporter's placements of the namespace's jobs, one line a
// job: "Kind/name desc=role ...", its pods named by desc and sorted.
func (v *viewer) view(ns string, desc func(*corev1.Pod) string) []string {
	pods, _ := v.bed.Pods(ns)
	byName := map[string]*corev1.Pod{}
	for _, p := range pods {
		byName[p.Name] = p
	}
	var out []string
	for _, jp := range v.idx.Placements("") {
		if jp.Job.Namespace != ns {
			continue
		}
		var ps []string
		for _, pp := range jp.Pods {
			d := "?" + pp.Pod
			if p := byName[pp.Pod]; p != nil {
				d = desc(p)
			}
			ps = append(ps, d+"="+pp.Role)
		}
		slices.Sort(ps)
		out = append(out, jp.Job.Kind+"/"+jp.Job.Name+" "+strings.Join(ps, " "))
	}
	slices.Sort(out)
	return out
}

// want waits until the view is want.
func (v *viewer) want(ctx context.Context, ns string, desc func(*corev1.Pod) string, want ...string) {
	v.t.Helper()
	slices.Sort(want)
	v.until(ctx, func() (bool, string) {
		got := v.view(ns, desc)
		return slices.Equal(got, want), fmt.Sprintf("view of %s:\n  got  %q\n  want %q\n  pods %s", ns, got, want, v.pods(ns, desc))
	})
}

// until polls cond until it holds, failing with its last state when ctx
// ends or a minute and a half passed.
func (v *viewer) until(ctx context.Context, cond func() (bool, string)) {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			v.t.Fatalf("%v: %s", ctx.Err(), state)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// pods lists the namespace's pods for a failure: name, desc, node, phase.
func (v *viewer) pods(ns string, desc func(*corev1.Pod) string) string {
	pods, _ := v.bed.Pods(ns)
	var out []string
	for _, p := range pods {
		s := fmt.Sprintf("%s(%s %s %s", p.Name, desc(p), p.Spec.NodeName, p.Status.Phase)
		if p.DeletionTimestamp != nil {
			s += " terminating"
		}
		out = append(out, s+")")
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// pod returns the live (not finished, not terminating) pod that desc names d.
func (v *viewer) pod(ns string, desc func(*corev1.Pod) string, d string) *corev1.Pod {
	v.t.Helper()
	if p := v.live(ns, desc, d); p != nil {
		return p
	}
	v.t.Fatalf("no live pod %s in %s", d, ns)
	return nil
}

func (v *viewer) live(ns string, desc func(*corev1.Pod) string, d string) *corev1.Pod {
	pods, _ := v.bed.Pods(ns)
	for _, p := range pods {
		if desc(p) == d && p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return p
		}
	}
	return nil
}

// replaced waits until the live pod that desc names d is a new one, not old.
func (v *viewer) replaced(ctx context.Context, ns string, desc func(*corev1.Pod) string, d string, old *corev1.Pod) {
	v.t.Helper()
	v.until(ctx, func() (bool, string) {
		p := v.live(ns, desc, d)
		return p != nil && p.UID != old.UID && p.Status.Phase == corev1.PodRunning, fmt.Sprintf("pod %s of %s (was %s, uid %s) not replaced by a running one", d, ns, old.Name, old.UID)
	})
}

// exit ends p's container with code once the kubelet stand-in runs it: a
// pod the index holds may still be Pending (the stand-in starts a pod after
// its binding; seen: "pod batch/train-1-... is Pending, not Running").
func (v *viewer) exit(ctx context.Context, p *corev1.Pod, code int32) {
	v.t.Helper()
	v.until(ctx, func() (bool, string) {
		pods, _ := v.bed.Pods(p.Namespace)
		for _, q := range pods {
			if q.UID == p.UID {
				return q.Status.Phase == corev1.PodRunning, fmt.Sprintf("pod %s/%s is %s", q.Namespace, q.Name, q.Status.Phase)
			}
		}
		return false, fmt.Sprintf("pod %s/%s is gone", p.Namespace, p.Name)
	})
	if err := v.bed.Kubelet.Exit(ctx, p.Namespace, p.Name, code); err != nil {
		v.t.Fatal(err)
	}
}

// gone waits until the job has no pod left, in the index or the cluster.
func (v *viewer) gone(ctx context.Context, ns, job string) {
	v.t.Helper()
	v.until(ctx, func() (bool, string) {
		pods, _ := v.bed.Pods(ns)
		exists := v.idx.JobExists(ns, job)
		return !exists && len(pods) == 0, fmt.Sprintf("job %s/%s: in the index %v, %d pods in the namespace", ns, job, exists, len(pods))
	})
}
