package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/promoperator"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/rules"
)

// kube-prometheus-stack's release name in the README's install command, and
// the name its chart gives the Prometheus object.
const (
	kpsRelease    = "kube-prometheus-stack"
	kpsPrometheus = kpsRelease + "-prometheus"
	// A second Prometheus whose selectors match another release's label.
	otherRelease    = "other-stack"
	otherPrometheus = otherRelease + "-prometheus"
)

// operatorStack is a kube-apiserver with every Prometheus Operator CRD and
// the real operator reconciling namespace monitoring.
type operatorStack struct {
	dyn    dynamic.Interface
	client kubernetes.Interface
	mapper func(schema.GroupVersionKind) (*meta.RESTMapping, error)
	tools  string
	log    string // the operator's
}

func startOperatorStack(ctx context.Context, t *testing.T) *operatorStack {
	t.Helper()
	if promoperator.Version != operatorVersion {
		t.Fatalf("internal/promoperator runs operator %s, the CRD tests use %s", promoperator.Version, operatorVersion)
	}
	tools := testenv.ToolsBin(t, "etcd", "kube-apiserver", "helm", "prometheus-operator", "promtool")
	api := testenv.StartAPIServer(t)
	dyn, err := dynamic.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	promoperator.InstallCRDs(ctx, t, dyn)
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace}}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mapper := restMapping(t, api.Config)
	log := promoperator.Start(t, tools, api.Kubeconfig, namespace)
	return &operatorStack{dyn: dyn, client: client, mapper: mapper, tools: tools, log: log}
}

