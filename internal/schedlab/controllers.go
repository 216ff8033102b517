package schedlab

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubeflow: Kubeflow Training Operator v1 (training-operator v1.9.0
// pkg/controller.v1/common/pod.go): pods "<job>-<type>-<index>" owned by
// the job, labelled with the job name, operator, replica type and index,
// and job-role=master on the coordinator.
func kubeflow(name, kind, apiVersion, field, coord, operator string) *Shape {
	s := &Shape{Name: name, Kind: kind}
	s.manifest = func(job string, sz Size) map[string]any {
		m := meta(kind, apiVersion, job)
		m["spec"] = map[string]any{field: map[string]any{
			coord:    map[string]any{"replicas": 1, "restartPolicy": "OnFailure", "template": podTemplate(strings.ToLower(kind), false, sz, "OnFailure")},
			"Worker": map[string]any{"replicas": sz.Workers, "restartPolicy": "OnFailure", "template": podTemplate(strings.ToLower(kind), true, sz, "OnFailure")},
		}}
		return m
	}
	s.templates = func(j *Job) []Template {
		var out []Template
		specs := Dig(j.Manifest, "spec", field)
		for _, key := range sortedKeys(specs) {
			t := Dig(specs, key, "template")
			out = append(out, Template{Path: field + "." + key, T: t, GPU: gpuTemplate(t)})
		}
		return out
	}
	s.pods = func(j *Job) (coords, workers []*corev1.Pod, _ []map[string]any, _ error) {
		specs := Dig(j.Manifest, "spec", field)
		owner := ownerRef(apiVersion, kind, j.Name)
		for _, key := range sortedKeys(specs) {
			rs := Dig(specs, key)
			rt := strings.ToLower(key)
			ps, err := replicas(j, j.Name+"-"+rt, intOf(rs["replicas"], 1), Dig(rs, "template"), func(i int) map[string]string {
				lbl := map[string]string{
					"training.kubeflow.org/operator-name": operator, "training.kubeflow.org/job-name": j.Name,
					"training.kubeflow.org/replica-type": rt, "training.kubeflow.org/replica-index": strconv.Itoa(i),
				}
				if key == coord {
					lbl["training.kubeflow.org/job-role"] = "master"
				}
				return lbl
			}, nil, owner)
			if err != nil {
				return nil, nil, nil, err
			}
			if key == coord {
				coords = append(coords, ps...)
			} else {
				workers = append(workers, ps...)
			}
		}
		return coords, workers, nil, nil
	}
	return s
}

// replicas makes the n pods "<prefix>-<i>" of a replica set from tmpl,
// with labels(i) and annotations ann, each named as its host in the job's
// subdomain (the headless service the operator makes).
func replicas(j *Job, prefix string, n int, tmpl map[string]any, labels func(i int) map[string]string, ann map[string]string, owner metav1.OwnerReference) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for i := 0; i < n; i++ {
		p, err := newPod(j, fmt.Sprintf("%s-%d", prefix, i), tmpl, labels(i), ann, owner)
		if err != nil {
			return nil, err
		}
		p.Spec.Hostname, p.Spec.Subdomain = p.Name, j.Name
		out = append(out, p)
	}
	return out, nil
}

