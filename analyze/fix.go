package analyze

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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

// Gang admission, written as the controllers read it.
const (
	// KueueTopologyAnnotation on a pod template asks Kueue TAS to admit the
	// pod set only into one topology domain with room for all of it
	// (kueue.x-k8s.io, pkg/controller/tas).
	KueueTopologyAnnotation = "kueue.x-k8s.io/podset-required-topology"
	// KueueGroupAnnotation on two pod templates (a coordinator and its
	// workers) makes Kueue TAS fit both pod sets into one domain together
	// (kueue v0.17 apis/kueue/v1beta2 PodSetGroupName; the scheduler's
	// TAS snapshot groups a leader pod set with a workers pod set).
	KueueGroupAnnotation = "kueue.x-k8s.io/podset-group-name"
	// KueuePreferredTopologyAnnotation asks Kueue TAS for one domain if
	// one has room, else lets it spread the pod set over several.
	KueuePreferredTopologyAnnotation = "kueue.x-k8s.io/podset-preferred-topology"
	// KueueQueueLabel queues a job to a LocalQueue.
	KueueQueueLabel = "kueue.x-k8s.io/queue-name"
	// LWSExclusiveAnnotation keeps each LeaderWorkerSet group in one
	// domain, one group per domain (sigs.k8s.io/lws api/leaderworkerset/v1
	// ExclusiveKeyAnnotationKey).
	LWSExclusiveAnnotation = "leaderworkerset.sigs.k8s.io/exclusive-topology"
	// TrainJobPatchManager names zonewatch's entry of a TrainJob's
	// spec.runtimePatches.
	TrainJobPatchManager = "zonewatch.io/analyze"
)

// suggestedFix is a pod-template patch, in the job's own kind, that keeps
// every pod of the job in one zone that has room for all of it now: a
// required nodeAffinity to that zone on every template, plus tolerations
// of its GPU nodes' taints for the templates whose pods have no GPUs. No
// pod picks the zone (a required self podAffinity lets the first pod, often
// a CPU-only coordinator, go anywhere, and the rest then cannot follow:
// seen on the real scheduler, internal/schedlab). When no zone can hold the
// job it says so and gives gang admission (Kueue TAS) instead, which waits
// for room rather than starting split.
func suggestedFix(j *Job, pods *jobPods, nodes map[string]nodeInfo, used map[string]corev1.ResourceList, podGroups bool) (fix string) {
	if pods == nil {
		pods = &jobPods{replicas: map[string]bool{}}
	}
	rooms := roomByZone(pods.demand, nodes, used)
	var zones []string
	for _, r := range rooms {
		if r.fits {
			zones = append(zones, r.zone)
		}
	}
	need := needOf(pods)
	if pods.kueuePreferred {
		return kueuePreferredFix(j, pods, nodes, need, rooms)
	}
	if j.JobKind == "LeaderWorkerSet" && pods.set != "" {
		fix := lwsFix(j, pods, nodes, zones, need, rooms)
		if podGroups {
			fix = "# No gang advice: " + lwsNoGang + ".\n" + fix
		}
		return fix
	}
	if j.JobKind == "VolcanoJob" {
		defer func() { fix += volcanoAdvice(len(pods.demand)) }()
	}
	if podGroups && j.JobKind != "VolcanoJob" {
		g := planGang(j.JobKind, pods)
		if !g.none {
			gp := g.gangPods(pods)
			return gangFix(j, gp, nodes, roomByZone(gp.demand, nodes, used), needOf(gp), g)
		}
		// The advice below does not depend on the order in which the
		// controller creates the pods.
		defer func() {
			fix = "# No gang advice: " + strings.Join(g.why, "; ") + ".\n" + fix
		}()
	}
	if len(zones) == 0 {
		return noRoomFix(j, pods, nodes, need, rooms)
	}
	zone := zones[0] // most free GPUs
	tols := gpuTolerations(pods, nodes, zone)
	pin := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
			"key": kube.LabelZone, "operator": "In", "values": []any{zone}}}}}}}}
	where, spec := patchTemplates(j, pods, func(replicaTypes ...string) map[string]any {
		s := map[string]any{"affinity": pin}
		if t := tols[replicaTypes[0]]; len(t) > 0 {
			s["tolerations"] = t
		}
		for _, rt := range replicaTypes[1:] {
			if t := tols[rt]; len(t) > 0 && s["tolerations"] == nil {
				s["tolerations"] = t
			}
		}
		return map[string]any{"spec": s}
	})
	body, err := yaml.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return "" // maps of strings always marshal
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Keep every pod of %s %s/%s in one zone: add this to %s and re-create the job (running pods do not move).\n",
		j.JobKind, j.Namespace, j.JobName, where)
	b.WriteString(recreateNote(j.JobKind))
	fmt.Fprintf(&b, "# %s has room for the whole job now (%s; free GPUs by zone: %s): every pod is pinned there, none picks a zone that cannot hold the rest.\n",
		zone, need, roomSummary(rooms))
	if len(tols) > 0 {
		fmt.Fprintf(&b, "# Pods without GPUs tolerate the taints of the GPU nodes in %s, so they can run next to the workers.\n", zone)
	}
	fmt.Fprintf(&b, "# If %s fills before the job is re-created some pods run and the rest wait Pending (half-placed: a pin holds no pod back); gang admission waits whole for a zone with room instead\n# (Kubernetes 1.37's gang + topology scheduling: analyze --podgroups=on; or Kueue TAS, %s).\n",
		zone, KueueTopologyAnnotation)
	b.Write(body)
	return b.String()
}

