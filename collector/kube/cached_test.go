package kube

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/zonewatch/zonewatch/topology"
)

// TestCachedPodInTheInformerStore: the kept pod is keyed as the pod was
// (namespace/name, also as a tombstone), indexed by its controller as
// byController indexes the full pod, passes through the transform again
// unchanged (client-go asks transforms to be idempotent), and converts to
// the same index pod as the full one.
func TestCachedPodInTheInformerStore(t *testing.T) {
	rules := topology.DefaultRules()
	strip := PodStripper(rules)
	full := fullPod(7, 3, 42)
	obj, err := strip(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	kept := obj.(*CachedPod)
	if again, _ := strip(kept); again != obj {
		t.Fatal("transform not idempotent on a kept pod")
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "team-7/job-7-worker-3", Obj: kept}
	if again, _ := strip(tomb); again != any(tomb) {
		t.Fatal("tombstone changed")
	}
	for _, o := range []any{kept, tomb} {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err != nil || k != "team-7/job-7-worker-3" {
			t.Fatalf("key %q, %v", k, err)
		}
	}
	want, _ := byController(full)
	if got, _ := podByController(kept); !reflect.DeepEqual(got, want) || len(got) != 1 {
		t.Fatalf("controller index %v, full pod %v", got, want)
	}
	if got, want := kept.Pod(rules, nil), PodFrom(rules, full); !reflect.DeepEqual(got, want) {
		t.Fatalf("kept %+v\nfull %+v", got, want)
	}
	if kept.ResourceVersion != full.ResourceVersion {
		t.Fatal("resource version lost: the informer tells updates from resyncs by it")
	}
	n, _ := StripNode(&corev1.Node{})
	if _, ok := n.(*CachedNode); !ok {
		t.Fatalf("StripNode made %T", n)
	}
}