// mpiV2: mpi-operator v2beta1 (v0.8.0 pkg/controller/mpi_job_controller.go):
// workers are pods "<job>-worker-<i>" owned by the MPIJob; the launcher is
// a batch Job "<job>-launcher" owned by the MPIJob, whose pod the Job
// controller names "<job>-launcher-<random>" and labels with its own keys.
func mpiV2() *Shape {
	const apiVersion = "kubeflow.org/v2beta1"
	s := kubeflow("MPIJob v2beta1", "MPIJob", apiVersion, "mpiReplicaSpecs", "Launcher", "mpi-operator")
	s.pods = func(j *Job) (coords, workers []*corev1.Pod, owners []map[string]any, _ error) {
		specs := Dig(j.Manifest, "spec", "mpiReplicaSpecs")
		mpi := ownerRef(apiVersion, "MPIJob", j.Name)
		base := map[string]string{"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/job-name": j.Name}
		launcher := j.Name + "-launcher"
		// No replica-index on the launcher: mpi-operator v0.8.0 sets it
		// ("0") only with runLauncherAsWorker (newLauncherPodTemplate),
		// as TestRealMPIAndRay's MPI Operator showed.
		lbl := map[string]string{"training.kubeflow.org/job-role": "launcher",
			"batch.kubernetes.io/job-name": launcher, "job-name": launcher,
			"batch.kubernetes.io/controller-uid": string(uid("Job", launcher)), "controller-uid": string(uid("Job", launcher))}
		for k, v := range base {
			lbl[k] = v
		}
		p, err := newPod(j, launcher+"-x7k2p", Dig(specs, "Launcher", "template"), lbl, nil, ownerRef("batch/v1", "Job", launcher))
		if err != nil {
			return nil, nil, nil, err
		}
		p.Spec.Hostname, p.Spec.Subdomain = launcher, j.Name
		coords = append(coords, p)
		owners = append(owners, ownerObject("batch/v1", "Job", j.Namespace, launcher, mpi))
		workers, err = replicas(j, j.Name+"-worker", intOf(Dig(specs, "Worker")["replicas"], 1), Dig(specs, "Worker", "template"), func(i int) map[string]string {
			lbl := map[string]string{"training.kubeflow.org/job-role": "worker", "training.kubeflow.org/replica-index": strconv.Itoa(i)}
			for k, v := range base {
				lbl[k] = v
			}
			return lbl
		}, nil, mpi)
		if err != nil {
			return nil, nil, nil, err
		}
		return coords, workers, owners, nil
	}
	return s
}

// jobSetPods makes the pods of a JobSet spec (jobset v0.11.1
// pkg/controllers/jobset_controller.go labelAndAnnotateObject, checked
// against the running controller by internal/trainlab's ShapeJobSet): one
// batch Job "<js>-<rjob>-<i>" per replica, Indexed, its pods labelled and
// annotated alike with the JobSet keys (the job key is the SHA-1 of
// "<namespace>/<job>", the group "default" where the spec names none),
// labelled with the pod's priority by JobSet's pod webhook, and with the
// completion index (label and annotation) by the Job controller.
func jobSetPods(j *Job, jsName string, spec map[string]any, extra map[string]string) (coords, workers []*corev1.Pod, jobs []string, err error) {
	rjobs := list(spec, "replicatedJobs")
	group := func(rj map[string]any) string {
		if g, _ := rj["groupName"].(string); g != "" {
			return g
		}
		return "default"
	}
	global, perGroup := 0, map[string]int{}
	for _, rj := range rjobs {
		global += intOf(rj["replicas"], 1)
		perGroup[group(rj)] += intOf(rj["replicas"], 1)
	}
	globalIdx, groupIdx := 0, map[string]int{}
	for _, rj := range rjobs {
		name, _ := rj["name"].(string)
		jobSpec := Dig(rj, "template", "spec")
		tmpl := Dig(jobSpec, "template")
		g := group(rj)
		for r := 0; r < intOf(rj["replicas"], 1); r++ {
			jobName := fmt.Sprintf("%s-%s-%d", jsName, name, r)
			jobs = append(jobs, jobName)
			key := sha1.Sum([]byte(j.Namespace + "/" + jobName))
			js := map[string]string{
				"jobset.sigs.k8s.io/jobset-name": jsName, "jobset.sigs.k8s.io/jobset-uid": string(uid("JobSet", jsName)),
				"jobset.sigs.k8s.io/replicatedjob-name": name, "jobset.sigs.k8s.io/restart-attempt": "0",
				"jobset.sigs.k8s.io/replicatedjob-replicas": strconv.Itoa(intOf(rj["replicas"], 1)),
				"jobset.sigs.k8s.io/global-replicas":        strconv.Itoa(global),
				"jobset.sigs.k8s.io/job-index":              strconv.Itoa(r), "jobset.sigs.k8s.io/job-key": hex.EncodeToString(key[:]),
				"jobset.sigs.k8s.io/job-global-index": strconv.Itoa(globalIdx),
				"jobset.sigs.k8s.io/group-name":       g, "jobset.sigs.k8s.io/group-replicas": strconv.Itoa(perGroup[g]),
				"jobset.sigs.k8s.io/job-group-index": strconv.Itoa(groupIdx[g]),
			}
			globalIdx++
			groupIdx[g]++
			for i := 0; i < intOf(jobSpec["parallelism"], 1); i++ {
				idx := strconv.Itoa(i)
				lbl := map[string]string{
					"batch.kubernetes.io/job-name": jobName, "job-name": jobName,
					"batch.kubernetes.io/controller-uid": string(uid("Job", jobName)), "controller-uid": string(uid("Job", jobName)),
					"batch.kubernetes.io/job-completion-index": idx, "jobset.sigs.k8s.io/priority": "0",
				}
				ann := map[string]string{"batch.kubernetes.io/job-completion-index": idx}
				for k, v := range js {
					lbl[k], ann[k] = v, v
				}
				for k, v := range extra {
					lbl[k] = v
				}
				p, err := newPod(j, fmt.Sprintf("%s-%s-x%d", jobName, idx, i), tmpl, lbl, ann, ownerRef("batch/v1", "Job", jobName))
				if err != nil {
					return nil, nil, nil, err
				}
				p.Spec.Hostname, p.Spec.Subdomain = jobName+"-"+idx, jsName
				if coordinatorName(name) || (r == 0 && i == 0 && len(coords) == 0 && !anyCoordinator(spec)) {
					coords = append(coords, p)
				} else {
					workers = append(workers, p)
				}
			}
		}
	}
	return coords, workers, jobs, nil
}

