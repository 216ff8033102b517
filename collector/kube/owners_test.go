package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	discoveryfake "k8s.io/client-go/discovery/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"
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
	// batch Jobs have two watches (a JobSet's, a RayJob's submitter): the
	// second answers for what the first does not hold.
	jobsetJobs, rayJobs := cache.NewStore(cache.MetaNamespaceKeyFunc), cache.NewStore(cache.MetaNamespaceKeyFunc)
	submitter, _ := StripOwner(partial("batch/v1", "Job", "ml", "tune", &metav1.OwnerReference{APIVersion: "ray.io/v1", Kind: "RayJob", Name: "tune", Controller: &yes}))
	_ = rayJobs.Add(submitter)
	s := &ownerStore{stores: map[groupKind][]cache.Store{{"jobset.x-k8s.io", "JobSet"}: {st}, {"batch", "Job"}: {jobsetJobs, rayJobs}}}
	got, ok := s.ControllerOf("ml", topology.OwnerRef{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llm"})
	if !ok || got != (topology.OwnerRef{APIVersion: "trainer.kubeflow.org/v1alpha1", Kind: "TrainJob", Name: "llm"}) {
		t.Fatalf("ControllerOf = %+v, %v", got, ok)
	}
	got, ok = s.ControllerOf("ml", topology.OwnerRef{APIVersion: "batch/v1", Kind: "Job", Name: "tune"})
	if !ok || got != (topology.OwnerRef{APIVersion: "ray.io/v1", Kind: "RayJob", Name: "tune"}) {
		t.Fatalf("ControllerOf(the RayJob's Job) = %+v, %v", got, ok)
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

// TestStartOwnersSkips: through discovery, a kind whose CRD is absent is
// skipped with one log line; one the exporter may not list (RBAC) is
// logged once at error with the rule to add and not waited for; the rest
// is watched and resolves.
func TestStartOwnersSkips(t *testing.T) {
	scheme := metadatafake.NewTestScheme()
	metav1.AddMetaToScheme(scheme)
	yes := true
	job := partial("batch/v1", "Job", "ml", "llm-node-0", &metav1.OwnerReference{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llm", Controller: &yes})
	meta := metadatafake.NewSimpleMetadataClient(scheme, job)
	meta.PrependReactor("list", "rayclusters", func(k8stesting.Action) (bool, kruntime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "ray.io", Resource: "rayclusters"}, "",
			errors.New(`User "system:serviceaccount:monitoring:zonewatch" cannot list resource "rayclusters" in API group "ray.io" at the cluster scope`))
	})
	disc := &discoveryfake.FakeDiscovery{Fake: &k8stesting.Fake{}}
	disc.Resources = []*metav1.APIResourceList{
		{GroupVersion: "batch/v1", APIResources: []metav1.APIResource{{Name: "jobs", Kind: "Job", Namespaced: true}}},
		{GroupVersion: "ray.io/v1", APIResources: []metav1.APIResource{{Name: "rayclusters", Kind: "RayCluster", Namespaced: true}}},
	}
	var log bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := slog.New(slog.NewTextHandler(&log, nil))
	store, synced := startOwners(ctx, meta, disc, 0, logger, NewDenials("kubernetes", logger), func(string) {})
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		t.Fatal("not synced")
	}
	if len(synced) != 2 || len(store.stores) != 2 || len(store.stores[groupKind{"batch", "Job"}]) != 2 {
		t.Fatalf("waiting for %d watches and watching %d kinds, want to wait for the two batch Job watches (JobSets', RayJobs') only and watch RayClusters too:\n%s", len(synced), len(store.stores), log.String())
	}
	for _, want := range []string{`level=INFO msg="not resolving owners of this kind" resource="jobset.x-k8s.io/v1alpha2, Resource=jobsets" reason="not served (CRD not installed)"`,
		`level=ERROR msg="permission denied: add the rule to zonewatch's ClusterRole (Helm chart: templates/clusterrole.yaml); kubernetes recovers by itself once granted" starved_source=kubernetes verb=list resource=rayclusters.ray.io user=system:serviceaccount:monitoring:zonewatch rule="{apiGroups: [\"ray.io\"], resources: [\"rayclusters\"], verbs: [\"list\", \"watch\"]}"`} {
		if strings.Count(log.String(), want) != 1 {
			t.Errorf("log lacks %q once:\n%s", want, log.String())
		}
	}
	got, ok := store.ControllerOf("ml", topology.OwnerRef{APIVersion: "batch/v1", Kind: "Job", Name: "llm-node-0"})
	if !ok || got.Kind != "JobSet" || got.Name != "llm" {
		t.Fatalf("ControllerOf = %+v, %v", got, ok)
	}
}
