package analyze

import (
	"encoding/json"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/collector/kube"
)

// Native gang + topology scheduling (kube-scheduler 1.37), field names as
// k8s.io/api v0.37.2 spells them: scheduling/v1beta1 PodGroup
// spec.schedulingPolicy.gang.minCount and
// spec.schedulingConstraints.topology[].key, core/v1 PodSpec
// spec.schedulingGroup.podGroupName. The scheduler's GangScheduling plugin
// holds a group's pods until minCount of them exist and binds none unless
// all fit (Permit); TopologyPlacementGenerator tries each value of the
// topology key as one placement for the whole group
// (pkg/scheduler/framework/plugins/gangscheduling, topologyaware).
const (
	PodGroupAPIVersion = "scheduling.k8s.io/v1beta1"
	// PodGroupLabel on a pod template names the PodGroup its pods join:
	// the opt-in admission policy (PodGroupPolicy) sets the pods'
	// spec.schedulingGroup.podGroupName from it, for controllers whose
	// templates cannot carry spec.schedulingGroup.
	PodGroupLabel = "zonewatch.io/pod-group"
)

// PodGroups says whether the advice uses native PodGroups.
type PodGroups string

const (
	// PodGroupsAuto: when the pods dump holds a scheduling.k8s.io/v1beta1
	// PodGroup with a topology constraint (a gate off drops it on write,
	// so its presence shows both gates on).
	PodGroupsAuto PodGroups = "auto"
	PodGroupsOn   PodGroups = "on"
	PodGroupsOff  PodGroups = "off"
)

// schedulingGroupCarriers are the controllers that copy a pod template's
// spec.schedulingGroup onto their pods. A CRD controller needs a CRD
// schema that keeps the field (structural pruning drops unknown fields)
// and Go types of k8s.io/api v0.36 or later (older ones drop it when they
// decode the template); every CRD of the releases below was generated
// before the field existed (it replaced spec.workloadRef in 1.36), so
// they drop it: TestCRDsDropSchedulingGroup loads those CRDs into the
// v1.37.2 apiserver and sees it go.
var schedulingGroupCarriers = map[string]bool{"Job": true}

// noCarrier names the release checked for each kind whose templates drop
// spec.schedulingGroup.
var noCarrier = map[string]string{
	"PyTorchJob": "training-operator v1.9.3", "TFJob": "training-operator v1.9.3", "XGBoostJob": "training-operator v1.9.3",
	"PaddleJob": "training-operator v1.9.3", "JAXJob": "training-operator v1.9.3", "MPIJob": "mpi-operator v0.8.0, training-operator v1.9.3",
	"JobSet": "jobset v0.11.1", "TrainJob": "trainer v2.2.0", "RayJob": "kuberay v1.6.0", "RayCluster": "kuberay v1.6.0",
	"LeaderWorkerSet": "lws v0.8.0", "VolcanoJob": "volcano apis v1.14.0 (Volcano schedules with its own PodGroup)",
}

// servesPodGroups: the dump holds a v1beta1 PodGroup with a topology
// constraint.
func servesPodGroups(raw json.RawMessage) bool {
	var pg struct {
		APIVersion string `json:"apiVersion"`
		Spec       struct {
			SchedulingConstraints struct {
				Topology []struct {
					Key string `json:"key"`
				} `json:"topology"`
			} `json:"schedulingConstraints"`
		} `json:"spec"`
	}
	return json.Unmarshal(raw, &pg) == nil && pg.APIVersion == PodGroupAPIVersion && len(pg.Spec.SchedulingConstraints.Topology) > 0
}

// podGroupName is the PodGroup the advice creates for a job.
func podGroupName(j *Job) string { return j.JobName + "-gang" }

// PodGroupManifest is the PodGroup of a job of minCount pods kept in one
// zone.
func PodGroupManifest(namespace, name string, minCount int) map[string]any {
	return map[string]any{
		"apiVersion": PodGroupAPIVersion, "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec": map[string]any{
			"schedulingPolicy":      map[string]any{"gang": map[string]any{"minCount": minCount}},
			"schedulingConstraints": map[string]any{"topology": []any{map[string]any{"key": kube.LabelZone}}},
		},
	}
}