// apply server-side applies the objects (as helm would create them).
func (s *operatorStack) apply(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		ri := s.resource(t, o)
		body, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		force := true
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
			FieldManager: "zonewatch-operator-test", Force: &force, FieldValidation: metav1.FieldValidationStrict,
		}); err != nil {
			t.Fatalf("applying %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

func (s *operatorStack) delete(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if err := s.resource(t, o).Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("deleting %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

func (s *operatorStack) resource(t *testing.T, o *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	m, err := s.mapper(o.GroupVersionKind())
	if err != nil {
		t.Fatalf("%s: no API resource: %v", o.GetKind(), err)
	}
	return resourceOf(s.dyn, m, o)
}

func (s *operatorStack) wait(ctx context.Context, t *testing.T, prometheus, what string, cond func(*promoperator.Generated) bool) *promoperator.Generated {
	t.Helper()
	g := promoperator.Wait(ctx, t, s.client, namespace, prometheus, what, 90*time.Second, func(g *promoperator.Generated) bool {
		return cond(g) || len(promoperator.Rejections(s.log)) > 0
	})
	if r := promoperator.Rejections(s.log); len(r) > 0 {
		t.Fatalf("the operator rejected what the chart rendered:\n%s", strings.Join(r, "\n"))
	}
	return g
}

// docSetFlags finds the `--set` flags of a command in README.md or docs/*.md:
// the helm install command (from its line on, while lines end in a
// backslash) or the inline code span that contains mark.
func docSetFlags(t *testing.T, mark string) []string {
	t.Helper()
	files, _ := filepath.Glob("../docs/*.md")
	files = append([]string{"../README.md"}, files...)
	span := regexp.MustCompile("`[^`]*`")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		for i, line := range lines {
			if !strings.Contains(line, mark) {
				continue
			}
			cmd := line
			if strings.HasPrefix(strings.TrimSpace(line), "helm install") {
				for j := i; strings.HasSuffix(strings.TrimSpace(lines[j]), `\`) && j+1 < len(lines); j++ {
					cmd += " " + lines[j+1]
				}
			} else {
				for _, s := range span.FindAllString(line, -1) {
					if strings.Contains(s, mark) {
						cmd = strings.Trim(s, "`")
					}
				}
			}
			fields := strings.Fields(strings.ReplaceAll(cmd, `\`, " "))
			var sets []string
			for k := 0; k+1 < len(fields); k++ {
				if fields[k] == "--set" {
					sets = append(sets, fields[k+1])
				}
			}
			t.Logf("%s: %s", f, strings.Join(sets, " "))
			return sets
		}
	}
	t.Fatalf("no %q in README.md or docs/*.md", mark)
	return nil
}

func renderSet(t *testing.T, sets []string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", namespace}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := runHelm(t, "", args...)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, strings.NewReader(out))
}

// monitorObjects are the objects the operator reads: monitors and rules.
func monitorObjects(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GroupVersionKind().Group == "monitoring.coreos.com" {
			out = append(out, o)
		}
	}
	return out
}

// sentinel is a monitor of another app with the given release label: once
// the operator's configuration for a Prometheus lists it (or, for a
// Prometheus that must not select it, once another Prometheus does), the
// operator has seen every monitor of that kind applied before it.
func sentinel(kind, release string) *unstructured.Unstructured {
	ep := map[string]any{"port": "web"}
	spec := map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "sentinel"}}}
	if kind == "PodMonitor" {
		spec["podMetricsEndpoints"] = []any{ep}
	} else {
		spec["endpoints"] = []any{ep}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "monitoring.coreos.com/v1", "kind": kind,
		"metadata": map[string]any{"name": "sentinel-" + release, "namespace": namespace, "labels": map[string]any{"release": release}},
		"spec":     spec,
	}}
}

func jobName(kind, name string) string { return promoperator.JobName(kind, namespace, name) }

// TestPrometheusOperator installs the chart with the README's values next to
// a Prometheus configured as kube-prometheus-stack configures it, runs the
// real Prometheus Operator, and reads what it generates: the scrape job of
// the PodMonitor (then of the ServiceMonitor) and the rule files, which
// promtool must accept. A second Prometheus, whose selectors match another
// release, must get neither, and the README's troubleshooting step (compare
// the monitor's labels with the Prometheus' podMonitorSelector) must show why.
func TestPrometheusOperator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := startOperatorStack(ctx, t)
	s.apply(ctx, t, []*unstructured.Unstructured{promoperator.KubePrometheusStack(kpsRelease, namespace), promoperator.KubePrometheusStack(otherRelease, namespace)})

	readme := docSetFlags(t, "helm install zonewatch")
	pmObjs := renderSet(t, readme)
	pm := ofKind(pmObjs, "PodMonitor")
	if len(pm) != 1 {
		t.Fatalf("the README's install values render %d PodMonitors, want 1", len(pm))
	}
	promRule := ofKind(pmObjs, "PrometheusRule")
	if len(promRule) != 1 {
		t.Fatalf("the README's install values render %d PrometheusRules, want 1", len(promRule))
	}
	s.apply(ctx, t, monitorObjects(pmObjs))
	s.apply(ctx, t, []*unstructured.Unstructured{sentinel("PodMonitor", otherRelease)})

	pmJob := jobName("PodMonitor", pm[0].GetName())
	ruleFile := namespace + "-" + promRule[0].GetName() + "-"
	hasRules := func(g *promoperator.Generated) bool { _, _, ok := g.RuleFile(ruleFile); return ok }
	var kps *promoperator.Generated
	t.Run("PodMonitor", func(t *testing.T) {
		kps = s.wait(ctx, t, kpsPrometheus, "scrape job "+pmJob+" and our rule file", func(g *promoperator.Generated) bool {
			return g.Config.Job(pmJob) != nil && hasRules(g)
		})
		checkScrapeJob(t, kps, pmJob, "pod")
		t.Logf("the operator's scrape job:\n%s", rawJob(t, kps, pmJob))
		s.checkSyntax(t, kps)
	})

	t.Run("rule files", func(t *testing.T) {
		if kps == nil {
			t.Skip("no generated configuration")
		}
		name, content, _ := kps.RuleFile(ruleFile)
		dir := t.TempDir()
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(filepath.Join(s.tools, "promtool"), "check", "rules", f).CombinedOutput(); err != nil {
			t.Errorf("promtool check rules on the operator's %s: %v\n%s", name, err, out)
		}
		// The rule files are loaded from the ConfigMap's mount.
		want := "/etc/prometheus/rules/prometheus-" + kpsPrometheus + "-rulefiles-0/*.yaml"
		if !slices.Contains(kps.Config.RuleFiles, want) {
			t.Errorf("rule_files %v, want %s", kps.Config.RuleFiles, want)
		}
		// The groups are the chart's, unchanged, and the generator's groups
		// and rule names (what the dashboards and the e2e rely on).
		var got, applied struct {
			Groups []map[string]any `json:"groups"`
		}
		if err := yaml.Unmarshal([]byte(content), &got); err != nil {
			t.Fatal(err)
		}
		appliedGroups, _, _ := unstructured.NestedSlice(promRule[0].Object, "spec", "groups")
		b, _ := json.Marshal(map[string]any{"groups": appliedGroups})
		if err := json.Unmarshal(b, &applied); err != nil {
			t.Fatal(err)
		}
		gj, _ := json.Marshal(got)
		aj, _ := json.Marshal(applied)
		if !bytes.Equal(gj, aj) {
			t.Errorf("the operator's rule file differs from the PrometheusRule's groups:\n got %.600s\nwant %.600s", gj, aj)
		}
		genFile, err := rules.Generate(rules.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		var gen struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Record string `json:"record"`
					Alert  string `json:"alert"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal(genFile, &gen); err != nil {
			t.Fatal(err)
		}
		gotNames := ruleNames(t, []byte(content))
		var wantNames []string
		for _, g := range gen.Groups {
			for _, r := range g.Rules {
				wantNames = append(wantNames, g.Name+"/"+r.Record+r.Alert)
			}
		}
		if !slices.Equal(gotNames, wantNames) {
			t.Errorf("rule names in the operator's file:\n%v\nwant the generator's:\n%v", gotNames, wantNames)
		}
		// The README's prices reached the rules.
		exprs := map[string]string{}
		// The rule pack records its prices as series, one per locality.
		prices := map[string]string{}
		for _, g := range got.Groups {
			rs, _ := g["rules"].([]any)
			for _, r := range rs {
				r, _ := r.(map[string]any)
				rec, _ := r["record"].(string)
				exprs[rec], _ = r["expr"].(string)
				if rec == rules.RecTransferPrice {
					labels, _ := r["labels"].(map[string]any)
					locality, _ := labels["locality"].(string)
					prices[locality] = strings.TrimSpace(exprs[rec])
				}
			}
		}
		for _, set := range readme {
			if v, ok := strings.CutPrefix(set, "rules.crossZoneDollarsPerGB="); ok && prices["cross_zone"] != "vector("+v+")" {
				t.Errorf("the cross-zone price %s is not the rule pack's cross_zone price series: %q", v, prices["cross_zone"])
			}
			if v, ok := strings.CutPrefix(set, "rules.gpuDollarsPerHour="); ok && !strings.HasSuffix(exprs["namespace_job_name:zonewatch_split_idle_gpu_cost_dollars_per_hour:sum"], ") * "+v) {
				t.Errorf("the GPU price %s is not in the idle-GPU cost rule: %q", v, exprs["namespace_job_name:zonewatch_split_idle_gpu_cost_dollars_per_hour:sum"])
			}
		}
		t.Logf("operator rule file %s: %d groups, %d rules", name, len(got.Groups), len(gotNames))
	})

	t.Run("selectors do not match", func(t *testing.T) {
		other := s.wait(ctx, t, otherPrometheus, "the sentinel PodMonitor", func(g *promoperator.Generated) bool {
			return g.Config.Job(jobName("PodMonitor", "sentinel-"+otherRelease)) != nil
		})
		if other.Config.Job(pmJob) != nil {
			t.Errorf("Prometheus %s (selecting release=%s) scrapes %s", otherPrometheus, otherRelease, pmJob)
		}
		if k, _, ok := other.RuleFile(ruleFile); ok {
			t.Errorf("Prometheus %s (selecting release=%s) loads our rules %s", otherPrometheus, otherRelease, k)
		}
		s.checkTroubleshooting(ctx, t, pm[0])
	})

	// The ServiceMonitor: the README's line added to the install values must
	// be all it takes. The operator discovers its targets through Endpoints
	// (spec.serviceDiscoveryRole defaults to Endpoints in v0.85.0, and
	// kube-prometheus-stack does not set it).
	t.Run("ServiceMonitor", func(t *testing.T) {
		smObjs := renderSet(t, append(slices.Clone(readme), docSetFlags(t, "serviceMonitor.enabled=true")...))
		sm := ofKind(smObjs, "ServiceMonitor")
		if len(sm) != 1 || len(ofKind(smObjs, "PodMonitor")) != 0 {
			t.Fatalf("the README's ServiceMonitor values render %d ServiceMonitors and %d PodMonitors, want 1 and 0", len(sm), len(ofKind(smObjs, "PodMonitor")))
		}
		s.delete(ctx, t, pm)
		s.apply(ctx, t, monitorObjects(smObjs))
		s.apply(ctx, t, []*unstructured.Unstructured{sentinel("ServiceMonitor", kpsRelease)})
		smJob := jobName("ServiceMonitor", sm[0].GetName())
		g := s.wait(ctx, t, kpsPrometheus, "the sentinel ServiceMonitor, no PodMonitor job", func(g *promoperator.Generated) bool {
			return g.Config.Job(jobName("ServiceMonitor", "sentinel-"+kpsRelease)) != nil && g.Config.Job(pmJob) == nil
		})
		if g.Config.Job(smJob) == nil {
			t.Errorf("with the README's ServiceMonitor values (%v), Prometheus %s does not select the ServiceMonitor (labels %v): the README must say to set serviceMonitor.labels",
				docSetFlags(t, "serviceMonitor.enabled=true"), kpsPrometheus, sm[0].GetLabels())
			smObjs = renderSet(t, append(slices.Clone(readme), "podMonitor.enabled=false", "serviceMonitor.enabled=true", "serviceMonitor.labels.release="+kpsRelease))
			s.apply(ctx, t, monitorObjects(smObjs))
			g = s.wait(ctx, t, kpsPrometheus, "scrape job "+smJob, func(g *promoperator.Generated) bool { return g.Config.Job(smJob) != nil })
		}
		checkScrapeJob(t, g, smJob, "endpoints")
		s.checkSyntax(t, g)
	})
}

func ruleNames(t *testing.T, file []byte) []string {
	t.Helper()
	var f struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Record string `json:"record"`
				Alert  string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(file, &f); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, g.Name+"/"+r.Record+r.Alert)
		}
	}
	return out
}

// checkScrapeJob: the generated job keeps the exporter's labels, sets
// job="zonewatch" last, scrapes the chart's path at the chart's interval,
// and discovers the release namespace's targets.
func checkScrapeJob(t *testing.T, g *promoperator.Generated, name, role string) {
	t.Helper()
	sc := g.Config.Job(name)
	if sc == nil {
		t.Fatalf("no scrape job %s in %v", name, g.Config.Jobs())
	}
	if !sc.HonorLabels {
		t.Errorf("%s: honor_labels false: the exporter's namespace and pod labels would become exported_namespace, exported_pod", name)
	}
	if sc.ScrapeInterval != "30s" || sc.ScrapeTimeout != "10s" || sc.MetricsPath != "/metrics" || sc.Scheme != "http" {
		t.Errorf("%s: interval %q timeout %q path %q scheme %q, want the chart's 30s, 10s, /metrics, http", name, sc.ScrapeInterval, sc.ScrapeTimeout, sc.MetricsPath, sc.Scheme)
	}
	if len(sc.KubernetesSD) != 1 || sc.KubernetesSD[0].Role != role || !slices.Equal(sc.KubernetesSD[0].Namespaces.Names, []string{namespace}) {
		t.Errorf("%s: kubernetes_sd_configs %+v, want role %s in namespace %s", name, sc.KubernetesSD, role, namespace)
	}
	last := -1
	for i, r := range sc.Relabel {
		if r.TargetLabel == "job" {
			last = i
		}
	}
	if last < 0 || sc.Relabel[last].Replacement == nil || *sc.Relabel[last].Replacement != "zonewatch" || len(sc.Relabel[last].SourceLabels) != 0 {
		t.Errorf("%s: the last relabeling of job is %+v, want replacement zonewatch", name, sc.Relabel[max(last, 0)])
	}
	// The pods are selected by the chart's selector labels and port name.
	var keeps []string
	for _, r := range sc.Relabel {
		if r.Action == "keep" {
			keeps = append(keeps, strings.Join(r.SourceLabels, ",")+"="+r.Regex)
		}
	}
	for _, want := range []string{"app_kubernetes_io_name", "app_kubernetes_io_instance", "port_name"} {
		if !slices.ContainsFunc(keeps, func(k string) bool { return strings.Contains(k, want) }) {
			t.Errorf("%s: no keep on %s in %v", name, want, keeps)
		}
	}
}

// checkSyntax runs promtool on the whole generated prometheus.yaml (syntax
// only: the rule files and service-account files live in the pod).
func (s *operatorStack) checkSyntax(t *testing.T, g *promoperator.Generated) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "prometheus.yaml")
	if err := os.WriteFile(f, g.Raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(s.tools, "promtool"), "check", "config", "--syntax-only", f).CombinedOutput(); err != nil {
		t.Errorf("promtool check config on the generated prometheus.yaml: %v\n%s", err, out)
	}
}

