package topology

import (
	"fmt"
	"strings"
)

// Role is a pod's normalised part in a training job.
const (
	RoleCoordinator = "coordinator"
	RoleWorker      = "worker"
)

// Identity says which training job a pod belongs to.
type Identity struct {
	Kind        string // owning controller: PyTorchJob, MPIJob, JobSet, Job, ...
	Name        string // job name, unique within the namespace for this kind
	Role        string // RoleCoordinator or RoleWorker
	ReplicaType string // raw replica type / replicated job / task name, lower case
}

// Owner is the part of an owner reference identity needs.
type Owner struct {
	Kind       string
	Controller bool
}

// Rule recognises one job controller from pod labels. Rules are tried in
// order; the first whose NameLabel is present wins, so more specific
// controllers (JobSet, Kubeflow) come before the batch Job their pods also
// carry labels of.
type Rule struct {
	// NameLabel holds the job name; the rule matches when it is set.
	NameLabel string
	// Kind is the job_kind when no owner reference or OperatorLabel says better.
	Kind string
	// RoleLabels are read in order; the first non-empty value is the raw
	// replica type.
	RoleLabels []string
	// CoordinatorLabel/CoordinatorValue mark the coordinator directly
	// (e.g. training.kubeflow.org/job-role=master).
	CoordinatorLabel string
	CoordinatorValue string
	// RankZeroLabels: when every one of these labels is "0" the pod is the
	// coordinator (rank 0 is MASTER_ADDR in torchrun-style jobs).
	RankZeroLabels []string
	// KindFromOwner takes job_kind from the pod's controller owner reference
	// when that is not a plain batch Job.
	KindFromOwner bool
	// OperatorLabel maps an operator name to a kind (mpi-operator -> MPIJob).
	OperatorLabel string
}

// coordinatorWords name the replica types that coordinate a job.
var coordinatorWords = map[string]bool{
	"master": true, "chief": true, "launcher": true, "leader": true,
	"coordinator": true, "driver": true, "head": true, "scheduler": true,
}

// operatorKinds maps training.kubeflow.org/operator-name values to kinds.
var operatorKinds = map[string]string{
	"mpi-operator":          "MPIJob",
	"mpijob-controller":     "MPIJob",
	"pytorchjob-controller": "PyTorchJob",
	"tfjob-controller":      "TFJob",
	"jaxjob-controller":     "JAXJob",
	"xgboostjob-controller": "XGBoostJob",
	"paddlejob-controller":  "PaddleJob",
	"mxjob-controller":      "MXJob",
}

// DefaultRules recognise the common training-job controllers.
func DefaultRules() []Rule {
	return []Rule{
		{ // Kubeflow Training Operator v1 and mpi-operator v2.
			NameLabel:        "training.kubeflow.org/job-name",
			Kind:             "KubeflowJob",
			RoleLabels:       []string{"training.kubeflow.org/replica-type", "training.kubeflow.org/job-role"},
			CoordinatorLabel: "training.kubeflow.org/job-role",
			CoordinatorValue: "master",
			KindFromOwner:    true,
			OperatorLabel:    "training.kubeflow.org/operator-name",
		},
		{ // JobSet and Kubeflow Trainer v2 (TrainJob runs as a JobSet).
			NameLabel:      "jobset.sigs.k8s.io/jobset-name",
			Kind:           "JobSet",
			RoleLabels:     []string{"jobset.sigs.k8s.io/replicatedjob-name"},
			RankZeroLabels: []string{"jobset.sigs.k8s.io/job-index", "batch.kubernetes.io/job-completion-index"},
		},
		{
			NameLabel:      "leaderworkerset.sigs.k8s.io/name",
			Kind:           "LeaderWorkerSet",
			RankZeroLabels: []string{"leaderworkerset.sigs.k8s.io/worker-index"},
		},
		{
			NameLabel:  "volcano.sh/job-name",
			Kind:       "VolcanoJob",
			RoleLabels: []string{"volcano.sh/task-spec"},
		},
		{
			NameLabel:  "ray.io/cluster",
			Kind:       "RayCluster",
			RoleLabels: []string{"ray.io/node-type"},
		},
		{
			NameLabel:      "batch.kubernetes.io/job-name",
			Kind:           "Job",
			RankZeroLabels: []string{"batch.kubernetes.io/job-completion-index"},
		},
	}
}

// ParseRule reads a rule from a flag value:
// "name=LABEL,kind=KIND[,role=LABEL[|LABEL]][,rank0=LABEL[|LABEL]]".
func ParseRule(s string) (Rule, error) {
	var r Rule
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || v == "" {
			return r, fmt.Errorf("job rule %q: %q is not key=value", s, part)
		}
		switch k {
		case "name":
			r.NameLabel = v
		case "kind":
			r.Kind = v
		case "role":
			r.RoleLabels = strings.Split(v, "|")
		case "rank0":
			r.RankZeroLabels = strings.Split(v, "|")
		default:
			return r, fmt.Errorf("job rule %q: unknown key %q (want name, kind, role, rank0)", s, k)
		}
	}
	if r.NameLabel == "" || r.Kind == "" {
		return r, fmt.Errorf("job rule %q: name and kind are required", s)
	}
	return r, nil
}

// NameLabels lists every rule's name label, for per-label informers.
func NameLabels(rules []Rule) []string {
	out := make([]string, 0, len(rules))
	for _, r := range rules {
		out = append(out, r.NameLabel)
	}
	return out
}

// Identify returns the job a pod belongs to, or false for a pod of no job.
func Identify(rules []Rule, labels map[string]string, owners []Owner) (Identity, bool) {
	for i := range rules {
		r := &rules[i]
		name := labels[r.NameLabel]
		if name == "" {
			continue
		}
		id := Identity{Name: name, Kind: r.Kind, Role: RoleWorker}
		for _, l := range r.RoleLabels {
			if v := labels[l]; v != "" {
				id.ReplicaType = strings.ToLower(v)
				break
			}
		}
		switch {
		case r.CoordinatorLabel != "" && strings.EqualFold(labels[r.CoordinatorLabel], r.CoordinatorValue):
			id.Role = RoleCoordinator
		case isCoordinatorName(id.ReplicaType):
			id.Role = RoleCoordinator
		case len(r.RankZeroLabels) > 0 && allZero(labels, r.RankZeroLabels):
			id.Role = RoleCoordinator
		}
		if r.KindFromOwner {
			if k := ownerKind(owners); k != "" {
				id.Kind = k
			} else if k := operatorKinds[labels[r.OperatorLabel]]; k != "" {
				id.Kind = k
			}
		}
		return id, true
	}
	return Identity{}, false
}

func allZero(labels map[string]string, keys []string) bool {
	for _, k := range keys {
		if labels[k] != "0" {
			return false
		}
	}
	return true
}

// isCoordinatorName accepts "master", "Launcher", "pytorch-master",
// "driver_0": any dash/underscore separated word that names a coordinator.
func isCoordinatorName(s string) bool {
	if s == "" {
		return false
	}
	if coordinatorWords[s] {
		return true
	}
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return r == '-' || r == '_' }) {
		if coordinatorWords[w] {
			return true
		}
	}
	return false
}

// ownerKind returns the controller's kind unless it is an intermediate
// controller (a batch Job created by MPIJob for its launcher, say).
func ownerKind(owners []Owner) string {
	for _, o := range owners {
		if o.Controller && o.Kind != "Job" && o.Kind != "ReplicaSet" && o.Kind != "StatefulSet" {
			return o.Kind
		}
	}
	return ""
}
