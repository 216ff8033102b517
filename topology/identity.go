package topology

import (
	"fmt"
	"strconv"
	"strings"
)

// Role is a pod's normalised part in a training job.
const (
	RoleCoordinator = "coordinator"
	RoleWorker      = "worker"
)

// LabelCompletionIndex is the batch Job completion index: an annotation
// on every pod of an Indexed Job, a label too since Kubernetes 1.28
// (PodIndexLabel).
const LabelCompletionIndex = "batch.kubernetes.io/job-completion-index"

// LabelMultiZone, a label or annotation on a job's pods, says the job is
// placed across zones on purpose when its value is MultiZoneIntentional
// (LeaderWorkerSet or RayService serving): the job alerts leave it out
// (zonewatch_job_multi_zone_info, docs/rules.md).
const (
	LabelMultiZone       = "zonewatch.io/multi-zone"
	MultiZoneIntentional = "intentional"
)

// Identity says which training job a pod belongs to.
type Identity struct {
	Kind        string // owning controller: PyTorchJob, MPIJob, JobSet, TrainJob, Job, ...
	Name        string // job name, unique within the namespace for this kind
	Role        string // RoleCoordinator or RoleWorker
	ReplicaType string // raw replica type / replicated job / task name, lower case
	// Set is the object the job is a group of (the LeaderWorkerSet of a
	// group); empty when the job is the whole object.
	Set string
	// Guess marks a coordinator chosen by rank 0 (or worker 0) only: it
	// yields to a pod of the same job that is a coordinator by name or
	// label (a launcher next to node 0-0).
	Guess bool
	// MinPods: a job with fewer pods is not a training job (a batch Job of
	// one pod); 0 for no minimum.
	MinPods int
	// MultiZone is the pod's LabelMultiZone value, "" without one.
	MultiZone string
}

// OwnerRef is a controller owner reference.
type OwnerRef struct {
	APIVersion string
	Kind       string
	Name       string
}

// Owners looks up an owner object's own controller reference (the
// metadata informers of the live feed, the owner objects of a kubectl dump).
type Owners interface {
	ControllerOf(namespace string, o OwnerRef) (OwnerRef, bool)
}

// PodMeta is what identity reads of a pod.
type PodMeta struct {
	Namespace   string
	Labels      map[string]string
	Annotations map[string]string // read where a label is absent: the controllers write both
	Hostname    string            // spec.hostname
	Owner       *OwnerRef         // the controller owner reference; nil for none
}

// get reads a label, else the annotation of the same key: JobSet,
// Volcano and the Job controller stamp their keys as both, and pods from
// before Kubernetes 1.28 carry the completion index only as an annotation.
func (p *PodMeta) get(key string) string {
	if v, ok := p.Labels[key]; ok {
		return v
	}
	return p.Annotations[key]
}

// Rule recognises one job controller from pod labels. Rules are tried in
// order; the first whose NameLabel is present wins, so more specific
// controllers (JobSet, Kubeflow) come before the batch Job their pods also
// carry labels of.
type Rule struct {
	// NameLabel holds the job name; the rule matches when it is set.
	NameLabel string
	// Kind is the job_kind when no owner reference, KindLabel or
	// OperatorLabel says better.
	Kind string
	// KindLabel, when set on the pod, holds the kind (ray.io/originated-from-crd).
	KindLabel string
	// GroupLabel splits the object into independent jobs, one per value,
	// named "<name>-<value>" (a LeaderWorkerSet's group index).
	GroupLabel string
	// RoleLabels are read in order; the first non-empty value is the raw
	// replica type.
	RoleLabels []string
	// CoordinatorLabel/CoordinatorValue mark the coordinator directly
	// (e.g. training.kubeflow.org/job-role=master).
	CoordinatorLabel string
	CoordinatorValue string
	// CoordinatorHostLabel names the coordinator's hostname on every pod
	// ("<hostname>.<subdomain>", JobSet's spec.coordinator): when present it
	// decides alone.
	CoordinatorHostLabel string
	// RankZeroLabels: when every one of these labels is "0" the pod is the
	// coordinator unless another pod of its job is one by name or label
	// (rank 0 is MASTER_ADDR in torchrun-style jobs).
	RankZeroLabels []string
	// RankZeroTypes limits the rank-0 guess to these replica types (empty:
	// any).
	RankZeroTypes []string
	// Indexed: only pods with a completion index belong to a job (a batch
	// Job that is not Indexed is a work queue or a cron run).
	Indexed bool
	// MinPods: see Identity.MinPods.
	MinPods int
	// KindFromOwner takes job_kind from the pod's controller owner reference
	// when that is not a plain batch Job.
	KindFromOwner bool
	// OwnerKinds: a pod that Indexed leaves out still belongs to a job when
	// its top owner, found through the owners, is of one of these kinds:
	// that owner's job (a RayJob's submitter, a plain batch Job the RayJob
	// controls). With KindFromOwner.
	OwnerKinds []string
	// OperatorLabel maps an operator name to a kind (mpi-operator -> MPIJob).
	OperatorLabel string
}

