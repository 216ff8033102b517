package topology

import (
	"strconv"
	"testing"
)

// The fixtures below build pods the way each controller does. Each
// builder cites the upstream file and version it follows; read there, not
// copied.

// kubeflowPod: kubeflow/training-operator v1.9.0
// pkg/controller.v1/common/pod.go createNewPod (GenLabels in
// common/job_controller.go: operator-name, job-name; replica-type lower
// case, replica-index; job-role=master when IsMasterRole), owned by the
// job (kind PyTorchJob, PaddleJob, ...).
func kubeflowPod(kind, operator, job, rtype string, index int, master bool) PodMeta {
	l := map[string]string{
		"training.kubeflow.org/operator-name": operator,
		"training.kubeflow.org/job-name":      job,
		"training.kubeflow.org/replica-type":  rtype,
		"training.kubeflow.org/replica-index": strconv.Itoa(index),
	}
	if master {
		l["training.kubeflow.org/job-role"] = "master"
	}
	return PodMeta{Namespace: "ml", Labels: l, Owner: &OwnerRef{APIVersion: "kubeflow.org/v1", Kind: kind, Name: job}}
}

// jobsetPod: sigs.k8s.io/jobset v0.12.0 pkg/controllers/jobset_controller.go
// labelAndAnnotateObject (jobset-name, replicatedjob-name, job-index, ...
// as labels and annotations; jobset.sigs.k8s.io/coordinator =
// CoordinatorEndpoint "<js>-<rjob>-<jobIdx>-<podIdx>.<subdomain>" when
// spec.coordinator is set), child Job "<js>-<rjob>-<jobIdx>"
// (placement.GenJobName); then the Job controller (k8s.io/kubernetes
// v1.37.2 pkg/controller/job/job_controller.go manageJob and
// indexed_job_utils.go): completion index annotation and label,
// spec.hostname "<job>-<index>", owner the Job.
func jobsetPod(js, rjob string, jobIdx, podIdx int, coordinator string) PodMeta {
	job := js + "-" + rjob + "-" + strconv.Itoa(jobIdx)
	common := map[string]string{
		"jobset.sigs.k8s.io/jobset-name":            js,
		"jobset.sigs.k8s.io/replicatedjob-name":     rjob,
		"jobset.sigs.k8s.io/job-index":              strconv.Itoa(jobIdx),
		"jobset.sigs.k8s.io/restart-attempt":        "0",
		"jobset.sigs.k8s.io/replicatedjob-replicas": "1",
		"batch.kubernetes.io/job-name":              job,
		"job-name":                                  job,
		LabelCompletionIndex:                        strconv.Itoa(podIdx),
	}
	if coordinator != "" {
		common["jobset.sigs.k8s.io/coordinator"] = coordinator
	}
	labels, ann := map[string]string{}, map[string]string{}
	for k, v := range common {
		labels[k], ann[k] = v, v
	}
	delete(ann, "batch.kubernetes.io/job-name")
	delete(ann, "job-name")
	return PodMeta{Namespace: "ml", Labels: labels, Annotations: ann, Hostname: job + "-" + strconv.Itoa(podIdx),
		Owner: &OwnerRef{APIVersion: "batch/v1", Kind: "Job", Name: job}}
}

// lwsPod: sigs.k8s.io/lws v0.10.0. Leader StatefulSet "<lws>" (pod
// "<lws>-<g>", labels name and worker-index 0 from
// pkg/controllers/leaderworkerset_controller.go; group-index and group-key
// added by pkg/webhooks/pod_webhook.go), worker StatefulSet "<lws>-<g>"
// (pkg/controllers/pod_controller.go constructWorkerStatefulSetApplyConfiguration:
// name, group-index, group-key; the webhook adds worker-index from the
// ordinal), annotation leaderworkerset.sigs.k8s.io/size.
func lwsPod(lws string, group, worker int) PodMeta {
	g := strconv.Itoa(group)
	sts := lws
	if worker > 0 {
		sts = lws + "-" + g
	}
	return PodMeta{Namespace: "serve", Labels: map[string]string{
		"leaderworkerset.sigs.k8s.io/name":         lws,
		"leaderworkerset.sigs.k8s.io/group-index":  g,
		"leaderworkerset.sigs.k8s.io/group-key":    "1a2b3c" + g,
		"leaderworkerset.sigs.k8s.io/worker-index": strconv.Itoa(worker),
	}, Annotations: map[string]string{"leaderworkerset.sigs.k8s.io/size": "4"},
		Owner: &OwnerRef{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts}}
}

