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
	// KueueQueuePlaceholder stands in the advice for the user's
	// LocalQueue, which the dump does not name.
	KueueQueuePlaceholder = "<LocalQueue of a TAS ResourceFlavor>"
	// TrainJobPatchManager names zonewatch's entry of a TrainJob's
	// spec.runtimePatches.
	TrainJobPatchManager = "zonewatch.io/analyze"
)

// suggestedFix is the advice that keeps every pod of a split job in one
// zone and holds whether or not the zone it would pick still has room
// when the job is re-created: gang admission, which starts every pod of
// the job in one zone or none. By default that is Kueue TAS (a required
// zone topology on every template, the job queued; Kueue creates no pod
// before it admits the job whole into one zone with room); with podGroups
// it is kube-scheduler 1.37's native gang + topology PodGroup; a
// VolcanoJob is a gang under Volcano's own scheduler already, and is
// pinned. A pin alone (a required nodeAffinity to the zone with room now,
// or a LeaderWorkerSet's exclusive topology) is not given: it holds no pod
// back, so when the zone fills before the job is re-created some pods run
// and the rest wait Pending (half-placed: seen on every training
// controller in internal/trainlab's TestAdviceCells), and the advice says
// so.
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
	if j.JobKind == "VolcanoJob" {
		// Kueue has no integration of a Volcano Job: Volcano's own gang.
		if len(zones) == 0 {
			return volcanoNoRoomFix(j, pods, need, rooms)
		}
		return volcanoFix(j, pods, nodes, zones[0], need, rooms)
	}
	if podGroups {
		g := planGang(j.JobKind, pods)
		if j.JobKind == "LeaderWorkerSet" && pods.set != "" {
			g = gangPlan{none: true, why: []string{lwsNoGang}}
		}
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
	return roomFix(j, pods, nodes, zones[0], need, rooms)
}

// pinAffinity is a required nodeAffinity to zone.
func pinAffinity(zone string) map[string]any {
	return map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
			"key": kube.LabelZone, "operator": "In", "values": []any{zone}}}}}}}}
}

// noPin says why a zone with room now gets no pin.
func noPin(zone string) string {
	return fmt.Sprintf("# No pin to %s is given: a required nodeAffinity holds no pod back, so if %s fills before the job is re-created some pods run\n"+
		"# and the rest wait Pending (half-placed; seen on every training controller, docs/runbooks.md \"Every advice side by side\").\n", zone, zone)
}

// roomFix: a zone has room for the job now (zone, the one with the most
// free GPUs). Kueue TAS admits the job whole into a zone with room, that
// one while it still has room, and creates no pod before.
func roomFix(j *Job, pods *jobPods, nodes map[string]nodeInfo, zone, need string, rooms []zoneRoom) string {
	where, note, body := kueueQueued(j, pods, nodes, rooms)
	var b strings.Builder
	if j.JobKind == "LeaderWorkerSet" && pods.set != "" {
		fmt.Fprintf(&b, "# Keep each group of LeaderWorkerSet %s/%s in one zone (group %s is split): Kueue topology-aware scheduling admits each group\n",
			j.Namespace, pods.set, j.JobName)
		b.WriteString("# whole into one zone with room, or it waits (groups are replicas of one service and may run in different zones).\n")
		where = "the LeaderWorkerSet"
	} else {
		fmt.Fprintf(&b, "# Keep every pod of %s %s/%s in one zone: Kueue topology-aware scheduling admits the job whole into one zone with room, or it waits.\n",
			j.JobKind, j.Namespace, j.JobName)
	}
	fmt.Fprintf(&b, "# Add this to %s, queue it to a LocalQueue of a TAS ResourceFlavor and re-create it (running pods do not move; docs/runbooks.md, Kueue TAS).\n", where)
	b.WriteString(recreateNote(j.JobKind))
	fmt.Fprintf(&b, "# %s has room for the whole job now (%s; free GPUs by zone: %s); if it fills first, the job waits whole for room instead of starting split.\n",
		zone, need, roomSummary(rooms))
	b.WriteString(noPin(zone))
	b.WriteString("# On Kubernetes 1.37 with GenericWorkload and TopologyAwareWorkloadScheduling on, analyze --podgroups=on gives the native gang instead.\n")
	if len(allZoneTolerations(pods, nodes, rooms)) > 0 {
		b.WriteString("# Pods without GPUs tolerate the GPU nodes' taints so that they fit the GPU zone's flavor with their workers.\n")
	}
	b.WriteString(note)
	b.Write(body)
	return b.String()
}