// coordinatorWords name the replica types that coordinate a job.
var coordinatorWords = []string{"master", "chief", "launcher", "leader", "coordinator", "driver", "head", "scheduler"}

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

// intermediateKinds are controllers between a pod and the object a user
// created; job_kind never names one.
var intermediateKinds = map[string]bool{
	"Job": true, "ReplicaSet": true, "StatefulSet": true, "Deployment": true, "CronJob": true, "Pod": true,
}

// DefaultRules recognise the common training-job controllers. The
// controller source each rule follows is cited in identity_test.go.
func DefaultRules() []Rule {
	return []Rule{
		{ // Kubeflow Training Operator v1 and mpi-operator v2.
			NameLabel:        "training.kubeflow.org/job-name",
			Kind:             "KubeflowJob",
			RoleLabels:       []string{"training.kubeflow.org/replica-type", "training.kubeflow.org/job-role"},
			CoordinatorLabel: "training.kubeflow.org/job-role",
			CoordinatorValue: "master",
			// Worker 0 is the rendezvous where no master exists (PaddleJob
			// collective mode, JAXJob, elastic PyTorchJob).
			RankZeroLabels: []string{"training.kubeflow.org/replica-index"},
			RankZeroTypes:  []string{"worker"},
			KindFromOwner:  true,
			OperatorLabel:  "training.kubeflow.org/operator-name",
		},
		{ // JobSet and Kubeflow Trainer v2 (TrainJob runs as a JobSet).
			NameLabel:            "jobset.sigs.k8s.io/jobset-name",
			Kind:                 "JobSet",
			RoleLabels:           []string{"jobset.sigs.k8s.io/replicatedjob-name"},
			CoordinatorHostLabel: "jobset.sigs.k8s.io/coordinator",
			RankZeroLabels:       []string{"jobset.sigs.k8s.io/job-index", LabelCompletionIndex},
			KindFromOwner:        true,
		},
		{ // Each LeaderWorkerSet group is a replica of its own.
			NameLabel:  "leaderworkerset.sigs.k8s.io/name",
			Kind:       "LeaderWorkerSet",
			GroupLabel: "leaderworkerset.sigs.k8s.io/group-index",
			// worker-index 0 is the leader, by definition (LeaderPod).
			CoordinatorLabel: "leaderworkerset.sigs.k8s.io/worker-index",
			CoordinatorValue: "0",
		},
		{
			NameLabel:  "volcano.sh/job-name",
			Kind:       "VolcanoJob",
			RoleLabels: []string{"volcano.sh/task-spec"},
		},
		{ // A RayJob submitter pod that carries KubeRay's originated-from labels
			// (KubeRay v1.6.0 sets them on its Job object only: the batch
			// Job rule's OwnerKinds finds that one).
			NameLabel:  "ray.io/originated-from-cr-name",
			Kind:       "RayJob",
			KindLabel:  "ray.io/originated-from-crd",
			RoleLabels: []string{"ray.io/node-type"},
			MinPods:    2,
		},
		{
			NameLabel:     "ray.io/cluster",
			Kind:          "RayCluster",
			RoleLabels:    []string{"ray.io/node-type"},
			KindFromOwner: true,
		},
		{
			NameLabel:      "batch.kubernetes.io/job-name",
			Kind:           "Job",
			RankZeroLabels: []string{LabelCompletionIndex},
			Indexed:        true,
			MinPods:        2,
			KindFromOwner:  true,
			// KubeRay v1.6.0's RayJob submitter: its pod carries only the
			// Job controller's labels, its Job (named after the RayJob)
			// is controlled by the RayJob, whose RayCluster's pods are
			// the rest of the job.
			OwnerKinds: []string{"RayJob"},
		},
	}
}

