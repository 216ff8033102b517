package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// The Prometheus Operator whose CRDs the chart's PodMonitor, ServiceMonitor
// and PrometheusRule must satisfy. Read from the Go module cache (`go mod
// download` fetches it once); nothing is copied into this repository.
const (
	operatorModule  = "github.com/prometheus-operator/prometheus-operator"
	operatorVersion = "v0.85.0"
)

var operatorCRDFiles = []string{
	"monitoring.coreos.com_podmonitors.yaml",
	"monitoring.coreos.com_servicemonitors.yaml",
	"monitoring.coreos.com_prometheusrules.yaml",
}

// dryRunVariants are rendered with helm and applied besides the committed
// default manifests: each brings objects or fields the default lacks.
var dryRunVariants = []string{"service monitor", "hubble relay", "web config with TLS and basic auth", "hubble socket group, nothing else"}

// TestServerSideDryRun applies the committed manifests and the rendered
// variants to a real kube-apiserver that has the Prometheus Operator CRDs,
// with server-side apply, dry run and strict field validation: every object
// must be accepted, with no warning.
func TestServerSideDryRun(t *testing.T) {
	crds := operatorCRDs(t)
	api := testenv.StartAPIServer(t)
	cfg := rest.CopyConfig(api.Config)
	warnings := &warningCollector{}
	cfg.WarningHandler = warnings
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, crd := range crds {
		if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("installing CRD %s: %v", crd.GetName(), err)
		}
	}
	ns := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace},
	}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", namespace, err)
	}
	for _, crd := range crds {
		waitEstablished(ctx, t, dyn.Resource(crdGVR), crd.GetName())
	}

	mapping := restMapping(t, cfg)

	sets := map[string][]*unstructured.Unstructured{"committed deploy/manifests": committed(t)}
	tools := testenv.ToolsBin(t, "etcd", "kube-apiserver")
	if _, err := os.Stat(filepath.Join(tools, "helm")); err != nil && os.Getenv("ZONEWATCH_REQUIRE_TOOLS") == "" && os.Getenv("CI") == "" {
		t.Log("helm not found: only the committed manifests are applied, not the variants")
	} else {
		for _, v := range variants {
			for _, name := range dryRunVariants {
				if v.name == name {
					sets[name] = render(t, v.values)
				}
			}
		}
	}
	for name, objs := range sets {
		t.Run(name, func(t *testing.T) {
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
				m, err := mapping(o.GroupVersionKind())
				if err != nil {
					t.Errorf("%s %s: no API resource: %v", o.GetKind(), o.GetName(), err)
					continue
				}
				body, err := json.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				ri := resourceOf(dyn, m, o)
				force := true
				before := warnings.count()
				_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
					DryRun: []string{metav1.DryRunAll}, FieldManager: "zonewatch-deploy-test", Force: &force,
					FieldValidation: metav1.FieldValidationStrict,
				})
				if err != nil {
					t.Errorf("%s %s/%s rejected: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
				for _, w := range warnings.since(before) {
					t.Errorf("%s %s/%s: server warning: %s", o.GetKind(), o.GetNamespace(), o.GetName(), w)
				}
			}
			t.Logf("accepted: %v", kinds)
		})
	}

	// The check can fail: the CRD schema and strict validation reject a
	// misspelt field (minimal stand-in CRDs accept anything).
	if pms := ofKind(sets["committed deploy/manifests"], "PodMonitor"); len(pms) == 1 && crds[0].GetAnnotations()["operator.prometheus.io/version"] != "" {
		bad := pms[0].DeepCopy()
		eps, _, _ := unstructured.NestedSlice(bad.Object, "spec", "podMetricsEndpoints")
		eps[0].(map[string]any)["honourLabels"] = true
		_ = unstructured.SetNestedSlice(bad.Object, eps, "spec", "podMetricsEndpoints")
		body, _ := json.Marshal(bad.Object)
		force := true
		gvr := schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "podmonitors"}
		_, err := dyn.Resource(gvr).Namespace(namespace).Patch(ctx, bad.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
			DryRun: []string{metav1.DryRunAll}, FieldManager: "zonewatch-deploy-test", Force: &force, FieldValidation: metav1.FieldValidationStrict,
		})
		if err == nil || !strings.Contains(err.Error(), "honourLabels") {
			t.Errorf("a PodMonitor with a misspelt field: %v, want it rejected", err)
		}
	}

	// Dry run: nothing was created.
	_, err = dyn.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}).Namespace(namespace).Get(ctx, release, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("DaemonSet after a dry run: %v, want not found", err)
	}
}

// operatorCRDs reads the Prometheus Operator's CRDs from the Go module
// cache. Where the module cannot be had (no cache, no proxy) minimal CRDs
// that accept any spec stand in, unless the tools are required (make test).
func operatorCRDs(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	dir, err := moduleDir(operatorModule + "@" + operatorVersion)
	if err != nil {
		msg := fmt.Sprintf("Prometheus Operator CRDs unavailable (%v): run `go mod download %s@%s`", err, operatorModule, operatorVersion)
		if os.Getenv("ZONEWATCH_REQUIRE_TOOLS") != "" || os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Log(msg + "; using minimal CRDs that check no schema")
		return minimalCRDs()
	}
	var crds []*unstructured.Unstructured
	for _, f := range operatorCRDFiles {
		b, err := os.ReadFile(filepath.Join(dir, "example", "prometheus-operator-crd", f))
		if err != nil {
			t.Fatalf("reading CRD from the module cache: %v", err)
		}
		objs := decode(t, strings.NewReader(string(b)))
		if len(objs) != 1 || objs[0].GetKind() != "CustomResourceDefinition" {
			t.Fatalf("%s: want one CustomResourceDefinition", f)
		}
		crds = append(crds, objs[0])
	}
	return crds
}

// moduleDir is the module's folder in the module cache, downloading it
// through GOPROXY when it is not there yet. go.mod is not touched.
func moduleDir(modVersion string) (string, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, gobin, "mod", "download", "-json", modVersion).Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); jerr != nil && err == nil {
		err = jerr
	}
	if m.Error != "" {
		return "", fmt.Errorf("go mod download %s: %s", modVersion, m.Error)
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	return m.Dir, nil
}

func minimalCRDs() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, kind := range []string{"PodMonitor", "ServiceMonitor", "PrometheusRule"} {
		plural := strings.ToLower(kind) + "s"
		out = append(out, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1",
			"kind":       "CustomResourceDefinition",
			"metadata":   map[string]any{"name": plural + ".monitoring.coreos.com"},
			"spec": map[string]any{
				"group": "monitoring.coreos.com",
				"names": map[string]any{"kind": kind, "listKind": kind + "List", "plural": plural, "singular": strings.ToLower(kind)},
				"scope": "Namespaced",
				"versions": []any{map[string]any{
					"name": "v1", "served": true, "storage": true,
					"schema": map[string]any{"openAPIV3Schema": map[string]any{
						"type": "object", "x-kubernetes-preserve-unknown-fields": true,
					}},
				}},
			},
		}})
	}
	return out
}

func waitEstablished(ctx context.Context, t *testing.T, ri dynamic.ResourceInterface, name string) {
	t.Helper()
	for {
		crd, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				c, _ := c.(map[string]any)
				if c["type"] == "Established" && c["status"] == "True" {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("CRD %s not established: %v", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// warningCollector keeps the warnings the API server sends back.
type warningCollector struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningCollector) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningCollector) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.msgs)
}

func (w *warningCollector) since(n int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs[n:]...)
}
