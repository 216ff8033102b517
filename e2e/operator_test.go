package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/promoperator"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/rules"
)

// The chart is installed as the README says, as release zonewatch in
// namespace monitoring, next to kube-prometheus-stack's Prometheus.
const (
	chartRelease   = "zonewatch"
	chartNamespace = "monitoring"
	kpsRelease     = "kube-prometheus-stack"
	kpsPrometheus  = kpsRelease + "-prometheus"
)

// Each exporter process listens on a loopback address of its own and one
// shared port: its pod object in the apiserver has that address as its IP
// and the chart's DaemonSet port, so Prometheus' pod discovery finds it
// where it listens. Addresses are per test and node: tests that run at the
// same time (TestEndToEnd beside the lane) simulate nodes of the same names.
var exporterAddrs = struct {
	sync.Mutex
	port   int
	byNode map[string]string
	count  int
}{byNode: map[string]string{}}

// exporterAddr is the listen address of node's exporter in t's top-level
// test, 127.0.0.<10+n>:<port>.
func exporterAddr(t *testing.T, node string) string {
	t.Helper()
	key := strings.SplitN(t.Name(), "/", 2)[0] + "/" + node
	a := &exporterAddrs
	a.Lock()
	defer a.Unlock()
	if addr, ok := a.byNode[key]; ok {
		return addr
	}
	const maxNodes = 200
	if a.count == maxNodes {
		t.Fatalf("more than %d exporters", maxNodes)
	}
	// One port for every address: the pods of a DaemonSet share it.
	for a.port == 0 {
		a.port = testenv.FreePort(t)
		for i := range maxNodes {
			if !free("127.0.0."+strconv.Itoa(10+i), a.port) {
				a.port = 0
				break
			}
		}
	}
	ip := "127.0.0." + strconv.Itoa(10+a.count)
	a.count++
	addr := net.JoinHostPort(ip, strconv.Itoa(a.port))
	a.byNode[key] = addr
	return addr
}