// volcanoNoRoomFix: no zone can hold a Volcano Job now; a pin would leave
// pods Pending, and Kueue does not manage Volcano Jobs. Volcano's gang
// kept in one tier-1 HyperNode per zone (networkTopology) waits whole for
// a zone with room: read from the source, UNTESTED.
func volcanoNoRoomFix(j *Job, pods *jobPods, need string, rooms []zoneRoom) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# No zone can hold every pod of VolcanoJob %s/%s now (%s; free GPUs by zone: %s).\n",
		j.Namespace, j.JobName, need, roomSummary(rooms))
	b.WriteString("# Pinning it to one zone would leave pods Pending, and Kueue does not manage Volcano Jobs. Free room in one zone (or shrink the job),\n")
	b.WriteString("# or let Volcano's scheduler keep the gang in one zone and wait for room there: add this to its manifest and re-create the job.\n")
	lines := volcanoLines(len(pods.demand))
	b.WriteString(strings.Join(lines.spec, "\n") + "\n")
	fmt.Fprintf(&b, "# UNTESTED (read from %s, not run here): with one tier-1 HyperNode per zone, the administrator's, once per zone:\n", VolcanoRelease)
	for _, l := range lines.hyperNode {
		b.WriteString("# " + l + "\n")
	}
	return b.String()
}

// volcanoFix: a VolcanoJob is a gang under Volcano's own scheduler
// (minAvailable pods start together or none does), so a pin to the zone
// with room holds it whole there, or it waits whole: minAvailable is set
// to every pod, and the templates are pinned.
func volcanoFix(j *Job, pods *jobPods, nodes map[string]nodeInfo, zone, need string, rooms []zoneRoom) string {
	tols := gpuTolerations(pods, nodes, zone)
	where, spec := patchTemplates(j, pods, func(replicaTypes ...string) map[string]any {
		s := map[string]any{"affinity": pinAffinity(zone)}
		for _, rt := range replicaTypes {
			if t := tols[rt]; len(t) > 0 {
				s["tolerations"] = t
				break
			}
		}
		return map[string]any{"spec": s}
	})
	spec["minAvailable"] = len(pods.demand)
	body, err := yaml.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Keep every pod of VolcanoJob %s/%s in one zone: add this to %s and re-create the job (running pods do not move).\n",
		j.Namespace, j.JobName, where)
	fmt.Fprintf(&b, "# %s has room for the whole job now (%s; free GPUs by zone: %s): every pod is pinned there, and Volcano's scheduler starts\n",
		zone, need, roomSummary(rooms))
	fmt.Fprintf(&b, "# minAvailable pods (all %d) together or none, so if %s fills first the job waits whole (UNTESTED: Volcano cannot be built here, see below).\n",
		len(pods.demand), zone)
	if len(tols) > 0 {
		fmt.Fprintf(&b, "# Pods without GPUs tolerate the taints of the GPU nodes in %s, so they can run next to the workers.\n", zone)
	}
	b.Write(body)
	b.WriteString(volcanoAdvice(len(pods.demand)))
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
	where, note, body := kueueQueued(j, pods, nodes, rooms)
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

// lwsNoGang says why a LeaderWorkerSet gets no PodGroup: its templates
// are every group's, so one pod-group label on them would join every
// group, each a replica of its own, to one PodGroup (lws v0.8.0 has no
// per-group pod-group name). Kueue's LeaderWorkerSet integration admits
// each group as a workload of its own.
const lwsNoGang = "a LeaderWorkerSet's groups are replicas, and one pod-group label on its templates would join them all to one PodGroup (lws v0.8.0); " +
	"Kueue TAS below admits each group whole into one zone"

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

// kueueQueued is Kueue's required-topology advice as YAML: the job queued
// (KueueQueuePlaceholder) and its templates from kueueTemplates.
func kueueQueued(j *Job, pods *jobPods, nodes map[string]nodeInfo, rooms []zoneRoom) (where, note string, body []byte) {
	where, spec, note := kueueTemplates(j, pods, nodes, rooms, KueueTopologyAnnotation)
	body, _ = yaml.Marshal(map[string]any{ // maps of strings always marshal
		"metadata": map[string]any{"labels": map[string]any{KueueQueueLabel: KueueQueuePlaceholder}},
		"spec":     spec,
	})
	return where, note, body
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
			pin = pinAffinity(zone)
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

// kueueZone is the zone every pod set of a job is held to for Kueue: the
// zone with room for the whole job now with the most free GPUs; else, of
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
		if r.fits {
			return r.zone, true // room now
		}
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
