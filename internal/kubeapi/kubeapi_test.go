package kubeapi_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestAgainstAPIServer reads a real kube-apiserver v1.37.2 through the
// exporter's client: selectors reach the server, lists and watches decode
// into the built-in types, protobuf is asked for (as client-go's typed
// clients ask), discovery answers as client-go's does, and an informer
// syncs and follows a change.
func TestAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(api.Config)

	cfg := rest.CopyConfig(api.Config)
	var mu sync.Mutex
	accepts := map[string]string{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			accepts[r.URL.Path] = r.Header.Get("Accept")
			mu.Unlock()
			return rt.RoundTrip(r)
		})
	})
	c := kubeapi.NewForConfigOrDie(cfg)

	for _, n := range []string{"n-a", "n-b"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelTopologyZone: "zone-" + n}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name, node string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	}
	for _, p := range []*corev1.Pod{pod("w-0", "n-a", map[string]string{"job": "j"}), pod("w-1", "n-b", map[string]string{"job": "j"}), pod("other", "n-a", nil)} {
		if _, err := admin.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	pods, err := kubeapi.ListPods(ctx, c, "default", metav1.ListOptions{LabelSelector: "job=j", FieldSelector: "spec.nodeName=n-b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || pods.Items[0].Name != "w-1" {
		t.Fatalf("pods with job=j on n-b: %v, want [w-1]", names(pods.Items))
	}
	all, err := kubeapi.ListPods(ctx, c, metav1.NamespaceAll, metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 1 || all.Continue == "" {
		t.Fatalf("limit 1 of 3 pods: %d items, continue %q", len(all.Items), all.Continue)
	}
	nodes, err := kubeapi.ListNodes(ctx, c, metav1.ListOptions{FieldSelector: "metadata.name=n-a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 1 || nodes.Items[0].Labels[corev1.LabelTopologyZone] != "zone-n-a" {
		t.Fatalf("node n-a: %+v", nodes.Items)
	}
	mu.Lock()
	got := accepts["/api/v1/namespaces/default/pods"]
	mu.Unlock()
	if !strings.HasPrefix(got, "application/vnd.kubernetes.protobuf") {
		t.Errorf("a pod list asked for %q, want protobuf first (as client-go's typed clients)", got)
	}
	slices, err := c.List(ctx, kubeapi.EndpointSlices, metav1.NamespaceAll, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := slices.(*discoveryv1.EndpointSliceList); !ok {
		t.Fatalf("endpointslices decoded as %T", slices)
	}

	// Discovery, as client-go's discovery client answers it.
	rl, err := c.ServerResourcesForGroupVersion("v1")
	if err != nil {
		t.Fatal(err)
	}
	if !hasResource(rl, "pods") {
		t.Errorf("v1 resources lack pods: %d resources", len(rl.APIResources))
	}
	want, err := admin.Discovery().ServerResourcesForGroupVersion("resource.k8s.io/v1")
	if err != nil {
		t.Fatal(err)
	}
	rl, err = c.ServerResourcesForGroupVersion("resource.k8s.io/v1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rl.APIResources) != len(want.APIResources) || !hasResource(rl, "resourceslices") {
		t.Errorf("resource.k8s.io/v1: %d resources, client-go's discovery %d", len(rl.APIResources), len(want.APIResources))
	}
	if _, err := c.ServerResourcesForGroupVersion("kubeflow.org/v1"); !apierrors.IsNotFound(err) {
		t.Errorf("a group not served: err %v, want NotFound (as client-go's discovery)", err)
	}

	// A watch from a list's version sees the next change, selected.
	w, err := c.Watch(ctx, kubeapi.Pods, "default", metav1.ListOptions{LabelSelector: "job=j", ResourceVersion: pods.ResourceVersion, TimeoutSeconds: ptr.To[int64](60)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := admin.CoreV1().Pods("default").Delete(ctx, "other", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if err := admin.CoreV1().Pods("default").Delete(ctx, "w-0", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		select {
		case e := <-w.ResultChan():
			p, ok := e.Object.(*corev1.Pod)
			if !ok || p.Name != "w-0" {
				t.Fatalf("event %s %T %v: only w-0 is selected and changed (other is not selected)", e.Type, e.Object, p)
			}
			done = e.Type == watch.Deleted
		case <-ctx.Done():
			t.Fatal("no deletion of w-0 watched")
		}
	}

	// An informer syncs and follows a change.
	inf := kubeapi.NewInformer(c, kubeapi.Pods, metav1.NamespaceAll, 0, func(o *metav1.ListOptions) { o.LabelSelector = "job=j" })
	kubeapi.Informers{inf}.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	if keys := inf.GetStore().ListKeys(); len(keys) != 1 || keys[0] != "default/w-1" {
		t.Fatalf("informer holds %v, want [default/w-1]", keys)
	}
	if _, err := admin.CoreV1().Pods("default").Create(ctx, pod("w-2", "n-a", map[string]string{"job": "j"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for len(inf.GetStore().ListKeys()) != 2 {
		if ctx.Err() != nil {
			t.Fatalf("informer holds %v, want w-1 and w-2", inf.GetStore().ListKeys())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func names(ps []corev1.Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func hasResource(rl *metav1.APIResourceList, name string) bool {
	for _, r := range rl.APIResources {
		if r.Name == name {
			return true
		}
	}
	return false
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
