package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/topology"
)

// OwnerResource is an owner kind watched, metadata only, to resolve a
// pod's top owner.
type OwnerResource struct {
	GVR  schema.GroupVersionResource
	Kind string
	// Selector narrows the watch (a label selector); empty for all.
	Selector string
	// PodLabel is the label whose value names an object of this kind on
	// every pod below it (the per-node view selects a job's pods by it);
	// empty where an owner above already names them all (a JobSet's Jobs).
	PodLabel string
}

// OwnerResources are the owner objects between a job pod and the object a
// user created, where the pod's labels do not name the latter:
//   - batch Jobs of a JobSet (-> JobSet), selected by the JobSet label so
//     that CronJob runs and other Jobs are not watched;
//   - a RayJob's submitter Job (-> RayJob), selected by the label KubeRay
//     v1.6.0 puts on that Job object (not on its pod, whose job-name label
//     names the Job);
//   - JobSets (-> TrainJob, Kubeflow Trainer v2);
//   - RayClusters (-> RayJob or RayService).
//
// MPIJob's launcher Job needs no watch: its pods name the MPIJob.
var OwnerResources = []OwnerResource{
	{GVR: schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, Kind: "Job", Selector: "jobset.sigs.k8s.io/jobset-name"},
	{GVR: schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, Kind: "Job", Selector: "ray.io/originated-from-crd=RayJob", PodLabel: "batch.kubernetes.io/job-name"},
	{GVR: schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}, Kind: "JobSet", PodLabel: "jobset.sigs.k8s.io/jobset-name"},
	{GVR: schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayclusters"}, Kind: "RayCluster", PodLabel: "ray.io/cluster"},
}

type groupKind struct{ group, kind string }

// ownerStore answers topology.Owners from the metadata informers' caches.
type ownerStore struct {
	// stores: one per watch of a kind (batch Jobs: a JobSet's, a RayJob's).
	stores map[groupKind][]cache.Store
	// below finds the owner objects a given one controls (a JobSet's Jobs).
	below []ownerIndex
}

type ownerIndex struct {
	groupKind
	indexer    cache.Indexer
	podLabel   string // OwnerResource.PodLabel
	apiVersion string
}

// controllerIndex indexes pods and owner objects by their controller
// reference, so that a change of an owner reaches exactly the pods below it.
const controllerIndex = "zonewatch-controller"

// controllerKindIndex indexes owner objects by their controller's
// namespace, kind and name (a job's identity names no API group).
const controllerKindIndex = "zonewatch-controller-kind"

func byControllerKind(obj any) ([]string, error) {
	m, err := apimeta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	for _, o := range m.GetOwnerReferences() {
		if o.Controller != nil && *o.Controller {
			return []string{m.GetNamespace() + "/" + o.Kind + "/" + o.Name}, nil
		}
	}
	return nil, nil
}

// labelValue is a pod label and its value.
type labelValue struct{ label, value string }

// podLabelsBelow lists, for the owner objects below the object of kind
// and name (at any depth), the pod label that names each (a RayJob's
// RayCluster: ray.io/cluster=<its name>).
func (s *ownerStore) podLabelsBelow(namespace, kind, name string) []labelValue {
	var out []labelValue
	type obj struct{ kind, name string }
	queue := []obj{{kind, name}}
	seen := map[obj]bool{queue[0]: true}
	for i := 0; i < len(queue) && i < 64; i++ {
		for _, b := range s.below {
			objs, _ := b.indexer.ByIndex(controllerKindIndex, namespace+"/"+queue[i].kind+"/"+queue[i].name)
			for _, o := range objs {
				m, ok := o.(*metav1.PartialObjectMetadata)
				if !ok || seen[obj{b.kind, m.Name}] {
					continue
				}
				seen[obj{b.kind, m.Name}] = true
				queue = append(queue, obj{b.kind, m.Name})
				if b.podLabel != "" {
					out = append(out, labelValue{b.podLabel, m.Name})
				}
			}
		}
	}
	return out
}