// coordinatorName: the replicated job names a coordinator (topology's
// coordinator words, the ones used here).
func coordinatorName(s string) bool {
	for _, w := range []string{"leader", "launcher", "coordinator", "driver", "master"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

func anyCoordinator(spec map[string]any) bool {
	for _, rj := range list(spec, "replicatedJobs") {
		if n, _ := rj["name"].(string); coordinatorName(n) {
			return true
		}
	}
	return false
}

func jobSetTemplates(spec map[string]any, prefix string) []Template {
	var out []Template
	for _, rj := range list(spec, "replicatedJobs") {
		t := Dig(rj, "template", "spec", "template")
		out = append(out, Template{Path: fmt.Sprintf("%sreplicatedJobs[%v]", prefix, rj["name"]), T: t, GPU: gpuTemplate(t)})
	}
	return out
}

func jobSet() *Shape {
	const apiVersion = "jobset.x-k8s.io/v1alpha2"
	s := &Shape{Name: "JobSet", Kind: "JobSet"}
	s.manifest = func(name string, sz Size) map[string]any {
		m := meta("JobSet", apiVersion, name)
		m["spec"] = map[string]any{"replicatedJobs": []any{
			map[string]any{"name": "leader", "replicas": 1, "template": map[string]any{"spec": map[string]any{
				"parallelism": 1, "completions": 1, "completionMode": "Indexed", "template": podTemplate("leader", false, sz, "Never")}}},
			map[string]any{"name": "workers", "replicas": 1, "template": map[string]any{"spec": map[string]any{
				"parallelism": sz.Workers, "completions": sz.Workers, "completionMode": "Indexed", "template": podTemplate("worker", true, sz, "Never")}}},
		}}
		return m
	}
	s.templates = func(j *Job) []Template { return jobSetTemplates(Dig(j.Manifest, "spec"), "") }
	s.pods = func(j *Job) (coords, workers []*corev1.Pod, owners []map[string]any, err error) {
		coords, workers, jobs, err := jobSetPods(j, j.Name, Dig(j.Manifest, "spec"), nil)
		for _, jn := range jobs {
			owners = append(owners, ownerObject("batch/v1", "Job", j.Namespace, jn, ownerRef(apiVersion, "JobSet", j.Name)))
		}
		// The JobSet itself, as kubectl get pods,jobsets dumps it: analyze
		// reads from it whether its replicated jobs start in steps.
		js := deepCopy(j.Manifest)
		js["metadata"] = map[string]any{"name": j.Name, "namespace": j.Namespace, "uid": string(uid("JobSet", j.Name))}
		owners = append(owners, js)
		return coords, workers, owners, err
	}
	return s
}

// torchRuntime is the JobSet template of Kubeflow Trainer's
// torch-distributed ClusterTrainingRuntime: one replicated job "node" of
// numNodes GPU pods.
func torchRuntime(sz Size) map[string]any {
	return map[string]any{"replicatedJobs": []any{
		map[string]any{"name": "node", "replicas": 1, "template": map[string]any{"spec": map[string]any{
			"parallelism": sz.Workers, "completions": sz.Workers, "completionMode": "Indexed", "template": podTemplate("node", true, sz, "Never")}}},
	}}
}

// trainJob: Kubeflow Trainer v2.3.0 builds a JobSet "<trainjob>" from its
// runtime, with spec.runtimePatches laid over the runtime's template.
func trainJob() *Shape {
	s := &Shape{Name: "TrainJob (JobSet)", Kind: "TrainJob", AllGPU: true}
	s.manifest = func(name string, sz Size) map[string]any {
		m := meta("TrainJob", "trainer.kubeflow.org/v1alpha1", name)
		m["spec"] = map[string]any{"runtimeRef": map[string]any{"name": "torch-distributed"}, "trainer": map[string]any{"numNodes": sz.Workers}}
		return m
	}
	s.templates = func(j *Job) []Template { return jobSetTemplates(j.Runtime, "runtime.") }
	s.pods = func(j *Job) (coords, workers []*corev1.Pod, owners []map[string]any, err error) {
		spec := deepCopy(j.Runtime)
		for _, rp := range list(Dig(j.Manifest, "spec"), "runtimePatches") {
			if t := Dig(rp, "trainingRuntimeSpec", "template", "spec"); t != nil {
				Merge(spec, t)
			}
		}
		coords, workers, jobs, err := jobSetPods(j, j.Name, spec, map[string]string{"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"})
		js := ownerRef("jobset.x-k8s.io/v1alpha2", "JobSet", j.Name)
		for _, jn := range jobs {
			owners = append(owners, ownerObject("batch/v1", "Job", j.Namespace, jn, js))
		}
		owners = append(owners, ownerObject("jobset.x-k8s.io/v1alpha2", "JobSet", j.Namespace, j.Name, ownerRef("trainer.kubeflow.org/v1alpha1", "TrainJob", j.Name)))
		return coords, workers, owners, err
	}
	return s
}

// lws: LeaderWorkerSet (lws v0.8.0, checked against the running
// controller by internal/trainlab's ShapeLeaderWorkerSet): the leader
// "<lws>-<group>" of the leader StatefulSet "<lws>", workers
// "<lws>-<group>-<i>" of the group's worker StatefulSet "<lws>-<group>";
// each named as its host in the LeaderWorkerSet's shared subdomain
// "<lws>", with the StatefulSet controller's labels. The LWS pod webhook
// (pkg/webhooks/pod_webhook.go) labels them with the group and worker
// index and the group key (SHA-1 of "<namespace>/<leader>"), annotates
// them with the group size (and the workers with their leader) and, with
// the exclusive-topology annotation, gives each pod a required affinity to
// its group and anti-affinity to other groups in the domain.
//
// Where the real controller differs (issue 43, internal/trainlab
// TestAdviceCells): with the exclusive-topology annotation LWS v0.8.0
// creates a group's worker StatefulSet only once the leader pod is
// scheduled (pkg/controllers/pod_controller.go), so its workers come a
// step after the leader; this shape makes them all at once, and its
// leader takes GPUs (a CPU-only leader held to GPU zones must tolerate
// their taints, or the group never gets its workers: seen on the real
// controller). Advice on LWS is proven on the real controller, not here.
func lws() *Shape {
	s := &Shape{Name: "LeaderWorkerSet", Kind: "LeaderWorkerSet", AllGPU: true}
	s.manifest = func(name string, sz Size) map[string]any {
		m := meta("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", name)
		m["spec"] = map[string]any{"replicas": 1, "leaderWorkerTemplate": map[string]any{"size": sz.Workers,
			"leaderTemplate": podTemplate("leader", true, sz, "Always"), "workerTemplate": podTemplate("worker", true, sz, "Always")}}
		return m
	}
	s.templates = func(j *Job) []Template {
		lwt := Dig(j.Manifest, "spec", "leaderWorkerTemplate")
		return []Template{{Path: "leaderTemplate", T: Dig(lwt, "leaderTemplate"), GPU: true}, {Path: "workerTemplate", T: Dig(lwt, "workerTemplate"), GPU: true}}
	}
	s.pods = func(j *Job) (coords, workers []*corev1.Pod, _ []map[string]any, _ error) {
		lwt := Dig(j.Manifest, "spec", "leaderWorkerTemplate")
		topo, _ := Dig(j.Manifest, "metadata")["annotations"].(map[string]any)
		leader := j.Name + "-0"
		sum := sha1.Sum([]byte(j.Namespace + "/" + leader))
		key := hex.EncodeToString(sum[:])
		size := strconv.Itoa(intOf(lwt["size"], 1))
		for i := 0; i < intOf(lwt["size"], 1); i++ {
			tmpl, name, sts, podIndex := Dig(lwt, "workerTemplate"), fmt.Sprintf("%s-%d", leader, i), leader, i
			ann := map[string]string{"leaderworkerset.sigs.k8s.io/size": size, "leaderworkerset.sigs.k8s.io/leader-name": leader}
			if i == 0 {
				tmpl, name, sts, podIndex = Dig(lwt, "leaderTemplate"), leader, j.Name, 0
				delete(ann, "leaderworkerset.sigs.k8s.io/leader-name")
			}
			lbl := map[string]string{"leaderworkerset.sigs.k8s.io/name": j.Name, "leaderworkerset.sigs.k8s.io/group-index": "0",
				"leaderworkerset.sigs.k8s.io/worker-index": strconv.Itoa(i), "leaderworkerset.sigs.k8s.io/group-key": key,
				"leaderworkerset.sigs.k8s.io/template-revision-hash": string(uid("template", j.Name)),
				"apps.kubernetes.io/pod-index":                       strconv.Itoa(podIndex), "statefulset.kubernetes.io/pod-name": name,
				"controller-revision-hash": string(uid("revision", sts))}
			p, err := newPod(j, name, tmpl, lbl, ann, ownerRef("apps/v1", "StatefulSet", sts))
			if err != nil {
				return nil, nil, nil, err
			}
			p.Spec.Hostname, p.Spec.Subdomain = name, j.Name
			if tk, ok := topo["leaderworkerset.sigs.k8s.io/exclusive-topology"].(string); ok {
				exclusive(p, tk, key)
			}
			if i == 0 {
				coords = append(coords, p)
			} else {
				workers = append(workers, p)
			}
		}
		return coords, workers, nil, nil
	}
	return s
}

func exclusive(p *corev1.Pod, topologyKey, groupKey string) {
	const k = "leaderworkerset.sigs.k8s.io/group-key"
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	p.Spec.Affinity.PodAffinity = &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		TopologyKey:   topologyKey,
		LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: k, Operator: "In", Values: []string{groupKey}}}},
	}}}
	p.Spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		TopologyKey: topologyKey,
		LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: k, Operator: "Exists"}, {Key: k, Operator: "NotIn", Values: []string{groupKey}}}},
	}}}
}

