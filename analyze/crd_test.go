package analyze

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestCRDsDropSchedulingGroup: the training controllers' CRDs (the
// releases Kueue v0.17.0 requires, copied by hack/tools.sh) prune a pod
// template's spec.schedulingGroup on the v1.37.2 apiserver with
// GenericWorkload on, and keep its tolerations and metadata labels: why
// analyze joins their pods to a PodGroup by label (schedulingGroupCarriers,
// noCarrier). A CRD that keeps the field fails the test.
func TestCRDsDropSchedulingGroup(t *testing.T) {
	t.Parallel() // its own apiserver (scheduler, Kueue where used); mostly waits (docs/development.md)
	bin := testenv.ToolsBin(t, "etcd", "kube-apiserver", "kueue.d")
	api := testenv.StartAPIServer(t, testenv.WithArgs("--feature-gates", schedlab.GangFeatureGates,
		"--runtime-config", "scheduling.k8s.io/v1beta1=true"))
	dyn, err := dynamic.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := filepath.Join(bin, "kueue.d", "controller-crds")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s (%v)", dir, err)
	}
	if err := testenv.InstallCRDs(ctx, dyn, files...); err != nil {
		t.Fatal(err)
	}
	versions, _ := os.ReadFile(filepath.Join(dir, "VERSIONS"))
	t.Logf("CRDs:\n%s", versions)
	tmpl := func() map[string]any {
		return map[string]any{
			"metadata": map[string]any{"labels": map[string]any{PodGroupLabel: "train-gang"}},
			"spec": map[string]any{
				"schedulingGroup": map[string]any{"podGroupName": "train-gang"},
				"tolerations":     []any{map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}},
				"containers":      []any{map[string]any{"name": "c", "image": "registry.example.com/x:1"}},
			},
		}
	}
	cases := []struct {
		kind string
		gvr  schema.GroupVersionResource
		spec map[string]any
		path []string // to the pod template
	}{
		{"PyTorchJob", schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"},
			map[string]any{"pytorchReplicaSpecs": map[string]any{"Worker": map[string]any{"replicas": 1, "template": tmpl()}}},
			[]string{"spec", "pytorchReplicaSpecs", "Worker", "template"}},
		{"MPIJob", schema.GroupVersionResource{Group: "kubeflow.org", Version: "v2beta1", Resource: "mpijobs"},
			map[string]any{"mpiReplicaSpecs": map[string]any{"Worker": map[string]any{"replicas": 1, "template": tmpl()}}},
			[]string{"spec", "mpiReplicaSpecs", "Worker", "template"}},
		{"JobSet", schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"},
			map[string]any{"replicatedJobs": []any{map[string]any{"name": "w", "template": map[string]any{"spec": map[string]any{"template": tmpl()}}}}},
			[]string{"spec", "replicatedJobs", "0", "template", "spec", "template"}},
		{"ClusterTrainingRuntime", schema.GroupVersionResource{Group: "trainer.kubeflow.org", Version: "v1alpha1", Resource: "clustertrainingruntimes"},
			map[string]any{"template": map[string]any{"spec": map[string]any{"replicatedJobs": []any{map[string]any{"name": "node", "template": map[string]any{"spec": map[string]any{"template": tmpl()}}}}}}},
			[]string{"spec", "template", "spec", "replicatedJobs", "0", "template", "spec", "template"}},
		{"RayCluster", schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayclusters"},
			map[string]any{"headGroupSpec": map[string]any{"rayStartParams": map[string]any{}, "template": tmpl()}},
			[]string{"spec", "headGroupSpec", "template"}},
		{"LeaderWorkerSet", schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"},
			map[string]any{"leaderWorkerTemplate": map[string]any{"size": 2, "workerTemplate": tmpl()}},
			[]string{"spec", "leaderWorkerTemplate", "workerTemplate"}},
	}
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "crds"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		apiVersion := c.gvr.Group + "/" + c.gvr.Version
		kind := c.kind
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind,
			"metadata": map[string]any{"name": "train", "namespace": "crds"}, "spec": c.spec}}
		var got *unstructured.Unstructured
		if c.kind == "ClusterTrainingRuntime" {
			obj.SetNamespace("")
			got, err = dyn.Resource(c.gvr).Create(ctx, obj, metav1.CreateOptions{})
		} else {
			got, err = dyn.Resource(c.gvr).Namespace("crds").Create(ctx, obj, metav1.CreateOptions{})
		}
		if err != nil {
			t.Errorf("%s: %v", c.kind, err)
			continue
		}
		tm := digPath(got.Object, c.path...)
		if tm == nil {
			t.Errorf("%s: no template at %s in %v", c.kind, strings.Join(c.path, "."), got.Object)
			continue
		}
		spec, _ := tm["spec"].(map[string]any)
		meta, _ := tm["metadata"].(map[string]any)
		lbl, _ := meta["labels"].(map[string]any)
		switch {
		case spec["schedulingGroup"] != nil:
			t.Errorf("%s keeps spec.schedulingGroup in its template: it can carry the PodGroup (update schedulingGroupCarriers)", c.kind)
		case spec["tolerations"] == nil || lbl[PodGroupLabel] != "train-gang":
			t.Errorf("%s drops more than spec.schedulingGroup: %v", c.kind, tm)
		default:
			t.Logf("%s: spec.schedulingGroup pruned; tolerations and the %s label kept", c.kind, PodGroupLabel)
		}
	}
}

// digPath walks maps and list indexes ("0").
func digPath(m map[string]any, path ...string) map[string]any {
	var cur any = m
	for _, p := range path {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[p]
		case []any:
			if p != "0" || len(c) == 0 {
				return nil
			}
			cur = c[0]
		default:
			return nil
		}
	}
	out, _ := cur.(map[string]any)
	return out
}
