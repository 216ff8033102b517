package probe

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestPodPeersDenied: on the real kube-apiserver under RBAC, the probe's
// peer informer running as the chart's ServiceAccount without its pods
// rule logs one error line naming the verb, the resource, the user and the
// rule to add (starved_source=probe), is not Up (source_up 0), and recovers
// by itself once the rule is granted.
func TestPodPeersDenied(t *testing.T) {
	testenv.Integration(t)
	api := testenv.StartAPIServer(t)
	const name = "zonewatch-probe-denied"
	rename := func(r *testenv.ChartRBAC) {
		r.ServiceAccount.Name, r.ClusterRole.Name, r.Binding.Name, r.Binding.RoleRef.Name, r.Binding.Subjects[0].Name = name, name, name, name, name
	}
	id := api.ChartIdentity(t, func(r *testenv.ChartRBAC) {
		rename(r)
		r.ClusterRole.Rules = slices.DeleteFunc(r.ClusterRole.Rules, func(p rbacv1.PolicyRule) bool {
			return slices.Contains(p.APIGroups, "") && slices.Contains(p.Resources, "pods")
		})
	})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(api.Config)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "monitoring", Name: "zw-b", Labels: map[string]string{"app.kubernetes.io/name": "zonewatch"}},
		Spec:       corev1.PodSpec{NodeName: "node-b", Containers: []corev1.Container{{Name: "exporter", Image: "zonewatch"}}},
	}
	created, err := admin.CoreV1().Pods("monitoring").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.2.5"}
	if _, err := admin.CoreV1().Pods("monitoring").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	var log testenv.SyncBuffer
	pp := NewPodPeers(kubeapi.NewForConfigOrDie(id.Config), DefaultSelector, DefaultPort, func(string) string { return "zone-b" },
		slog.New(slog.NewTextHandler(&log, nil)))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	pp.Start(runCtx)

	want := []string{`level=ERROR`, `msg="permission denied: add the rule to zonewatch's ClusterRole`, `starved_source=probe`,
		`verb=list`, `resource=pods`, `user=` + id.User, `rule="{apiGroups: [\"\"], resources: [\"pods\"], verbs: [\"list\", \"watch\"]}"`}
	denied := func() (n int) {
		for _, l := range strings.Split(log.String(), "\n") {
			all := true
			for _, w := range want {
				all = all && strings.Contains(l, w)
			}
			if all {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(30 * time.Second); denied() == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no denial line with %q in:\n%s", want, log.String())
		}
	}
	// The reflector retries meanwhile (backoff from 800 ms): still one line.
	time.Sleep(3 * time.Second)
	if n := denied(); n != 1 {
		t.Errorf("%d denial lines after the retries, want 1:\n%s", n, log.String())
	}
	if pp.Up() {
		t.Error("Up with the pods rule missing")
	}
	if len(pp.Peers()) != 0 {
		t.Errorf("peers %v with the pods rule missing", pp.Peers())
	}

	api.ChartIdentity(t, rename) // the chart's rules again
	for deadline := time.Now().Add(60 * time.Second); !pp.Up() || len(pp.Peers()) != 1; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not recovered after the rule was granted: up %v, peers %v\n%s", pp.Up(), pp.Peers(), log.String())
		}
	}
}
