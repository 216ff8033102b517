package analyze

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/collector/kube"
)

// dumpPod is a pod of a unit test's dump: labels, owner, node, phase and
// the GPUs it asks.
type dumpPod struct {
	name, node, phase string
	labels            map[string]string
	owner             [2]string // kind, name
	gpus              int
}

func (p dumpPod) object(ns string) map[string]any {
	res := map[string]any{"cpu": "2", "memory": "8Gi"}
	if p.gpus > 0 {
		res["nvidia.com/gpu"] = fmt.Sprint(p.gpus)
	}
	c := map[string]any{"name": "c", "image": "registry.example.com/x:1", "resources": map[string]any{"requests": res, "limits": res}}
	phase := p.phase
	if phase == "" {
		phase = "Running"
	}
	spec := map[string]any{"nodeName": p.node, "containers": []any{c}}
	if p.gpus > 0 { // as GPU pods do (ExtendedResourceToleration)
		spec["tolerations"] = []any{map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}}
	}
	apiVersion := map[string]string{"Job": "batch/v1", "MPIJob": "kubeflow.org/v2beta1", "RayCluster": "ray.io/v1", "TFJob": "kubeflow.org/v1"}[p.owner[0]]
	t := true
	return map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": p.name, "namespace": ns, "labels": p.labels, "uid": "uid-" + p.name,
			"ownerReferences": []any{map[string]any{"apiVersion": apiVersion, "kind": p.owner[0], "name": p.owner[1], "uid": "uid-" + p.owner[1], "controller": &t}}},
		"spec":   spec,
		"status": map[string]any{"phase": phase, "podIP": ""},
	}
}

// owned is an owner object of a dump.
func owned(apiVersion, kind, ns, name, ownerAPIVersion, ownerKind, owner string, spec map[string]any) map[string]any {
	t := true
	md := map[string]any{"name": name, "namespace": ns, "uid": "uid-" + name}
	if owner != "" {
		md["ownerReferences"] = []any{map[string]any{"apiVersion": ownerAPIVersion, "kind": ownerKind, "name": owner, "uid": "uid-" + owner, "controller": &t}}
	}
	o := map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": md}
	if spec != nil {
		o["spec"] = spec
	}
	return o
}

// jobSetPod: a pod of replicated job rjob, index i, of JobSet js (jobset
// v0.11.1 labels), through its child Job "<js>-<rjob>-0".
func jobSetPod(js, rjob string, i int, node, phase string, gpus int) dumpPod {
	job := js + "-" + rjob + "-0"
	return dumpPod{name: fmt.Sprintf("%s-%d-x", job, i), node: node, phase: phase, gpus: gpus, owner: [2]string{"Job", job},
		labels: map[string]string{"jobset.sigs.k8s.io/jobset-name": js, "jobset.sigs.k8s.io/replicatedjob-name": rjob,
			"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-name": job, "batch.kubernetes.io/job-completion-index": fmt.Sprint(i)}}
}

// stepsFix writes the dump and returns analyze's fix for job name.
func stepsFix(t *testing.T, mode PodGroups, name string, objects ...map[string]any) string {
	t.Helper()
	items := make([]any, len(objects))
	for i, o := range objects {
		items[i] = o
	}
	b, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pods.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(Input{Nodes: "testdata/nodes.json", Pods: path, PodGroups: mode})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range rep.Jobs {
		if j.JobName == name {
			return j.SuggestedFix
		}
	}
	t.Fatalf("no job %s in %+v", name, rep.Jobs)
	return ""
}

// gangOf splits the gang advice into the PodGroup's minCount and the
// templates (by their path in the patch) that carry the pod-group label.
func gangOf(t *testing.T, fix string) (int, []string) {
	t.Helper()
	docs := strings.Split(fix, "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("no gang advice:\n%s", fix)
	}
	var pg struct {
		Spec struct {
			SchedulingPolicy struct {
				Gang struct{ MinCount int } `json:"gang"`
			} `json:"schedulingPolicy"`
		}
	}
	if err := yaml.Unmarshal([]byte(docs[0]), &pg); err != nil {
		t.Fatal(err)
	}
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(docs[1]), &patch); err != nil {
		t.Fatal(err)
	}
	var labelled []string
	walkPatch("", patch, func(path string, x map[string]any) {
		if l, ok := x["labels"].(map[string]any); ok && l[PodGroupLabel] != nil {
			labelled = append(labelled, path)
		}
	})
	return pg.Spec.SchedulingPolicy.Gang.MinCount, labelled
}

