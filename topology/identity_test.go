package topology

import "testing"

func TestIdentify(t *testing.T) {
	cases := []struct {
		name   string
		labels map[string]string
		owners []Owner
		want   Identity
		ok     bool
	}{
		{
			name: "PyTorchJob master",
			labels: map[string]string{
				"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "master",
				"training.kubeflow.org/replica-index": "0", "training.kubeflow.org/job-role": "master",
				"training.kubeflow.org/operator-name": "pytorchjob-controller",
			},
			owners: []Owner{{Kind: "PyTorchJob", Controller: true}},
			want:   Identity{Kind: "PyTorchJob", Name: "bert", Role: RoleCoordinator, ReplicaType: "master"},
			ok:     true,
		},
		{
			name: "PyTorchJob worker (v1 upper-case replica type)",
			labels: map[string]string{
				"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "Worker",
				"training.kubeflow.org/replica-index": "3",
			},
			owners: []Owner{{Kind: "PyTorchJob", Controller: true}},
			want:   Identity{Kind: "PyTorchJob", Name: "bert", Role: RoleWorker, ReplicaType: "worker"},
			ok:     true,
		},
		{
			name: "MPIJob v2 launcher owned by a batch Job",
			labels: map[string]string{
				"batch.kubernetes.io/job-name": "pi-launcher", "job-name": "pi-launcher",
				"training.kubeflow.org/job-name": "pi", "training.kubeflow.org/job-role": "launcher",
				"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/replica-index": "0",
			},
			owners: []Owner{{Kind: "Job", Controller: true}},
			want:   Identity{Kind: "MPIJob", Name: "pi", Role: RoleCoordinator, ReplicaType: "launcher"},
			ok:     true,
		},
		{
			name: "MPIJob v2 worker",
			labels: map[string]string{
				"training.kubeflow.org/job-name": "pi", "training.kubeflow.org/job-role": "worker",
				"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/replica-index": "1",
			},
			owners: []Owner{{Kind: "MPIJob", Controller: true}},
			want:   Identity{Kind: "MPIJob", Name: "pi", Role: RoleWorker, ReplicaType: "worker"},
			ok:     true,
		},
		{
			name: "TFJob chief",
			labels: map[string]string{
				"training.kubeflow.org/job-name": "mnist", "training.kubeflow.org/replica-type": "chief",
			},
			owners: []Owner{{Kind: "TFJob", Controller: true}},
			want:   Identity{Kind: "TFJob", Name: "mnist", Role: RoleCoordinator, ReplicaType: "chief"},
			ok:     true,
		},
		{
			name: "JobSet rank 0 of a single replicated job",
			labels: map[string]string{
				"jobset.sigs.k8s.io/jobset-name": "pytorch", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
				"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": "0",
				"batch.kubernetes.io/job-name": "pytorch-workers-0",
			},
			owners: []Owner{{Kind: "Job", Controller: true}},
			want:   Identity{Kind: "JobSet", Name: "pytorch", Role: RoleCoordinator, ReplicaType: "workers"},
			ok:     true,
		},
		{
			name: "JobSet worker",
			labels: map[string]string{
				"jobset.sigs.k8s.io/jobset-name": "pytorch", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
				"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": "2",
				"batch.kubernetes.io/job-name": "pytorch-workers-0",
			},
			want: Identity{Kind: "JobSet", Name: "pytorch", Role: RoleWorker, ReplicaType: "workers"},
			ok:   true,
		},
		{
			name: "JobSet replicated job named driver",
			labels: map[string]string{
				"jobset.sigs.k8s.io/jobset-name": "tr", "jobset.sigs.k8s.io/replicatedjob-name": "Driver",
				"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": "0",
			},
			want: Identity{Kind: "JobSet", Name: "tr", Role: RoleCoordinator, ReplicaType: "driver"},
			ok:   true,
		},
		{
			name:   "batch Job indexed",
			labels: map[string]string{"batch.kubernetes.io/job-name": "etl", "batch.kubernetes.io/job-completion-index": "1"},
			owners: []Owner{{Kind: "Job", Controller: true}},
			want:   Identity{Kind: "Job", Name: "etl", Role: RoleWorker},
			ok:     true,
		},
		{
			name:   "LeaderWorkerSet leader",
			labels: map[string]string{"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/worker-index": "0"},
			want:   Identity{Kind: "LeaderWorkerSet", Name: "vllm", Role: RoleCoordinator},
			ok:     true,
		},
		{
			name:   "Ray head",
			labels: map[string]string{"ray.io/cluster": "rc", "ray.io/node-type": "head"},
			want:   Identity{Kind: "RayCluster", Name: "rc", Role: RoleCoordinator, ReplicaType: "head"},
			ok:     true,
		},
		{
			name:   "Volcano task",
			labels: map[string]string{"volcano.sh/job-name": "vj", "volcano.sh/task-spec": "worker"},
			want:   Identity{Kind: "VolcanoJob", Name: "vj", Role: RoleWorker, ReplicaType: "worker"},
			ok:     true,
		},
		{
			name:   "pod of no job",
			labels: map[string]string{"app": "frontend", "pod-template-hash": "5d8f7"},
			owners: []Owner{{Kind: "ReplicaSet", Controller: true}},
			ok:     false,
		},
	}
	rules := DefaultRules()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := Identify(rules, c.labels, c.owners)
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
	id, ok := Identify([]Rule{r}, map[string]string{"example.com/job": "j1", "example.com/type": "Leader"}, nil)
	if !ok || id.Kind != "MyJob" || id.Role != RoleCoordinator || id.ReplicaType != "leader" {
		t.Fatalf("custom rule: %+v %v", id, ok)
	}
	for _, bad := range []string{"", "kind=X", "name=a", "name=a,kind=B,colour=red", "name"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}
