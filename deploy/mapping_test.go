package deploy

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// restMapping returns the lookup from a kind to its API resource on the
// apiserver at cfg. A new CRD's group reaches discovery shortly after the
// CRD is established: the lookup retries for up to 5 s.
func restMapping(t *testing.T, cfg *rest.Config) func(schema.GroupVersionKind) (*meta.RESTMapping, error) {
	t.Helper()
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	return func(gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
		var err error
		for range 50 {
			var m *meta.RESTMapping
			if m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err == nil {
				return m, nil
			}
			mapper.Reset()
			time.Sleep(100 * time.Millisecond)
		}
		return nil, err
	}
}

// resourceOf is the dynamic client of o's resource, in o's namespace when
// the resource is namespaced.
func resourceOf(dyn dynamic.Interface, m *meta.RESTMapping, o *unstructured.Unstructured) dynamic.ResourceInterface {
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	return dyn.Resource(m.Resource)
}
