package rules

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const regenerate = "run `go run ./rules/cmd/generate` from the repository root and commit the result"

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// tool finds a binary built by hack/tools.sh: in $ZONEWATCH_TOOLS_BIN, else
// in .tools/bin. Without it the test skips, unless CI or
// ZONEWATCH_REQUIRE_TOOLS is set.
func tool(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip(name + ": skipped in -short (make test-unit); make test-integration runs it")
	}
	dir := os.Getenv("ZONEWATCH_TOOLS_BIN")
	if dir == "" {
		dir = filepath.Join(repoRoot(t), ".tools", "bin")
	}
	path := filepath.Join(dir, name)
	if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
		return path
	}
	msg := name + " not found in " + dir + " (build it with hack/tools.sh or set ZONEWATCH_TOOLS_BIN)"
	if os.Getenv("CI") != "" || os.Getenv("ZONEWATCH_REQUIRE_TOOLS") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func run(t *testing.T, dir, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s (%s)", filepath.Base(bin), strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestCommittedFilesAreGenerated(t *testing.T) {
	files, err := Artifacts()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		got, err := os.ReadFile(filepath.Join(repoRoot(t), f.Path))
		if err != nil {
			t.Errorf("%s: %v; %s", f.Path, err, regenerate)
			continue
		}
		if !bytes.Equal(got, f.Data) {
			t.Errorf("%s differs from what the generator writes; %s", f.Path, regenerate)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"empty selector":      func(c *Config) { c.Selector = "" },
		"selector in braces":  func(c *Config) { c.Selector = `{job="zonewatch"}` },
		"bad cluster label":   func(c *Config) { c.ClusterLabel = "k8s-cluster" },
		"runbook fragment":    func(c *Config) { c.RunbookBaseURL = "https://x/runbooks.md#top" },
		"negative price":      func(c *Config) { c.CrossZoneDollarsPerGB = -1 },
		"ratio over 1":        func(c *Config) { c.SlowdownSMActive = 50 },
		"zero for":            func(c *Config) { c.For.IdleGPUSplitJob = 0 },
		"sub-millisecond for": func(c *Config) { c.For.CrossZoneCost = time.Microsecond },
		"severity page":       func(c *Config) { c.Severity["crossZoneCost"] = "page" },
		"severity missing":    func(c *Config) { delete(c.Severity, "exporterDown") },
		"severity unknown":    func(c *Config) { c.Severity["noSuchAlert"] = "info" },
		"disabled unknown":    func(c *Config) { c.Disabled = map[string]bool{"ZonewatchNoSuchAlert": true} },
		"label severity":      func(c *Config) { c.AdditionalRuleLabels = map[string]string{"severity": "low"} },
		"label name":          func(c *Config) { c.AdditionalRuleLabels = map[string]string{"team-name": "x"} },
		"annotation summary":  func(c *Config) { c.AdditionalRuleAnnotations = map[string]string{"summary": "x"} },
		"rollup of 0 nodes":   func(c *Config) { c.SourceDownRollupNodes = 0 },
		"drop window 0":       func(c *Config) { c.IdleGPUPageDropWindow = 0 },
		"negative min GPUs":   func(c *Config) { c.IdleGPUPageMinGPUs = -1 },
	} {
		c := DefaultConfig()
		mutate(&c)
		if _, err := Generate(c); err == nil {
			t.Errorf("%s: Generate accepted it", name)
		}
	}
}

func TestPromDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		10 * time.Minute:                     "10m",
		time.Hour + 30*time.Minute:           "1h30m",
		26 * time.Hour:                       "26h",
		5 * time.Second:                      "5s",
		1500 * time.Millisecond:              "1s500ms",
		2*time.Minute + 250*time.Millisecond: "2m250ms",
	} {
		if got := promDuration(d); got != want {
			t.Errorf("promDuration(%s) = %q, want %q", d, got, want)
		}
	}
}

// parsedRule is what the tests read back from generated YAML.
type parsedRule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type parsedGroups struct {
	Groups []struct {
		Name  string       `yaml:"name"`
		Rules []parsedRule `yaml:"rules"`
	} `yaml:"groups"`
}

func parse(t *testing.T, data []byte) []parsedRule {
	t.Helper()
	var f parsedGroups
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	var rules []parsedRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

func generate(t *testing.T, cfg Config) []parsedRule {
	t.Helper()
	data, err := Generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, data)
}

