package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// TestRemoteJobsOnDemand (issue 45 item 2): a remote pod of a job with no
// pod on this node whose identity cannot name its job (an Indexed Job's:
// Cilium drops the completion index, and the rule's minimum counts pods)
// is named once the per-node view has listed the job on demand. On the
// real kube-apiserver, node n-a's view, with at most one remote job at a
// time: the first Indexed Job a lookup meets is listed and named (kind
// Job, both pods); a second waits while the first is in use; once no
// lookup has met the first for the idle time its feed stops, its pods
// leave the index and the second is listed; deleting the second's pods
// ends it, and no job feed is left.
func TestRemoteJobsOnDemand(t *testing.T) {
	testenv.ToolsBin(t, "etcd", "kube-apiserver")
	c := startCluster(t)
	nb, err := c.client.CoreV1().Nodes().Get(c.ctx, "n-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nb.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.2"}}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, nb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, job := range []string{"idx1", "idx2"} {
		for i := range 2 {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", job, i),
				Labels: map[string]string{"batch.kubernetes.io/job-name": job, "job-name": job, topology.LabelCompletionIndex: fmt.Sprint(i)}}}
			c.pod(p, "n-b", fmt.Sprintf("10.0.5.%d", map[string]int{"idx1": 1, "idx2": 3}[job]+i))
		}
	}
	cil := newClusterCilium()
	syncCilium := func() {
		nodes, err := c.client.CoreV1().Nodes().List(c.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods, err := c.client.CoreV1().Pods("ml").List(c.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cil.sync(nodes.Items, pods.Items)
	}
	syncCilium()

	rules := topology.DefaultRules()
	idx := topology.NewIndex()
	idx.SetRemote("n-a", nodeIPCache{cil, "n-a"}, cil, rules)
	l, fs, err := kube.NewLocal(c.kapi, idx, rules, "n-a", 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const idle = 2 * time.Second
	kube.SetRemoteBounds(l, 1, idle)
	if err := l.Run(c.ctx, fs); err != nil {
		t.Fatal(err)
	}

	// Flows keep meeting the addresses in use.
	var mu sync.Mutex
	inUse := map[string]bool{}
	use := func(ip string, on bool) {
		mu.Lock()
		defer mu.Unlock()
		inUse[ip] = on
	}
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			mu.Lock()
			for ip, on := range inUse {
				if on {
					idx.LookupIP(netip.MustParseAddr(ip))
				}
			}
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	jobOf := func(ip string) string {
		e, _ := idx.LookupIP(netip.MustParseAddr(ip))
		if e.Job == nil {
			return ""
		}
		return e.Job.Name + "/" + e.Job.Kind + "/" + e.Zone
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				n, st := l.RemoteJobs()
				t.Fatalf("%s: not within 60 s; remote jobs %d %+v, job feeds %d, 10.0.5.1 %q, 10.0.5.3 %q", what, n, st, l.Feeds(), jobOf("10.0.5.1"), jobOf("10.0.5.3"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	if j := jobOf("10.0.5.1"); j != "" {
		t.Fatalf("an Indexed Job's pod named by its identity alone: %s", j)
	}
	use("10.0.5.1", true)
	waitFor("idx1 listed and named", func() bool { return jobOf("10.0.5.1") == "idx1/Job/zone-b" && jobOf("10.0.5.2") == "idx1/Job/zone-b" })
	use("10.0.5.3", true)
	waitFor("idx2 waits for the one place", func() bool { _, st := l.RemoteJobs(); return st.Deferred > 0 })
	if j := jobOf("10.0.5.3"); j != "" {
		t.Fatalf("a second remote job listed beyond the bound of one: %s", j)
	}
	use("10.0.5.1", false)
	waitFor("idx1 let go after the idle time, idx2 listed", func() bool { return jobOf("10.0.5.3") == "idx2/Job/zone-b" })
	// (By name: a lookup of its address would ask for idx1 again.)
	for i := range 2 {
		if _, ok := idx.LookupPod("ml", fmt.Sprintf("idx1-%d", i)); ok {
			t.Errorf("idx1-%d stayed in the index after its feed stopped", i)
		}
	}
	use("10.0.5.3", false)
	for i := range 2 {
		if err := c.client.CoreV1().Pods("ml").Delete(c.ctx, fmt.Sprintf("idx2-%d", i), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	syncCilium()
	waitFor("idx2 ended, no job feed left", func() bool { n, _ := l.RemoteJobs(); return n == 0 && l.Feeds() == 0 })
	n, st := l.RemoteJobs()
	if st.Started != 2 || st.Stopped != 2 {
		t.Errorf("remote jobs %d, %+v: want 2 started, 2 stopped", n, st)
	}
	t.Logf("remote jobs: %+v", st)
}