// RuleSyntax is the --kube.job-rule value syntax, for flag help and docs.
const RuleSyntax = "name=LABEL,kind=KIND[,role=LABEL|LABEL][,rank0=LABEL|LABEL][,coordinator=LABEL[=VALUE]][,group=LABEL][,indexed=true][,minpods=N]"

// ParseRules parses the --kube.job-rule values; none means the built-in
// rules.
func ParseRules(specs []string) ([]Rule, error) {
	if len(specs) == 0 {
		return DefaultRules(), nil
	}
	rules := make([]Rule, 0, len(specs))
	for _, s := range specs {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// ParseRule reads a rule from a flag value (RuleSyntax). coordinator=LABEL=VALUE
// marks pods whose LABEL is VALUE; coordinator=LABEL alone reads LABEL as
// the coordinator's hostname (JobSet's form). group=LABEL makes each value
// of LABEL a job of its own. job_kind is KIND as given.
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
		case "coordinator":
			if l, val, ok := strings.Cut(v, "="); ok {
				r.CoordinatorLabel, r.CoordinatorValue = l, val
			} else {
				r.CoordinatorHostLabel = v
			}
		case "group":
			r.GroupLabel = v
		case "indexed":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return r, fmt.Errorf("job rule %q: indexed=%q is not true or false", s, v)
			}
			r.Indexed = b
		case "minpods":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return r, fmt.Errorf("job rule %q: minpods=%q is not a count", s, v)
			}
			r.MinPods = n
		default:
			return r, fmt.Errorf("job rule %q: unknown key %q (want name, kind, role, rank0, coordinator, group, indexed, minpods)", s, k)
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

// Keys lists every label (and annotation) key the rules read, for the
// informer transform.
func Keys(rules []Rule) []string {
	var out []string
	add := func(keys ...string) {
		for _, k := range keys {
			if k != "" && !contains(out, k) {
				out = append(out, k)
			}
		}
	}
	if len(rules) > 0 {
		add(LabelMultiZone)
	}
	for _, r := range rules {
		add(r.NameLabel, r.KindLabel, r.GroupLabel, r.CoordinatorLabel, r.CoordinatorHostLabel, r.OperatorLabel)
		add(r.RoleLabels...)
		add(r.RankZeroLabels...)
		if r.Indexed {
			add(LabelCompletionIndex)
		}
	}
	return out
}

