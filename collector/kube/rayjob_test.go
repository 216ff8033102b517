package kube_test

import (
	"log/slog"
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

// TestPerNodeViewRayJob (issue 45 item 2): a RayJob is one job on every
// node of the per-node view, however its pods are labelled. KubeRay v1.7.0
// shapes (ray-operator/controllers/ray/common/pod.go labelPod,
// rayjob_controller.go getSubmitterTemplate / createNewK8sJob /
// constructRayClusterForRayJob): the head and worker carry ray.io/cluster
// of the RayCluster "<rayjob>-<random>" the RayJob controls, the submitter
// ray.io/originated-from-cr-name of the RayJob. With the head and worker
// in zone b and the submitter in zone a, both nodes' views hold all three
// pods and export what the cluster-wide view does: one split job of two
// zones. The RayCluster arrives after the pods the second time: the
// submitter's node then selects the cluster's pods once it is known.
func TestPerNodeViewRayJob(t *testing.T) {
	testenv.ToolsBin(t, "etcd", "kube-apiserver")
	c := startCluster(t)
	c.crd("ray.io", "v1", "RayCluster", "rayclusters")
	c.crd("ray.io", "v1", "RayJob", "rayjobs")

	rules := topology.DefaultRules()
	logger := slog.New(slog.DiscardHandler)
	wide := topology.NewIndex()
	lw, fs, err := kube.NewLive(c.client, wide, rules, 0, logger)
	if err != nil {
		t.Fatal(err)
	}
	lw.WithOwners(c.meta, c.client.Discovery())
	if err := lw.Run(c.ctx, fs); err != nil {
		t.Fatal(err)
	}
	views := map[string]*topology.Index{}
	feeds := map[string]*kube.Live{}
	for _, node := range []string{"n-a", "n-b"} {
		idx := topology.NewIndex()
		l, fs, err := kube.NewLocal(c.client, idx, rules, node, 0, logger)
		if err != nil {
			t.Fatal(err)
		}
		l.WithOwners(c.meta, c.client.Discovery())
		if err := l.Run(c.ctx, fs); err != nil {
			t.Fatal(err)
		}
		views[node], feeds[node] = idx, l
	}

	ip := 0
	addr := func() string { ip++; return "10.0.3." + strconv.Itoa(ip) }
	submit := func(rayjob, cluster string, clusterFirst bool) {
		rj := c.object("ray.io/v1", "RayJob", "rayjobs", rayjob, nil, map[string]any{}, nil)
		var rc *metav1.OwnerReference
		mkCluster := func() {
			rc = c.object("ray.io/v1", "RayCluster", "rayclusters", cluster, map[string]string{"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": rayjob}, map[string]any{}, rj)
		}
		if clusterFirst {
			mkCluster()
		} else {
			yes := true
			rc = &metav1.OwnerReference{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: cluster, UID: "00000000-0000-0000-0000-0000000000aa", Controller: &yes}
		}
		ray := func(name, nodeType string) *corev1.Pod {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels:          map[string]string{"ray.io/cluster": cluster, "ray.io/node-type": nodeType, "ray.io/group": "g", "ray.io/is-ray-node": "yes"},
				OwnerReferences: []metav1.OwnerReference{*rc}}}
		}
		c.pod(ray(cluster+"-head-abcde", "head"), "n-b", addr())
		c.pod(ray(cluster+"-g-worker-fghij", "worker"), "n-b", addr())
		c.pod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: rayjob + "-klmno", Labels: map[string]string{
			"ray.io/originated-from-cr-name": rayjob, "ray.io/originated-from-crd": "RayJob",
			"batch.kubernetes.io/job-name": rayjob, "job-name": rayjob}}}, "n-a", addr())
		if !clusterFirst {
			// Before its RayCluster exists the cluster is a job of its own
			// and the submitter alone is none (below its rule's minimum).
			waitPlacement(t, wide, "RayCluster before its owner exists", func(jp []topology.JobPlacement) bool {
				return slices.ContainsFunc(jp, func(j topology.JobPlacement) bool { return j.Job.Name == cluster })
			})
			mkCluster()
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
		clusterFirst    bool
	}{{"tune", "tune-x7k2p", true}, {"late", "late-q9w4z", false}} {
		submit(tc.rayjob, tc.cluster, tc.clusterFirst)
		waitPlacement(t, wide, "cluster-wide "+tc.rayjob, want(tc.rayjob))
		for node, idx := range views {
			waitNodePlacement(t, idx, node, tc.rayjob+" on "+node, want(tc.rayjob))
		}
	}
	// One job per RayJob on each node, two selectors each: the
	// submitter's label and the cluster's.
	for node, l := range feeds {
		if n := l.Feeds(); n != 4 {
			t.Errorf("%s runs %d job feeds, want 4 (2 RayJobs, 2 selectors each)", node, n)
		}
	}
	// The jobs' pods gone, every feed stops.
	for _, p := range []string{"tune-x7k2p-head-abcde", "tune-x7k2p-g-worker-fghij", "tune-klmno", "late-q9w4z-head-abcde", "late-q9w4z-g-worker-fghij", "late-klmno"} {
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