// volcano: a Volcano Job (volcano v1.15.0 pkg/controllers/job
// job_controller_util.go): pods "<job>-<task>-<i>" owned by the Job,
// labelled and annotated with the job and task names. Volcano's own
// scheduler is not run: the job names the default scheduler
// (spec.schedulerName), as a Volcano Job may.
func volcano() *Shape {
	const apiVersion = "batch.volcano.sh/v1alpha1"
	s := &Shape{Name: "Volcano Job", Kind: "VolcanoJob"}
	s.manifest = func(name string, sz Size) map[string]any {
		m := meta("Job", apiVersion, name)
		m["spec"] = map[string]any{"schedulerName": "default-scheduler", "minAvailable": sz.Workers + 1, "tasks": []any{
			map[string]any{"name": "mpimaster", "replicas": 1, "template": podTemplate("mpimaster", false, sz, "OnFailure")},
			map[string]any{"name": "mpiworker", "replicas": sz.Workers, "template": podTemplate("mpiworker", true, sz, "OnFailure")},
		}}
		return m
	}
	s.templates = func(j *Job) []Template {
		var out []Template
		for _, t := range list(Dig(j.Manifest, "spec"), "tasks") {
			tt := Dig(t, "template")
			out = append(out, Template{Path: fmt.Sprintf("tasks[%v]", t["name"]), T: tt, GPU: gpuTemplate(tt)})
		}
		return out
	}
	s.pods = func(j *Job) (coords, workers []*corev1.Pod, _ []map[string]any, _ error) {
		owner := ownerRef(apiVersion, "Job", j.Name)
		for _, t := range list(Dig(j.Manifest, "spec"), "tasks") {
			task, _ := t["name"].(string)
			lbl := map[string]string{"volcano.sh/job-name": j.Name, "volcano.sh/job-namespace": j.Namespace, "volcano.sh/task-spec": task, "volcano.sh/queue-name": "default"}
			ann := map[string]string{"volcano.sh/job-name": j.Name, "volcano.sh/task-spec": task, "scheduling.k8s.io/group-name": j.Name + "-" + string(owner.UID)}
			ps, err := replicas(j, j.Name+"-"+task, intOf(t["replicas"], 1), Dig(t, "template"), func(int) map[string]string { return lbl }, ann, owner)
			if err != nil {
				return nil, nil, nil, err
			}
			for _, p := range ps {
				p.Spec.SchedulerName, _ = Dig(j.Manifest, "spec")["schedulerName"].(string)
			}
			if task == "mpimaster" {
				coords = append(coords, ps...)
			} else {
				workers = append(workers, ps...)
			}
		}
		return coords, workers, nil, nil
	}
	return s
}