// needOf says what the job's unfinished pods need.
func needOf(pods *jobPods) string {
	var gpus int64
	for _, d := range pods.demand {
		gpus += d.gpus
	}
	return fmt.Sprintf("%s in %s", plural(int(gpus), "GPU"), plural(len(pods.demand), "pod"))
}

// noRoomFix: no zone can hold the job; pinning it would leave pods
// Pending, so the advice is gang admission: Kueue admits the job only
// into a zone with room for every pod set, and creates no pod before.
func noRoomFix(j *Job, pods *jobPods, nodes map[string]nodeInfo, need string, rooms []zoneRoom) string {
	where, spec, note := kueueTemplates(j, pods, nodes, rooms, KueueTopologyAnnotation)
	body, err := yaml.Marshal(map[string]any{
		"metadata": map[string]any{"labels": map[string]any{KueueQueueLabel: "<LocalQueue of a TAS ResourceFlavor>"}},
		"spec":     spec,
	})
	if err != nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# No zone can hold every pod of %s %s/%s now (%s; free GPUs by zone: %s).\n",
		j.JobKind, j.Namespace, j.JobName, need, roomSummary(rooms))
	b.WriteString("# Pinning it to one zone would leave pods Pending. Free room in one zone (or shrink the job), or let Kueue\n")
	fmt.Fprintf(&b, "# topology-aware scheduling admit it only when one zone has room: add this to %s (docs/runbooks.md, Kueue TAS;\n", where)
	b.WriteString("# pods without GPUs tolerate the GPU nodes' taints so that they fit the GPU zone's flavor with their workers).\n")
	b.WriteString(recreateNote(j.JobKind))
	b.WriteString(note)
	b.Write(body)
	return b.String()
}