// volcanoPod: volcano.sh/volcano v1.15.0 pkg/controllers/job/job_controller_util.go
// createJobPod (labels and annotations volcano.sh/job-name, task-spec =
// the task name, task-index; owner batch.volcano.sh Job).
func volcanoPod(job, task string, index int) PodMeta {
	m := map[string]string{"volcano.sh/job-name": job, "volcano.sh/task-spec": task,
		"volcano.sh/task-index": strconv.Itoa(index), "volcano.sh/job-namespace": "ml", "volcano.sh/queue-name": "default"}
	return PodMeta{Namespace: "ml", Labels: m, Annotations: m,
		Owner: &OwnerRef{APIVersion: "batch.volcano.sh/v1alpha1", Kind: "Job", Name: job}}
}

// rayPod: ray-project/kuberay v1.7.0 ray-operator/controllers/ray/common/pod.go
// labelPod (ray.io/cluster, ray.io/node-type head|worker, ray.io/group),
// owned by the RayCluster.
func rayPod(cluster, nodeType, group string) PodMeta {
	return PodMeta{Namespace: "ray", Labels: map[string]string{
		"ray.io/cluster": cluster, "ray.io/node-type": nodeType, "ray.io/group": group, "ray.io/is-ray-node": "yes",
		"app.kubernetes.io/created-by": "kuberay-operator",
	}, Owner: &OwnerRef{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: cluster}}
}

// raySubmitter: kuberay v1.7.0 ray-operator/controllers/ray/rayjob_controller.go
// getSubmitterTemplate (pod labels ray.io/originated-from-cr-name,
// ray.io/originated-from-crd=RayJob) and createNewK8sJob (batch Job named
// like the RayJob, owned by it); the Job controller adds job-name labels.
func raySubmitter(rayjob string) PodMeta {
	return PodMeta{Namespace: "ray", Labels: map[string]string{
		"ray.io/originated-from-cr-name": rayjob, "ray.io/originated-from-crd": "RayJob",
		"app.kubernetes.io/created-by": "kuberay-operator",
		"batch.kubernetes.io/job-name": rayjob, "job-name": rayjob, "batch.kubernetes.io/controller-uid": "u",
	}, Owner: &OwnerRef{APIVersion: "batch/v1", Kind: "Job", Name: rayjob}}
}

// raySubmitterV16: KubeRay v1.6.0, the version the test bed runs
// (internal/trainlab TestRealMPIAndRay): rayjob_controller.go
// createNewK8sJob puts ray.io/originated-from-cr-name and
// originated-from-crd=RayJob on the Job object only, and
// common/job.go GetSubmitterTemplate gives its pod template no label: the
// pod carries only the Job controller's labels and its owner reference.
func raySubmitterV16(rayjob string) PodMeta {
	return PodMeta{Namespace: "ray", Labels: map[string]string{
		"batch.kubernetes.io/job-name": rayjob, "job-name": rayjob, "batch.kubernetes.io/controller-uid": "u", "controller-uid": "u",
	}, Owner: &OwnerRef{APIVersion: "batch/v1", Kind: "Job", Name: rayjob}}
}

// batchPod: a plain batch Job's pod (k8s.io/kubernetes v1.37.2
// pkg/controller/job). index < 0: not Indexed. labelIndex false: the
// completion index only as an annotation (before 1.28, or PodIndexLabel off).
func batchPod(job string, index int, labelIndex bool) PodMeta {
	p := PodMeta{Namespace: "etl", Labels: map[string]string{"batch.kubernetes.io/job-name": job, "job-name": job},
		Annotations: map[string]string{}, Owner: &OwnerRef{APIVersion: "batch/v1", Kind: "Job", Name: job}}
	if index >= 0 {
		p.Annotations[LabelCompletionIndex] = strconv.Itoa(index)
		if labelIndex {
			p.Labels[LabelCompletionIndex] = strconv.Itoa(index)
		}
	}
	return p
}

