package analyze

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Controllers that create a job's pods in steps, as their code does:
//   - Kubeflow Trainer v2.2.0: a TrainJob's initializers (replicated jobs
//     dataset-initializer and model-initializer, pkg/constants) run
//     first; its runtime's node job dependsOn them with status Complete
//     (manifests/base/runtimes), so no trainer pod exists before they end;
//   - JobSet v0.11.1: a replicated job with dependsOn is created once the
//     one it names is Ready or Complete, and with startupPolicy InOrder
//     each replicated job once the one before it is Ready
//     (pkg/controllers/jobset_controller.go, depends_on.go);
//   - mpi-operator v0.8.0: with launcherCreationPolicy WaitForWorkersReady
//     the launcher Job is created once every worker is Ready
//     (pkg/controller/mpi_job_controller.go); training-operator v1.9.3
//     creates both at once;
//   - KubeRay v1.6.0: a RayJob's submitter Job is created once its
//     RayCluster is ready (rayjob_controller.go); the cluster's head and
//     workers come together.
//
// A PodGroup whose minCount counts pods of a later step, or whose label is
// on the template of a step that must end first, waits for ever: the
// controller creates the later pods only after the group has run. The
// scheduler keeps a pod that joins a group after it was placed in the
// group's domain (kube-scheduler v1.37.2 topologyaware GeneratePlacements:
// the scheduled pods' domain is required), so a later step joins the group
// without being counted.

// Trainer v2's initializer replicated jobs (trainer v2.2.0 pkg/constants
// DatasetInitializer, ModelInitializer).
var trainerInitializers = []string{"dataset-initializer", "model-initializer"}

// jobSetSpec is what the steps need of a JobSet in the dump.
type jobSetSpec struct {
	Spec struct {
		ReplicatedJobs []struct {
			Name      string `json:"name"`
			DependsOn []struct {
				Name   string `json:"name"`
				Status string `json:"status"`
			} `json:"dependsOn"`
		} `json:"replicatedJobs"`
		StartupPolicy *struct {
			StartupPolicyOrder string `json:"startupPolicyOrder"`
		} `json:"startupPolicy"`
	} `json:"spec"`
}

// gangPlan is which of a job's replica types join its PodGroup (their
// templates get the label) and which of them make its minCount (the pods
// created at once, first); why says what was left out and why.
type gangPlan struct {
	join, count map[string]bool
	minCount    int
	why         []string
	// none: no gang can be given; why says why.
	none bool
}