// walkPatch calls visit with every object under v and its path: map keys
// joined by dots, a list item by its name (or groupName) in brackets.
func walkPatch(path string, v any, visit func(path string, m map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		visit(path, x)
		for k, v := range x {
			walkPatch(path+"."+k, v, visit)
		}
	case []any:
		for _, v := range x {
			name := ""
			if m, ok := v.(map[string]any); ok {
				name, _ = m["name"].(string)
				if name == "" {
					name, _ = m["groupName"].(string)
				}
			}
			walkPatch(path+"["+name+"]", v, visit)
		}
	}
}

func hasPath(paths []string, part string) bool {
	for _, p := range paths {
		if strings.Contains(p, part) {
			return true
		}
	}
	return false
}

// TestGangSteps: for controllers that create a job's pods in steps, the
// gang advice counts in minCount only the pods created at once, first,
// and labels no template of a step that must end before the gang exists;
// a later step's templates join the group. Before, minCount was every
// unfinished pod and every replica type seen got the label: each of these
// groups waited for pods its controller creates only after the group ran.
func TestGangSteps(t *testing.T) {
	const ns = "ml"
	trainJob := func(initPhase string, withJobSet bool) []map[string]any {
		var objs []map[string]any
		for _, p := range []dumpPod{
			jobSetPod("tj", "dataset-initializer", 0, "cpu-a1", initPhase, 0),
			jobSetPod("tj", "model-initializer", 0, "cpu-a1", initPhase, 0),
			jobSetPod("tj", "node", 0, "gpu-a1", "", 4), jobSetPod("tj", "node", 1, "gpu-b1", "", 4),
		} {
			objs = append(objs, p.object(ns))
		}
		for _, rj := range []string{"dataset-initializer", "model-initializer", "node"} {
			objs = append(objs, owned("batch/v1", "Job", ns, "tj-"+rj+"-0", "jobset.x-k8s.io/v1alpha2", "JobSet", "tj", nil))
		}
		var spec map[string]any
		if withJobSet {
			spec = map[string]any{"replicatedJobs": []any{
				map[string]any{"name": "dataset-initializer"}, map[string]any{"name": "model-initializer"},
				map[string]any{"name": "node", "dependsOn": []any{map[string]any{"name": "dataset-initializer", "status": "Complete"}, map[string]any{"name": "model-initializer", "status": "Complete"}}},
			}}
		}
		return append(objs, owned("jobset.x-k8s.io/v1alpha2", "JobSet", ns, "tj", "trainer.kubeflow.org/v1alpha1", "TrainJob", "tj", spec))
	}
	for _, c := range []struct {
		name, phase string
		withJobSet  bool
	}{{"initializers done", "Succeeded", false}, {"initializers running", "", false}, {"initializers done, JobSet in the dump", "Succeeded", true}} {
		fix := stepsFix(t, PodGroupsOn, "tj", trainJob(c.phase, c.withJobSet)...)
		n, labelled := gangOf(t, fix)
		if n != 2 || !hasPath(labelled, "[node]") || hasPath(labelled, "initializer") {
			t.Errorf("TrainJob, %s: minCount %d, labelled %v; want 2, the node template only:\n%s", c.name, n, labelled, fix)
		}
		if os.Getenv("PRINT") != "" {
			t.Log(fix)
		}
		if !strings.Contains(fix, "# In steps: dataset-initializer ends before") {
			t.Errorf("TrainJob, %s: the advice does not say why the initializers are left out:\n%s", c.name, fix)
		}
	}

	// The TrainJob's pods dumped without their JobSet (kubectl get pods):
	// they are the JobSet's job, whose patch Trainer would put back; the
	// advice says to dump the JobSets for the TrainJob's own (issue 43,
	// the real Trainer v2.2.0 in internal/trainlab).
	var alone []map[string]any
	for _, o := range trainJob("Succeeded", false) {
		if k := o["kind"]; k != "JobSet" && k != "Job" {
			alone = append(alone, o)
		}
	}
	if fix := stepsFix(t, PodGroupsOff, "tj", alone...); !strings.Contains(fix, "JobSet ml/tj") || !strings.Contains(fix, "dump the JobSets too") {
		t.Errorf("a TrainJob's pods without their JobSet: the advice does not say to dump the JobSets:\n%s", fix)
	}
	if fix := stepsFix(t, PodGroupsOff, "tj", trainJob("Succeeded", true)...); !strings.Contains(fix, "TrainJob ml/tj") || strings.Contains(fix, "dump the JobSets too") {
		t.Errorf("a TrainJob with its JobSet in the dump: not the TrainJob's own advice:\n%s", fix)
	}

	// A JobSet whose workers start once its driver is Ready (dependsOn),
	// or in order (startupPolicy InOrder); the JobSet is in the dump.
	jobSet := func(spec map[string]any) []map[string]any {
		objs := []map[string]any{
			jobSetPod("js", "driver", 0, "cpu-a1", "", 0).object(ns),
			jobSetPod("js", "workers", 0, "gpu-a1", "", 4).object(ns), jobSetPod("js", "workers", 1, "gpu-b1", "", 4).object(ns),
		}
		for _, rj := range []string{"driver", "workers"} {
			objs = append(objs, owned("batch/v1", "Job", ns, "js-"+rj+"-0", "jobset.x-k8s.io/v1alpha2", "JobSet", "js", nil))
		}
		if spec != nil {
			objs = append(objs, owned("jobset.x-k8s.io/v1alpha2", "JobSet", ns, "js", "", "", "", spec))
		}
		return objs
	}
	// The driver after its workers: the workers are the gang; the driver
	// joins it.
	for name, spec := range map[string]map[string]any{
		"dependsOn Ready": {"replicatedJobs": []any{map[string]any{"name": "workers"},
			map[string]any{"name": "driver", "dependsOn": []any{map[string]any{"name": "workers", "status": "Ready"}}}}},
		"startupPolicy InOrder": {"startupPolicy": map[string]any{"startupPolicyOrder": "InOrder"},
			"replicatedJobs": []any{map[string]any{"name": "workers"}, map[string]any{"name": "driver"}}},
	} {
		fix := stepsFix(t, PodGroupsOn, "js", jobSet(spec)...)
		n, labelled := gangOf(t, fix)
		if n != 2 || !hasPath(labelled, "[driver]") || !hasPath(labelled, "[workers]") {
			t.Errorf("JobSet, workers then driver, %s: minCount %d, labelled %v; want 2 (the workers), both templates:\n%s", name, n, labelled, fix)
		}
	}
	// The workers (GPUs) after the driver: a group's zone would be the
	// driver's choice alone; no gang, Kueue's advice, and why.
	for name, spec := range map[string]map[string]any{
		"dependsOn Ready": {"replicatedJobs": []any{map[string]any{"name": "driver"},
			map[string]any{"name": "workers", "dependsOn": []any{map[string]any{"name": "driver", "status": "Ready"}}}}},
		"startupPolicy InOrder": {"startupPolicy": map[string]any{"startupPolicyOrder": "InOrder"},
			"replicatedJobs": []any{map[string]any{"name": "driver"}, map[string]any{"name": "workers"}}},
	} {
		fix := stepsFix(t, PodGroupsOn, "js", jobSet(spec)...)
		if strings.Contains(fix, "kind: PodGroup") || !strings.Contains(fix, KueueTopologyAnnotation) || !strings.HasPrefix(fix, "# No gang advice: ") ||
			!strings.Contains(fix, "workers, with GPUs, is created only after") || strings.Contains(fix, "joins the group") {
			t.Errorf("JobSet, driver then workers, %s: want no gang and Kueue's advice, with the reason first:\n%s", name, fix)
		}
	}
	// Created at once: the whole JobSet is the gang.
	fix := stepsFix(t, PodGroupsOn, "js", jobSet(map[string]any{"replicatedJobs": []any{map[string]any{"name": "driver"}, map[string]any{"name": "workers"}}})...)
	if n, labelled := gangOf(t, fix); n != 3 || len(labelled) != 2 {
		t.Errorf("JobSet without steps: minCount %d, labelled %v; want 3, both templates:\n%s", n, labelled, fix)
	}
	// Without the JobSet analyze cannot tell: no gang, Kueue's advice, and why.
	fix = stepsFix(t, PodGroupsOn, "js", jobSet(nil)...)
	if strings.Contains(fix, "kind: PodGroup") || !strings.Contains(fix, KueueTopologyAnnotation) || !strings.HasPrefix(fix, "# No gang advice: the dump holds no JobSet object") {
		t.Errorf("JobSet not in the dump: want no gang and Kueue's advice, with the reason first:\n%s", fix)
	}

	// An MPIJob (mpi-operator v2beta1): the launcher may come once the
	// workers are Ready.
	mpi := []map[string]any{
		dumpPod{name: "pi-launcher-x7k2p", node: "cpu-a1", owner: [2]string{"Job", "pi-launcher"}, labels: map[string]string{
			"training.kubeflow.org/job-name": "pi", "training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/job-role": "launcher",
			"batch.kubernetes.io/job-name": "pi-launcher"}}.object(ns),
		owned("batch/v1", "Job", ns, "pi-launcher", "kubeflow.org/v2beta1", "MPIJob", "pi", nil),
	}
	for i, node := range []string{"gpu-a1", "gpu-b1"} {
		mpi = append(mpi, dumpPod{name: fmt.Sprintf("pi-worker-%d", i), node: node, gpus: 4, owner: [2]string{"MPIJob", "pi"}, labels: map[string]string{
			"training.kubeflow.org/job-name": "pi", "training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/job-role": "worker",
			"training.kubeflow.org/replica-index": fmt.Sprint(i)}}.object(ns))
	}
	fix = stepsFix(t, PodGroupsOn, "pi", mpi...)
	if os.Getenv("PRINT") != "" {
		t.Log(fix)
	}
	if n, labelled := gangOf(t, fix); n != 2 || !hasPath(labelled, "Launcher") || !hasPath(labelled, "Worker") {
		t.Errorf("MPIJob: minCount %d, labelled %v; want 2 (the workers), Launcher and Worker:\n%s", n, labelled, fix)
	}

	// A RayJob whose submitter runs (KubeRay: created once the cluster is
	// ready; the identity test's labels).
	ray := []map[string]any{
		dumpPod{name: "tune-x-head", node: "cpu-a1", owner: [2]string{"RayCluster", "tune-x"}, labels: map[string]string{
			"ray.io/cluster": "tune-x", "ray.io/node-type": "head", "ray.io/group": "headgroup", "ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "tune"}}.object(ns),
		dumpPod{name: "tune-sub", node: "cpu-b1", owner: [2]string{"Job", "tune"}, labels: map[string]string{
			"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "tune", "batch.kubernetes.io/job-name": "tune"}}.object(ns),
		owned("ray.io/v1", "RayCluster", ns, "tune-x", "ray.io/v1", "RayJob", "tune", nil),
		owned("batch/v1", "Job", ns, "tune", "ray.io/v1", "RayJob", "tune", nil),
	}
	for i, node := range []string{"gpu-a1", "gpu-b1"} {
		ray = append(ray, dumpPod{name: fmt.Sprintf("tune-x-gpu-%d", i), node: node, gpus: 4, owner: [2]string{"RayCluster", "tune-x"}, labels: map[string]string{
			"ray.io/cluster": "tune-x", "ray.io/node-type": "worker", "ray.io/group": "gpu", "ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "tune"}}.object(ns))
	}
	fix = stepsFix(t, PodGroupsOn, "tune", ray...)
	if n, labelled := gangOf(t, fix); n != 3 || !hasPath(labelled, "headGroupSpec") || !hasPath(labelled, "[gpu]") || !hasPath(labelled, "submitterPodTemplate") {
		t.Errorf("RayJob with its submitter: minCount %d, labelled %v; want 3 (head and workers), head, worker group and submitter (uncounted):\n%s", n, labelled, fix)
	}
	// KubeRay v1.6.0 takes a submitterPodTemplate as it is: the advice's
	// is whole (the container the submitter ran, restartPolicy Never).
	var patch struct {
		Spec struct {
			Submitter *corev1.PodTemplateSpec `json:"submitterPodTemplate"`
		} `json:"spec"`
	}
	docs := strings.Split(fix, "\n---\n")
	if err := yaml.Unmarshal([]byte(docs[len(docs)-1]), &patch); err != nil || patch.Spec.Submitter == nil {
		t.Fatalf("no submitterPodTemplate (%v):\n%s", err, fix)
	}
	if sub := patch.Spec.Submitter.Spec; len(sub.Containers) != 1 || sub.Containers[0].Image == "" || sub.RestartPolicy != corev1.RestartPolicyNever || len(sub.Containers[0].Command) > 0 {
		t.Errorf("the submitterPodTemplate is not whole, or sets a command: %+v\n%s", sub, fix)
	}
	// Not created yet (the cluster is not ready): KubeRay's default
	// submitter, of the head's image, in Kueue's advice all the same.
	fix = stepsFix(t, PodGroupsOff, "tune", slices.Delete(slices.Clone(ray), 1, 2)...)
	if !strings.Contains(fix, "submitterPodTemplate") || !strings.Contains(fix, "ray-job-submitter") || !strings.Contains(fix, KueueTopologyAnnotation) {
		t.Errorf("the advice of a RayJob whose submitter is not created yet holds no default submitter:\n%s", fix)
	}
}

// TestKueueManyPodSets: Kueue v0.17.0 keeps two pod sets together only as
// a podset group of exactly two, one of them a single pod; a job of three
// pod sets (TFJob Chief + PS + Worker, a RayCluster with two worker
// groups, a JobSet of three replicated jobs) or of two pod sets of several
// pods each gets no group (Kueue's webhook refuses it) and every template
// held to one zone, which Kueue TAS honours: one zone or none. Before, it
// got one required zone per pod set, which Kueue may pick apart.
func TestKueueManyPodSets(t *testing.T) {
	const ns = "ml"
	// Another team's 8 GPUs in us-east-1a: no zone has room for the job's
	// 16 GPUs now; us-east-1a (16 GPUs) holds it once they are free.
	other := dumpPod{name: "serve", node: "gpu-a1", gpus: 8, owner: [2]string{"Job", "serve"}, labels: map[string]string{"app": "serve"}}.object("other")
	tf := func(replicaType string, i int, node string, gpus int) map[string]any {
		lbl := map[string]string{"training.kubeflow.org/job-name": "tf", "training.kubeflow.org/operator-name": "tfjob-controller",
			"training.kubeflow.org/replica-type": replicaType, "training.kubeflow.org/replica-index": fmt.Sprint(i)}
		if replicaType == "chief" {
			lbl["training.kubeflow.org/job-role"] = "master"
		}
		return dumpPod{name: fmt.Sprintf("tf-%s-%d", replicaType, i), node: node, gpus: gpus, owner: [2]string{"TFJob", "tf"}, labels: lbl}.object(ns)
	}
	ray := func(group string, i int, node string, gpus int) map[string]any {
		typ := "worker"
		if group == "headgroup" {
			typ = "head"
		}
		return dumpPod{name: fmt.Sprintf("rc-%s-%d", group, i), node: node, gpus: gpus, owner: [2]string{"RayCluster", "rc"}, labels: map[string]string{
			"ray.io/cluster": "rc", "ray.io/node-type": typ, "ray.io/group": group}}.object(ns)
	}
	cases := []struct {
		name, job string
		objects   []map[string]any
		templates []string
	}{
		{"TFJob Chief + PS + Worker", "tf", []map[string]any{other,
			tf("chief", 0, "cpu-a1", 0), tf("ps", 0, "cpu-b1", 0), tf("ps", 1, "cpu-b1", 0),
			tf("worker", 0, "gpu-b1", 4), tf("worker", 1, "gpu-c1", 4), tf("worker", 2, "gpu-c1", 4), tf("worker", 3, "gpu-a2", 4)},
			[]string{"Chief", "PS", "Worker"}},
		{"RayCluster with two worker groups", "rc", []map[string]any{other,
			ray("headgroup", 0, "cpu-a1", 0), ray("small", 0, "gpu-b1", 4), ray("small", 1, "gpu-b1", 4), ray("big", 0, "gpu-c1", 4), ray("big", 1, "gpu-a2", 4)},
			[]string{"headGroupSpec", "[big]", "[small]"}},
		{"JobSet of three replicated jobs", "js3", []map[string]any{other,
			jobSetPod("js3", "leader", 0, "cpu-a1", "", 0).object(ns),
			jobSetPod("js3", "prep", 0, "gpu-b1", "", 4).object(ns), jobSetPod("js3", "prep", 1, "gpu-b1", "", 4).object(ns),
			jobSetPod("js3", "train", 0, "gpu-c1", "", 4).object(ns), jobSetPod("js3", "train", 1, "gpu-a2", "", 4).object(ns)},
			[]string{"[leader]", "[prep]", "[train]"}},
		{"TFJob PS + Worker, several pods each", "tf", []map[string]any{other,
			tf("ps", 0, "cpu-a1", 0), tf("ps", 1, "cpu-b1", 0),
			tf("worker", 0, "gpu-b1", 4), tf("worker", 1, "gpu-c1", 4), tf("worker", 2, "gpu-c1", 4), tf("worker", 3, "gpu-a2", 4)},
			[]string{"PS", "Worker"}},
	}
	for _, c := range cases {
		fix := stepsFix(t, PodGroupsOff, c.job, c.objects...)
		if !strings.HasPrefix(fix, "# No zone can hold") {
			t.Fatalf("%s: not Kueue's advice:\n%s", c.name, fix)
		}
		if os.Getenv("PRINT") != "" {
			t.Log(fix)
		}
		if strings.Contains(fix, KueueGroupAnnotation) {
			t.Errorf("%s: a podset group, which Kueue v0.17.0 refuses for it:\n%s", c.name, fix)
		}
		var patch map[string]any
		if err := yaml.Unmarshal([]byte(fix), &patch); err != nil {
			t.Fatal(err)
		}
		pinned := map[string]bool{}
		walkPatch("", patch, func(path string, x map[string]any) {
			if spec, ok := x["spec"].(map[string]any); ok {
				if md, ok := x["metadata"].(map[string]any); ok && dig(md, "annotations")[KueueTopologyAnnotation] == kube.LabelZone {
					b, _ := json.Marshal(spec["affinity"])
					pinned[path] = strings.Contains(string(b), `"values":["us-east-1a"]`)
				}
			}
		})
		for _, want := range c.templates {
			found := false
			for path, pin := range pinned {
				if strings.Contains(path, want) {
					found = true
					if !pin {
						t.Errorf("%s: template %s is not held to us-east-1a:\n%s", c.name, path, fix)
					}
				}
			}
			if !found {
				t.Errorf("%s: no template %s with Kueue's annotation in %v:\n%s", c.name, want, pinned, fix)
			}
		}
		if len(pinned) != len(c.templates) {
			t.Errorf("%s: templates %v, want %v", c.name, pinned, c.templates)
		}
	}
	// A coordinator of one pod and its workers: the podset group, no pin.
	fix := stepsFix(t, PodGroupsOff, "tf", other, tf("chief", 0, "cpu-a1", 0), tf("worker", 0, "gpu-b1", 4), tf("worker", 1, "gpu-c1", 4),
		tf("worker", 2, "gpu-c1", 4), tf("worker", 3, "gpu-a2", 4))
	if !strings.Contains(fix, KueueGroupAnnotation) || strings.Contains(fix, "nodeAffinity") {
		t.Errorf("Chief + Worker: want the podset group and no pin:\n%s", fix)
	}
}

// TestKueueRayJobShutsDownItsCluster: Kueue v0.17.0's webhook refuses a
// queued RayJob that keeps its cluster when it finishes (KubeRay's
// default, shutdownAfterJobFinishes false): seen on the real Kueue and
// KubeRay v1.6.0 (internal/trainlab, a RayJob applying the advice was
// denied "a kueue managed job should delete the cluster after
// finishing"). The Kueue advice for a RayJob sets it.
func TestKueueRayJobShutsDownItsCluster(t *testing.T) {
	fix := stepsFix(t, PodGroupsOff, "tune", rayJobTooBig()...)
	if !strings.HasPrefix(fix, "# No zone can hold") || !strings.Contains(fix, KueueTopologyAnnotation) {
		t.Fatalf("not the Kueue advice:\n%s", fix)
	}
	var patch struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(fix), &patch); err != nil {
		t.Fatal(err)
	}
	if patch.Spec["shutdownAfterJobFinishes"] != true {
		t.Errorf("the Kueue advice for a RayJob does not set spec.shutdownAfterJobFinishes: true (Kueue refuses the RayJob):\n%s", fix)
	}
	if _, ok := patch.Spec["rayClusterSpec"]; !ok {
		t.Errorf("the Kueue advice for a RayJob patches no rayClusterSpec:\n%s", fix)
	}
}

// TestKubeRayRecreateNote: the advice for a RayJob or RayCluster says to
// re-create it half a minute after its old pods are gone: KubeRay v1.6.0
// keeps a cluster's pod expectations by name for 30 s, and a RayCluster
// re-created sooner got its pods only at its next reconcile, 300 s later
// (internal/trainlab TestAdviceCells, the operator logging
// "NotSatisfiedHeadExpectations"). A TrainJob's says to delete it with
// kubectl's default cascade (Trainer v2.2.0 re-creates the JobSet of a
// TrainJob deleted with foreground cascade). Other kinds' advice does not.
func TestKubeRayRecreateNote(t *testing.T) {
	if !strings.Contains(recreateNote("RayCluster"), "half a minute") || !strings.Contains(recreateNote("RayJob"), "half a minute") {
		t.Errorf("no KubeRay note: %q", recreateNote("RayCluster"))
	}
	if !strings.Contains(recreateNote("TrainJob"), "--cascade=foreground") {
		t.Errorf("no Trainer note: %q", recreateNote("TrainJob"))
	}
	if n := recreateNote("PyTorchJob"); n != "" {
		t.Errorf("a PyTorchJob gets a note: %q", n)
	}
	if fix := stepsFix(t, PodGroupsOff, "tune", rayJobTooBig()...); !strings.Contains(fix, recreateNote("RayJob")) {
		t.Errorf("the RayJob's advice lacks the KubeRay note:\n%s", fix)
	}
}

// rayJobTooBig is the dump of RayJob ml/tune's cluster: a CPU-only head
// and five workers of 4 GPUs, 20 GPUs, more than any zone has (us-east-1a
// 16): the Kueue advice.
func rayJobTooBig() []map[string]any {
	const ns = "ml"
	lbl := func(typ, group string) map[string]string {
		return map[string]string{"ray.io/cluster": "tune-x", "ray.io/node-type": typ, "ray.io/group": group}
	}
	ray := []map[string]any{
		dumpPod{name: "tune-x-head", node: "cpu-a1", owner: [2]string{"RayCluster", "tune-x"}, labels: lbl("head", "headgroup")}.object(ns),
		owned("ray.io/v1", "RayCluster", ns, "tune-x", "ray.io/v1", "RayJob", "tune", nil),
	}
	for i, node := range []string{"gpu-a1", "gpu-a1", "gpu-a2", "gpu-b1", "gpu-c1"} {
		ray = append(ray, dumpPod{name: fmt.Sprintf("tune-x-gpu-%d", i), node: node, gpus: 4, owner: [2]string{"RayCluster", "tune-x"}, labels: lbl("worker", "gpu")}.object(ns))
	}
	return ray
}