// patchTemplates lays a per-template fragment (tmpl, given the raw replica
// types the template makes) out in the job's own kind; it returns where
// the patch goes and the spec.
func patchTemplates(j *Job, pods *jobPods, tmpl func(replicaTypes ...string) map[string]any) (string, map[string]any) {
	allTypes := sortedKeys(pods.replicas)
	if len(allTypes) == 0 {
		allTypes = []string{""}
	}
	where := "its manifest"
	var spec map[string]any
	switch field, kubeflow := replicaSpecs[j.JobKind]; {
	case kubeflow:
		byKey := map[string][]string{}
		for _, rt := range sortedKeys(pods.replicas) {
			if rt == "" {
				continue
			}
			key := replicaKeys[rt]
			if key == "" {
				key = strings.ToUpper(rt[:1]) + rt[1:]
			}
			byKey[key] = append(byKey[key], rt)
		}
		if len(byKey) == 0 {
			for key := range defaultReplicas[j.JobKind] {
				byKey[key] = []string{strings.ToLower(key)}
			}
		}
		if len(byKey) == 0 {
			byKey["Worker"] = []string{"worker"}
		}
		specs := map[string]any{}
		for key, rts := range byKey {
			specs[key] = map[string]any{"template": tmpl(rts...)}
		}
		spec = map[string]any{field: specs}
	case j.JobKind == "JobSet" && named(pods.replicas):
		var list []any
		for _, name := range sortedKeys(pods.replicas) {
			list = append(list, map[string]any{"name": name, "template": map[string]any{"spec": map[string]any{
				"template": tmpl(name)}}})
		}
		spec = map[string]any{"replicatedJobs": list}
		where = "its manifest"
		if pods.jobSet == nil {
			// A TrainJob's pods reach it only through its JobSet, which
			// Trainer owns and would put back (seen in internal/trainlab).
			where = "its manifest (if a Kubeflow TrainJob owns this JobSet, dump the JobSets too, kubectl get pods,jobs,jobsets -o json, for the TrainJob's own patch: Trainer puts a patched JobSet back)"
		}
	case j.JobKind == "TrainJob" && named(pods.replicas):
		// Trainer v2.2.0 TrainJob spec.runtimePatches (trainjob_types.go
		// RuntimePatch): a patch of the runtime's JobSet template. Its
		// webhook takes only a domain-prefixed manager (seen on the real
		// trainer-controller-manager: "must be a domain-prefixed path").
		var list []any
		for _, name := range sortedKeys(pods.replicas) {
			list = append(list, map[string]any{"name": name, "template": map[string]any{"spec": map[string]any{
				"template": tmpl(name)}}})
		}
		spec = map[string]any{"runtimePatches": []any{map[string]any{"manager": TrainJobPatchManager, "trainingRuntimeSpec": map[string]any{
			"template": map[string]any{"spec": map[string]any{"replicatedJobs": list}}}}}}
	case j.JobKind == "LeaderWorkerSet":
		spec = map[string]any{"leaderWorkerTemplate": map[string]any{
			"leaderTemplate": tmpl(leaderTypes(pods)...),
			"workerTemplate": tmpl(workerTypes(pods)...),
		}}
	case j.JobKind == "VolcanoJob" && named(pods.replicas):
		var list []any
		for _, name := range sortedKeys(pods.replicas) {
			list = append(list, map[string]any{"name": name, "template": tmpl(name)})
		}
		spec = map[string]any{"tasks": list}
	case (j.JobKind == "RayCluster" || j.JobKind == "RayJob") && len(pods.rayGroups) > 0:
		var list []any
		groups := append([]string(nil), pods.rayGroups...)
		sort.Strings(groups)
		for _, g := range groups {
			list = append(list, map[string]any{"groupName": g, "template": tmpl("worker")})
		}
		spec = map[string]any{
			"headGroupSpec":    map[string]any{"template": tmpl("head")},
			"workerGroupSpecs": list,
		}
		if j.JobKind == "RayJob" {
			spec = map[string]any{"rayClusterSpec": spec}
			if sub := submitterTemplate(pods, tmpl(rayJobSubmitter)); sub != nil {
				spec["submitterPodTemplate"] = sub
				where = "its manifest (a RayJob with a submitterPodTemplate of its own: add the submitter's affinity and tolerations to that one, KubeRay takes it as it is)"
			}
		}
	default:
		// A batch Job has one pod template; other kinds get it for each
		// of theirs.
		spec = map[string]any{"template": tmpl(allTypes...)}
		if j.JobKind != "Job" {
			where = "every pod template in its manifest"
		}
	}
	return where, spec
}

// rayJobSubmitter is the replica type of a RayJob's submitter pod: the
// batch Job rule's, which reads no role label.
const rayJobSubmitter = ""

// defaultRaySubmitter is KubeRay v1.6.0's default submitter container
// (ray-operator controllers/ray/common/job.go GetDefaultSubmitterContainer):
// the head's image; KubeRay adds the command (`ray job submit ...`) to a
// container that has none.
func defaultRaySubmitter(headImage string) corev1.Container {
	return corev1.Container{Name: "ray-job-submitter", Image: headImage, Resources: corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("200Mi")},
	}}
}

// submitterTemplate is a whole submitterPodTemplate for a RayJob: KubeRay
// v1.6.0 takes a RayJob's submitterPodTemplate as it is (no default is
// merged into it), so the advice's affinity and tolerations (frag) come
// with the container the submitter ran (its name, image and resources;
// no command: KubeRay writes its own into a container without one).
func submitterTemplate(pods *jobPods, frag map[string]any) map[string]any {
	if pods.submitter == nil {
		return nil
	}
	b, err := json.Marshal(pods.submitter)
	if err != nil {
		return nil
	}
	var c map[string]any
	if json.Unmarshal(b, &c) != nil {
		return nil
	}
	spec := map[string]any{"restartPolicy": "Never", "containers": []any{c}}
	out := map[string]any{"spec": spec}
	for k, v := range frag {
		m, _ := v.(map[string]any)
		if k == "spec" {
			for sk, sv := range m {
				spec[sk] = sv
			}
			continue
		}
		out[k] = v
	}
	return out
}

