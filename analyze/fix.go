package analyze

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/collector/kube"
)

// replicaSpecs is the field holding the replica specs of each Kubeflow
// Training Operator / mpi-operator kind.
var replicaSpecs = map[string]string{
	"PyTorchJob": "pytorchReplicaSpecs",
	"TFJob":      "tfReplicaSpecs",
	"MPIJob":     "mpiReplicaSpecs",
	"JAXJob":     "jaxReplicaSpecs",
	"XGBoostJob": "xgbReplicaSpecs",
	"PaddleJob":  "paddleReplicaSpecs",
	"MXJob":      "mxReplicaSpecs",
}

// replicaKeys spells the replica types (pod labels are lower case) as
// the replica spec keys are written.
var replicaKeys = map[string]string{
	"master": "Master", "worker": "Worker", "launcher": "Launcher", "chief": "Chief",
	"ps": "PS", "evaluator": "Evaluator", "scheduler": "Scheduler", "server": "Server",
}

// defaultReplicas are used when no pod names its replica type.
var defaultReplicas = map[string]map[string]bool{
	"PyTorchJob": {"Master": true, "Worker": false},
	"XGBoostJob": {"Master": true, "Worker": false},
	"MPIJob":     {"Launcher": true, "Worker": false},
}

// suggestedFix is a pod-template patch, in the job's own kind, that keeps
// every pod of the job in one zone: a required podAffinity on the zone
// selecting the job's own label (the first pod may go anywhere; the rest
// follow it), plus tolerations for the coordinator when the GPU nodes
// where the workers run are tainted against pods without GPUs.
func suggestedFix(j *Job, pods *jobPods, nodes map[string]nodeInfo) string {
	if pods == nil {
		pods = &jobPods{replicas: map[string]bool{}}
	}
	selector := pods.selector
	if selector == "" {
		selector = "<label naming the job>"
	}
	if j.JobKind == "LeaderWorkerSet" && pods.set != "" {
		return lwsFix(j, pods.set)
	}
	tols := coordinatorTolerations(j, pods, nodes)
	term := map[string]any{
		"labelSelector": map[string]any{"matchLabels": map[string]any{selector: j.JobName}},
		"topologyKey":   kube.LabelZone,
	}
	if j.JobKind == "RayJob" {
		// The RayJob's RayCluster has a generated name: select the pod's
		// own cluster with matchLabelKeys (Kubernetes 1.31+).
		term = map[string]any{
			"labelSelector":  map[string]any{"matchExpressions": []any{map[string]any{"key": "ray.io/cluster", "operator": "Exists"}}},
			"matchLabelKeys": []any{"ray.io/cluster"},
			"topologyKey":    kube.LabelZone,
		}
	}
	podSpec := func(coordinator bool) map[string]any {
		s := map[string]any{"affinity": map[string]any{"podAffinity": map[string]any{
			"requiredDuringSchedulingIgnoredDuringExecution": []any{term},
		}}}
		if coordinator && len(tols) > 0 {
			s["tolerations"] = tols
		}
		return s
	}
	anyCoordinator := false
	for _, c := range pods.replicas {
		anyCoordinator = anyCoordinator || c
	}

	where := "its manifest"
	var spec map[string]any
	switch field, kubeflow := replicaSpecs[j.JobKind]; {
	case kubeflow:
		replicas := map[string]bool{}
		for rt, c := range pods.replicas {
			if rt == "" {
				continue
			}
			key := replicaKeys[rt]
			if key == "" {
				key = strings.ToUpper(rt[:1]) + rt[1:]
			}
			replicas[key] = replicas[key] || c
		}
		if len(replicas) == 0 {
			replicas = defaultReplicas[j.JobKind]
		}
		if len(replicas) == 0 {
			replicas = map[string]bool{"Worker": anyCoordinator}
		}
		specs := map[string]any{}
		for key, c := range replicas {
			specs[key] = map[string]any{"template": map[string]any{"spec": podSpec(c)}}
		}
		spec = map[string]any{field: specs}
	case j.JobKind == "JobSet" && named(pods.replicas):
		var list []any
		for _, name := range sortedKeys(pods.replicas) {
			list = append(list, map[string]any{"name": name, "template": map[string]any{"spec": map[string]any{
				"template": map[string]any{"spec": podSpec(pods.replicas[name])}}}})
		}
		spec = map[string]any{"replicatedJobs": list}
		where = "its manifest (for a Kubeflow TrainJob: its runtime's spec.template)"
	case j.JobKind == "TrainJob" && named(pods.replicas):
		// Trainer v2.3 TrainJob spec.runtimePatches (trainjob_types.go
		// RuntimePatch): a patch of the runtime's JobSet template.
		var list []any
		for _, name := range sortedKeys(pods.replicas) {
			list = append(list, map[string]any{"name": name, "template": map[string]any{"spec": map[string]any{
				"template": map[string]any{"spec": podSpec(pods.replicas[name])}}}})
		}
		spec = map[string]any{"runtimePatches": []any{map[string]any{"manager": "zonewatch", "trainingRuntimeSpec": map[string]any{
			"template": map[string]any{"spec": map[string]any{"replicatedJobs": list}}}}}}
	case j.JobKind == "LeaderWorkerSet":
		spec = map[string]any{"leaderWorkerTemplate": map[string]any{
			"leaderTemplate": map[string]any{"spec": podSpec(true)},
			"workerTemplate": map[string]any{"spec": podSpec(false)},
		}}
	case j.JobKind == "VolcanoJob" && named(pods.replicas):
		var list []any
		for _, name := range sortedKeys(pods.replicas) {
			list = append(list, map[string]any{"name": name, "template": map[string]any{"spec": podSpec(pods.replicas[name])}})
		}
		spec = map[string]any{"tasks": list}
	case (j.JobKind == "RayCluster" || j.JobKind == "RayJob") && len(pods.rayGroups) > 0:
		var list []any
		groups := append([]string(nil), pods.rayGroups...)
		sort.Strings(groups)
		for _, g := range groups {
			list = append(list, map[string]any{"groupName": g, "template": map[string]any{"spec": podSpec(false)}})
		}
		spec = map[string]any{
			"headGroupSpec":    map[string]any{"template": map[string]any{"spec": podSpec(true)}},
			"workerGroupSpecs": list,
		}
		if j.JobKind == "RayJob" {
			spec = map[string]any{"rayClusterSpec": spec}
		}
	default:
		// A batch Job has one pod template; other kinds get it for each
		// of theirs.
		spec = map[string]any{"template": map[string]any{"spec": podSpec(anyCoordinator)}}
		if j.JobKind != "Job" {
			where = "every pod template in its manifest"
		}
	}
	body, err := yaml.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return "" // maps of strings always marshal
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Keep every pod of %s %s/%s in one zone: add this to %s and re-create the job (running pods do not move).\n",
		j.JobKind, j.Namespace, j.JobName, where)
	b.WriteString("# The first pod scheduled picks the zone; that zone needs room for every pod of the job.\n")
	if len(tols) > 0 {
		b.WriteString("# The coordinator tolerates the taints of the GPU nodes in its workers' zone, so it can run there.\n")
	}
	b.Write(body)
	return b.String()
}

