package sim

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	fakecorev1 "k8s.io/client-go/kubernetes/typed/core/v1/fake"
	typeddiscoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	fakediscoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1/fake"
	typedresourcev1 "k8s.io/client-go/kubernetes/typed/resource/v1"
	fakeresourcev1 "k8s.io/client-go/kubernetes/typed/resource/v1/fake"
	"k8s.io/client-go/testing"
)

// Clientset returns a fake clientset holding the scenario's nodes and
// pods, so the exporter's real informers run against it. It serves what
// the exporter asks of a cluster: core/v1 (Services too),
// discovery.k8s.io/v1 (EndpointSlices), resource.k8s.io/v1 and discovery, from client-go's object tracker, as client-go's fake
// clientset does. It is not that clientset: that one brings the fake
// client of every API group into the exporter's binary (13 MiB more of
// resident binary pages, docs/performance.md). Another group's client is
// nil.
func Clientset(s *Scenario) kubernetes.Interface {
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, resourcev1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err) // registering the API's own types
		}
	}
	tracker := testing.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
	nodes, pods := s.KubeObjects()
	for _, n := range nodes {
		if err := tracker.Add(n); err != nil {
			panic(err)
		}
	}
	for _, p := range pods {
		if err := tracker.Add(p); err != nil {
			panic(err)
		}
	}
	cs := &clientset{}
	cs.discovery = &fakediscovery.FakeDiscovery{Fake: &cs.Fake}
	cs.AddReactor("*", "*", testing.ObjectReaction(tracker))
	cs.AddWatchReactor("*", func(action testing.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if w, ok := action.(testing.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := tracker.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		return true, w, nil
	})
	return cs
}

type clientset struct {
	kubernetes.Interface // nil: the groups the exporter does not use
	testing.Fake
	discovery *fakediscovery.FakeDiscovery
}

func (c *clientset) Discovery() discovery.DiscoveryInterfaces { return c.discovery }

func (c *clientset) CoreV1() typedcorev1.CoreV1Interface {
	return &fakecorev1.FakeCoreV1{Fake: &c.Fake}
}

func (c *clientset) DiscoveryV1() typeddiscoveryv1.DiscoveryV1Interface {
	return &fakediscoveryv1.FakeDiscoveryV1{Fake: &c.Fake}
}

func (c *clientset) ResourceV1() typedresourcev1.ResourceV1Interface {
	return &fakeresourcev1.FakeResourceV1{Fake: &c.Fake}
}

// IsWatchListSemanticsUnSupported tells client-go's reflector that the
// tracker's watch sends no initial events (as client-go's fake does).
func (c *clientset) IsWatchListSemanticsUnSupported() bool { return true }

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