// Identify returns the job a pod belongs to, or false for a pod of no job.
// owners (nil for none) resolves the controller the user created: TrainJob
// over JobSet over Job, RayJob over RayCluster, MPIJob over its launcher Job.
func Identify(rules []Rule, p PodMeta, owners Owners) (Identity, bool) {
	for i := range rules {
		r := &rules[i]
		name := p.Labels[r.NameLabel]
		if name == "" {
			continue
		}
		if r.Indexed && p.get(LabelCompletionIndex) == "" && !ownedBy(r, &p, owners) {
			return Identity{}, false
		}
		id := Identity{Name: name, Kind: r.Kind, Role: RoleWorker, MinPods: r.MinPods, MultiZone: p.get(LabelMultiZone)}
		if r.GroupLabel != "" {
			if g := p.get(r.GroupLabel); g != "" {
				id.Set, id.Name = name, name+"-"+g
			}
		}
		for _, l := range r.RoleLabels {
			if v := p.get(l); v != "" {
				id.ReplicaType = strings.ToLower(v)
				break
			}
		}
		if host, ok := p.Labels[r.CoordinatorHostLabel]; ok && r.CoordinatorHostLabel != "" {
			// "<hostname>.<subdomain>" names exactly one pod.
			host, _, _ = strings.Cut(host, ".")
			if host != "" && host == hostname(&p) {
				id.Role = RoleCoordinator
			}
		} else {
			switch {
			case r.CoordinatorLabel != "" && strings.EqualFold(p.get(r.CoordinatorLabel), r.CoordinatorValue):
				id.Role = RoleCoordinator
			case isCoordinatorName(id.ReplicaType):
				id.Role = RoleCoordinator
			case len(r.RankZeroLabels) > 0 && allZero(&p, r.RankZeroLabels) && rankZeroType(r, id.ReplicaType):
				id.Role, id.Guess = RoleCoordinator, true
			}
		}
		if k := p.Labels[r.KindLabel]; r.KindLabel != "" && k != "" {
			id.Kind = k
		}
		if r.KindFromOwner {
			top, looked, ok := topOwner(p.Namespace, p.Owner, owners)
			switch {
			case ok && looked && r.GroupLabel == "":
				// The object the user created, above the one the labels
				// name: its name too (a RayJob's RayCluster is
				// "<rayjob>-<random>").
				id.Kind, id.Name = top.Kind, top.Name
			case ok:
				id.Kind = top.Kind
			default:
				if k := operatorKinds[p.Labels[r.OperatorLabel]]; r.OperatorLabel != "" && k != "" {
					id.Kind = k
				}
			}
		}
		return id, true
	}
	return Identity{}, false
}

// topOwner walks controller references up from the pod's owner and
// returns the highest that is not an intermediate controller, and whether
// it took a lookup to get there. A Kubeflow v1 pod's own owner (PyTorchJob)
// is found without one.
func topOwner(namespace string, o *OwnerRef, owners Owners) (top OwnerRef, looked, found bool) {
	if o == nil {
		return OwnerRef{}, false, false
	}
	cur := *o
	for depth := 0; depth < 5; depth++ {
		if !intermediateKinds[cur.Kind] {
			top, found, looked = cur, true, depth > 0
		}
		if owners == nil {
			break
		}
		next, ok := owners.ControllerOf(namespace, cur)
		if !ok {
			break
		}
		cur = next
	}
	return top, looked, found
}

// ownedBy reports whether the pod's top owner, found through owners, is
// of one of the rule's OwnerKinds.
func ownedBy(r *Rule, p *PodMeta, owners Owners) bool {
	if len(r.OwnerKinds) == 0 {
		return false
	}
	top, looked, ok := topOwner(p.Namespace, p.Owner, owners)
	return ok && looked && contains(r.OwnerKinds, top.Kind)
}

// hostname is the pod's spec.hostname, or what the Job controller sets it
// to for an Indexed Job ("<job>-<index>") when the pod does not say.
func hostname(p *PodMeta) string {
	if p.Hostname != "" {
		return p.Hostname
	}
	if j, i := p.Labels["batch.kubernetes.io/job-name"], p.get(LabelCompletionIndex); j != "" && i != "" {
		return j + "-" + i
	}
	return ""
}

func allZero(p *PodMeta, keys []string) bool {
	for _, k := range keys {
		if p.get(k) != "0" {
			return false
		}
	}
	return true
}

// rankZeroType: the rule's rank-0 guess applies to this replica type.
// Kubeflow Trainer's initializer jobs (dataset-initializer,
// model-initializer) run before training and never coordinate it.
func rankZeroType(r *Rule, replicaType string) bool {
	if strings.HasSuffix(replicaType, "-initializer") {
		return false
	}
	return len(r.RankZeroTypes) == 0 || contains(r.RankZeroTypes, replicaType)
}

// isCoordinatorName accepts "master", "Launcher", "pytorch-master",
// "driver_0", Volcano's "mpimaster": a coordinator word that is the name,
// a dash/underscore separated word of it, or its prefix or suffix.
func isCoordinatorName(s string) bool {
	if s == "" {
		return false
	}
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return r == '-' || r == '_' }) {
		for _, c := range coordinatorWords {
			if strings.HasPrefix(w, c) || strings.HasSuffix(w, c) {
				return true
			}
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