// checkTroubleshooting follows step 3 of the chart's NOTES.txt (and the
// README's Verify section): list each Prometheus' podMonitorSelector with
// the kubectl jsonpath it prints, and compare it with the PodMonitor's
// labels: only the Prometheus that scrapes it may match.
func (s *operatorStack) checkTroubleshooting(ctx context.Context, t *testing.T, pm *unstructured.Unstructured) {
	t.Helper()
	const expr = `{range .items[*]}{.metadata.name}: {.spec.podMonitorSelector}{"\n"}{end}`
	notes, err := os.ReadFile(filepath.Join(chartDir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(notes), "kubectl get prometheus -A -o jsonpath='"+expr+"'") {
		t.Fatalf("NOTES.txt no longer prints the jsonpath %s: update this test", expr)
	}
	list, err := s.dyn.Resource(schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheuses"}).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	jp := jsonpath.New("notes")
	if err := jp.Parse(expr); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := jp.Execute(&out, list.UnstructuredContent()); err != nil {
		t.Fatal(err)
	}
	t.Logf("NOTES step 3 prints:\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(list.Items) {
		t.Errorf("the jsonpath printed %d lines for %d Prometheus objects", len(lines), len(list.Items))
	}
	for _, line := range lines {
		name, raw, ok := strings.Cut(line, ": ")
		if !ok {
			t.Fatalf("unexpected line %q", line)
		}
		var ls metav1.LabelSelector
		if err := json.Unmarshal([]byte(raw), &ls); err != nil {
			t.Fatalf("%s: selector %q: %v", name, raw, err)
		}
		sel, err := metav1.LabelSelectorAsSelector(&ls)
		if err != nil {
			t.Fatal(err)
		}
		matches := sel.Matches(labels.Set(pm.GetLabels()))
		if want := name == kpsPrometheus; matches != want {
			t.Errorf("%s: its podMonitorSelector %s matches the PodMonitor's labels: %v, want %v", name, raw, matches, want)
		}
	}
}

// rawJob is the scrape job as the operator wrote it, as YAML.
func rawJob(t *testing.T, g *promoperator.Generated, name string) string {
	t.Helper()
	var cfg struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(g.Raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, sc := range cfg.ScrapeConfigs {
		if sc["job_name"] == name {
			b, _ := yaml.Marshal(sc)
			return string(b)
		}
	}
	return ""
}