func TestShortForDurations(t *testing.T) {
	cfg := DefaultConfig()
	cfg.For = ForDurations{
		IdleGPUSplitJob: 5 * time.Second, BlockedSplitJob: 14 * time.Second, PeerPolicyDrops: 15 * time.Second,
		CrossZoneSlowdown: 6 * time.Second, CrossZoneCost: 7 * time.Second,
		SplitZonePlacement: 8 * time.Second, ExporterDown: 9 * time.Second, ExporterAbsent: 10 * time.Second,
		HubbleDisconnected: 11 * time.Second, HubbleLostEvents: 12 * time.Second, GPUSourceDown: 13 * time.Second,
		ByteSourceUnavailable: 1500 * time.Millisecond, SplitJobTrafficUnseen: 16 * time.Second,
		KubernetesSourceDown: 17 * time.Second, IPCacheSourceDown: 18 * time.Second, SourceDownOnManyNodes: 19 * time.Second,
	}
	got := map[string]string{}
	for _, r := range generate(t, cfg) {
		if r.Alert != "" {
			got[r.Alert] = r.For
		}
	}
	want := map[string]string{
		AlertIdleGPUSplitJob: "5s", AlertBlockedSplitJob: "14s", AlertPeerPolicyDrops: "15s",
		AlertCrossZoneSlowdown: "6s", AlertCrossZoneCost: "7s",
		AlertSplitZonePlacement: "8s", AlertExporterDown: "9s", AlertExporterAbsent: "10s",
		AlertHubbleDisconnected: "11s", AlertHubbleLostEvents: "12s", AlertGPUSourceDown: "13s",
		AlertByteSourceUnavailable: "1s500ms", AlertSplitJobTrafficUnseen: "16s",
		AlertKubernetesSourceDown: "17s", AlertIPCacheSourceDown: "18s", AlertSourceDownOnManyNodes: "19s",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("for durations = %v, want %v", got, want)
	}
}

var (
	clauseRE = regexp.MustCompile(`\b(by|on) \(([^)]*)\)`)
	matchRE  = regexp.MustCompile(`\{namespace=%q,job_name=%q([^}]*)\}" \$labels\.namespace \$labels\.job_name([^)]*)\)`)
)

func TestClusterLabel(t *testing.T) {
	for _, r := range generate(t, DefaultConfig()) {
		if strings.Contains(r.Expr+r.Annotations["description"], "k8s_cluster") {
			t.Errorf("%s%s mentions a cluster label although none is set", r.Record, r.Alert)
		}
	}
	cfg := DefaultConfig()
	cfg.ClusterLabel = "k8s_cluster"
	nClauses, nQueries := 0, 0
	for _, r := range generate(t, cfg) {
		name := r.Record + r.Alert
		clauses := clauseRE.FindAllStringSubmatch(r.Expr, -1)
		if len(clauses) == 0 && !strings.HasPrefix(r.Expr, "absent(") && !strings.Contains(r.Expr, "up{") {
			// Rules without aggregation or join keep every label anyway.
			t.Logf("%s: no by/on clause", name)
		}
		nClauses += len(clauses)
		for _, c := range clauses {
			if c[1] == "on" && c[2] == "locality" && strings.Contains(r.Expr, RecTransferPrice) {
				// One price per locality, whatever the cluster.
				continue
			}
			if !strings.Contains(c[2], "k8s_cluster") {
				t.Errorf("%s: %s (%s) lacks the cluster label", name, c[1], c[2])
			}
		}
		for _, m := range matchRE.FindAllStringSubmatch(r.Annotations["description"], -1) {
			nQueries++
			// Extra matchers (peer="job") may come first.
			if !strings.HasSuffix(m[1], `,k8s_cluster=%q`) || m[2] != ` $labels.k8s_cluster` {
				t.Errorf("%s: description query does not filter on the cluster: %q", name, m[0])
			}
		}
	}
	if nClauses < 40 || nQueries < 10 {
		t.Errorf("checked only %d by/on clauses and %d description queries: the patterns no longer match the rules", nClauses, nQueries)
	}
	t.Logf("%d by/on clauses and %d description queries carry the cluster label", nClauses, nQueries)
}

var (
	recordNameRE = regexp.MustCompile(`^[a-z_]+:zonewatch_[a-z0-9_]+:[a-z0-9_]+$`)
	alertNameRE  = regexp.MustCompile(`^Zonewatch([A-Z][a-zA-Z0-9]*)+$`)
	headingRE    = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
)