func leaderTypes(pods *jobPods) []string {
	var out []string
	for _, rt := range sortedKeys(pods.replicas) {
		if pods.replicas[rt] {
			out = append(out, rt)
		}
	}
	return append(out, "")
}

func workerTypes(pods *jobPods) []string {
	var out []string
	for _, rt := range sortedKeys(pods.replicas) {
		if !pods.replicas[rt] {
			out = append(out, rt)
		}
	}
	return append(out, "")
}

// lwsNoGang says why a LeaderWorkerSet gets LWS's own exclusive topology
// and not a PodGroup: one pod-group label on its templates would join
// every group to one PodGroup, and with the exclusive topology LWS v0.8.0
// creates a group's workers only once its leader is scheduled
// (pkg/controllers/pod_controller.go), so a gang of the group would wait
// for ever for workers that are never created.
const lwsNoGang = "a LeaderWorkerSet's groups are replicas, and one pod-group label on its templates would join them all to one PodGroup; " +
	"held to one zone, LWS creates a group's workers only once its leader is scheduled (lws v0.8.0), so a gang of leader and workers would wait for ever. " +
	"LWS's own exclusive topology below keeps each group in one zone"

// lwsFix: a LeaderWorkerSet's groups are independent replicas, and
// spreading them across zones is healthy; what must stay in one zone is
// each group. LWS does that itself with its exclusive-topology annotation
// (sigs.k8s.io/lws v0.10.0 pkg/webhooks/pod_webhook.go gives each group's
// pods a required affinity to their group-key and anti-affinity to other
// groups in the domain). The leader picks the zone, so the templates are
// also held to the zones with room for a whole group.
func lwsFix(j *Job, pods *jobPods, nodes map[string]nodeInfo, zones []string, need string, rooms []zoneRoom) string {
	if len(zones) == 0 {
		return noRoomFix(j, pods, nodes, need, rooms)
	}
	vals := make([]any, len(zones))
	for i, z := range zones {
		vals[i] = z
	}
	affinity := map[string]any{"nodeAffinity": map[string]any{
		"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{map[string]any{
			"matchExpressions": []any{map[string]any{"key": kube.LabelZone, "operator": "In", "values": vals}}}}}}}
	// A CPU-only leader held to zones of GPU nodes only must tolerate
	// their taints, or it is never scheduled and, held to one zone, LWS
	// never creates its workers (seen with lws v0.8.0: the group stuck
	// at its leader).
	byType := zonesTolerations(pods, nodes, zones)
	var tolerating bool
	pin := func(replicaTypes []string) map[string]any {
		spec := map[string]any{"affinity": affinity}
		var tols []any
		for _, rt := range replicaTypes {
			for _, t := range byType[rt] {
				if !containsJSON(tols, t) {
					tols = append(tols, t)
				}
			}
		}
		if len(tols) > 0 {
			spec["tolerations"], tolerating = tols, true
		}
		return map[string]any{"spec": spec}
	}
	body, err := yaml.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{LWSExclusiveAnnotation: kube.LabelZone}},
		"spec": map[string]any{"leaderWorkerTemplate": map[string]any{
			"leaderTemplate": pin(leaderTypes(pods)), "workerTemplate": pin(workerTypes(pods))}},
	})
	if err != nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Keep each group of LeaderWorkerSet %s/%s in one zone (group %s is split): add this to the LeaderWorkerSet and re-create it (running pods do not move).\n",
		j.Namespace, pods.set, j.JobName)
	b.WriteString("# Groups are replicas of one service and may run in different zones; the annotation keeps every group's pods together, one group per zone (more groups than zones leave some pending).\n")
	fmt.Fprintf(&b, "# The leader picks its group's zone: only %s can hold a whole group now (%s; free GPUs by zone: %s).\n",
		strings.Join(zones, ", "), need, roomSummary(rooms))
	if tolerating {
		b.WriteString("# Pods without GPUs tolerate the taints of those zones' GPU nodes, so a leader can run next to its workers.\n")
	}
	b.WriteString("# If a zone fills before the group's workers are placed, some of them wait Pending (LWS places the leader first); where capacity moves, Kueue TAS waits for a zone with room instead.\n")
	b.Write(body)
	return b.String()
}

