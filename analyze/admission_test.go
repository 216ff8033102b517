package analyze

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
