package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zonewatch/zonewatch/rules"
)

// TestHelmTemplate renders templates/dashboards.yaml with helm in a scratch
// chart (the template and the chart's dashboard copies, nothing else) and
// checks the ConfigMaps: sidecar label and folder, the dashboard JSON, and
// the price constants taken from the rules values.
func TestHelmTemplate(t *testing.T) {
	if testing.Short() {
		t.Skip("helm: skipped in -short (make test-unit); make test-integration runs it")
	}
	required := os.Getenv("CI") != "" || os.Getenv("ZONEWATCH_REQUIRE_TOOLS") != ""
	helm := findHelm()
	if helm == "" {
		if required {
			t.Fatal("helm not found in $ZONEWATCH_TOOLS_BIN, .tools/bin or PATH: run `make tools`")
		}
		t.Skip("helm not found in $ZONEWATCH_TOOLS_BIN, .tools/bin or PATH: run `make tools`; set ZONEWATCH_REQUIRE_TOOLS=1 to make this a failure")
	}

	chart := filepath.Join(t.TempDir(), "zonewatch")
	for _, dir := range []string{"templates", "dashboards"} {
		if err := os.MkdirAll(filepath.Join(chart, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, filepath.Join(repoRoot, "deploy/helm/zonewatch/templates/dashboards.yaml"), filepath.Join(chart, "templates/dashboards.yaml"))
	copies, _ := filepath.Glob(filepath.Join(repoRoot, HelmDir, "*.json"))
	if len(copies) != 3 {
		t.Fatalf("%d dashboards in %s, want 3; %s", len(copies), HelmDir, regenerate)
	}
	for _, p := range copies {
		copyFile(t, p, filepath.Join(chart, "dashboards", filepath.Base(p)))
	}
	if err := os.WriteFile(filepath.Join(chart, "Chart.yaml"), []byte("apiVersion: v2\nname: zonewatch\nversion: 0.0.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	out := runHelm(t, helm, "template", "zw", chart, "--namespace", "monitoring",
		"--set", "rules.crossZoneDollarsPerGB=0.02", "--set", "rules.gpuDollarsPerHour=2.5",
		"--set", "dashboards.folder=GPU jobs")
	docs := strings.Split(out, "\n---\n")
	var found []string
	for _, doc := range docs {
		if !strings.Contains(doc, "kind: ConfigMap") {
			continue
		}
		for _, want := range []string{"namespace: monitoring", `grafana_dashboard: "1"`, `grafana_folder: "GPU jobs"`} {
			if !strings.Contains(doc, want) {
				t.Errorf("ConfigMap lacks %q:\n%.400s", want, doc)
			}
		}
		_, block, ok := strings.Cut(doc, ".json: |-\n")
		if !ok {
			t.Fatalf("no dashboard in ConfigMap:\n%.400s", doc)
		}
		var js strings.Builder
		for line := range strings.Lines(block) {
			js.WriteString(strings.TrimPrefix(line, "    "))
		}
		var d struct {
			UID        string `json:"uid"`
			Templating struct {
				List []struct {
					Name, Type string
					Query      any
				}
			}
		}
		if err := json.Unmarshal([]byte(js.String()), &d); err != nil {
			t.Fatalf("ConfigMap data is not JSON: %v", err)
		}
		found = append(found, d.UID)
		consts := map[string]any{}
		for _, v := range d.Templating.List {
			if v.Type == "constant" {
				consts[v.Name] = v.Query
			}
		}
		want := map[string]any{varCrossZonePrice: "0.02", varGPUPrice: "2.5", varIdleGPU: "0.05"}
		for k, v := range want {
			if consts[k] != v {
				t.Errorf("%s: constant %s = %v, want %v (from the rules values, or the generated default)", d.UID, k, consts[k], v)
			}
		}
		qs, err := Queries([]byte(js.String()), map[string]string{"namespace": "ml", "job_name": "llama"})
		if err != nil {
			t.Errorf("%s: rendered dashboard: %v", d.UID, err)
		}
		// GPU-hours divide by the chart's GPU price; transfer dollars read
		// the rule pack's price series, which the chart fills from the same
		// rules values.
		if d.UID == UIDCost && (!strings.Contains(exprs(qs), "/ 2.5") || !strings.Contains(exprs(qs), rules.RecTransferPrice)) {
			t.Errorf("%s: cost queries use neither the chart's GPU price 2.5 nor the rules' price series:\n%s", d.UID, exprs(qs))
		}
	}
	if len(found) != 3 {
		t.Errorf("rendered dashboards %v, want 3", found)
	}

	if off := runHelm(t, helm, "template", "zw", chart, "--set", "dashboards.enabled=false"); strings.Contains(off, "kind: ConfigMap") {
		t.Errorf("dashboards.enabled=false still renders ConfigMaps")
	}

	// The variables' defaults and the runbook links from values, linted as
	// the generator's own variants are.
	anchors := runbookAnchors(t)
	for _, tc := range []struct {
		name     string
		set      []string
		want     lintWant
		runbooks string
	}{
		{"defaults", nil, committedWant, rules.DefaultRunbookBaseURL},
		{"scrape.job and rules", []string{"scrape.job=zw-scrape", "rules.clusterLabel=k8s_cluster", "rules.runbookBaseURL=https://runbooks.example.com/zw.md"},
			lintWant{true, "k8s_cluster", "zw-scrape"}, "https://runbooks.example.com/zw.md"},
		{"dashboards.variables first", []string{"scrape.job=zw-scrape", "dashboards.variables.scrapeJob=monitoring/zonewatch",
			"rules.clusterLabel=k8s_cluster", "dashboards.variables.clusterLabel=region_cluster"},
			lintWant{true, "region_cluster", "monitoring/zonewatch"}, rules.DefaultRunbookBaseURL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", "zw", chart}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			rendered := renderedDashboards(t, runHelm(t, helm, args...))
			if len(rendered) != 3 {
				t.Fatalf("rendered %d dashboards, want 3", len(rendered))
			}
			for uid, js := range rendered {
				t.Run(uid, func(t *testing.T) {
					lintDashboardJSON(t, js, tc.want)
					_, problems := runbookLinkProblems(js, tc.runbooks, anchors)
					for _, p := range problems {
						t.Error(p)
					}
					qs, err := Queries(js, map[string]string{"namespace": "ml", "job_name": "llama"})
					if err != nil {
						t.Fatal(err)
					}
					all := exprs(qs)
					if uid == UIDOverview && !strings.Contains(all, fmt.Sprintf("job=%q", tc.want.scrapeJob)) {
						t.Errorf("no query selects the scrape job %q:\n%s", tc.want.scrapeJob, all)
					}
					if !strings.Contains(all, tc.want.clusterLabel+`=~".*"`) {
						t.Errorf("no query matches the cluster label %s at All:\n%s", tc.want.clusterLabel, all)
					}
				})
			}
		})
	}
	cmd := exec.Command(helm, "template", "zw", chart, "--set", "dashboards.variables.clusterLabel=cluster\\=x")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "is not a label name") {
		t.Errorf("a cluster label that is no label name rendered (%v):\n%.300s", err, out)
	}
}

// renderedDashboards reads the dashboards out of rendered ConfigMaps, by UID.
func renderedDashboards(t *testing.T, out string) map[string][]byte {
	t.Helper()
	found := map[string][]byte{}
	for _, doc := range strings.Split(out, "\n---\n") {
		_, block, ok := strings.Cut(doc, ".json: |-\n")
		if !strings.Contains(doc, "kind: ConfigMap") || !ok {
			continue
		}
		var js strings.Builder
		for line := range strings.Lines(block) {
			js.WriteString(strings.TrimPrefix(line, "    "))
		}
		var d struct{ UID string }
		if err := json.Unmarshal([]byte(js.String()), &d); err != nil {
			t.Fatalf("ConfigMap data is not JSON: %v", err)
		}
		found[d.UID] = []byte(js.String())
	}
	return found
}

func exprs(qs []Query) string {
	var b strings.Builder
	for _, q := range qs {
		b.WriteString(q.Expr + "\n")
	}
	return b.String()
}

// findHelm looks where `make tools` puts it ($ZONEWATCH_TOOLS_BIN, else
// .tools/bin), then on PATH.
func findHelm() string {
	dir := os.Getenv("ZONEWATCH_TOOLS_BIN")
	if dir == "" {
		dir = filepath.Join(repoRoot, ".tools", "bin")
	}
	if p := filepath.Join(dir, "helm"); isExecutable(p) {
		return p
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

func runHelm(t *testing.T, helm string, args ...string) string {
	t.Helper()
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