// githubAnchor is how GitHub turns a Markdown heading into a fragment.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func TestConventions(t *testing.T) {
	runbooks, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range headingRE.FindAllStringSubmatch(string(runbooks), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	severities := map[string]bool{"critical": true, "warning": true, "info": true}
	records := map[string]bool{}
	alerts := 0
	for _, r := range generate(t, DefaultConfig()) {
		for _, line := range strings.Split(r.Expr+"\n"+r.Annotations["description"], "\n") {
			if strings.TrimRight(line, " \t") != line {
				t.Errorf("%s%s: trailing space breaks the literal YAML style: %q", r.Record, r.Alert, line)
			}
		}
		if r.Record != "" {
			if !recordNameRE.MatchString(r.Record) {
				t.Errorf("recording rule %s: not level:metric:operations", r.Record)
			}
			records[r.Record] = true
			continue
		}
		alerts++
		if !alertNameRE.MatchString(r.Alert) {
			t.Errorf("alert %s: not CamelCase with the Zonewatch prefix", r.Alert)
		}
		if r.For == "" {
			t.Errorf("%s: no for", r.Alert)
		}
		if !severities[r.Labels["severity"]] {
			t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
		}
		if s := r.Annotations["summary"]; !strings.HasSuffix(s, ".") || strings.Contains(s, "{{") {
			t.Errorf("%s: summary %q must be fixed text ending with a period", r.Alert, s)
		}
		// absent() yields only the selector's labels, which the text spells out already.
		if d := r.Annotations["description"]; !strings.Contains(d, "{{") && r.Alert != AlertExporterAbsent {
			t.Errorf("%s: description is not templated", r.Alert)
		}
		url := r.Annotations["runbook_url"]
		base, anchor, ok := strings.Cut(url, "#")
		if !ok || base != DefaultRunbookBaseURL || !anchors[anchor] {
			t.Errorf("%s: runbook_url %q does not point at a section of docs/runbooks.md", r.Alert, url)
		}
	}
	if want := len(AlertNames()); alerts != want || want != 16 {
		t.Errorf("%d alerts, AlertNames %d, want 16", alerts, want)
	}
	for _, name := range []string{
		"namespace_job_name:zonewatch_job_zones:max",
		"namespace_job_name:zonewatch_job_split_zone:max",
		"namespace_job_name_role_zone:zonewatch_job_pods:count",
		"namespace_job_name:zonewatch_gpus:count",
		"namespace_job_name:zonewatch_gpu_utilization_ratio:avg",
		"namespace_job_name:zonewatch_gpu_sm_active_ratio:avg",
		"namespace_job_name_signal:zonewatch_gpu_activity_ratio:avg",
		"namespace_job_name_locality:zonewatch_job_policy_drops:rate5m",
		"namespace_job_name_peer_peer_namespace_peer_workload_policy_policy_source:zonewatch_job_peer_cross_zone_policy_drops:rate5m",
		"namespace_job_name:zonewatch_job_cross_zone_flow_events:rate5m",
		"namespace_job_name:zonewatch_job_cross_zone_bytes:rate5m",
		"namespace_job_name:zonewatch_cross_zone_cost_dollars_per_hour:rate5m",
		"namespace:zonewatch_cross_zone_cost_dollars_per_hour:rate5m",
		"namespace_job_name:zonewatch_split_idle_gpu_cost_dollars_per_hour:sum",
	} {
		if !records[name] {
			t.Errorf("recording rule %s is missing (dashboards query it)", name)
		}
	}
}

// TestEveryAlertIsTested checks that the promtool tests show every alert
// firing and, at another time or in another case, not firing.
func TestEveryAlertIsTested(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("tests", "*_test.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests: %v", err)
	}
	type alertTest struct {
		Alertname string `yaml:"alertname"`
		ExpAlerts []any  `yaml:"exp_alerts"`
	}
	var unit struct {
		Tests []struct {
			AlertRuleTest   []alertTest `yaml:"alert_rule_test"`
			PromqlExprTests []struct {
				Expr string `yaml:"expr"`
			} `yaml:"promql_expr_test"`
		} `yaml:"tests"`
	}
	fires, quiet, exprs := map[string]bool{}, map[string]bool{}, ""
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		unit.Tests = nil
		if err := yaml.Unmarshal(data, &unit); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tg := range unit.Tests {
			for _, a := range tg.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
			for _, e := range tg.PromqlExprTests {
				exprs += e.Expr + "\n"
			}
		}
	}
	var missing []string
	for _, r := range generate(t, DefaultConfig()) {
		switch {
		case r.Alert != "" && !fires[r.Alert]:
			missing = append(missing, r.Alert+" never fires")
		case r.Alert != "" && !quiet[r.Alert]:
			missing = append(missing, r.Alert+" is never shown not firing")
		case r.Record != "" && !strings.Contains(exprs, r.Record):
			missing = append(missing, r.Record+" has no promql_expr_test")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Error(m)
	}
}

