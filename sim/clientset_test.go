package sim

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
)

// TestClusterSelects: the simulated cluster applies label and field
// selectors as the API server does (the exporter's per-node and job
// informers select by spec.nodeName and by a job's label), and its watch
// sends only the selected objects' events.
func TestClusterSelects(t *testing.T) {
	s := Default()
	c := NewCluster(s)
	ctx := context.Background()
	node := s.Nodes[0].Name

	all, err := kubeapi.ListPods(ctx, c, "", metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	on, err := kubeapi.ListPods(ctx, c, "", metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, p := range all.Items {
		if p.Spec.NodeName == node {
			want++
		}
	}
	if want == 0 || want == len(all.Items) || len(on.Items) != want {
		t.Fatalf("pods on %s: %d of %d, want %d", node, len(on.Items), len(all.Items), want)
	}
	nodes, err := kubeapi.ListNodes(ctx, c, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 1 || nodes.Items[0].Name != node {
		t.Fatalf("node by name: %d nodes", len(nodes.Items))
	}
	if _, err := kubeapi.ListPods(ctx, c, "", metav1.ListOptions{LabelSelector: "a in (b"}); !apierrors.IsBadRequest(err) {
		t.Errorf("a bad selector: %v, want BadRequest", err)
	}

	w, err := c.Watch(ctx, kubeapi.Pods, "data", metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=etl-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, name := range []string{"etl-0", "etl-1"} {
		p := KubePod(Pod{Namespace: "data", Name: name + "-0", Node: node, Labels: map[string]string{"batch.kubernetes.io/job-name": name}})
		if err := c.CreatePod(p); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case e := <-w.ResultChan():
		p, _ := e.Object.(*corev1.Pod)
		if e.Type != watch.Added || p == nil || p.Name != "etl-1-0" {
			t.Fatalf("first event %s %v, want etl-1-0 added (etl-0-0 is not selected)", e.Type, p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event")
	}

	rl, err := c.ServerResourcesForGroupVersion("resource.k8s.io/v1")
	if err != nil || len(rl.APIResources) != 1 || rl.APIResources[0].Name != "resourceslices" {
		t.Errorf("resource.k8s.io/v1: %v, %v", rl, err)
	}
	if _, err := c.ServerResourcesForGroupVersion("kubeflow.org/v1"); !apierrors.IsNotFound(err) {
		t.Errorf("a group not served: %v, want NotFound", err)
	}
}