// gangFix: a PodGroup for the job (a gang of the unfinished pods that the
// controller creates at once, first: g.minCount, one zone) and the
// templates of g's pods joined to it, in the job's own kind: the
// templates' spec.schedulingGroup where the controller carries it, else
// the PodGroupLabel for the admission policy. pods are the pods that join
// (planGang). No zone is named: the scheduler picks one with room for all
// of them, or binds none and waits; pods of a later step join the group
// in its zone. Pods without GPUs tolerate the GPU nodes' taints of every
// zone.
func gangFix(j *Job, pods *jobPods, nodes map[string]nodeInfo, rooms []zoneRoom, need string, g gangPlan) string {
	name := podGroupName(j)
	carries := schedulingGroupCarriers[j.JobKind]
	tols := allZoneTolerations(pods, nodes, rooms)
	where, spec := patchTemplates(j, pods, func(replicaTypes ...string) map[string]any {
		s := map[string]any{}
		for _, rt := range replicaTypes {
			if t := tols[rt]; len(t) > 0 {
				s["tolerations"] = t
				break
			}
		}
		out := map[string]any{}
		if carries {
			s["schedulingGroup"] = map[string]any{"podGroupName": name}
		} else {
			out["metadata"] = map[string]any{"labels": map[string]any{PodGroupLabel: name}}
		}
		if len(s) > 0 {
			out["spec"] = s
		}
		return out
	})
	pg, err := yaml.Marshal(PodGroupManifest(j.Namespace, name, g.minCount))
	if err != nil {
		return ""
	}
	body, err := yaml.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return ""
	}
	var fits []string
	for _, r := range rooms {
		if r.fits {
			fits = append(fits, r.zone)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Keep every pod of %s %s/%s in one zone with kube-scheduler's gang + topology scheduling (%s PodGroup; gates GenericWorkload and TopologyAwareWorkloadScheduling on the apiserver and scheduler).\n",
		j.JobKind, j.Namespace, j.JobName, PodGroupAPIVersion)
	if g.minCount == len(pods.demand) {
		fmt.Fprintf(&b, "# The scheduler binds no pod of the group until one zone has room for all %d (%s; free GPUs by zone now: %s; %s), then all of them there.\n",
			len(pods.demand), need, roomSummary(rooms), fitsNow(fits))
	} else {
		fmt.Fprintf(&b, "# The scheduler binds none of the %d pods created first until one zone has room for them, then all of them there; the pods created later join the group in that zone\n", g.minCount)
		fmt.Fprintf(&b, "# (they wait there, Pending, if it filled meanwhile: only the first step is a gang). The group's pods: %s; free GPUs by zone now: %s; %s.\n",
			need, roomSummary(rooms), fitsNow(fits))
	}
	b.WriteString(stepsNote(g.why))
	fmt.Fprintf(&b, "# Create the PodGroup, then add the rest to %s and re-create the job (running pods do not move).\n", where)
	b.WriteString(recreateNote(j.JobKind))
	if len(tols) > 0 {
		b.WriteString("# Pods without GPUs tolerate the GPU nodes' taints, so they can run next to the workers.\n")
	}
	if !carries {
		rel := noCarrier[j.JobKind]
		if rel == "" {
			rel = "its controller"
		}
		fmt.Fprintf(&b, "# %s (%s) drops spec.schedulingGroup from its pod templates (its CRD schema and Go types predate Kubernetes 1.36): the templates carry the label %s,\n", j.JobKind, rel, PodGroupLabel)
		fmt.Fprintf(&b, "# which zonewatch's opt-in admission policy (%s) turns into each pod's spec.schedulingGroup.podGroupName.\n", PodGroupPolicyName)
	}
	b.Write(pg)
	b.WriteString("---\n")
	b.Write(body)
	return b.String()
}

func fitsNow(zones []string) string {
	if len(zones) == 0 {
		return "none has room now: the job waits whole"
	}
	return "room now in " + strings.Join(zones, ", ")
}

func containsJSON(list []any, v any) bool {
	b, _ := json.Marshal(v)
	for _, x := range list {
		if c, _ := json.Marshal(x); string(c) == string(b) {
			return true
		}
	}
	return false
}
