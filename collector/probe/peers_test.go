package probe

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestPodPeersOnAPIServer: on the real kube-apiserver, the peers are the
// Running exporter pods the selector matches in any namespace, at their pod
// IP and the probe port, with their node's zone; a pending, a terminating
// and an unlabelled pod are not peers, and a pod that starts running later
// becomes one.
func TestPodPeersOnAPIServer(t *testing.T) {
	testenv.Integration(t)
	api := testenv.StartAPIServer(t)
	c := kubernetes.NewForConfigOrDie(api.Config)
	ctx := context.Background()
	for _, ns := range []string{"monitoring", "other"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	labels := map[string]string{"app.kubernetes.io/name": "zonewatch", "app.kubernetes.io/instance": "zw"}
	pod := func(ns, name, node, ip string, phase corev1.PodPhase, l map[string]string, finalizer bool) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "exporter", Image: "zonewatch"}}},
		}
		if finalizer {
			p.Finalizers = []string{"zonewatch.test/hold"}
		}
		created, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if phase != "" {
			created.Status = corev1.PodStatus{Phase: phase, PodIP: ip}
			if _, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	pod("monitoring", "zw-a", "node-a", "10.0.1.5", corev1.PodRunning, labels, false)
	pod("other", "zw-b", "node-b", "10.0.2.5", corev1.PodRunning, labels, false)
	pod("monitoring", "zw-pending", "node-c", "", corev1.PodPending, labels, false)
	pod("monitoring", "web", "node-a", "10.0.1.9", corev1.PodRunning, map[string]string{"app": "web"}, false)
	pod("monitoring", "zw-leaving", "node-d", "10.0.4.5", corev1.PodRunning, labels, true)
	if err := c.CoreV1().Pods("monitoring").Delete(ctx, "zw-leaving", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p, err := c.CoreV1().Pods("monitoring").Get(ctx, "zw-leaving", metav1.GetOptions{})
		if err == nil {
			p.Finalizers = nil
			_, _ = c.CoreV1().Pods("monitoring").Update(ctx, p, metav1.UpdateOptions{})
		}
	})

	zones := map[string]string{"node-a": "zone-a", "node-b": "zone-b", "node-c": "zone-c"}
	pp := NewPodPeers(kubeapi.NewForConfigOrDie(api.Config), "app.kubernetes.io/name=zonewatch,app.kubernetes.io/instance=zw", DefaultPort, func(n string) string { return zones[n] }, slog.New(slog.DiscardHandler))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	pp.Start(runCtx)

	waitPeers := func(want ...string) {
		t.Helper()
		var got []string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			got = got[:0]
			for _, p := range pp.Peers() {
				got = append(got, fmt.Sprintf("%s %s %s", p.Node, p.Zone, p.Addr))
			}
			sort.Strings(got)
			if fmt.Sprint(got) == fmt.Sprint(want) {
				return
			}
		}
		t.Fatalf("peers %v, want %v", got, want)
	}
	waitPeers("node-a zone-a 10.0.1.5:19421", "node-b zone-b 10.0.2.5:19421")

	// The pending exporter starts.
	p, err := c.CoreV1().Pods("monitoring").Get(ctx, "zw-pending", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.3.5"}
	if _, err := c.CoreV1().Pods("monitoring").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPeers("node-a zone-a 10.0.1.5:19421", "node-b zone-b 10.0.2.5:19421", "node-c zone-c 10.0.3.5:19421")
}