// TestPrometheusRuleManifest checks that the manifest carries the same
// groups as the plain rule file.
func TestPrometheusRuleManifest(t *testing.T) {
	plain, err := Generate(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := PrometheusRule(DefaultConfig(), "zw", "")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name      string `yaml:"name"`
			Namespace string `yaml:"namespace"`
		} `yaml:"metadata"`
		Spec any `yaml:"spec"`
	}
	if err := yaml.Unmarshal(manifest, &m); err != nil {
		t.Fatal(err)
	}
	if m.APIVersion != "monitoring.coreos.com/v1" || m.Kind != "PrometheusRule" || m.Metadata.Name != "zw" || m.Metadata.Namespace != "" {
		t.Errorf("manifest header: %+v", m)
	}
	var want any
	if err := yaml.Unmarshal(plain, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.Spec, want) {
		t.Error("manifest spec differs from the plain rule file")
	}
}

func TestPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	root := repoRoot(t)

	// A variant with short for: durations and a cluster label, as the e2e
	// test and multi-cluster sites generate it.
	cfg := DefaultConfig()
	cfg.ClusterLabel = "cluster"
	cfg.For.IdleGPUSplitJob = 10 * time.Second
	variant, err := Generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	variantFile := filepath.Join(t.TempDir(), "variant.rules.yml")
	if err := os.WriteFile(variantFile, variant, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(run(t, root, promtool, "check", "rules", "rules/zonewatch.rules.yml", "rules/tests/zonewatch-cluster.rules.yml", variantFile))

	tests, err := filepath.Glob(filepath.Join(root, "rules", "tests", "*_test.yml"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no promtool tests: %v", err)
	}
	out := run(t, root, promtool, append([]string{"test", "rules"}, tests...)...)
	t.Logf("%d test files\n%s", len(tests), out)
}

// TestHelmTemplate renders the chart template with helm and checks that it
// yields exactly the rules Generate writes for the same knobs.
func TestHelmTemplate(t *testing.T) {
	helm := tool(t, "helm")
	root := repoRoot(t)
	chart := filepath.Join(t.TempDir(), "zonewatch")
	tmpl, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "zonewatch", "templates", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(root, "rules", "helm-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"Chart.yaml":                    []byte("apiVersion: v2\nname: zonewatch\nversion: 0.0.0\n"),
		"values.yaml":                   values,
		"templates/prometheusrule.yaml": tmpl,
		"override.yaml": []byte(`rules:
  selector: job="zw", namespace="monitoring"
  clusterLabel: cluster
  runbookBaseURL: https://runbooks.example.com/zonewatch
  gpuDollarsPerHour: 2.5
  crossZoneDollarsPerGB: 0.02
  crossZoneDailyBudgetDollars: 1000000
  for:
    idleGPUSplitJob: 2m
prometheusRule:
  labels:
    release: kube-prometheus-stack
`),
		"off.yaml": []byte("prometheusRule:\n  enabled: false\n"),
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(chart, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(chart, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	overridden := DefaultConfig()
	overridden.Selector = `job="zw", namespace="monitoring"`
	overridden.ClusterLabel = "cluster"
	overridden.RunbookBaseURL = "https://runbooks.example.com/zonewatch"
	overridden.GPUDollarsPerHour = 2.5
	overridden.CrossZoneDollarsPerGB = 0.02
	overridden.CrossZoneDailyBudgetDollars = 1e6
	overridden.For.IdleGPUSplitJob = 2 * time.Minute

	for _, c := range []struct {
		name string
		args []string
		cfg  Config
	}{
		{"defaults", nil, DefaultConfig()},
		{"overridden", []string{"-f", filepath.Join(chart, "override.yaml")}, overridden},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := run(t, root, helm, append([]string{"template", "zw", chart, "--namespace", "monitoring"}, c.args...)...)
			var m struct {
				Kind     string `yaml:"kind"`
				Metadata struct {
					Name      string            `yaml:"name"`
					Namespace string            `yaml:"namespace"`
					Labels    map[string]string `yaml:"labels"`
				} `yaml:"metadata"`
				Spec any `yaml:"spec"`
			}
			if err := yaml.Unmarshal([]byte(out), &m); err != nil {
				t.Fatalf("helm output is not YAML: %v\n%s", err, out)
			}
			if m.Kind != "PrometheusRule" || m.Metadata.Name != "zw-zonewatch" || m.Metadata.Namespace != "monitoring" {
				t.Errorf("metadata: %+v", m.Metadata)
			}
			if c.name == "overridden" && m.Metadata.Labels["release"] != "kube-prometheus-stack" {
				t.Errorf("extra labels missing: %v", m.Metadata.Labels)
			}
			plain, err := Generate(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var want any
			if err := yaml.Unmarshal(plain, &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(m.Spec, want) {
				got, _ := yaml.Marshal(m.Spec)
				t.Errorf("helm renders other rules than Generate:\n--- helm\n%s\n--- Generate\n%s", got, plain)
			}
		})
	}
	if out := run(t, root, helm, "template", "zw", chart, "-f", filepath.Join(chart, "off.yaml")); strings.Contains(out, "PrometheusRule") {
		t.Errorf("prometheusRule.enabled=false still renders:\n%s", out)
	}
}

// TestPageWithinSixMinutes keeps the shipped default's promise: the first
// drop's counter needs two 30s scrapes (the chart's PodMonitor) and one 1m
// rule evaluation (Prometheus' default) before the condition holds, then
// for: runs (docs/runbooks.md, rules/tests/time_to_page_test.yml).
func TestPageWithinSixMinutes(t *testing.T) {
	const scrape, eval = 30 * time.Second, time.Minute
	if worst := 2*scrape + eval + DefaultConfig().For.IdleGPUSplitJob; worst > 6*time.Minute {
		t.Errorf("with for %s the page may come %s after the first drop, over 6m", DefaultConfig().For.IdleGPUSplitJob, worst)
	}
}

// TestBlockedNeverWithPage checks that the blocked ticket's condition
// excludes the page's whole condition, so both never fire for one job, and
// that both read the drops between the job's own pods only.
func TestBlockedNeverWithPage(t *testing.T) {
	exprs := map[string]string{}
	for _, r := range generate(t, DefaultConfig()) {
		exprs[r.Alert] = r.Expr
	}
	page, blocked := exprs[AlertIdleGPUSplitJob], exprs[AlertBlockedSplitJob]
	if page == "" || blocked == "" {
		t.Fatal("page or blocked alert missing")
	}
	if !strings.Contains(strings.Join(strings.Fields(blocked), " "), "unless on (namespace, job_name) ( "+strings.Join(strings.Fields(page), " ")+" )") {
		t.Errorf("%s does not exclude the page's condition:\n%s", AlertBlockedSplitJob, blocked)
	}
	for _, name := range []string{AlertIdleGPUSplitJob, AlertBlockedSplitJob} {
		if !strings.Contains(exprs[name], RecOwnCrossZonePolicyDrops) || strings.Contains(exprs[name], RecPolicyDrops) {
			t.Errorf("%s does not read the own-pods drops only:\n%s", name, exprs[name])
		}
	}
}

// TestJobAlertsHonourOptOut: every alert of the zonewatch.jobs group leaves
// out the jobs marked zonewatch.io/multi-zone: intentional.
func TestJobAlertsHonourOptOut(t *testing.T) {
	groups, err := configuredGroups(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	const clause = `unless on (namespace, job_name) zonewatch_job_multi_zone_info{job="zonewatch", multi_zone="intentional"}`
	recorded := map[string]string{}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] += string(r.Expr)
			}
		}
	}
	n := 0
	for _, g := range groups {
		if g.Name != "zonewatch.jobs" {
			continue
		}
		for _, r := range g.Rules {
			n++
			// An alert that is a recording rule's output: that rule's expression.
			expr := string(r.Expr)
			if rec, ok := recorded[strings.TrimSpace(expr)]; ok {
				expr = rec
			}
			if !strings.Contains(expr, clause) {
				t.Errorf("%s does not leave out intentional multi-zone jobs:\n%s", r.Alert, r.Expr)
			}
		}
	}
	if n != 7 {
		t.Errorf("%d job alerts, want 7", n)
	}
}