// rayJob: KubeRay v1.6.0 (rayjob_controller.go, common/pod.go labelPod), as
// internal/trainlab's TestRealMPIAndRay runs it: a RayCluster
// "<rayjob>-<random>" owned by the RayJob; its head and worker pods carry
// the cluster, node type and group labels, not the originated-from labels
// (those are on the RayCluster and the submitter Job objects only; the
// pods were written with them before the real controller ran), so the
// RayJob is found through the owners. The submitter Job comes once the
// cluster is ready; its pod has no Ray label and is left out.
func rayJob() *Shape {
	s := &Shape{Name: "RayJob", Kind: "RayJob"}
	s.manifest = func(name string, sz Size) map[string]any {
		m := meta("RayJob", "ray.io/v1", name)
		m["spec"] = map[string]any{"rayClusterSpec": map[string]any{
			"headGroupSpec":    map[string]any{"template": podTemplate("ray-head", false, sz, "Always")},
			"workerGroupSpecs": []any{map[string]any{"groupName": "gpu", "replicas": sz.Workers, "template": podTemplate("ray-worker", true, sz, "Always")}},
		}}
		return m
	}
	s.templates = func(j *Job) []Template {
		rc := Dig(j.Manifest, "spec", "rayClusterSpec")
		out := []Template{{Path: "headGroupSpec", T: Dig(rc, "headGroupSpec", "template")}}
		for _, g := range list(rc, "workerGroupSpecs") {
			t := Dig(g, "template")
			out = append(out, Template{Path: fmt.Sprintf("workerGroupSpecs[%v]", g["groupName"]), T: t, GPU: gpuTemplate(t)})
		}
		return out
	}
	s.pods = func(j *Job) (coords, workers []*corev1.Pod, owners []map[string]any, _ error) {
		rc := Dig(j.Manifest, "spec", "rayClusterSpec")
		cluster := j.Name + "-x7k2p"
		owner := ownerRef("ray.io/v1", "RayCluster", cluster)
		base := map[string]string{"ray.io/cluster": cluster, "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "kuberay-operator",
			"app.kubernetes.io/name": "kuberay"}
		mk := func(name, nodeType, group string, tmpl map[string]any) (*corev1.Pod, error) {
			lbl := map[string]string{"ray.io/node-type": nodeType, "ray.io/group": group, "ray.io/identifier": cluster + "-" + nodeType}
			for k, v := range base {
				lbl[k] = v
			}
			return newPod(j, name, tmpl, lbl, nil, owner)
		}
		p, err := mk(cluster+"-head-q8rzt", "head", "headgroup", Dig(rc, "headGroupSpec", "template"))
		if err != nil {
			return nil, nil, nil, err
		}
		coords = append(coords, p)
		for _, g := range list(rc, "workerGroupSpecs") {
			group, _ := g["groupName"].(string)
			for i := 0; i < intOf(g["replicas"], 1); i++ {
				p, err := mk(fmt.Sprintf("%s-%s-worker-w%d", cluster, group, i), "worker", group, Dig(g, "template"))
				if err != nil {
					return nil, nil, nil, err
				}
				workers = append(workers, p)
			}
		}
		owners = append(owners, ownerObject("ray.io/v1", "RayCluster", j.Namespace, cluster, ownerRef("ray.io/v1", "RayJob", j.Name)))
		return coords, workers, owners, nil
	}
	return s
}

