package deploy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestPackagedChartInstall packages the chart as `make chart` does and
// installs the package with `helm install --dry-run=server` against a real
// kube-apiserver that has the Prometheus Operator CRDs (helm needs every kind
// to exist). Helm's dry run does not check fields (a misspelt field in
// extraEnv passes it), so the manifest it would install is then applied with
// server-side apply, dry run and strict field validation. The DaemonSet runs
// the image `make image` builds, at the chart's appVersion. Values that
// violate values.schema.json are refused by the install itself.
func TestPackagedChartInstall(t *testing.T) {
	helm(t)
	crds := operatorCRDs(t)
	api := testenv.StartAPIServer(t)
	dyn, err := dynamic.NewForConfig(api.Config)
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
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace}}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		waitEstablished(ctx, t, dyn.Resource(crdGVR), crd.GetName())
	}

	var chart struct{ Version, AppVersion string }
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	if _, err := runHelm(t, "", "package", chartDir, "--destination", dist); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(dist, "zonewatch-"+chart.Version+".tgz")
	if out, err := runHelm(t, "", "lint", "--strict", pkg); err != nil || strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
		t.Fatalf("helm lint --strict %s: %v\n%s", filepath.Base(pkg), err, out)
	}

	install := func(values string) (string, error) {
		return runHelm(t, values, "install", release, pkg, "--namespace", namespace,
			"--kubeconfig", api.Kubeconfig, "--dry-run=server", "--output", "json")
	}
	// The default waits in a new cluster: discovery of a fresh CRD group lags its Established condition.
	var out string
	for i := 0; ; i++ {
		if out, err = install(""); err == nil || i == 20 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("helm install --dry-run=server of the package: %v", err)
	}
	var rel struct {
		Manifest string
		Info     struct{ Status string }
	}
	if err := json.Unmarshal([]byte(out), &rel); err != nil {
		t.Fatalf("helm install output: %v\n%s", err, out)
	}
	if rel.Info.Status != "pending-install" {
		t.Errorf("dry-run release status %q, want pending-install", rel.Info.Status)
	}
	kinds := map[string]int{}
	var ds *appsv1.DaemonSet
	objs := decode(t, strings.NewReader(rel.Manifest))
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetKind() == "DaemonSet" {
			ds = &appsv1.DaemonSet{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	applyStrict(ctx, t, api, objs)
	t.Logf("accepted by the server (helm dry run, then server-side apply dry run, strict): %v", kinds)
	if ds == nil || len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("no DaemonSet with one container in the installed manifest (%v)", kinds)
	}
	if want, got := "ghcr.io/zonewatch/zonewatch-exporter:"+chart.AppVersion, ds.Spec.Template.Spec.Containers[0].Image; got != want {
		t.Errorf("DaemonSet image %q, want %q (the image make image builds, at the chart's appVersion)", got, want)
	}
	if _, err := dyn.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}).Namespace(namespace).Get(ctx, ds.Name, metav1.GetOptions{}); err == nil {
		t.Error("the dry run created the DaemonSet")
	}

	for _, tc := range []struct{ values, want string }{
		{"hubble: {enabeld: false}", "additional properties 'enabeld' not allowed"},
		{"imagePullSecrets: [regcred]", "/imagePullSecrets/0"},
		{"image: {digest: latest}", "/image/digest"},
		{"port: '19420'", "/port"},
		{"conntrack: {pollInterval: 10s, layuot: split}", "'layuot' not allowed"},
		{"serviceAcount: {create: false}", "'serviceAcount' not allowed"},
	} {
		_, err := install(tc.values)
		if err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm install with %s: %v, want the schema to refuse it naming %q", tc.values, err, tc.want)
		}
	}
}

// applyStrict applies the objects with server-side apply, dry run and strict
// field validation; any rejection or server warning fails the test.
func applyStrict(ctx context.Context, t *testing.T, api *testenv.APIServer, objs []*unstructured.Unstructured) {
	t.Helper()
	cfg := rest.CopyConfig(api.Config)
	warnings := &warningCollector{}
	cfg.WarningHandler = warnings
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapping := restMapping(t, cfg)
	force := true
	for _, o := range objs {
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
		before := warnings.count()
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
			DryRun: []string{metav1.DryRunAll}, FieldManager: "zonewatch-release-test", Force: &force,
			FieldValidation: metav1.FieldValidationStrict,
		}); err != nil {
			t.Errorf("%s %s/%s rejected: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		for _, w := range warnings.since(before) {
			t.Errorf("%s %s/%s: server warning: %s", o.GetKind(), o.GetNamespace(), o.GetName(), w)
		}
	}
}