// gpuTolerations returns, per raw replica type whose pods have no GPUs,
// tolerations for the NoSchedule/NoExecute taints of the GPU nodes in zone
// that some of its pods do not tolerate.
func gpuTolerations(pods *jobPods, nodes map[string]nodeInfo, zone string) map[string][]any {
	type te struct{ key, effect string }
	out := map[string][]any{}
	// The finished pods too: their templates make them again when the
	// job is re-created (a TrainJob's CPU-only initializers, which Kueue
	// admits as pod sets of the job's Workload and places on the GPU
	// nodes of its TAS flavor: seen with Kueue v0.17.0, "couldn't assign
	// flavors to pod set dataset-initializer: ... excluded: taint").
	for _, d := range slices.Concat(pods.demand, pods.done) {
		if d.gpus > 0 || out[d.replicaType] != nil {
			continue
		}
		need := map[te]bool{}
		for _, n := range nodes {
			if !n.gpu || n.zone != zone {
				continue
			}
			for i := range n.taints {
				if t := &n.taints[i]; !tolerated(d.tolerations, t) {
					need[te{t.Key, string(t.Effect)}] = true
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
		for _, k := range keys {
			out[d.replicaType] = append(out[d.replicaType], map[string]any{"key": k.key, "operator": "Exists", "effect": k.effect})
		}
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

// kueueTemplates lays Kueue TAS's annotations (topology, of kind
// required or preferred) on the job's templates, with tolerations of the
// GPU nodes' taints for those without GPUs (the TAS flavor holds the GPU
// nodes: a coordinator that cannot run on them fits no domain with its
// workers). Kueue fits each pod set into a domain of its own choosing;
// it keeps two pod sets in one domain only as a podset group, of exactly
// two pod sets of which one is a single pod (kueue v0.17.0
// jobframework.ValidatePodSetGroupingTopology refuses other groups, and
// the TAS snapshot's findLeaderAndWorkers fits only two). Two such
// templates get a group; more (or two of several pods each) are all held
// to one zone by a required nodeAffinity, which Kueue TAS honours when it
// picks domains (pkg/cache/scheduler tas_flavor_snapshot.go): the job is
// admitted when that zone has room. note says which.
func kueueTemplates(j *Job, pods *jobPods, nodes map[string]nodeInfo, rooms []zoneRoom, annotation string) (where string, spec map[string]any, note string) {
	tols := allZoneTolerations(pods, nodes, rooms)
	templates, single := 0, 0
	patchTemplates(j, pods, func(rts ...string) map[string]any {
		templates++
		if podsOf(pods, rts) == 1 {
			single++
		}
		return nil
	})
	group := templates == 2 && single > 0
	var pin map[string]any
	if templates > 1 && !group {
		zone, ever := kueueZone(pods, nodes, rooms)
		if zone != "" {
			pin = map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
				"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
					"key": kube.LabelZone, "operator": "In", "values": []any{zone}}}}}}}}
			note = fmt.Sprintf("# Kueue keeps only two pod sets together (a podset group: one of them a single pod); this job has %d pod sets of which Kueue would pick a zone each,\n", templates)
			if ever {
				note += fmt.Sprintf("# so every template is also held to %s, the zone that can hold the whole job when its room is free: Kueue admits the job when %s has room.\n", zone, zone)
			} else {
				note += fmt.Sprintf("# so every template is also held to %s, the zone with the most free GPUs; no zone could hold the whole job even empty: Kueue admits it only once %s grows.\n", zone, zone)
			}
		}
	}
	if j.JobKind == "RayJob" {
		// kueue v0.17.0 pkg/controller/jobs/rayjob rayjob_webhook.go: a
		// queued RayJob must delete its cluster when it finishes (KubeRay's
		// default is to keep it); the webhook refuses the RayJob otherwise.
		note += "# Kueue admits a RayJob only if it deletes its cluster when it finishes (spec.shutdownAfterJobFinishes: true, set below; its webhook refuses it otherwise).\n"
	}
	where, spec = patchTemplates(j, pods, func(replicaTypes ...string) map[string]any {
		ann := map[string]any{annotation: kube.LabelZone}
		if group {
			ann[KueueGroupAnnotation] = "training"
		}
		out := map[string]any{"metadata": map[string]any{"annotations": ann}}
		s := map[string]any{}
		if pin != nil {
			s["affinity"] = pin
		}
		for _, rt := range replicaTypes {
			if t := tols[rt]; len(t) > 0 {
				s["tolerations"] = t
				break
			}
		}
		if len(s) > 0 {
			out["spec"] = s
		}
		return out
	})
	if j.JobKind == "RayJob" {
		spec["shutdownAfterJobFinishes"] = true
	}
	return where, spec, note
}