// lwsFix: a LeaderWorkerSet's groups are independent replicas, and
// spreading them across zones is healthy; what must stay in one zone is
// each group. LWS does that itself with its exclusive-topology annotation
// (sigs.k8s.io/lws v0.10.0 api/leaderworkerset/v1 ExclusiveKeyAnnotationKey;
// pkg/webhooks/pod_webhook.go gives each group's pods affinity to their
// group-key and anti-affinity to other groups in the topology domain).
func lwsFix(j *Job, set string) string {
	body, err := yaml.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		"leaderworkerset.sigs.k8s.io/exclusive-topology": kube.LabelZone,
	}}})
	if err != nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Keep each group of LeaderWorkerSet %s/%s in one zone (group %s is split): add this annotation to the LeaderWorkerSet and re-create it (running pods do not move).\n",
		j.Namespace, set, j.JobName)
	b.WriteString("# Groups are replicas of one service and may run in different zones; the annotation keeps every group's pods together, one group per zone (more groups than zones leave some pending).\n")
	b.Write(body)
	return b.String()
}

// coordinatorTolerations returns tolerations for the NoSchedule/NoExecute
// taints of the GPU nodes in the workers' zones (every GPU node when no
// worker is scheduled) that some coordinator pod does not tolerate.
func coordinatorTolerations(j *Job, pods *jobPods, nodes map[string]nodeInfo) []any {
	if len(pods.coordinatorTolerations) == 0 {
		return nil
	}
	type te struct{ key, effect string }
	need := map[te]bool{}
	for _, n := range nodes {
		if !n.gpu || (len(j.workerZones) > 0 && !slices.Contains(j.workerZones, n.zone)) {
			continue
		}
		for i := range n.taints {
			t := &n.taints[i]
			for _, have := range pods.coordinatorTolerations {
				if !tolerated(have, t) {
					need[te{t.Key, string(t.Effect)}] = true
				}
			}
		}
	}
	keys := make([]te, 0, len(need))
	for k := range need {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool {
		if keys[a].key != keys[b].key {
			return keys[a].key < keys[b].key
		}
		return keys[a].effect < keys[b].effect
	})
	out := make([]any, 0, len(keys))
	for _, k := range keys {
		out = append(out, map[string]any{"key": k.key, "operator": "Exists", "effect": k.effect})
	}
	return out
}

func tolerated(have []corev1.Toleration, t *corev1.Taint) bool {
	for i := range have {
		if have[i].ToleratesTaint(logr.Discard(), t, true) {
			return true
		}
	}
	return false
}

// named reports whether every replica has a name (a replicated job, a task).
func named(replicas map[string]bool) bool {
	if len(replicas) == 0 {
		return false
	}
	for name := range replicas {
		if name == "" {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
