package topology

import (
	"net/netip"
	"testing"
)

// These tests put the controllers' pod shapes (identity_test.go) through
// the index: the decisions that need the whole job.

type placed struct {
	name string
	meta PodMeta
	node string
	ip   string
	// terminating: deletionTimestamp set.
	terminating bool
}

func zonedIndex(t *testing.T, pods []placed, owners Owners) *Index {
	t.Helper()
	x := NewIndex()
	x.UpsertNode(Node{Name: "n-a", Zone: "z-a"})
	x.UpsertNode(Node{Name: "n-b", Zone: "z-b"})
	x.UpsertNode(Node{Name: "n-c", Zone: "z-c"})
	for _, p := range pods {
		id, ok := Identify(DefaultRules(), p.meta, owners)
		if !ok {
			continue
		}
		pod := Pod{Namespace: p.meta.Namespace, Name: p.name, Node: p.node, Identity: id, Terminating: p.terminating}
		if p.ip != "" {
			pod.IPs = []netip.Addr{netip.MustParseAddr(p.ip)}
		}
		x.UpsertPod(0, pod)
	}
	return x
}

func roles(jp JobPlacement) map[string]string {
	out := map[string]string{}
	for _, p := range jp.Pods {
		out[p.Pod] = p.Role
	}
	return out
}

// Point 3: Trainer v2 MPI runtime (runLauncherAsNode): only the launcher
// coordinates; node 0-0 runs sshd.
func TestIndexRoleGuessYields(t *testing.T) {
	x := zonedIndex(t, []placed{
		{name: "ds-launcher-0-0-abcde", meta: jobsetPod("ds", "launcher", 0, 0, ""), node: "n-a"},
		{name: "ds-node-0-0-fghij", meta: jobsetPod("ds", "node", 0, 0, ""), node: "n-a", ip: "10.0.0.2"},
		{name: "ds-node-0-1-klmno", meta: jobsetPod("ds", "node", 0, 1, ""), node: "n-a"},
	}, nil)
	jp := x.Placements("")
	if len(jp) != 1 {
		t.Fatalf("placements: %+v", jp)
	}
	want := map[string]string{"ds-launcher-0-0-abcde": RoleCoordinator, "ds-node-0-0-fghij": RoleWorker, "ds-node-0-1-klmno": RoleWorker}
	if got := roles(jp[0]); !equalMaps(got, want) {
		t.Fatalf("roles %v, want %v", got, want)
	}
	if e, _ := x.LookupIP(netip.MustParseAddr("10.0.0.2")); e.Role != RoleWorker {
		t.Fatalf("node 0-0 endpoint role %q", e.Role)
	}
	// Without the launcher the guess stands (torch runtime: node 0-0 is MASTER_ADDR).
	x.DeletePod(0, "ml", "ds-launcher-0-0-abcde")
	if got := roles(x.Placements("")[0]); got["ds-node-0-0-fghij"] != RoleCoordinator {
		t.Fatalf("without a launcher: %v", got)
	}
}

// Point 4: PaddleJob collective mode: worker 0 coordinates; with a Master
// replica (PS mode) the master does.
func TestIndexPaddleJob(t *testing.T) {
	collective := zonedIndex(t, []placed{
		{name: "paddle-simple-gpu-worker-0", meta: kubeflowPod("PaddleJob", "paddlejob-controller", "paddle-simple-gpu", "worker", 0, false), node: "n-a"},
		{name: "paddle-simple-gpu-worker-1", meta: kubeflowPod("PaddleJob", "paddlejob-controller", "paddle-simple-gpu", "worker", 1, false), node: "n-a"},
	}, nil)
	if got := roles(collective.Placements("")[0]); got["paddle-simple-gpu-worker-0"] != RoleCoordinator || got["paddle-simple-gpu-worker-1"] != RoleWorker {
		t.Fatalf("collective: %v", got)
	}
	ps := zonedIndex(t, []placed{
		{name: "p-master-0", meta: kubeflowPod("PaddleJob", "paddlejob-controller", "p", "master", 0, true), node: "n-a"},
		{name: "p-worker-0", meta: kubeflowPod("PaddleJob", "paddlejob-controller", "p", "worker", 0, false), node: "n-a"},
	}, nil)
	if got := roles(ps.Placements("")[0]); got["p-master-0"] != RoleCoordinator || got["p-worker-0"] != RoleWorker {
		t.Fatalf("with a master: %v", got)
	}
}

