package kube

import (
	"fmt"
	"runtime"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/zonewatch/zonewatch/topology"
)

func partial(apiVersion, kind, ns, name string, owner *metav1.OwnerReference) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}, ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, UID: types.UID("0c8a1f3e-5d1b-4c1e-9a4f-" + name), ResourceVersion: "123456789",
		Labels:      map[string]string{"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "node", "team": "ml"},
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(make([]byte, 1500))},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "jobset", Operation: metav1.ManagedFieldsOperationUpdate,
			FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 800)}}},
	}}
	if owner != nil {
		m.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return m
}

// TestOwnerStore resolves through stripped metadata: StripOwner keeps the
// controller reference and drops the rest.
func TestOwnerStore(t *testing.T) {
	yes := true
	js := partial("jobset.x-k8s.io/v1alpha2", "JobSet", "ml", "llm", &metav1.OwnerReference{APIVersion: "trainer.kubeflow.org/v1alpha1", Kind: "TrainJob", Name: "llm", Controller: &yes})
	js.OwnerReferences = append([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "not-a-controller"}}, js.OwnerReferences...)
	stripped, _ := StripOwner(js)
	m := stripped.(*metav1.PartialObjectMetadata)
	if len(m.Labels) != 0 || len(m.Annotations) != 0 || len(m.ManagedFields) != 0 || len(m.OwnerReferences) != 1 {
		t.Fatalf("stripped: %+v", m.ObjectMeta)
	}
	st := cache.NewStore(cache.MetaNamespaceKeyFunc)
	_ = st.Add(m)
	s := &ownerStore{stores: map[groupKind]cache.Store{{"jobset.x-k8s.io", "JobSet"}: st}}
	got, ok := s.ControllerOf("ml", topology.OwnerRef{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llm"})
	if !ok || got != (topology.OwnerRef{APIVersion: "trainer.kubeflow.org/v1alpha1", Kind: "TrainJob", Name: "llm"}) {
		t.Fatalf("ControllerOf = %+v, %v", got, ok)
	}
	for _, o := range []topology.OwnerRef{
		{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "other"},
		{APIVersion: "batch.volcano.sh/v1alpha1", Kind: "JobSet", Name: "llm"}, // another group's kind
		{APIVersion: "a/b/c", Kind: "JobSet", Name: "llm"},
	} {
		if _, ok := s.ControllerOf("ml", o); ok {
			t.Errorf("ControllerOf(%+v) resolved", o)
		}
	}
	if _, ok := (*ownerStore)(nil).ControllerOf("ml", topology.OwnerRef{}); ok {
		t.Error("nil store resolved")
	}
}

// TestOwnerHeapAtScale reports (with -v) the heap of the owner caches for
// 2,000 JobSets and their 2,000 child Jobs, as the metadata informers
// hold them after StripOwner. Measured, not asserted.
func TestOwnerHeapAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("heap measurement")
	}
	const jobs = 2000
	yes := true
	base := heapNow()
	st := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for j := 0; j < jobs; j++ {
		ns, name := fmt.Sprintf("team-%d", j%50), fmt.Sprintf("job-%d", j)
		js, _ := StripOwner(partial("jobset.x-k8s.io/v1alpha2", "JobSet", ns, name, &metav1.OwnerReference{APIVersion: "trainer.kubeflow.org/v1alpha1", Kind: "TrainJob", Name: name, Controller: &yes}))
		job, _ := StripOwner(partial("batch/v1", "Job", ns, name+"-node-0", &metav1.OwnerReference{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: name, Controller: &yes}))
		_ = st.Add(js)
		_ = st.Add(job)
	}
	t.Logf("owner caches (stripped): %.2f MiB for %d JobSets + %d Jobs", float64(heapNow()-base)/(1<<20), jobs, jobs)
	runtime.KeepAlive(st)
}