// planGang decides the gang of a job from its kind, its pods and, for a
// JobSet (a TrainJob runs as one), its spec when the dump holds it.
func planGang(kind string, pods *jobPods) gangPlan {
	g := gangPlan{join: map[string]bool{}, count: map[string]bool{}}
	for rt := range pods.replicas {
		g.join[rt], g.count[rt] = true, true
	}
	leave := func(rt, why string) {
		if g.join[rt] {
			delete(g.join, rt)
			delete(g.count, rt)
			g.why = append(g.why, why)
		}
	}
	notCounted := func(rt, why string) {
		if g.count[rt] {
			delete(g.count, rt)
			g.why = append(g.why, why)
		}
	}
	switch kind {
	case "TrainJob", "JobSet":
		if kind == "TrainJob" {
			for _, rt := range trainerInitializers {
				leave(rt, fmt.Sprintf("%s ends before the trainer's pods are created (the runtime's dependsOn, status Complete): it is left out of the gang", rt))
			}
		}
		js := pods.jobSet
		if js == nil {
			if kind == "JobSet" && len(g.join) > 1 {
				g.none = true
				g.why = append(g.why, "the dump holds no JobSet object, so analyze cannot tell whether its replicated jobs start in steps (dependsOn, startupPolicy InOrder), where a gang of all its pods waits for ever; dump it with its pods (kubectl get pods,jobsets -o json) for the gang advice")
			}
			break
		}
		rjs := js.Spec.ReplicatedJobs
		for _, rj := range rjs {
			for _, d := range rj.DependsOn {
				if d.Status == "Complete" {
					leave(d.Name, fmt.Sprintf("%s ends before %s is created (dependsOn, status Complete): it is left out of the gang", d.Name, rj.Name))
				}
			}
		}
		for _, rj := range rjs {
			for _, d := range rj.DependsOn {
				if d.Status != "Complete" {
					notCounted(rj.Name, fmt.Sprintf("%s is created once %s is %s (dependsOn): it joins the group but is not counted in minCount", rj.Name, d.Name, d.Status))
				}
			}
		}
		if sp := js.Spec.StartupPolicy; sp != nil && sp.StartupPolicyOrder == "InOrder" {
			first := ""
			for _, rj := range rjs {
				if !g.join[rj.Name] {
					continue
				}
				if first == "" {
					first = rj.Name
					continue
				}
				notCounted(rj.Name, fmt.Sprintf("%s is created once the replicated job before it is Ready (startupPolicy InOrder): it joins the group but is not counted in minCount", rj.Name))
			}
		}
	case "MPIJob":
		notCounted("launcher", "the launcher may be created only once every worker is Ready (mpi-operator launcherCreationPolicy: WaitForWorkersReady): it joins the group but is not counted in minCount")
	case "RayJob", "RayCluster":
		for rt := range pods.replicas {
			if rt != "head" && rt != "worker" {
				// The submitter: the patch's submitterPodTemplate.
				notCounted(rt, "the RayJob's submitter is created once its RayCluster is ready: it joins the group but is not counted in minCount")
			}
		}
	}
	late := map[string]bool{}
	for _, d := range pods.demand {
		if g.count[d.replicaType] {
			g.minCount++
		}
		if g.join[d.replicaType] && !g.count[d.replicaType] && d.gpus > 0 && !late[d.replicaType] {
			// The group's zone is chosen by the pods created first, alone.
			late[d.replicaType] = true
			g.none = true
			g.why = append(g.why, fmt.Sprintf("%s, with GPUs, is created only after the pods before it run, and a PodGroup's zone is chosen by those alone: it may find no room there (this advice picks the zone for every pod before any is created)", d.replicaType))
		}
	}
	if len(late) > 0 {
		// No group to join: only the reasons for giving none.
		g.why = slices.DeleteFunc(g.why, func(w string) bool { return strings.Contains(w, "joins the group") })
	}
	if !g.none && g.minCount == 0 {
		g.none = true
		g.why = append(g.why, "none of the pods that start together exists yet (an earlier step runs), so analyze cannot count them")
	}
	sort.Strings(g.why)
	g.why = slices.Compact(g.why)
	return g
}

// gangPods is the job's pods that join the group.
func (g gangPlan) gangPods(pods *jobPods) *jobPods {
	out := *pods
	out.replicas = map[string]bool{}
	for rt, coord := range pods.replicas {
		if g.join[rt] {
			out.replicas[rt] = coord
		}
	}
	out.demand = nil
	for _, d := range pods.demand {
		if g.join[d.replicaType] {
			out.demand = append(out.demand, d)
		}
	}
	return &out
}

// stepsNote renders why as comment lines.
func stepsNote(why []string) string {
	var b strings.Builder
	for _, w := range why {
		fmt.Fprintf(&b, "# In steps: %s.\n", w)
	}
	return b.String()
}

// decodeJobSet reads a JobSet object of the dump.
func decodeJobSet(raw json.RawMessage) (ns, name string, js *jobSetSpec, err error) {
	var o struct {
		Metadata struct{ Namespace, Name string } `json:"metadata"`
	}
	js = &jobSetSpec{}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", "", nil, err
	}
	if err := json.Unmarshal(raw, js); err != nil {
		return "", "", nil, err
	}
	return o.Metadata.Namespace, o.Metadata.Name, js, nil
}