// ownerMap is a table of owner objects' controller references.
type ownerMap map[OwnerRef]OwnerRef

func (m ownerMap) ControllerOf(_ string, o OwnerRef) (OwnerRef, bool) {
	r, ok := m[o]
	return r, ok
}

func TestIdentify(t *testing.T) {
	mpiLauncher := PodMeta{Namespace: "ml", Labels: map[string]string{ // mpi-operator v0.8.0 pkg/controller/mpi_job_controller.go newLauncherPodTemplate
		"batch.kubernetes.io/job-name": "pi-launcher", "job-name": "pi-launcher",
		"training.kubeflow.org/job-name": "pi", "training.kubeflow.org/job-role": "launcher",
		"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/replica-index": "0",
	}, Owner: &OwnerRef{APIVersion: "batch/v1", Kind: "Job", Name: "pi-launcher"}}
	mpiWorker := PodMeta{Namespace: "ml", Labels: map[string]string{ // newWorker: defaultLabels(worker) + replica-index
		"training.kubeflow.org/job-name": "pi", "training.kubeflow.org/job-role": "worker",
		"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/replica-index": "0",
	}, Owner: &OwnerRef{APIVersion: "kubeflow.org/v2beta1", Kind: "MPIJob", Name: "pi"}}
	noOwner := func(p PodMeta) PodMeta { p.Owner = nil; return p }

	// Owner objects as the controllers create them: Trainer v2.3.0
	// pkg/runtime/framework/plugins/jobset/jobset.go builds a JobSet named
	// like the TrainJob and owned by it; JobSet v0.12.0 owns its Jobs;
	// KubeRay v1.7.0 rayjob_controller.go constructRayClusterForRayJob owns
	// "<rayjob>-<random>"; mpi-operator owns "<mpijob>-launcher".
	owners := ownerMap{
		{APIVersion: "batch/v1", Kind: "Job", Name: "llm-node-0"}:             {APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llm"},
		{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llm"}: {APIVersion: "trainer.kubeflow.org/v1alpha1", Kind: "TrainJob", Name: "llm"},
		{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "tune-x7k2p"}:     {APIVersion: "ray.io/v1", Kind: "RayJob", Name: "tune"},
		{APIVersion: "batch/v1", Kind: "Job", Name: "tune"}:                   {APIVersion: "ray.io/v1", Kind: "RayJob", Name: "tune"},
		{APIVersion: "batch/v1", Kind: "Job", Name: "pi-launcher"}:            {APIVersion: "kubeflow.org/v2beta1", Kind: "MPIJob", Name: "pi"},
		{APIVersion: "batch/v1", Kind: "Job", Name: "nightly"}:                {APIVersion: "argoproj.io/v1alpha1", Kind: "Workflow", Name: "etl"},
	}

	cases := []struct {
		name   string
		pod    PodMeta
		owners Owners
		want   Identity
		ok     bool
	}{
		{name: "PyTorchJob master", pod: kubeflowPod("PyTorchJob", "pytorchjob-controller", "bert", "master", 0, true),
			want: Identity{Kind: "PyTorchJob", Name: "bert", Role: RoleCoordinator, ReplicaType: "master"}, ok: true},
		{name: "PyTorchJob worker 3", pod: kubeflowPod("PyTorchJob", "pytorchjob-controller", "bert", "worker", 3, false),
			want: Identity{Kind: "PyTorchJob", Name: "bert", Role: RoleWorker, ReplicaType: "worker"}, ok: true},
		{name: "TFJob chief", pod: kubeflowPod("TFJob", "tfjob-controller", "mnist", "chief", 0, false),
			want: Identity{Kind: "TFJob", Name: "mnist", Role: RoleCoordinator, ReplicaType: "chief"}, ok: true},
		{name: "TFJob ps 0 is no guess", pod: kubeflowPod("TFJob", "tfjob-controller", "mnist", "ps", 0, false),
			want: Identity{Kind: "TFJob", Name: "mnist", Role: RoleWorker, ReplicaType: "ps"}, ok: true},
		// Point 4: training-operator v1.9.0 pkg/controller.v1/paddlepaddle/envvar.go:
		// with no Master replica spec ("Collective mode") PADDLE_MASTER is
		// worker 0; IsMasterRole is true only for Master, so no pod has
		// job-role=master. Shape of examples/paddlepaddle/simple-gpu.yaml (Worker only).
		{name: "PaddleJob collective worker 0", pod: kubeflowPod("PaddleJob", "paddlejob-controller", "paddle-simple-gpu", "worker", 0, false),
			want: Identity{Kind: "PaddleJob", Name: "paddle-simple-gpu", Role: RoleCoordinator, ReplicaType: "worker", Guess: true}, ok: true},
		{name: "PaddleJob collective worker 1", pod: kubeflowPod("PaddleJob", "paddlejob-controller", "paddle-simple-gpu", "worker", 1, false),
			want: Identity{Kind: "PaddleJob", Name: "paddle-simple-gpu", Role: RoleWorker, ReplicaType: "worker"}, ok: true},
		// JAXJob: training-operator v1.9.0 pkg/controller.v1/jax/envvar.go
		// COORDINATOR_ADDRESS = worker 0.
		{name: "JAXJob worker 0", pod: kubeflowPod("JAXJob", "jaxjob-controller", "jx", "worker", 0, false),
			want: Identity{Kind: "JAXJob", Name: "jx", Role: RoleCoordinator, ReplicaType: "worker", Guess: true}, ok: true},
		{name: "MPIJob v2 launcher, kind from operator-name", pod: mpiLauncher,
			want: Identity{Kind: "MPIJob", Name: "pi", Role: RoleCoordinator, ReplicaType: "launcher"}, ok: true},
		{name: "MPIJob v2 launcher, kind from its Job's owner", pod: mpiLauncher, owners: owners,
			want: Identity{Kind: "MPIJob", Name: "pi", Role: RoleCoordinator, ReplicaType: "launcher"}, ok: true},
		// Worker 0 is a rank-0 guess; the index gives way to the launcher
		// (TestIndexRoleGuessYields).
		{name: "MPIJob v2 worker 0 is only a guess", pod: mpiWorker,
			want: Identity{Kind: "MPIJob", Name: "pi", Role: RoleCoordinator, ReplicaType: "worker", Guess: true}, ok: true},

		{name: "JobSet rank 0 of a single replicated job", pod: jobsetPod("pytorch", "workers", 0, 0, ""),
			want: Identity{Kind: "JobSet", Name: "pytorch", Role: RoleCoordinator, ReplicaType: "workers", Guess: true}, ok: true},
		{name: "JobSet worker", pod: jobsetPod("pytorch", "workers", 0, 2, ""),
			want: Identity{Kind: "JobSet", Name: "pytorch", Role: RoleWorker, ReplicaType: "workers"}, ok: true},
		{name: "JobSet replicated job named Driver", pod: jobsetPod("tr", "Driver", 0, 0, ""),
			want: Identity{Kind: "JobSet", Name: "tr", Role: RoleCoordinator, ReplicaType: "driver"}, ok: true},
		// Point 2: spec.coordinator {replicatedJob: workers, jobIndex: 1,
		// podIndex: 2}: the label names "<js>-workers-1-2.<subdomain>".
		{name: "JobSet coordinator label names this pod", pod: jobsetPod("tr", "workers", 1, 2, "tr-workers-1-2.tr"),
			want: Identity{Kind: "JobSet", Name: "tr", Role: RoleCoordinator, ReplicaType: "workers"}, ok: true},
		{name: "JobSet coordinator label beats rank 0", pod: jobsetPod("tr", "workers", 0, 0, "tr-workers-1-2.tr"),
			want: Identity{Kind: "JobSet", Name: "tr", Role: RoleWorker, ReplicaType: "workers"}, ok: true},
		{name: "JobSet coordinator label beats the name driver", pod: jobsetPod("tr", "driver", 0, 0, "tr-workers-1-2.tr"),
			want: Identity{Kind: "JobSet", Name: "tr", Role: RoleWorker, ReplicaType: "driver"}, ok: true},
		{name: "JobSet coordinator label, hostname from job-name and index", pod: func() PodMeta {
			p := jobsetPod("tr", "workers", 1, 2, "tr-workers-1-2.tr")
			p.Hostname = ""
			return p
		}(), want: Identity{Kind: "JobSet", Name: "tr", Role: RoleCoordinator, ReplicaType: "workers"}, ok: true},
		// Point 3: Trainer v2.3.0 manifests/base/runtimes/deepspeed_distributed.yaml
		// and mlx_distributed.yaml (runLauncherAsNode: true): replicated
		// jobs "node" (sshd) and "launcher" (mpirun).
		{name: "Trainer MPI launcher", pod: jobsetPod("ds", "launcher", 0, 0, ""),
			want: Identity{Kind: "JobSet", Name: "ds", Role: RoleCoordinator, ReplicaType: "launcher"}, ok: true},
		{name: "Trainer MPI node 0-0 is only a guess", pod: jobsetPod("ds", "node", 0, 0, ""),
			want: Identity{Kind: "JobSet", Name: "ds", Role: RoleCoordinator, ReplicaType: "node", Guess: true}, ok: true},
		// Trainer v2.3.0 pkg/constants/constants.go DatasetInitializer,
		// ModelInitializer: replicated jobs that run before the trainer.
		{name: "Trainer dataset initializer 0-0", pod: jobsetPod("llm", "dataset-initializer", 0, 0, ""),
			want: Identity{Kind: "JobSet", Name: "llm", Role: RoleWorker, ReplicaType: "dataset-initializer"}, ok: true},
		// Point 9: Job -> JobSet -> TrainJob.
		{name: "TrainJob over JobSet over Job", pod: jobsetPod("llm", "node", 0, 1, ""), owners: owners,
			want: Identity{Kind: "TrainJob", Name: "llm", Role: RoleWorker, ReplicaType: "node"}, ok: true},

		// Point 1: LeaderWorkerSet groups.
		{name: "LWS group 0 leader", pod: lwsPod("vllm", 0, 0),
			want: Identity{Kind: "LeaderWorkerSet", Name: "vllm-0", Set: "vllm", Role: RoleCoordinator}, ok: true},
		{name: "LWS group 2 worker 3", pod: lwsPod("vllm", 2, 3),
			want: Identity{Kind: "LeaderWorkerSet", Name: "vllm-2", Set: "vllm", Role: RoleWorker}, ok: true},

		// Point 5: Volcano v1.15.0 docs/user-guide/how_to_use_mpi_plugin.md and
		// example/integrations/mpi/mpi-example.yaml name the tasks
		// mpimaster/mpiworker; the pytorch, ray and tensorflow plugins
		// (pkg/controllers/job/plugins/distributed-framework/*) default to
		// master, head and chief.
		{name: "Volcano mpimaster", pod: volcanoPod("lm-mpi-job", "mpimaster", 0),
			want: Identity{Kind: "VolcanoJob", Name: "lm-mpi-job", Role: RoleCoordinator, ReplicaType: "mpimaster"}, ok: true},
		{name: "Volcano mpiworker", pod: volcanoPod("lm-mpi-job", "mpiworker", 0),
			want: Identity{Kind: "VolcanoJob", Name: "lm-mpi-job", Role: RoleWorker, ReplicaType: "mpiworker"}, ok: true},
		{name: "Volcano pytorch master", pod: volcanoPod("pt", "master", 0),
			want: Identity{Kind: "VolcanoJob", Name: "pt", Role: RoleCoordinator, ReplicaType: "master"}, ok: true},
		{name: "Volcano ray head", pod: volcanoPod("rj", "head", 0),
			want: Identity{Kind: "VolcanoJob", Name: "rj", Role: RoleCoordinator, ReplicaType: "head"}, ok: true},
		{name: "Volcano tensorflow chief suffix", pod: volcanoPod("tf", "tfchief", 0),
			want: Identity{Kind: "VolcanoJob", Name: "tf", Role: RoleCoordinator, ReplicaType: "tfchief"}, ok: true},
		{name: "Volcano ps", pod: volcanoPod("tf", "ps", 0),
			want: Identity{Kind: "VolcanoJob", Name: "tf", Role: RoleWorker, ReplicaType: "ps"}, ok: true},

		{name: "Ray head", pod: rayPod("rc", "head", "headgroup"),
			want: Identity{Kind: "RayCluster", Name: "rc", Role: RoleCoordinator, ReplicaType: "head"}, ok: true},
		// Point 9: RayJob over RayCluster.
		{name: "Ray worker of a RayJob's cluster", pod: rayPod("tune-x7k2p", "worker", "gpu"), owners: owners,
			want: Identity{Kind: "RayJob", Name: "tune", Role: RoleWorker, ReplicaType: "worker"}, ok: true},
		// Point 8: the submitter belongs to the RayJob.
		{name: "RayJob submitter", pod: raySubmitter("tune"),
			want: Identity{Kind: "RayJob", Name: "tune", Role: RoleWorker, MinPods: 2}, ok: true},

		// KubeRay v1.6.0: the submitter's pod names no RayJob; its Job's
		// owner does. Without the owners it is a plain Job's pod: none.
		{name: "RayJob submitter, KubeRay v1.6.0, through its Job's owner", pod: raySubmitterV16("tune"), owners: owners,
			want: Identity{Kind: "RayJob", Name: "tune", Role: RoleWorker, MinPods: 2}, ok: true},
		{name: "RayJob submitter, KubeRay v1.6.0, no owners known", pod: raySubmitterV16("tune"), ok: false},
		{name: "plain Job of another top owner stays out", pod: batchPod("nightly", -1, false), owners: owners, ok: false},

		// Points 7 and 10: batch Jobs.
		{name: "batch Job indexed", pod: batchPod("etl", 1, true),
			want: Identity{Kind: "Job", Name: "etl", Role: RoleWorker, MinPods: 2}, ok: true},
		{name: "batch Job index 0 from the annotation", pod: batchPod("etl", 0, false),
			want: Identity{Kind: "Job", Name: "etl", Role: RoleCoordinator, Guess: true, MinPods: 2}, ok: true},
		{name: "batch Job not indexed (work queue, cron run)", pod: batchPod("queue", -1, false), ok: false},
		{name: "JobSet rank 0 from annotations only", pod: func() PodMeta {
			p := jobsetPod("old", "w", 0, 0, "")
			delete(p.Labels, LabelCompletionIndex)
			return p
		}(), want: Identity{Kind: "JobSet", Name: "old", Role: RoleCoordinator, ReplicaType: "w", Guess: true}, ok: true},
		{name: "pod of no job", pod: PodMeta{Labels: map[string]string{"app": "frontend", "pod-template-hash": "5d8f7"},
			Owner: &OwnerRef{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "frontend-5d8f7"}}, ok: false},
		{name: "Kubeflow pod without owner reference", pod: noOwner(kubeflowPod("PyTorchJob", "pytorchjob-controller", "bert", "worker", 1, false)),
			want: Identity{Kind: "PyTorchJob", Name: "bert", Role: RoleWorker, ReplicaType: "worker"}, ok: true},
	}
	rules := DefaultRules()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := Identify(rules, c.pod, c.owners)
			if ok != c.ok || got != c.want {
				t.Fatalf("Identify = %+v, %v; want %+v, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestParseRule(t *testing.T) {
	r, err := ParseRule("name=example.com/job,kind=MyJob,role=example.com/role|example.com/type,rank0=example.com/rank")
	if err != nil {
		t.Fatal(err)
	}
	id, ok := Identify([]Rule{r}, PodMeta{Labels: map[string]string{"example.com/job": "j1", "example.com/type": "Leader"}}, nil)
	if !ok || id.Kind != "MyJob" || id.Role != RoleCoordinator || id.ReplicaType != "leader" {
		t.Fatalf("custom rule: %+v %v", id, ok)
	}
	for _, bad := range []string{"", "kind=X", "name=a", "name=a,kind=B,colour=red", "name", "name=a,kind=B,minpods=-1", "name=a,kind=B,indexed=maybe"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}

// TestParseRuleSiteController: point 11, a site's own controller with a
// coordinator label, a group label and a minimum size.
func TestParseRuleSiteController(t *testing.T) {
	r, err := ParseRule("name=example.com/job,kind=SiteJob,coordinator=example.com/role=rendezvous,group=example.com/replica,minpods=2")
	if err != nil {
		t.Fatal(err)
	}
	pod := func(role, replica string) PodMeta {
		return PodMeta{Labels: map[string]string{"example.com/job": "svc", "example.com/role": role, "example.com/replica": replica}}
	}
	id, ok := Identify([]Rule{r}, pod("rendezvous", "1"), nil)
	if want := (Identity{Kind: "SiteJob", Name: "svc-1", Set: "svc", Role: RoleCoordinator, MinPods: 2}); !ok || id != want {
		t.Fatalf("coordinator: %+v %v, want %+v", id, ok, want)
	}
	id, _ = Identify([]Rule{r}, pod("member", "1"), nil)
	if id.Role != RoleWorker || id.Name != "svc-1" {
		t.Fatalf("member: %+v", id)
	}

	host, err := ParseRule("name=example.com/job,kind=SiteJob,coordinator=example.com/coordinator-host,indexed=true")
	if err != nil {
		t.Fatal(err)
	}
	p := PodMeta{Labels: map[string]string{"example.com/job": "j", "example.com/coordinator-host": "j-3.svc"}, Hostname: "j-3",
		Annotations: map[string]string{LabelCompletionIndex: "3"}}
	if id, ok := Identify([]Rule{host}, p, nil); !ok || id.Role != RoleCoordinator {
		t.Fatalf("hostname coordinator: %+v %v", id, ok)
	}
	delete(p.Annotations, LabelCompletionIndex)
	if _, ok := Identify([]Rule{host}, p, nil); ok {
		t.Fatal("indexed=true accepted a pod without a completion index")
	}
}

func TestKeys(t *testing.T) {
	keys := Keys(DefaultRules())
	for _, k := range []string{"jobset.sigs.k8s.io/coordinator", LabelCompletionIndex, "leaderworkerset.sigs.k8s.io/group-index",
		"ray.io/originated-from-crd", "training.kubeflow.org/replica-index", "batch.kubernetes.io/job-name", LabelMultiZone} {
		if !contains(keys, k) {
			t.Errorf("Keys lacks %s", k)
		}
	}
}

func TestParseRules(t *testing.T) {
	if r, err := ParseRules(nil); err != nil || len(r) != len(DefaultRules()) {
		t.Errorf("no flags: %d rules, %v; want the %d built-in ones", len(r), err, len(DefaultRules()))
	}
	r, err := ParseRules([]string{"name=example.com/job,kind=SiteJob", "name=other.io/run,kind=Run"})
	if err != nil || len(r) != 2 || r[0].Kind != "SiteJob" || r[1].Kind != "Run" {
		t.Errorf("two flags: %+v, %v", r, err)
	}
	if _, err := ParseRules([]string{"name=example.com/job,kind=SiteJob", "kind=NoName"}); err == nil {
		t.Error("a bad rule among good ones parsed")
	}
}

// TestIdentifyMultiZone: the zonewatch.io/multi-zone label, else the
// annotation, is carried in the identity; without it the value is empty.
func TestIdentifyMultiZone(t *testing.T) {
	base := map[string]string{"leaderworkerset.sigs.k8s.io/name": "serve", "leaderworkerset.sigs.k8s.io/group-index": "0"}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	for _, c := range []struct {
		name        string
		labels, ann map[string]string
		want        string
	}{
		{"none", base, nil, ""},
		{"label", with(base, LabelMultiZone, MultiZoneIntentional), nil, MultiZoneIntentional},
		{"annotation", base, map[string]string{LabelMultiZone: MultiZoneIntentional}, MultiZoneIntentional},
		{"label wins", with(base, LabelMultiZone, "reviewed"), map[string]string{LabelMultiZone: MultiZoneIntentional}, "reviewed"},
	} {
		id, ok := Identify(DefaultRules(), PodMeta{Namespace: "serving", Labels: c.labels, Annotations: c.ann}, nil)
		if !ok || id.MultiZone != c.want {
			t.Errorf("%s: %+v %v, want MultiZone %q", c.name, id, ok, c.want)
		}
	}
}