func free(ip string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// chartValues are the README's install values for kube-prometheus-stack
// (podMonitor.labels.release, prometheusRule.labels.release; deploy's
// TestPrometheusOperator checks them against the README), with the e2e's
// timings: a 1s scrape, the port the exporters listen on, and cfg's `for:`
// durations as rules.for.<field, lower camel case> (values.yaml). The
// README's prices are not used: the e2e checks the costs of
// rules.DefaultConfig's. startOperatorPrometheus checks that the chart then
// renders exactly cfg's rule pack.
func chartValues(cfg rules.Config, port int) []string {
	sets := []string{
		"podMonitor.labels.release=" + kpsRelease,
		"prometheusRule.labels.release=" + kpsRelease,
		"port=" + strconv.Itoa(port),
		"scrape.interval=1s", "scrape.scrapeTimeout=1s",
	}
	v := reflect.ValueOf(cfg.For)
	for i := range v.NumField() {
		d := v.Field(i).Interface().(time.Duration)
		sets = append(sets, "rules.for."+lowerCamel(v.Type().Field(i).Name)+"="+model.Duration(d).String())
	}
	return sets
}

// lowerCamel: IdleGPUSplitJob -> idleGPUSplitJob, GPUSourceDown -> gpuSourceDown.
func lowerCamel(s string) string {
	n := 0
	for n < len(s) && unicode.IsUpper(rune(s[n])) {
		n++
	}
	if n > 1 && n < len(s) {
		n--
	}
	return strings.ToLower(s[:n]) + s[n:]
}

// startOperatorPrometheus installs the chart's PodMonitor and
// PrometheusRule in the apiserver with one pod object per exporter (the
// chart's DaemonSet pod, bound to the exporter's node, Running, its IP the
// exporter's loopback address), a Prometheus configured as
// kube-prometheus-stack configures it (its scrapeInterval and
// evaluationInterval values at 1s, Alertmanager through its
// additionalAlertManagerConfigs), and runs the real Prometheus Operator.
// Prometheus then runs with the configuration the operator generated and the
// rule files it wrote, rewritten only where they cannot work outside a
// cluster (rewriteForLoopback). The operator's rule file must be the rule
// pack of cfg (wantRules, from rules.Generate).
func startOperatorPrometheus(ctx context.Context, t *testing.T, tools, dir string, api *testenv.APIServer, cfg rules.Config, wantRules []byte, amAddr string, exporters []exporter) *prom {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(api.Config)
	client := kubernetes.NewForConfigOrDie(api.Config)
	promoperator.InstallCRDs(ctx, t, dyn)
	// The exporters' ServiceAccount (ChartIdentity) may have made it.
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chartNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	exporterAddrs.Lock()
	port := exporterAddrs.port
	exporterAddrs.Unlock()
	for _, e := range exporters {
		if _, p, _ := net.SplitHostPort(e.addr); p != strconv.Itoa(port) {
			t.Fatalf("exporter on %s listens on %s, not on the port of its pod (%d): start it with startExporter", e.node, e.addr, port)
		}
	}
	objs := helmTemplate(t, tools, chartValues(cfg, port))
	var podTemplate *corev1.PodTemplateSpec
	for _, o := range objs {
		switch o.GetKind() {
		case "PodMonitor", "PrometheusRule":
			gvr := schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: strings.ToLower(o.GetKind()) + "s"}
			if _, err := dyn.Resource(gvr).Namespace(chartNamespace).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
			podTemplate = &ds.Spec.Template
		}
	}
	if podTemplate == nil {
		t.Fatal("the chart rendered no DaemonSet")
	}
	for _, e := range exporters {
		host, _, _ := net.SplitHostPort(e.addr)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: chartRelease + "-" + e.node, Namespace: chartNamespace, Labels: podTemplate.Labels},
			Spec:       *podTemplate.Spec.DeepCopy(),
		}
		pod.Spec.NodeName = e.node
		created, err := client.CoreV1().Pods(chartNamespace).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating the exporter pod of %s: %v", e.node, err)
		}
		created.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: host, PodIPs: []corev1.PodIP{{IP: host}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		}
		if _, err := client.CoreV1().Pods(chartNamespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("setting the status of the exporter pod of %s: %v", e.node, err)
		}
	}

	// kube-prometheus-stack's prometheusSpec.additionalAlertManagerConfigs
	// (a Secret it creates, alertmanager.enabled=false): Alertmanager runs on
	// loopback, where no Endpoints object may point.
	amSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: kpsPrometheus + "-am-confg", Namespace: chartNamespace},
		StringData: map[string]string{"additional-alertmanager-configs.yaml": fmt.Sprintf("- static_configs:\n  - targets: [%q]\n", amAddr)},
	}
	if _, err := client.CoreV1().Secrets(chartNamespace).Create(ctx, amSecret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := promoperator.KubePrometheusStack(kpsRelease, chartNamespace)
	unstructured.RemoveNestedField(p.Object, "spec", "alerting")
	_ = unstructured.SetNestedField(p.Object, "1s", "spec", "scrapeInterval")
	_ = unstructured.SetNestedField(p.Object, "1s", "spec", "scrapeTimeout")
	_ = unstructured.SetNestedField(p.Object, "1s", "spec", "evaluationInterval")
	_ = unstructured.SetNestedMap(p.Object, map[string]any{"name": amSecret.Name, "key": "additional-alertmanager-configs.yaml"}, "spec", "additionalAlertManagerConfigs")
	gvr := schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheuses"}
	if _, err := dyn.Resource(gvr).Namespace(chartNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Prometheus: %v", err)
	}

	began := time.Now()
	log := promoperator.Start(t, tools, api.Kubeconfig, chartNamespace)
	job := promoperator.JobName("PodMonitor", chartNamespace, chartRelease)
	ruleFilePrefix := chartNamespace + "-" + chartRelease + "-zonewatch-"
	g := promoperator.Wait(ctx, t, client, chartNamespace, kpsPrometheus, "scrape job "+job+" and the rule file", 2*time.Minute, func(g *promoperator.Generated) bool {
		_, _, ok := g.RuleFile(ruleFilePrefix)
		return g.Config.Job(job) != nil && ok || len(promoperator.Rejections(log)) > 0
	})
	if r := promoperator.Rejections(log); len(r) > 0 {
		t.Fatalf("the operator rejected what the chart rendered:\n%s", strings.Join(r, "\n"))
	}
	t.Logf("operator %s generated the configuration in %s (jobs %v)", promoperator.Version, time.Since(began).Round(time.Millisecond), g.Config.Jobs())
	if sc := g.Config.Job(job); !sc.HonorLabels || sc.ScrapeInterval != "1s" {
		t.Errorf("%s: honor_labels %v, scrape_interval %q; want true and the chart's 1s", job, sc.HonorLabels, sc.ScrapeInterval)
	}
	name, content, _ := g.RuleFile(ruleFilePrefix)
	if err := sameGroups([]byte(content), wantRules); err != nil {
		t.Fatalf("the operator's rule file %s (the chart's PrometheusRule with the e2e values) is not the e2e's rule pack: %v", name, err)
	}

	rulesDir := filepath.Join(dir, "operator-rules")
	file := filepath.Join(dir, "prometheus-operator.yaml")
	out, err := rewriteForLoopback(g, api, kpsPrometheus, rulesDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return runPrometheus(t, tools, dir, file)
}

// rewriteForLoopback writes the operator's rule files under rulesDir and
// returns its prometheus.yaml with the three things a Prometheus pod's
// surroundings provide and this test has instead, each changed in one place:
//   - kubernetes_sd_configs: in a pod Prometheus reaches the API server
//     in-cluster (KUBERNETES_SERVICE_HOST, the service-account token and CA);
//     here it gets api_server, the apiserver's token and an unverified TLS
//     connection (the test apiserver's certificate is self-signed);
//   - rule_files: the ConfigMaps are mounted under /etc/prometheus/rules/;
//     here they are files under rulesDir;
//   - $(VAR) references (POD_NAME in external_labels, SHARD in the sharding
//     relabeling): the operator's config-reloader sidecar expands them from
//     its environment when it writes the config (--config-envsubst-file,
//     pkg/operator/config_reloader.go: SHARD=0 on shard 0, POD_NAME from the
//     pod); here they get the values of the first StatefulSet pod.
//
// Everything else (jobs, relabelings, intervals, alerting) is as generated.
func rewriteForLoopback(g *promoperator.Generated, api *testenv.APIServer, prometheus, rulesDir string) ([]byte, error) {
	env := map[string]string{"POD_NAME": "prometheus-" + prometheus + "-0", "SHARD": "0"}
	var unknown []string
	raw := envRef.ReplaceAllStringFunc(string(g.Raw), func(ref string) string {
		v, ok := env[ref[2:len(ref)-1]]
		if !ok {
			unknown = append(unknown, ref)
		}
		return v
	})
	if len(unknown) > 0 {
		return nil, fmt.Errorf("the generated config refers to %v, which the config-reloader's environment does not set here", unknown)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil {
		return nil, err
	}
	const mount = "/etc/prometheus/rules/"
	files, _ := cfg["rule_files"].([]any)
	for i, f := range files {
		s, _ := f.(string)
		rel, ok := strings.CutPrefix(s, mount)
		if !ok {
			return nil, fmt.Errorf("rule file %q is not under %s", s, mount)
		}
		files[i] = filepath.Join(rulesDir, rel)
		dir := filepath.Join(rulesDir, filepath.Dir(rel))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		// Every rule file the operator wrote for this Prometheus lives in
		// its rulefiles-N ConfigMaps; the glob picks the file names.
		for name, content := range g.Rules {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				return nil, err
			}
		}
	}
	scrapes, _ := cfg["scrape_configs"].([]any)
	for _, sc := range scrapes {
		sc, _ := sc.(map[string]any)
		sds, _ := sc["kubernetes_sd_configs"].([]any)
		for _, sd := range sds {
			sd, _ := sd.(map[string]any)
			if _, ok := sd["api_server"]; ok {
				return nil, fmt.Errorf("job %v: kubernetes_sd_configs already names an API server", sc["job_name"])
			}
			sd["api_server"] = api.URL
			sd["authorization"] = map[string]any{"credentials": api.Config.BearerToken}
			sd["tls_config"] = map[string]any{"insecure_skip_verify": true}
		}
	}
	return yaml.Marshal(cfg)
}

// envRef is a $(VAR) reference as the config-reloader expands it.
var envRef = regexp.MustCompile(`\$\(([a-zA-Z_0-9]+)\)`)

// sameGroups compares two rule files' groups as data.
func sameGroups(got, want []byte) error {
	var a, b struct {
		Groups []map[string]any `json:"groups"`
	}
	if err := yaml.Unmarshal(got, &a); err != nil {
		return err
	}
	if err := yaml.Unmarshal(want, &b); err != nil {
		return err
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		for i := 0; i < len(ja) && i < len(jb); i++ {
			if ja[i] != jb[i] {
				lo := max(0, i-200)
				return fmt.Errorf("differ at byte %d:\n got ...%s\nwant ...%s", i, ja[lo:min(len(ja), i+200)], jb[lo:min(len(jb), i+200)])
			}
		}
		return fmt.Errorf("differ in length: %d and %d bytes", len(ja), len(jb))
	}
	return nil
}

// helmTemplate renders the chart (deploy/helm/zonewatch) with the --set values.
func helmTemplate(t *testing.T, tools string, sets []string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", chartRelease, filepath.Join("..", "deploy", "helm", "zonewatch"), "--namespace", chartNamespace}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(filepath.Join(tools, "helm"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decoding helm output: %v", err)
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}
