package sim

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

// Clientset returns a client-go fake clientset holding the scenario's nodes
// and pods, so the exporter's real informers run against it.
func Clientset(s *Scenario) kubernetes.Interface {
	nodes, pods := s.KubeObjects()
	objs := make([]runtime.Object, 0, len(nodes)+len(pods))
	for _, n := range nodes {
		objs = append(objs, n)
	}
	for _, p := range pods {
		objs = append(objs, p)
	}
	return fake.NewClientset(objs...)
}

// Churn starts and finishes short batch Jobs every period (a data-prep job
// in one zone), so placement series come and go as in a real cluster.
func Churn(ctx context.Context, client kubernetes.Interface, s *Scenario, period time.Duration, logger *slog.Logger) {
	t := time.NewTicker(period)
	defer t.Stop()
	node := s.Nodes[len(s.Nodes)-1]
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		name := fmt.Sprintf("etl-%d", i)
		p := Pod{
			Namespace: "data", Name: name + "-0", Node: node.Name,
			IP:        node.PodCIDR.Addr().Next().Next().Next().Next(),
			Labels:    map[string]string{"batch.kubernetes.io/job-name": name, "batch.kubernetes.io/job-completion-index": "0"},
			OwnerKind: "Job", OwnerName: name,
		}
		pods := client.CoreV1().Pods("data")
		if _, err := pods.Create(ctx, KubePod(p), metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
			logger.Warn("simulated churn: create", "pod", p.Name, "err", err)
		}
		prev := fmt.Sprintf("etl-%d-0", i-1)
		if i > 0 {
			if err := pods.Delete(ctx, prev, metav1.DeleteOptions{}); err != nil && ctx.Err() == nil {
				logger.Warn("simulated churn: delete", "pod", prev, "err", err)
			}
		}
	}
}
