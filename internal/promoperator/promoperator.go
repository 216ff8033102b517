// Package promoperator runs the real Prometheus Operator (built by
// hack/tools.sh at Version) against a test kube-apiserver, and reads the
// configuration it generates, for the deploy and e2e tests.
package promoperator

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// Module and Version of the operator: its CRDs come from the module cache,
// its binary from hack/tools.sh (PROMETHEUS_OPERATOR_VERSION).
const (
	Module  = "github.com/prometheus-operator/prometheus-operator"
	Version = "v0.85.0"
)

// ModuleDir is the module's folder in the module cache, downloading it
// through GOPROXY when it is not there yet. No go.mod is touched.
func ModuleDir() (string, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, gobin, "mod", "download", "-json", Module+"@"+Version).Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); jerr != nil && err == nil {
		err = jerr
	}
	if m.Error != "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", Module, Version, m.Error)
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", Module, Version, err)
	}
	return m.Dir, nil
}

// InstallCRDs creates every CRD of the release (example/prometheus-operator-crd:
// the Prometheus controller waits for the informers of every kind it
// selects, Probe and ScrapeConfig too) and waits until they are established.
func InstallCRDs(ctx context.Context, t testing.TB, dyn dynamic.Interface) {
	t.Helper()
	dir, err := ModuleDir()
	if err != nil {
		t.Fatalf("Prometheus Operator CRDs unavailable: %v", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "example", "prometheus-operator-crd", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s (%v)", dir, err)
	}
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crd := &unstructured.Unstructured{Object: m}
		if _, err := dyn.Resource(gvr).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("installing CRD %s: %v", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	for _, name := range names {
		for {
			crd, err := dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(crd) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("CRD %s not established: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if c, _ := c.(map[string]any); c["type"] == "Established" && c["status"] == "True" {
			return true
		}
	}
	return false
}

// Start runs the operator binary (tools/prometheus-operator) for the length
// of the test, reconciling namespace. It reads the kubeconfig from
// $KUBECONFIG (pkg/k8sutil NewClusterConfig); without --kubelet-service it
// runs no kubelet controller. No kubelet or controller-manager runs here:
// the StatefulSets it creates never get pods, while the configuration it
// writes (the config Secret, the rule-file ConfigMaps) is complete.
// It returns the path of the operator's log.
func Start(t *testing.T, tools, kubeconfig, namespace string) (log string) {
	t.Helper()
	bin := filepath.Join(tools, "prometheus-operator")
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "version "+strings.TrimPrefix(Version, "v")) {
		t.Fatalf("%s is not operator %s (hack/tools.sh builds the pinned version):\n%s", bin, Version, out)
	}
	dir := t.TempDir()
	testenv.StartEnv(t, dir, "prometheus-operator", bin, []string{"KUBECONFIG=" + kubeconfig},
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)),
		"--namespaces="+namespace,
		"--log-level=debug",
	)
	return filepath.Join(dir, "prometheus-operator.log")
}

// Rejections are the operator's log lines saying why it skipped a monitor or
// rule (an invalid rule: its PromQL parser is the Prometheus its go.mod
// requires, v0.305.0 for v0.85.0, older than the Prometheus the tests run).
func Rejections(log string) []string {
	b, _ := os.ReadFile(log)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		// pkg/operator/rules.go and pkg/prometheus/resource_selector.go.
		if strings.Contains(line, `msg="invalid rule"`) && strings.Contains(line, " err=") ||
			strings.Contains(line, `msg="skipping object"`) || strings.Contains(line, `msg="skipping prometheusrule"`) {
			out = append(out, line)
		}
	}
	return out
}

// KubePrometheusStack is the Prometheus object kube-prometheus-stack 77.14.0
// (the chart release shipping operator v0.85.0: Chart.yaml appVersion)
// creates for release in namespace with its default values, as its
// templates/prometheus/prometheus.yaml renders it: every *Selector is
// `matchLabels: {release: <release>}` (values.yaml sets
// *SelectorNilUsesHelmValues: true), every *NamespaceSelector is {} (all
// namespaces), no scrapeInterval or evaluationInterval (values "": the
// operator's 30s), image tag v3.6.0, alerting to the stack's Alertmanager.
// Fields that only shape the StatefulSet (resources, storage, security
// context) are left out: the operator generates no configuration from them.
func KubePrometheusStack(release, namespace string) *unstructured.Unstructured {
	sel := map[string]any{"matchLabels": map[string]any{"release": release}}
	name := release + "-prometheus"
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "Prometheus",
		"metadata": map[string]any{
			"name": name, "namespace": namespace,
			"labels": map[string]any{"app": "kube-prometheus-stack-prometheus", "release": release},
		},
		"spec": map[string]any{
			"alerting": map[string]any{"alertmanagers": []any{map[string]any{
				"namespace": namespace, "name": release + "-alertmanager", "port": "http-web", "apiVersion": "v2",
			}}},
			"image":                           "quay.io/prometheus/prometheus:v3.6.0",
			"version":                         "v3.6.0",
			"externalUrl":                     "http://" + name + "." + namespace + ":9090",
			"paused":                          false,
			"replicas":                        int64(1),
			"shards":                          int64(1),
			"logLevel":                        "info",
			"logFormat":                       "logfmt",
			"listenLocal":                     false,
			"enableAdminAPI":                  false,
			"retention":                       "10d",
			"walCompression":                  true,
			"routePrefix":                     "/",
			"serviceAccountName":              name,
			"serviceMonitorSelector":          sel,
			"serviceMonitorNamespaceSelector": map[string]any{},
			"podMonitorSelector":              sel,
			"podMonitorNamespaceSelector":     map[string]any{},
			"probeSelector":                   sel,
			"probeNamespaceSelector":          map[string]any{},
			"ruleSelector":                    sel,
			"ruleNamespaceSelector":           map[string]any{},
			"scrapeConfigSelector":            sel,
			"scrapeConfigNamespaceSelector":   map[string]any{},
			"portName":                        "http-web",
			"hostNetwork":                     false,
		},
	}}
}