// Point 6: an Indexed Job's pod with a deletionTimestamp next to its
// replacement (KEP-3939; podReplacementPolicy TerminatingOrFailed is the
// default, k8s.io/kubernetes v1.37.2 pkg/controller/job/job_controller.go):
// one coordinator, and the leaving pod in another zone makes no split.
func TestIndexTerminatingPodIsNotPlaced(t *testing.T) {
	x := zonedIndex(t, []placed{
		{name: "pt-workers-0-0-old", meta: jobsetPod("pt", "workers", 0, 0, ""), node: "n-b", terminating: true},
		{name: "pt-workers-0-0-new", meta: jobsetPod("pt", "workers", 0, 0, ""), node: "n-a"},
		{name: "pt-workers-0-1-aaaaa", meta: jobsetPod("pt", "workers", 0, 1, ""), node: "n-a"},
	}, nil)
	jp := x.Placements("")
	if len(jp) != 1 || jp[0].Split() || len(jp[0].Pods) != 2 {
		t.Fatalf("placements: %+v", jp)
	}
	n := 0
	for _, p := range jp[0].Pods {
		if p.Role == RoleCoordinator {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d coordinators: %+v", n, jp[0].Pods)
	}
	if got := x.Placements("n-b"); len(got) != 0 {
		t.Fatalf("the terminating pod's node hosts the job: %+v", got)
	}
}

// Point 1: one LWS, one group per zone: three healthy jobs, none split.
func TestIndexLeaderWorkerSetGroups(t *testing.T) {
	var pods []placed
	nodes := []string{"n-a", "n-b", "n-c"}
	for g := 0; g < 3; g++ {
		for w := 0; w < 3; w++ {
			name := "vllm-" + string(rune('0'+g))
			if w > 0 {
				name += "-" + string(rune('0'+w))
			}
			pods = append(pods, placed{name: name, meta: lwsPod("vllm", g, w), node: nodes[g]})
		}
	}
	jp := zonedIndex(t, pods, nil).Placements("")
	if len(jp) != 3 {
		t.Fatalf("want 3 groups, got %+v", jp)
	}
	for i, j := range jp {
		if j.Split() || j.Job.Name != "vllm-"+string(rune('0'+i)) || j.Job.Kind != "LeaderWorkerSet" {
			t.Errorf("group %d: %+v", i, j)
		}
		if r := roles(j); r[j.Job.Name] != RoleCoordinator {
			t.Errorf("group %d: leader %s not the coordinator: %v", i, j.Job.Name, r)
		}
	}
}

// Point 10: a batch Job is a training job only when Indexed with more
// than one pod.
func TestIndexBatchJobs(t *testing.T) {
	x := zonedIndex(t, []placed{
		{name: "queue-abcde", meta: batchPod("queue", -1, false), node: "n-a"},
		{name: "queue-fghij", meta: batchPod("queue", -1, false), node: "n-b"},
		{name: "single-0-abcde", meta: batchPod("single", 0, true), node: "n-a", ip: "10.0.0.9"},
		{name: "etl-0-abcde", meta: batchPod("etl", 0, false), node: "n-a"},
		{name: "etl-1-fghij", meta: batchPod("etl", 1, false), node: "n-b"},
	}, nil)
	jp := x.Placements("")
	if len(jp) != 1 || jp[0].Job.Name != "etl" || !jp[0].Split() {
		t.Fatalf("placements: %+v", jp)
	}
	if e, _ := x.LookupIP(netip.MustParseAddr("10.0.0.9")); e.Job != nil {
		t.Fatalf("a one-pod Job's pod resolves to a job: %+v", e)
	}
}

// Points 8 and 9: the RayJob's submitter and its cluster's pods are one job.
func TestIndexRayJob(t *testing.T) {
	owners := ownerMap{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "tune-x7k2p"}: {APIVersion: "ray.io/v1", Kind: "RayJob", Name: "tune"}}
	pods := []placed{
		{name: "tune-x7k2p-head-abcde", meta: rayPod("tune-x7k2p", "head", "headgroup"), node: "n-a"},
		{name: "tune-x7k2p-gpu-worker-fghij", meta: rayPod("tune-x7k2p", "worker", "gpu"), node: "n-a"},
		{name: "tune-klmno", meta: raySubmitter("tune"), node: "n-a"},
	}
	jp := zonedIndex(t, pods, owners).Placements("")
	if len(jp) != 1 || jp[0].Job != (Job{Namespace: "ray", Name: "tune", Kind: "RayJob"}) || len(jp[0].Pods) != 3 {
		t.Fatalf("with owners: %+v", jp)
	}
	// Without the RayCluster's owner the submitter alone is no job.
	jp = zonedIndex(t, pods, nil).Placements("")
	if len(jp) != 1 || jp[0].Job.Kind != "RayCluster" {
		t.Fatalf("without owners: %+v", jp)
	}
}

