package deploy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

const ciliumModule = "github.com/cilium/cilium@v1.20.2"

// TestCiliumNetworkPolicy: the opt-in CiliumNetworkPolicy admits the
// probes between exporter pods (both ways) and the scrapes of the metrics
// port from the Prometheus selectors, only allows (no deny rule, default
// deny off both ways, so the exporters keep reaching everything else), and
// Cilium's own CRD schema (v1.20.2, from the module cache) accepts it with
// strict field validation.
func TestCiliumNetworkPolicy(t *testing.T) {
	if cnps := ofKind(render(t, ""), "CiliumNetworkPolicy"); len(cnps) != 0 {
		t.Fatalf("default values render %d CiliumNetworkPolicies, want none (opt-in)", len(cnps))
	}
	objs := render(t, "ciliumNetworkPolicy: {enabled: true}\nprobe: {port: 19500}\nport: 19501")
	cnps := ofKind(objs, "CiliumNetworkPolicy")
	if len(cnps) != 1 {
		t.Fatalf("%d CiliumNetworkPolicies, want 1", len(cnps))
	}
	cnp := cnps[0]
	ds := ofKind(objs, "DaemonSet")[0]
	podLabels, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "selector", "matchLabels")
	sel, _, _ := unstructured.NestedStringMap(cnp.Object, "spec", "endpointSelector", "matchLabels")
	if !reflect.DeepEqual(sel, podLabels) {
		t.Errorf("endpointSelector %v, want the exporter pods' %v", sel, podLabels)
	}
	for _, dir := range []string{"ingress", "egress"} {
		if on, found, _ := unstructured.NestedBool(cnp.Object, "spec", "enableDefaultDeny", dir); !found || on {
			t.Errorf("enableDefaultDeny.%s = %v (set: %v), want false: the policy must not put the exporters into default deny", dir, on, found)
		}
	}
	for _, deny := range []string{"ingressDeny", "egressDeny"} {
		if _, found, _ := unstructured.NestedFieldNoCopy(cnp.Object, "spec", deny); found {
			t.Errorf("spec.%s present: zonewatch's policy only allows", deny)
		}
	}
	peer := map[string]string{"k8s:io.kubernetes.pod.namespace": namespace}
	for k, v := range podLabels {
		peer[k] = v
	}
	ingress, _, _ := unstructured.NestedSlice(cnp.Object, "spec", "ingress")
	egress, _, _ := unstructured.NestedSlice(cnp.Object, "spec", "egress")
	if !admits(ingress, "fromEndpoints", peer, "19500") {
		t.Errorf("ingress does not admit probes from exporter pods %v on TCP 19500: %v", peer, ingress)
	}
	if !admits(egress, "toEndpoints", peer, "19500") {
		t.Errorf("egress does not admit probes to exporter pods %v on TCP 19500: %v", peer, egress)
	}
	if !admits(ingress, "fromEndpoints", map[string]string{"app.kubernetes.io/name": "prometheus"}, "19501") {
		t.Errorf("ingress does not admit scrapes from Prometheus on TCP 19501: %v", ingress)
	}

	// Cilium's own CRD schema.
	testenv.ToolsBin(t, "etcd", "kube-apiserver")
	dir, err := moduleDir(ciliumModule)
	if err != nil {
		t.Fatalf("Cilium's CRDs: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "pkg", "k8s", "apis", "cilium.io", "client", "crds", "v2", "ciliumnetworkpolicies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := decode(t, strings.NewReader(string(b)))[0]
	api := testenv.StartAPIServer(t)
	cfg := rest.CopyConfig(api.Config)
	warnings := &warningCollector{}
	cfg.WarningHandler = warnings
	dyn := dynamic.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(ctx, t, dyn.Resource(crdGVR), crd.GetName())
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace}}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Cilium's CRD itself draws a warning when created (a format the
	// apiserver does not know); only the policy's own count.
	before := warnings.count()
	ri := dyn.Resource(schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}).Namespace(namespace)
	apply := func(o *unstructured.Unstructured) error {
		body, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		force := true
		_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
			DryRun: []string{metav1.DryRunAll}, FieldManager: "zonewatch-deploy-test", Force: &force, FieldValidation: metav1.FieldValidationStrict})
		return err
	}
	if err := apply(cnp); err != nil {
		t.Errorf("Cilium's CRD schema rejects the policy: %v", err)
	}
	for _, w := range warnings.since(before) {
		t.Errorf("server warning: %s", w)
	}
	// The check can fail: a misspelt field is refused.
	bad := cnp.DeepCopy()
	_ = unstructured.SetNestedField(bad.Object, map[string]any{"ingres": false}, "spec", "enableDefaultDeny")
	if err := apply(bad); err == nil {
		t.Error("a misspelt enableDefaultDeny field was accepted: the schema check checks nothing")
	}
}

// admits reports whether one rule of rules selects peer (all of the
// selector's labels match) in its field and allows TCP port.
func admits(rules []any, field string, peer map[string]string, port string) bool {
	for _, r := range rules {
		rule, _ := r.(map[string]any)
		sels, _, _ := unstructured.NestedSlice(rule, field)
		selects := false
		for _, s := range sels {
			m, _, _ := unstructured.NestedStringMap(s.(map[string]any), "matchLabels")
			ok := len(m) > 0
			for k, v := range m {
				ok = ok && peer[k] == v
			}
			selects = selects || ok
		}
		if !selects {
			continue
		}
		tps, _, _ := unstructured.NestedSlice(rule, "toPorts")
		for _, tp := range tps {
			ports, _, _ := unstructured.NestedSlice(tp.(map[string]any), "ports")
			for _, p := range ports {
				pm := p.(map[string]any)
				if pm["port"] == port && pm["protocol"] == "TCP" {
					return true
				}
			}
		}
	}
	return false
}
