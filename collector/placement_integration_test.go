package collector_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/collector"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

// TestPlacementAgainstKubeAPIServer runs the real informers against a real
// kube-apiserver and follows /metrics as job pods are created, moved
// across zones and deleted.
func TestPlacementAgainstKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	api := testenv.StartAPIServer(t)
	client := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	s := sim.Default()
	for _, n := range s.Nodes {
		if _, err := client.CoreV1().Nodes().Create(ctx, s.KubeNode(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"ml-team", "research", "shop"} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createPod := func(p sim.Pod) {
		t.Helper()
		obj := sim.KubePod(p)
		status := obj.Status
		obj.Status = corev1.PodStatus{}
		created, err := client.CoreV1().Pods(p.Namespace).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
		created.Status = status
		if _, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("pod %s status: %v", p.Name, err)
		}
	}
	// No kubelet confirms a graceful deletion: delete at once.
	zero := int64(0)
	now := metav1.DeleteOptions{GracePeriodSeconds: &zero}
	blocked := s.Jobs[1] // ml-team/llm-blocked: master gpu-b1, workers gpu-a2
	for _, p := range blocked.Pods {
		createPod(p)
	}
	createPod(s.Others[0]) // a non-job pod: never exported

	index := topology.NewIndex()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	live, factories, err := kube.NewLive(kubeapi.NewForConfigOrDie(api.Config), index, topology.DefaultRules(), 0, logger)
	if err != nil {
		t.Fatal(err)
	}
	exp := collector.New(logger)
	exp.AddSource("kubernetes", live)
	exp.Add("placement", collector.NewPlacement(index, "gpu-a2"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(exp)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	if err := live.Run(ctx, factories); err != nil {
		t.Fatal(err)
	}

	scrape := func() []string {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "zonewatch_job_") || strings.HasPrefix(l, "zonewatch_source_up") {
				lines = append(lines, l)
			}
		}
		sort.Strings(lines)
		return lines
	}
	waitFor := func(what string, want []string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := scrape()
			if strings.Join(got, "\n") == strings.Join(want, "\n") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s:\n got:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	waitFor("split job on gpu-a2", []string{
		`zonewatch_job_pod_info{job_kind="PyTorchJob",job_name="llm-blocked",namespace="ml-team",node="gpu-a2",pod="llm-blocked-worker-0",role="worker",zone="us-east-1a"} 1`,
		`zonewatch_job_pod_info{job_kind="PyTorchJob",job_name="llm-blocked",namespace="ml-team",node="gpu-a2",pod="llm-blocked-worker-1",role="worker",zone="us-east-1a"} 1`,
		`zonewatch_job_split_zone{job_name="llm-blocked",namespace="ml-team"} 1`,
		`zonewatch_job_zones{job_name="llm-blocked",namespace="ml-team"} 2`,
		`zonewatch_source_up{source="kubernetes"} 1`,
	})

	// The fix: the master is recreated in zone a (as podAffinity would place it).
	if err := client.CoreV1().Pods("ml-team").Delete(ctx, "llm-blocked-master-0", now); err != nil {
		t.Fatal(err)
	}
	master := blocked.Pods[0]
	master.Node = "gpu-a2"
	createPod(master)
	waitFor("master moved to zone a", []string{
		`zonewatch_job_pod_info{job_kind="PyTorchJob",job_name="llm-blocked",namespace="ml-team",node="gpu-a2",pod="llm-blocked-master-0",role="coordinator",zone="us-east-1a"} 1`,
		`zonewatch_job_pod_info{job_kind="PyTorchJob",job_name="llm-blocked",namespace="ml-team",node="gpu-a2",pod="llm-blocked-worker-0",role="worker",zone="us-east-1a"} 1`,
		`zonewatch_job_pod_info{job_kind="PyTorchJob",job_name="llm-blocked",namespace="ml-team",node="gpu-a2",pod="llm-blocked-worker-1",role="worker",zone="us-east-1a"} 1`,
		`zonewatch_job_split_zone{job_name="llm-blocked",namespace="ml-team"} 0`,
		`zonewatch_job_zones{job_name="llm-blocked",namespace="ml-team"} 1`,
		`zonewatch_source_up{source="kubernetes"} 1`,
	})

	// A worker finishes: it no longer counts; then the job is deleted: no stale series.
	w, err := client.CoreV1().Pods("ml-team").Get(ctx, "llm-blocked-worker-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Status.Phase = corev1.PodSucceeded
	if _, err := client.CoreV1().Pods("ml-team").UpdateStatus(ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("worker finished", []string{
		`zonewatch_job_pod_info{job_kind="PyTorchJob",job_name="llm-blocked",namespace="ml-team",node="gpu-a2",pod="llm-blocked-master-0",role="coordinator",zone="us-east-1a"} 1`,
		`zonewatch_job_pod_info{job_kind="PyTorchJob",job_name="llm-blocked",namespace="ml-team",node="gpu-a2",pod="llm-blocked-worker-0",role="worker",zone="us-east-1a"} 1`,
		`zonewatch_job_split_zone{job_name="llm-blocked",namespace="ml-team"} 0`,
		`zonewatch_job_zones{job_name="llm-blocked",namespace="ml-team"} 1`,
		`zonewatch_source_up{source="kubernetes"} 1`,
	})
	for _, p := range blocked.Pods {
		if err := client.CoreV1().Pods("ml-team").Delete(ctx, p.Name, now); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("job deleted", []string{`zonewatch_source_up{source="kubernetes"} 1`})
}
