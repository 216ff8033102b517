package rules

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// chartDir is the real chart, with its values.yaml and values.schema.json.
func chartDir(t *testing.T) string { return filepath.Join(repoRoot(t), "deploy", "helm", "zonewatch") }

// helmRules renders the real chart's PrometheusRule with the values file
// and returns its spec (the rule file's content).
func helmRules(t *testing.T, helm, valuesFile string) any {
	t.Helper()
	out := run(t, repoRoot(t), helm, "template", "zw", chartDir(t), "--namespace", "monitoring",
		"--show-only", "templates/prometheusrule.yaml", "-f", valuesFile)
	var m struct {
		Kind string `yaml:"kind"`
		Spec any    `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(out), &m); err != nil || m.Kind != "PrometheusRule" {
		t.Fatalf("helm output is not a PrometheusRule (%v):\n%s", err, out)
	}
	return m.Spec
}

// TestHelmOverrides renders the chart with rules/tests/helm/overrides.yaml
// (page floors, severity, for, disabled, additional labels and
// annotations), checks that Helm writes what Generate writes for the same
// settings, and runs promtool check rules and promtool test rules
// (rules/tests/helm/overrides_test.yml) on Helm's output.
func TestHelmOverrides(t *testing.T) {
	helm := tool(t, "helm")
	promtool := tool(t, "promtool")
	root := repoRoot(t)
	spec := helmRules(t, helm, filepath.Join(root, "rules", "tests", "helm", "overrides.yaml"))

	cfg := DefaultConfig()
	cfg.IdleGPUPageMinGPUs = 4
	cfg.IdleGPUPageMinDollarsPerHour = 10
	cfg.For.BlockedSplitJob = 5 * time.Minute
	cfg.Severity["idleGPUSplitJob"] = "warning"
	cfg.Disabled = map[string]bool{AlertSplitZonePlacement: true}
	cfg.AdditionalRuleLabels = map[string]string{"team": "ml-platform"}
	cfg.AdditionalRuleAnnotations = map[string]string{"dashboard": "https://grafana.example.com/d/zonewatch-job"}
	plain, err := Generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var want any
	if err := yaml.Unmarshal(plain, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(spec, want) {
		got, _ := yaml.Marshal(spec)
		t.Errorf("helm renders other rules than Generate:\n--- helm\n%s\n--- Generate\n%s", got, plain)
	}
	rendered, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rendered), AlertSplitZonePlacement) {
		t.Errorf("%s is disabled but rendered", AlertSplitZonePlacement)
	}
	for _, r := range parse(t, rendered) {
		if r.Alert != "" && (r.Labels["team"] != "ml-platform" || r.Annotations["dashboard"] == "") {
			t.Errorf("%s lacks the additional label or annotation: %v %v", r.Alert, r.Labels, r.Annotations)
		}
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "zonewatch-helm.rules.yml"), rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile(filepath.Join(root, "rules", "tests", "helm", "overrides_test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "overrides_test.yml"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(run(t, dir, promtool, "check", "rules", "zonewatch-helm.rules.yml"))
	t.Log(run(t, dir, promtool, "test", "rules", "overrides_test.yml"))
}

// TestChartRefusesBadRuleValues: values.schema.json refuses rule values
// the generator's Validate refuses, at helm template, naming the value.
func TestChartRefusesBadRuleValues(t *testing.T) {
	helm := tool(t, "helm")
	dir := t.TempDir()
	for i, tc := range []struct{ values, want string }{
		{"rules: {severity: {crossZoneCost: page}}", "/rules/severity/crossZoneCost"},
		{"rules: {severity: {noSuchAlert: info}}", "/rules/severity"},
		{"rules: {disabled: {ZonewatchNoSuchAlert: true}}", "/rules/disabled"},
		{"rules: {additionalRuleLabels: {severity: low}}", "invalid propertyName 'severity'"},
		{"rules: {additionalRuleLabels: {team-name: x}}", "invalid propertyName 'team-name'"},
		{"rules: {additionalRuleAnnotations: {runbook_url: x}}", "invalid propertyName 'runbook_url'"},
		{"rules: {for: {exporterDown: 10 minutes}}", "/rules/for/exporterDown"},
		{"rules: {idleGPUPageDropWindow: ''}", "/rules/idleGPUPageDropWindow"},
		{"rules: {idleGPUPageMinGPUs: 0.5}", "/rules/idleGPUPageMinGPUs"},
		{"rules: {sourceDownRollupNodes: 0}", "/rules/sourceDownRollupNodes"},
		{"rules: {idleGPUUtilization: 5}", "/rules/idleGPUUtilization"},
		{"rules: {noSuchKnob: 1}", "/rules"},
	} {
		f := filepath.Join(dir, "values"+string(rune('a'+i))+".yaml")
		if err := os.WriteFile(f, []byte(tc.values), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(helm, "template", "zw", chartDir(t), "-f", f, "--show-only", "templates/prometheusrule.yaml").CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("helm template with %s: %v, want a failure naming %q:\n%s", tc.values, err, tc.want, out)
		}
	}
}

// TestValuesSchemaHasRules: the chart's values.schema.json carries the
// schema the generator writes (rules/helm-values.schema.json) for the
// prometheusRule and rules values.
func TestValuesSchemaHasRules(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir(t), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Properties map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	gen, err := HelmValuesSchema()
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal(gen, &want); err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if !reflect.DeepEqual(chart.Properties[k], v) {
			t.Errorf("values.schema.json's %s differs from rules/helm-values.schema.json: merge it (go run ./rules/cmd/generate writes the latter)", k)
		}
	}
}