// objectKey names an object for controllerIndex: namespace, group, kind, name.
func objectKey(namespace, group, kind, name string) string {
	return namespace + "/" + group + "/" + kind + "/" + name
}

func byController(obj any) ([]string, error) {
	m, err := apimeta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	for _, o := range m.GetOwnerReferences() {
		if o.Controller != nil && *o.Controller {
			gv, err := schema.ParseGroupVersion(o.APIVersion)
			if err != nil {
				return nil, nil
			}
			return []string{objectKey(m.GetNamespace(), gv.Group, o.Kind, o.Name)}, nil
		}
	}
	return nil, nil
}

// keysBelow returns key and the keys of every owner object below it.
func (s *ownerStore) keysBelow(key string) []string {
	keys := []string{key}
	seen := map[string]bool{key: true}
	for i := 0; i < len(keys); i++ {
		for _, b := range s.below {
			objs, _ := b.indexer.ByIndex(controllerIndex, keys[i])
			for _, o := range objs {
				if m, ok := o.(*metav1.PartialObjectMetadata); ok {
					if k := objectKey(m.Namespace, b.group, b.kind, m.Name); !seen[k] {
						seen[k] = true
						keys = append(keys, k)
					}
				}
			}
		}
	}
	return keys
}

// OwnerByLabels names the owner object a pod's labels name through an
// owner kind's PodLabel, when the object exists (topology.LabelOwners: a
// security identity holds labels, no owner reference).
func (s *ownerStore) OwnerByLabels(namespace string, labels map[string]string) (topology.OwnerRef, bool) {
	if s == nil {
		return topology.OwnerRef{}, false
	}
	for _, b := range s.below {
		v := labels[b.podLabel]
		if b.podLabel == "" || v == "" {
			continue
		}
		if _, ok, _ := b.indexer.GetByKey(namespace + "/" + v); ok {
			return topology.OwnerRef{APIVersion: b.apiVersion, Kind: b.kind, Name: v}, true
		}
	}
	return topology.OwnerRef{}, false
}

// ControllerOf returns the controller reference of the owner object o.
func (s *ownerStore) ControllerOf(namespace string, o topology.OwnerRef) (topology.OwnerRef, bool) {
	if s == nil {
		return topology.OwnerRef{}, false
	}
	gv, err := schema.ParseGroupVersion(o.APIVersion)
	if err != nil {
		return topology.OwnerRef{}, false
	}
	for _, st := range s.stores[groupKind{gv.Group, o.Kind}] {
		obj, ok, _ := st.GetByKey(namespace + "/" + o.Name)
		if !ok {
			continue
		}
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			continue
		}
		if c := metav1.GetControllerOfNoCopy(m); c != nil {
			return topology.OwnerRef{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name}, true
		}
	}
	return topology.OwnerRef{}, false
}

// StripOwner keeps name, namespace and the controller reference of an
// owner object: all that top-owner resolution reads.
func StripOwner(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion,
	}}
	if c := metav1.GetControllerOfNoCopy(m); c != nil {
		out.OwnerReferences = []metav1.OwnerReference{{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name, UID: c.UID, Controller: c.Controller}}
	}
	return out, nil
}