// KubeRay v1.6.0 (internal/trainlab TestRealMPIAndRay): the submitter
// pod carries only the Job controller's labels; through its Job's owner
// it is one of the RayJob's pods, in its own zone, and the job counts
// the cluster's pods for the submitter's minimum. Without the owners the
// cluster is a RayCluster of its own and the submitter no job.
func TestIndexRayJobV16Submitter(t *testing.T) {
	owners := ownerMap{
		{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "tune-x7k2p"}: {APIVersion: "ray.io/v1", Kind: "RayJob", Name: "tune"},
		{APIVersion: "batch/v1", Kind: "Job", Name: "tune"}:               {APIVersion: "ray.io/v1", Kind: "RayJob", Name: "tune"},
	}
	pods := []placed{
		{name: "tune-x7k2p-head-abcde", meta: rayPod("tune-x7k2p", "head", "headgroup"), node: "n-a"},
		{name: "tune-x7k2p-gpu-worker-fghij", meta: rayPod("tune-x7k2p", "worker", "gpu"), node: "n-a"},
		{name: "tune-klmno", meta: raySubmitterV16("tune"), node: "n-b", ip: "10.0.0.7"},
	}
	x := zonedIndex(t, pods, owners)
	jp := x.Placements("")
	if len(jp) != 1 || jp[0].Job != (Job{Namespace: "ray", Name: "tune", Kind: "RayJob"}) || len(jp[0].Pods) != 3 ||
		len(jp[0].Zones) != 2 || jp[0].Zones[0] != "z-a" || jp[0].Zones[1] != "z-b" || roles(jp[0])["tune-klmno"] != RoleWorker {
		t.Fatalf("with owners: %+v", jp)
	}
	if e, _ := x.LookupIP(netip.MustParseAddr("10.0.0.7")); e.Job == nil || e.Job.Name != "tune" || e.Job.Kind != "RayJob" {
		t.Fatalf("the submitter's address resolves to %+v, want RayJob tune", e)
	}
	jp = zonedIndex(t, pods, nil).Placements("")
	if len(jp) != 1 || jp[0].Job.Kind != "RayCluster" || len(jp[0].Pods) != 2 {
		t.Fatalf("without owners: %+v", jp)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Point 9, late owner: the JobSet's TrainJob owner becomes known after its
// pods were identified; every pod of the job follows, and the *Job handed
// out before keeps its old value.
func TestIndexJobKindFollowsOwner(t *testing.T) {
	x := zonedIndex(t, []placed{
		{name: "llm-node-0-0-a", meta: jobsetPod("llm", "node", 0, 0, ""), node: "n-a", ip: "10.0.0.1"},
		{name: "llm-node-0-1-b", meta: jobsetPod("llm", "node", 0, 1, ""), node: "n-a"},
	}, nil)
	before, _ := x.LookupIP(netip.MustParseAddr("10.0.0.1"))
	owners := ownerMap{
		{APIVersion: "batch/v1", Kind: "Job", Name: "llm-node-0"}:             {APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llm"},
		{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llm"}: {APIVersion: "trainer.kubeflow.org/v1alpha1", Kind: "TrainJob", Name: "llm"},
	}
	// The feed re-identifies one pod: the whole job takes the kind.
	id, _ := Identify(DefaultRules(), jobsetPod("llm", "node", 0, 1, ""), owners)
	x.UpsertPod(0, Pod{Namespace: "ml", Name: "llm-node-0-1-b", Node: "n-a", Identity: id})
	jp := x.Placements("")
	if len(jp) != 1 || jp[0].Job.Kind != "TrainJob" || len(jp[0].Pods) != 2 {
		t.Fatalf("placements: %+v", jp)
	}
	if e, _ := x.LookupIP(netip.MustParseAddr("10.0.0.1")); e.Job.Kind != "TrainJob" {
		t.Fatalf("lookup after: %+v", e.Job)
	}
	if before.Job.Kind != "JobSet" {
		t.Fatalf("the *Job handed out before changed: %+v", before.Job)
	}
}
