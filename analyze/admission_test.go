package analyze

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

const chartPolicy = "../deploy/helm/zonewatch/templates/admission-policy.yaml"

// chartTemplate renders the chart's admission policy template from
// AdmissionPolicy: the same objects, with the apiVersion the cluster
// serves and the namespace selector from the values.
func chartTemplate(t *testing.T) string {
	const apiVersion, selector = "APIVERSION", "NAMESPACESELECTOR"
	body, err := AdmissionPolicyYAML(topology.DefaultRules(), apiVersion, map[string]any{"x": selector})
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	if strings.Contains(text, "{{") {
		t.Fatalf("the policy holds a template delimiter:\n%s", text)
	}
	text = strings.ReplaceAll(text, "apiVersion: "+apiVersion, "apiVersion: {{ $apiVersion }}")
	text = strings.ReplaceAll(text, "      x: "+selector+"\n", "      {{- toYaml .Values.admissionPolicy.namespaceSelector | nindent 6 }}\n")
	text = strings.ReplaceAll(text, "metadata:\n", "metadata:\n  labels:\n    {{- include \"zonewatch.labels\" . | nindent 4 }}\n")
	return `{{- /* Generated from analyze.AdmissionPolicy by go test ./analyze -run TestAdmissionPolicyChart -update: do not edit. */ -}}
{{- if .Values.admissionPolicy.enabled }}
{{- $apiVersion := "admissionregistration.k8s.io/v1beta1" }}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}
{{- $apiVersion = "admissionregistration.k8s.io/v1" }}
{{- end }}
` + text + "{{- end }}\n"
}

// TestAdmissionPolicyChart: the chart's template is what AdmissionPolicy
// generates (the policy the scheduling test runs on the real apiserver).
func TestAdmissionPolicyChart(t *testing.T) {
	want := chartTemplate(t)
	if *update {
		if err := os.WriteFile(chartPolicy, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(filepath.Clean(chartPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from analyze.AdmissionPolicy (go test ./analyze -run TestAdmissionPolicyChart -update)", chartPolicy)
	}
}

// TestAdmissionPolicyChartOnAPIServer renders the chart's policy with helm
// as a 1.36+ cluster gets it, creates it on the real apiserver (which
// compiles and type-checks the CEL) and checks what it does to pods; and
// that a cluster without the v1 API gets v1beta1.
func TestAdmissionPolicyChartOnAPIServer(t *testing.T) {
	bin := testenv.ToolsBin(t, "helm", "etcd", "kube-apiserver")
	render := func(args ...string) []map[string]any {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "helm"), append([]string{"template", "zw", "../deploy/helm/zonewatch",
			"--set", "admissionPolicy.enabled=true", "--show-only", "templates/admission-policy.yaml"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		var objs []map[string]any
		for _, doc := range strings.Split(string(out), "\n---\n") {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				t.Fatalf("rendered policy: %v\n%s", err, doc)
			}
			if m != nil {
				objs = append(objs, m)
			}
		}
		if len(objs) != 2 {
			t.Fatalf("rendered %d objects, want the policy and its binding:\n%s", len(objs), out)
		}
		return objs
	}
	for _, o := range render() {
		if o["apiVersion"] != "admissionregistration.k8s.io/v1beta1" {
			t.Errorf("without the v1 API the chart renders %v, want v1beta1", o["apiVersion"])
		}
	}
	objs := render("--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
	api := testenv.StartAPIServer(t)
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	applyPolicy(ctx, t, api.Config, cs, objs)
}

const chartPodGroupPolicy = "../deploy/helm/zonewatch/templates/admission-podgroup-policy.yaml"

// TestPodGroupPolicyChart: the chart's PodGroup policy template is what
// PodGroupPolicy generates (the policy TestGangOnRealScheduler runs).
func TestPodGroupPolicyChart(t *testing.T) {
	const apiVersion, selector = "APIVERSION", "NAMESPACESELECTOR"
	body, err := PodGroupPolicyYAML(apiVersion, map[string]any{"x": selector})
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	text = strings.ReplaceAll(text, "apiVersion: "+apiVersion, "apiVersion: {{ $apiVersion }}")
	text = strings.ReplaceAll(text, "      x: "+selector+"\n", "      {{- toYaml .Values.admissionPolicy.namespaceSelector | nindent 6 }}\n")
	text = strings.ReplaceAll(text, "metadata:\n", "metadata:\n  labels:\n    {{- include \"zonewatch.labels\" . | nindent 4 }}\n")
	want := `{{- /* Generated from analyze.PodGroupPolicy by go test ./analyze -run TestPodGroupPolicyChart -update: do not edit. */ -}}
{{- if and .Values.admissionPolicy.enabled .Values.admissionPolicy.podGroups }}
{{- $apiVersion := "admissionregistration.k8s.io/v1beta1" }}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}
{{- $apiVersion = "admissionregistration.k8s.io/v1" }}
{{- end }}
` + text + "{{- end }}\n"
	if *update {
		if err := os.WriteFile(chartPodGroupPolicy, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(filepath.Clean(chartPodGroupPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from analyze.PodGroupPolicy (go test ./analyze -run TestPodGroupPolicyChart -update)", chartPodGroupPolicy)
	}
}