// startOwners finds which owner resources the server serves and the
// exporter may list, and prepares a metadata-only informer for each. A
// resource that is absent (its CRD not installed) or forbidden is skipped
// with one log line: identity then falls back to the pod's labels. A
// forbidden one is logged at error with the ClusterRole rule to add
// (Denials) and watched all the same, without waiting for it: its informer
// retries, and once the rule is granted it syncs and the pods below its
// objects are named after their top owner.
func startOwners(ctx context.Context, meta metadata.Interface, disc Discovery, resync time.Duration, logger *slog.Logger,
	denied *Denials, changed func(key string)) (*ownerStore, []cache.InformerSynced) {
	store := &ownerStore{stores: map[groupKind][]cache.Store{}}
	var synced []cache.InformerSynced
	var factories kubeapi.Informers
	for _, res := range OwnerResources {
		forbidden := false
		if err := served(ctx, meta, disc, res); err != nil {
			if forbidden = denied.Note(res.GVR.GroupResource(), err); !forbidden {
				// A CRD not installed: nothing to resolve.
				logger.Info("not resolving owners of this kind", "resource", res.GVR.String(), "reason", err)
				continue
			}
		}
		sel := res.Selector
		inf := metadataInformer(meta, res.GVR, sel, resync)
		if err := inf.SetTransform(StripOwner); err != nil {
			logger.Warn("owner informer transform", "resource", res.GVR.String(), "err", err)
			continue
		}
		if err := denied.Watch(inf, res.GVR.GroupResource()); err != nil {
			logger.Warn("owner informer error handler", "resource", res.GVR.String(), "err", err)
			continue
		}
		if err := inf.AddIndexers(cache.Indexers{controllerIndex: byController, controllerKindIndex: byControllerKind}); err != nil {
			logger.Warn("owner informer index", "resource", res.GVR.String(), "err", err)
			continue
		}
		gk := groupKind{res.GVR.Group, res.Kind}
		ns := func(o any) {
			if m, ok := tombstone(o).(*metav1.PartialObjectMetadata); ok {
				changed(objectKey(m.Namespace, gk.group, gk.kind, m.Name))
			}
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: ns,
			// Status updates change only the resource version: act only
			// when the controller reference moved.
			UpdateFunc: func(old, cur any) {
				a, _ := old.(*metav1.PartialObjectMetadata)
				b, _ := cur.(*metav1.PartialObjectMetadata)
				if a == nil || b == nil || !sameController(a, b) {
					ns(cur)
				}
			},
			DeleteFunc: ns,
		}); err != nil {
			logger.Warn("owner informer handler", "resource", res.GVR.String(), "err", err)
			continue
		}
		store.stores[gk] = append(store.stores[gk], inf.GetStore())
		store.below = append(store.below, ownerIndex{gk, inf.GetIndexer(), res.PodLabel, res.GVR.GroupVersion().String()})
		if !forbidden {
			synced = append(synced, inf.HasSynced)
		}
		factories = append(factories, inf)
	}
	factories.Start(ctx.Done())
	return store, synced
}

// metadataInformer lists and watches the metadata of gvr's objects that
// carry sel in every namespace, as client-go's metadata informer does (not
// its factory: that one brings every built-in group's informers into the
// binary, docs/performance.md).
func metadataInformer(meta metadata.Interface, gvr schema.GroupVersionResource, sel string, resync time.Duration) cache.SharedIndexInformer {
	r := meta.Resource(gvr)
	return kubeapi.InformerFor(meta, &metav1.PartialObjectMetadata{}, resync,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return r.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return r.Watch(ctx, o)
		})
}

func sameController(a, b *metav1.PartialObjectMetadata) bool {
	ca, cb := metav1.GetControllerOfNoCopy(a), metav1.GetControllerOfNoCopy(b)
	if ca == nil || cb == nil {
		return ca == cb
	}
	return ca.Kind == cb.Kind && ca.Name == cb.Name && ca.APIVersion == cb.APIVersion
}

// Discovery says which resources a group version serves, as client-go's
// discovery client does (kubeapi.Client answers it too).
type Discovery interface {
	ServerResourcesForGroupVersion(groupVersion string) (*metav1.APIResourceList, error)
}

// served checks through discovery that the server has the resource, and
// that the exporter may list it.
func served(ctx context.Context, meta metadata.Interface, disc Discovery, res OwnerResource) error {
	list, err := disc.ServerResourcesForGroupVersion(res.GVR.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return errors.New("not served (CRD not installed)")
	}
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	found := false
	for _, r := range list.APIResources {
		found = found || r.Name == res.GVR.Resource
	}
	if !found {
		return errors.New("not served (CRD not installed)")
	}
	_, err = meta.Resource(res.GVR).List(ctx, metav1.ListOptions{Limit: 1, LabelSelector: res.Selector})
	return err
}