// Config is the part of the generated prometheus.yaml the tests read.
type Config struct {
	RuleFiles     []string       `json:"rule_files"`
	ScrapeConfigs []ScrapeConfig `json:"scrape_configs"`
}

type ScrapeConfig struct {
	JobName        string          `json:"job_name"`
	HonorLabels    bool            `json:"honor_labels"`
	ScrapeInterval string          `json:"scrape_interval"`
	ScrapeTimeout  string          `json:"scrape_timeout"`
	MetricsPath    string          `json:"metrics_path"`
	Scheme         string          `json:"scheme"`
	KubernetesSD   []KubernetesSD  `json:"kubernetes_sd_configs"`
	Relabel        []RelabelConfig `json:"relabel_configs"`
}

type KubernetesSD struct {
	Role       string `json:"role"`
	Namespaces struct {
		Names []string `json:"names"`
	} `json:"namespaces"`
}

type RelabelConfig struct {
	SourceLabels []string `json:"source_labels"`
	Regex        string   `json:"regex"`
	TargetLabel  string   `json:"target_label"`
	Replacement  *string  `json:"replacement"`
	Action       string   `json:"action"`
}

// Job is the scrape config named name, or nil.
func (c *Config) Job(name string) *ScrapeConfig {
	for i := range c.ScrapeConfigs {
		if c.ScrapeConfigs[i].JobName == name {
			return &c.ScrapeConfigs[i]
		}
	}
	return nil
}

func (c *Config) Jobs() []string {
	var out []string
	for _, sc := range c.ScrapeConfigs {
		out = append(out, sc.JobName)
	}
	return out
}

// JobName is the scrape job the operator names after a monitor's first
// endpoint (kind PodMonitor or ServiceMonitor).
func JobName(kind, namespace, name string) string {
	k := "podMonitor"
	if kind == "ServiceMonitor" {
		k = "serviceMonitor"
	}
	return k + "/" + namespace + "/" + name + "/0"
}

// Generated is what the operator wrote for one Prometheus.
type Generated struct {
	Raw    []byte // prometheus.yaml
	Config Config
	// Rules is the rule-file ConfigMaps' data: file name -> content.
	Rules map[string]string
}

// RuleFile is the content of the rule file whose name starts with prefix
// (the operator names it <namespace>-<PrometheusRule name>-<uid>.yaml).
func (g *Generated) RuleFile(prefix string) (name, content string, ok bool) {
	for _, k := range slices.Sorted(maps.Keys(g.Rules)) {
		if strings.HasPrefix(k, prefix) {
			return k, g.Rules[k], true
		}
	}
	return "", "", false
}

// Read reads the config Secret prometheus-<name> (key prometheus.yaml.gz)
// and the rule ConfigMaps prometheus-<name>-rulefiles-N that the operator
// writes (pkg/prometheus/common.go ConfigFilename, pkg/prometheus/server/rules.go).
func Read(ctx context.Context, client kubernetes.Interface, namespace, name string) (*Generated, error) {
	sec, err := client.CoreV1().Secrets(namespace).Get(ctx, "prometheus-"+name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	gz, ok := sec.Data["prometheus.yaml.gz"]
	if !ok {
		return nil, fmt.Errorf("secret %s has no prometheus.yaml.gz", sec.Name)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	g := &Generated{Raw: raw, Rules: map[string]string{}}
	if err := yaml.Unmarshal(raw, &g.Config); err != nil {
		return nil, fmt.Errorf("generated prometheus.yaml: %w", err)
	}
	cms, err := client.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, cm := range cms.Items {
		if strings.HasPrefix(cm.Name, "prometheus-"+name+"-rulefiles-") {
			for k, v := range cm.Data {
				g.Rules[k] = v
			}
		}
	}
	return g, nil
}

// Wait polls what the operator generated for the Prometheus until cond
// holds, for up to timeout.
func Wait(ctx context.Context, t testing.TB, client kubernetes.Interface, namespace, name, what string, timeout time.Duration, cond func(*Generated) bool) *Generated {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		g, err := Read(ctx, client, namespace, name)
		if err == nil && cond(g) {
			return g
		}
		last = err
		if err == nil {
			last = fmt.Errorf("jobs %v, rule files %v", g.Config.Jobs(), slices.Sorted(maps.Keys(g.Rules)))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("Prometheus %s/%s: %s: not within %s; last: %v", namespace, name, what, timeout, errors.Join(last, ctx.Err()))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
