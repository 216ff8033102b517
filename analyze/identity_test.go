package analyze

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/topology"
)

// testdata/identity/pods.json is a `kubectl get pods,jobs,jobsets,rayclusters
// -A -o json` List holding each controller's pod shape (and the owner
// objects between the pods and what the user created), written from:
//   - LeaderWorkerSet vllm, three groups: sigs.k8s.io/lws v0.10.0
//     pkg/controllers/leaderworkerset_controller.go, pod_controller.go,
//     pkg/webhooks/pod_webhook.go (group-index, group-key, worker-index;
//     worker StatefulSet "<lws>-<g>");
//   - TrainJob ds on deepspeed-distributed: kubeflow/trainer v2.3.0
//     manifests/base/runtimes/deepspeed_distributed.yaml (replicated jobs
//     launcher and node, runLauncherAsNode), plugins/jobset/jobset.go (the
//     JobSet is named like the TrainJob and owned by it);
//   - JobSet pt with spec.coordinator and JobSet tp with a terminating pod
//     next to its replacement: sigs.k8s.io/jobset v0.12.0
//     pkg/controllers/jobset_controller.go labelAndAnnotateObject and
//     CoordinatorEndpoint; k8s.io/kubernetes v1.37.2 pkg/controller/job
//     (completion index, hostname, replacement of terminating pods);
//   - PaddleJob paddle-simple-gpu: kubeflow/training-operator v1.9.0
//     examples/paddlepaddle/simple-gpu.yaml, pkg/controller.v1/paddlepaddle/envvar.go;
//   - Volcano lm-mpi-job: volcano.sh/volcano v1.15.0
//     docs/user-guide/how_to_use_mpi_plugin.md, pkg/controllers/job/job_controller_util.go;
//   - batch Jobs queue (not Indexed), single (one pod) and etl (index
//     only as an annotation);
//   - RayJob tune: ray-project/kuberay v1.7.0 rayjob_controller.go
//     (RayCluster tune-x7k2p owned by the RayJob; submitter Job "tune"
//     with ray.io/originated-from-* pod labels), common/pod.go labelPod.
//
// TestIdentityShapes is the same table as topology's and collector/kube's
// tests, through the offline path.
func TestIdentityShapes(t *testing.T) {
	rep, err := Run(Input{Nodes: td("nodes.json"), Pods: td("identity", "pods.json")})
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		kind, verdict string
		zones         map[string]RoleCount
		fix, noFix    []string
	}
	a, b, c := "us-east-1a", "us-east-1b", "us-east-1c"
	wants := map[string]want{
		// Point 1: each LWS group is a job; groups in different zones are
		// healthy; the split group's fix is Kueue's, which admits each
		// group whole (LWS's exclusive topology half-places a group when
		// the zone fills first: not given).
		"serve/vllm-0": {kind: "LeaderWorkerSet", verdict: VerdictHealthy, zones: map[string]RoleCount{a: {Coordinator: 1, Worker: 2}}},
		"serve/vllm-1": {kind: "LeaderWorkerSet", verdict: VerdictHealthy, zones: map[string]RoleCount{b: {Coordinator: 1, Worker: 2}}},
		"serve/vllm-2": {kind: "LeaderWorkerSet", verdict: VerdictSplit, zones: map[string]RoleCount{a: {Worker: 1}, c: {Coordinator: 1, Worker: 1}},
			fix:   []string{"LeaderWorkerSet serve/vllm", "leaderTemplate:", "workerTemplate:", "podset-required-topology: topology.kubernetes.io/zone"},
			noFix: []string{"podAffinity", "leaderworkerset.sigs.k8s.io/name", "exclusive-topology"}},
		// Points 3 and 9: the launcher coordinates, node 0-0 does not; the
		// kind is the TrainJob, the fix a TrainJob runtime patch.
		"ml/ds": {kind: "TrainJob", verdict: VerdictSplit, zones: map[string]RoleCount{a: {Worker: 2}, b: {Coordinator: 1}},
			fix: []string{"runtimePatches:", "manager: zonewatch.io/analyze", "- name: launcher", "- name: node", "podset-required-topology: topology.kubernetes.io/zone"}},
		// Point 2: the coordinator label names pt-workers-0-1 in zone b.
		"ml/pt": {kind: "JobSet", verdict: VerdictSplit, zones: map[string]RoleCount{a: {Worker: 2}, b: {Coordinator: 1}}},
		// Point 6: the terminating pod in zone b is not placed.
		"ml/tp": {kind: "JobSet", verdict: VerdictHealthy, zones: map[string]RoleCount{a: {Coordinator: 1, Worker: 1}}},
		// Point 4: worker 0 is PADDLE_MASTER.
		"ml/paddle-simple-gpu": {kind: "PaddleJob", verdict: VerdictSplit, zones: map[string]RoleCount{a: {Worker: 1}, b: {Coordinator: 1}},
			fix: []string{"paddleReplicaSpecs:", "Worker:"}},
		// Point 5: mpimaster coordinates.
		"ml/lm-mpi-job": {kind: "VolcanoJob", verdict: VerdictSplit, zones: map[string]RoleCount{a: {Coordinator: 1}, b: {Worker: 2}},
			fix: []string{"- name: mpimaster", "- name: mpiworker", "minAvailable: 3", "operator: In"}},
		// Points 7 and 10: only the Indexed Job of two pods; its index is an
		// annotation.
		"etl/etl": {kind: "Job", verdict: VerdictHealthy, zones: map[string]RoleCount{a: {Coordinator: 1, Worker: 1}}},
		// Points 8 and 9: head, worker and submitter are the RayJob.
		"ray/tune": {kind: "RayJob", verdict: VerdictSplit, zones: map[string]RoleCount{a: {Coordinator: 1, Worker: 1}, b: {Worker: 1}},
			fix: []string{"rayClusterSpec:", "headGroupSpec:", "groupName: gpu", "key: topology.kubernetes.io/zone"}, noFix: []string{"podAffinity"}},
	}
	got := map[string]Job{}
	for _, j := range rep.Jobs {
		got[j.Namespace+"/"+j.JobName] = j
	}
	for name, w := range wants {
		j, ok := got[name]
		if !ok {
			t.Errorf("%s: not reported", name)
			continue
		}
		if j.JobKind != w.kind || j.Verdict != w.verdict || !reflect.DeepEqual(j.Zones, w.zones) {
			t.Errorf("%s: kind %s verdict %s zones %v; want %s %s %v", name, j.JobKind, j.Verdict, j.Zones, w.kind, w.verdict, w.zones)
		}
		for _, s := range w.fix {
			if !strings.Contains(j.SuggestedFix, s) {
				t.Errorf("%s: fix lacks %q:\n%s", name, s, j.SuggestedFix)
			}
		}
		for _, s := range w.noFix {
			if strings.Contains(j.SuggestedFix, s) {
				t.Errorf("%s: fix has %q:\n%s", name, s, j.SuggestedFix)
			}
		}
	}
	for name := range got {
		if _, ok := wants[name]; !ok {
			t.Errorf("%s reported; not a training job (work queue, one-pod Job, or a RayJob's parts apart)", name)
		}
	}
}

// TestIdentityAgreesWithTheInformerTransform: the exporter identifies the
// pods its informers keep after PodStripper, analyze the pods of the dump
// as they are. Both must reach the same identity for every shape.
func TestIdentityAgreesWithTheInformerTransform(t *testing.T) {
	data, err := os.ReadFile(td("identity", "pods.json"))
	if err != nil {
		t.Fatal(err)
	}
	owners, err := kube.LoadOwners(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	rules := topology.DefaultRules()
	strip := kube.PodStripper(rules)
	n := 0
	err = kube.DecodeObjects(bytes.NewReader(data), "Pod", func(raw json.RawMessage) error {
		var p corev1.Pod
		if err := json.Unmarshal(raw, &p); err != nil {
			return err
		}
		s, _ := strip(p.DeepCopy())
		full, kept := kube.PodWithOwners(rules, owners, &p), s.(*kube.CachedPod).Pod(rules, owners)
		if !reflect.DeepEqual(full, kept) {
			t.Errorf("%s/%s: dump %+v, informer %+v", p.Namespace, p.Name, full, kept)
		}
		n++
		return nil
	})
	if err != nil || n < 30 {
		t.Fatalf("%d pods read: %v", n, err)
	}
}