// podsOf counts a template's pods: its unfinished pods, else every pod
// the dump holds of it (the controller makes them again).
func podsOf(pods *jobPods, replicaTypes []string) int {
	n, all := 0, 0
	for _, d := range pods.demand {
		if slices.Contains(replicaTypes, d.replicaType) {
			n++
		}
	}
	for _, rt := range replicaTypes {
		all += pods.seen[rt]
	}
	if n == 0 {
		return all
	}
	return n
}

// kueueZone is the zone every pod set of a job is held to for Kueue: of
// the zones whose nodes could hold the whole job when the other pods'
// room is free, the one with the most free GPUs now (ever: there is one);
// else the zone with the most free GPUs.
func kueueZone(pods *jobPods, nodes map[string]nodeInfo, rooms []zoneRoom) (zone string, ever bool) {
	// Unbound, the job's pods and no other take room.
	unbound := slices.Clone(pods.demand)
	for i := range unbound {
		unbound[i].node = ""
	}
	empty := map[string]bool{}
	for _, r := range roomByZone(unbound, nodes, nil) {
		empty[r.zone] = r.fits
	}
	for _, r := range rooms {
		if empty[r.zone] {
			return r.zone, true
		}
	}
	if len(rooms) > 0 {
		return rooms[0].zone, false
	}
	return "", false
}

// allZoneTolerations: gpuTolerations over every zone, merged.
func allZoneTolerations(pods *jobPods, nodes map[string]nodeInfo, rooms []zoneRoom) map[string][]any {
	var zones []string
	for _, r := range rooms {
		zones = append(zones, r.zone)
	}
	sort.Strings(zones)
	return zonesTolerations(pods, nodes, zones)
}

// zonesTolerations: gpuTolerations over the zones, merged.
func zonesTolerations(pods *jobPods, nodes map[string]nodeInfo, zones []string) map[string][]any {
	tols := map[string][]any{}
	for _, z := range zones {
		for rt, ts := range gpuTolerations(pods, nodes, z) {
			for _, t := range ts {
				if !containsJSON(tols[rt], t) {
					tols[rt] = append(tols[rt], t)
				}
			}
		}
	}
	return tols
}

// kueuePreferredFix: the job's pod sets ask Kueue for a preferred zone,
// and Kueue, finding no zone with room for all of a pod set, admitted it
// across zones: the split is Kueue's choice. Required topology makes it
// wait for one zone instead.
// recreateNote is what re-creating a job of kind takes beyond deleting
// and creating it ("" for most kinds).
func recreateNote(kind string) string {
	switch kind {
	case "RayCluster", "RayJob":
		// Seen on the real KubeRay v1.6.0 (internal/trainlab, TestAdviceCells).
		return "# KubeRay: re-create it half a minute after the old pods are gone (KubeRay keeps a cluster's pod expectations by name for 30 s; sooner, its pods come only at its next reconcile, 300 s later).\n"
	case "TrainJob":
		// Seen on the real Kubeflow Trainer v2.2.0 (internal/trainlab).
		return "# Trainer: delete it with kubectl's default cascade; with --cascade=foreground Trainer v2.2.0 re-creates its JobSet while the TrainJob waits for it, and the TrainJob never goes.\n"
	}
	return ""
}

func kueuePreferredFix(j *Job, pods *jobPods, nodes map[string]nodeInfo, need string, rooms []zoneRoom) string {
	where, spec, note := kueueTemplates(j, pods, nodes, rooms, KueueTopologyAnnotation)
	body, err := yaml.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Kueue's choice: the pods of %s %s/%s ask Kueue TAS for a preferred zone (%s), which lets Kueue admit a pod set\n",
		j.JobKind, j.Namespace, j.JobName, KueuePreferredTopologyAnnotation)
	fmt.Fprintf(&b, "# across zones when none has room for it (%s; free GPUs by zone now: %s). To wait for one zone instead, replace it with\n", need, roomSummary(rooms))
	fmt.Fprintf(&b, "# %s in %s and re-create the job:\n", KueueTopologyAnnotation, where)
	b.WriteString(recreateNote(j.JobKind))
	b.WriteString(note)
	b.Write(body)
	return b.String()
}
