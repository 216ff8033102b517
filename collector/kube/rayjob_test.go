package kube_test

import (
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// TestPerNodeViewRayJob (issue 45 item 2, issue 43): a RayJob is one job
// on every node of the per-node view, however its pods are labelled. As
// KubeRay v1.6.0 makes them (internal/trainlab TestRealMPIAndRay, on the
// real operator): the head and worker carry ray.io/cluster of the
// RayCluster "<rayjob>-<random>" the RayJob controls; the submitter's pod
// only the Job controller's job-name labels of its Job "<rayjob>", which
// the RayJob controls and which alone carries the ray.io/originated-from-*
// labels. A submitter pod that carries those labels itself (a
// submitterPodTemplate that sets them) is the RayJob's too. With the head
// and worker in zone b and the submitter in zone a, both nodes' views
// hold all three pods and export what the cluster-wide view does: one
// split job of two zones. For "late" the RayCluster and the submitter's
// Job arrive after the pods: the nodes then select and place the pods
// once their owners are known.
func TestPerNodeViewRayJob(t *testing.T) {
	testenv.ToolsBin(t, "etcd", "kube-apiserver")
	c := startCluster(t)
	c.crd("ray.io", "v1", "RayCluster", "rayclusters")
	c.crd("ray.io", "v1", "RayJob", "rayjobs")

	rules := topology.DefaultRules()
	logger := slog.New(slog.DiscardHandler)
	wide := topology.NewIndex()
	lw, fs, err := kube.NewLive(c.kapi, wide, rules, 0, logger)
	if err != nil {
		t.Fatal(err)
	}
	lw.WithOwners(c.meta, c.kapi)
	if err := lw.Run(c.ctx, fs); err != nil {
		t.Fatal(err)
	}
	views := map[string]*topology.Index{}
	feeds := map[string]*kube.Live{}
	for _, node := range []string{"n-a", "n-b"} {
		idx := topology.NewIndex()
		l, fs, err := kube.NewLocal(c.kapi, idx, rules, node, 0, logger)
		if err != nil {
			t.Fatal(err)
		}
		l.WithOwners(c.meta, c.kapi)
		if err := l.Run(c.ctx, fs); err != nil {
			t.Fatal(err)
		}
		views[node], feeds[node] = idx, l
	}

	ip := 0
	addr := func() string { ip++; return "10.0.3." + strconv.Itoa(ip) }
	submitterJob := map[string]any{"template": map[string]any{"spec": map[string]any{"restartPolicy": "Never",
		"containers": []any{map[string]any{"name": "ray-job-submitter", "image": "rayproject/ray:2.40.0"}}}}}
	submit := func(rayjob, cluster string, ownersFirst, podLabels bool) {
		rj := c.object("ray.io/v1", "RayJob", "rayjobs", rayjob, nil, map[string]any{}, nil)
		originated := map[string]string{"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": rayjob}
		yes := true
		rc := &metav1.OwnerReference{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: cluster, UID: "00000000-0000-0000-0000-0000000000aa", Controller: &yes}
		job := &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: rayjob, UID: "00000000-0000-0000-0000-0000000000bb", Controller: &yes}
		mkOwners := func() {
			rc = c.object("ray.io/v1", "RayCluster", "rayclusters", cluster, originated, map[string]any{}, rj)
			job = c.object("batch/v1", "Job", "jobs", rayjob, originated, submitterJob, rj)
		}
		if ownersFirst {
			mkOwners()
		}
		ray := func(name, nodeType string) *corev1.Pod {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels:          map[string]string{"ray.io/cluster": cluster, "ray.io/node-type": nodeType, "ray.io/group": "g", "ray.io/is-ray-node": "yes"},
				OwnerReferences: []metav1.OwnerReference{*rc}}}
		}
		c.pod(ray(cluster+"-head-abcde", "head"), "n-b", addr())
		c.pod(ray(cluster+"-g-worker-fghij", "worker"), "n-b", addr())
		sub := map[string]string{"batch.kubernetes.io/job-name": rayjob, "job-name": rayjob}
		if podLabels {
			maps.Copy(sub, originated)
		}
		c.pod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: rayjob + "-klmno", Labels: sub, OwnerReferences: []metav1.OwnerReference{*job}}}, "n-a", addr())
		if !ownersFirst {
			// Before its RayCluster exists the cluster is a job of its own
			// and the submitter alone is none (below its rule's minimum,
			// or, without its Job, a plain Job's pod).
			waitPlacement(t, wide, "RayCluster before its owner exists", func(jp []topology.JobPlacement) bool {
				return slices.ContainsFunc(jp, func(j topology.JobPlacement) bool { return j.Job.Name == cluster })
			})
			mkOwners()
		}
	}
	want := func(rayjob string) func(jp []topology.JobPlacement) bool {
		return func(jp []topology.JobPlacement) bool {
			for _, j := range jp {
				if j.Job == (topology.Job{Namespace: "ml", Name: rayjob, Kind: "RayJob"}) {
					return len(j.Pods) == 3 && slices.Equal(j.Zones, []string{"zone-a", "zone-b"}) && coordinators(j) == 1
				}
			}
			return false
		}
	}
	for _, tc := range []struct {
		rayjob, cluster string
		ownersFirst     bool
		podLabels       bool // the submitter's pod carries the originated-from labels
	}{{"tune", "tune-x7k2p", true, false}, {"late", "late-q9w4z", false, false}, {"labelled", "labelled-m3n8v", true, true}} {
		submit(tc.rayjob, tc.cluster, tc.ownersFirst, tc.podLabels)
		waitPlacement(t, wide, "cluster-wide "+tc.rayjob, want(tc.rayjob))
		for node, idx := range views {
			waitNodePlacement(t, idx, node, tc.rayjob+" on "+node, want(tc.rayjob))
		}
	}
	// One job per RayJob on each node, three selectors each: the
	// cluster's, the submitter's Job's (job-name) and the RayJob's name
	// under the originated-from rule (which selects the submitter where
	// its pod carries the labels, and none of KubeRay v1.6.0's pods).
	for node, l := range feeds {
		if n := l.Feeds(); n != 9 {
			t.Errorf("%s runs %d job feeds, want 9 (3 RayJobs, 3 selectors each)", node, n)
		}
	}
	// The jobs' pods gone, every feed stops.
	for _, p := range []string{"tune-x7k2p-head-abcde", "tune-x7k2p-g-worker-fghij", "tune-klmno", "late-q9w4z-head-abcde", "late-q9w4z-g-worker-fghij", "late-klmno",
		"labelled-m3n8v-head-abcde", "labelled-m3n8v-g-worker-fghij", "labelled-klmno"} {
		if err := c.client.CoreV1().Pods("ml").Delete(c.ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for node, l := range feeds {
		for l.Feeds() != 0 || len(views[node].Placements("")) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d job feeds and placements %+v after the jobs' pods were deleted", node, l.Feeds(), views[node].Placements(""))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// waitNodePlacement polls one node's placements until check passes.
func waitNodePlacement(t *testing.T, index *topology.Index, node, what string, check func([]topology.JobPlacement) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		jp := index.Placements(node)
		if check(jp) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: placements %+v", what, jp)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