// indexedJob: a batch Job with completionMode Indexed (k8s v1.37.2
// pkg/controller/job, checked against the running controller by
// internal/trainlab's ShapeIndexedJob): pods "<job>-<index>-<random>"
// with the job's labels, the completion index as label and annotation,
// and the hostname "<job>-<index>".
func indexedJob() *Shape {
	s := &Shape{Name: "Indexed Job", Kind: "Job", AllGPU: true}
	s.manifest = func(name string, sz Size) map[string]any {
		m := meta("Job", "batch/v1", name)
		m["spec"] = map[string]any{"completionMode": "Indexed", "completions": sz.Workers, "parallelism": sz.Workers,
			"template": podTemplate("train", true, sz, "Never")}
		return m
	}
	s.templates = func(j *Job) []Template {
		return []Template{{Path: "template", T: Dig(j.Manifest, "spec", "template"), GPU: true}}
	}
	s.pods = func(j *Job) (coords, workers []*corev1.Pod, _ []map[string]any, _ error) {
		spec := Dig(j.Manifest, "spec")
		for i := 0; i < intOf(spec["parallelism"], 1); i++ {
			idx := strconv.Itoa(i)
			lbl := map[string]string{"batch.kubernetes.io/job-name": j.Name, "job-name": j.Name,
				"batch.kubernetes.io/controller-uid": string(uid("Job", j.Name)), "controller-uid": string(uid("Job", j.Name)),
				"batch.kubernetes.io/job-completion-index": idx}
			p, err := newPod(j, fmt.Sprintf("%s-%s-r%d", j.Name, idx, i), Dig(spec, "template"), lbl,
				map[string]string{"batch.kubernetes.io/job-completion-index": idx}, ownerRef("batch/v1", "Job", j.Name))
			if err != nil {
				return nil, nil, nil, err
			}
			p.Spec.Hostname = j.Name + "-" + idx
			if i == 0 {
				coords = append(coords, p)
			} else {
				workers = append(workers, p)
			}
		}
		return coords, workers, nil, nil
	}
	return s
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
