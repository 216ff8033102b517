package sim

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/testing"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
)

// Cluster is the scenario's API server: its nodes and pods in client-go's
// object tracker (the store of client-go's fake clientsets), served to the
// exporter's real informers through kubeapi.Interface, with label and field
// selectors applied as the API server applies them (the fields the
// exporter selects on). It serves core/v1, discovery.k8s.io/v1 and
// resource.k8s.io/v1, as a cluster does.
type Cluster struct {
	tracker testing.ObjectTracker
}

var _ kubeapi.Interface = (*Cluster)(nil)

// NewCluster returns the scenario's cluster.
func NewCluster(s *Scenario) *Cluster {
	tracker := testing.NewObjectTracker(kubeapi.Scheme, serializer.NewCodecFactory(kubeapi.Scheme).UniversalDecoder())
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
	return &Cluster{tracker: tracker}
}

// IsWatchListSemanticsUnSupported tells client-go's reflector that the
// tracker's watch sends no initial events (as client-go's fake does).
func (c *Cluster) IsWatchListSemanticsUnSupported() bool { return true }

// List implements kubeapi.Interface.
func (c *Cluster) List(_ context.Context, r kubeapi.Resource, namespace string, opts metav1.ListOptions) (runtime.Object, error) {
	match, err := matcher(opts)
	if err != nil {
		return nil, err
	}
	gvks, _, err := kubeapi.Scheme.ObjectKinds(r.Object())
	if err != nil {
		return nil, err
	}
	list, err := c.tracker.List(r.GVR, gvks[0], namespace)
	if err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	var kept []runtime.Object
	for _, o := range items {
		if match(o) {
			kept = append(kept, o)
		}
	}
	if err := meta.SetList(list, kept); err != nil {
		return nil, err
	}
	return list, nil
}

// Watch implements kubeapi.Interface.
func (c *Cluster) Watch(_ context.Context, r kubeapi.Resource, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	match, err := matcher(opts)
	if err != nil {
		return nil, err
	}
	w, err := c.tracker.Watch(r.GVR, namespace)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) { return e, match(e.Object) }), nil
}

// ServerResourcesForGroupVersion implements kubeapi.Interface: the groups
// the simulated cluster serves, the resources the exporter reads.
func (c *Cluster) ServerResourcesForGroupVersion(groupVersion string) (*metav1.APIResourceList, error) {
	list := &metav1.APIResourceList{GroupVersion: groupVersion}
	for _, r := range []kubeapi.Resource{kubeapi.Pods, kubeapi.Nodes, kubeapi.Services, kubeapi.EndpointSlices, kubeapi.ResourceSlices} {
		if r.GVR.GroupVersion().String() == groupVersion {
			list.APIResources = append(list.APIResources, metav1.APIResource{Name: r.GVR.Resource, Namespaced: r.Namespaced})
		}
	}
	if len(list.APIResources) == 0 {
		gv, _ := schema.ParseGroupVersion(groupVersion)
		return nil, apierrors.NewNotFound(gv.WithResource("").GroupResource(), "")
	}
	return list, nil
}

// CreatePod creates a pod.
func (c *Cluster) CreatePod(p *corev1.Pod) error {
	return c.tracker.Create(kubeapi.Pods.GVR, p, p.Namespace)
}

// DeletePod deletes a pod.
func (c *Cluster) DeletePod(namespace, name string) error {
	return c.tracker.Delete(kubeapi.Pods.GVR, namespace, name)
}

// matcher returns what the API server would select with opts: the label
// selector, and the field selector on the fields the exporter selects on.
func matcher(opts metav1.ListOptions) (func(runtime.Object) bool, error) {
	ls, err := labels.Parse(opts.LabelSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	fs, err := fields.ParseSelector(opts.FieldSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return func(o runtime.Object) bool {
		m, ok := o.(metav1.Object)
		return ok && ls.Matches(labels.Set(m.GetLabels())) && fs.Matches(fieldsOf(o))
	}, nil
}

// fieldsOf is what the API server's field selectors read of an object
// (the fields the exporter selects on).
func fieldsOf(o runtime.Object) fields.Set {
	switch v := o.(type) {
	case *corev1.Pod:
		return fields.Set{"metadata.name": v.Name, "metadata.namespace": v.Namespace, "spec.nodeName": v.Spec.NodeName,
			"status.podIP": v.Status.PodIP, "status.phase": string(v.Status.Phase)}
	case *corev1.Service:
		return fields.Set{"metadata.name": v.Name, "metadata.namespace": v.Namespace, "spec.clusterIP": v.Spec.ClusterIP, "spec.type": string(v.Spec.Type)}
	case *discoveryv1.EndpointSlice:
		return fields.Set{"metadata.name": v.Name, "metadata.namespace": v.Namespace}
	case metav1.Object:
		return fields.Set{"metadata.name": v.GetName(), "metadata.namespace": v.GetNamespace()}
	}
	return fields.Set{}
}

// Churn starts and finishes short batch Jobs every period (a data-prep job
// in one zone), so placement series come and go as in a real cluster.
func Churn(ctx context.Context, client *Cluster, s *Scenario, period time.Duration, logger *slog.Logger) {
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
		if err := client.CreatePod(KubePod(p)); err != nil && ctx.Err() == nil {
			logger.Warn("simulated churn: create", "pod", p.Name, "err", err)
		}
		prev := fmt.Sprintf("etl-%d-0", i-1)
		if i > 0 {
			if err := client.DeletePod("data", prev); err != nil && ctx.Err() == nil {
				logger.Warn("simulated churn: delete", "pod", prev, "err", err)
			}
		}
	}
}
