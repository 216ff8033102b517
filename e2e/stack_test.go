package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
)

var (
	buildOnce   sync.Once
	buildDir    string
	exporterBin string
	buildErr    error
)

// lane holds the heavy end-to-end tests (the Cilium labs, and the stacks of
// their own) to one at a time, while TestEndToEnd runs beside them: most of
// its five and a half minutes is the wait for the cost rules' 5m rate
// window to fill, with its processes near idle (a 2-core CI runner spent
// those minutes doing nothing else). The Makefile's e2e target gives go
// test a -parallel above the number of tests, so that every parallel test
// starts at once and only the lane orders them; with go test's default
// (GOMAXPROCS) they still run, with less overlap.
var lane = make(chan struct{}, 1)

// inLane makes t a parallel test that runs only while it holds the lane; it
// gives the lane back after t's own cleanups (a lab's teardown) ran. It
// logs how long it waited ("lane: waited D", hack/testtime's
// LaneWaitPrefix): go test counts the wait in the test's time, make
// test's time table leaves it out.
func inLane(t *testing.T) {
	t.Helper()
	t.Parallel()
	began := time.Now()
	lane <- struct{}{}
	t.Cleanup(func() { <-lane })
	t.Logf("lane: waited %s", time.Since(began).Round(time.Millisecond))
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// exporterBinary builds the exporter once per test binary, on first use, so
// that a run whose e2e tests are skipped or filtered out builds nothing.
func exporterBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "zonewatch-e2e-"); buildErr != nil {
			return
		}
		root := testenv.RepoRoot()
		exporterBin = filepath.Join(buildDir, "zonewatch-exporter")
		// The environment's flags (the Makefile's CGO_ENABLED and
		// GOFLAGS), so the build shares the cache of `go test ./...`.
		cmd := exec.Command("go", "build", "-o", exporterBin, "./cmd/exporter")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/exporter: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return exporterBin
}

// eventually polls cond every 250ms until it holds or timeout passes; on
// timeout it reports what with cond's last detail and returns false.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return true
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: not within %s; last: %s", what, timeout, detail)
			return false
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// createObjects creates the scenario's namespaces, nodes and pods in the
// apiserver: pods without status first, then status through the status
// subresource, as the kubelet sets it.
func createObjects(ctx context.Context, t *testing.T, client kubernetes.Interface, s *sim.Scenario) {
	t.Helper()
	nss := map[string]bool{}
	for _, p := range s.AllPods() {
		nss[p.Namespace] = true
	}
	for ns := range nss {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range s.Nodes {
		if _, err := client.CoreV1().Nodes().Create(ctx, s.KubeNode(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range s.AllPods() {
		if err := createPod(ctx, client, p); err != nil {
			t.Fatal(err)
		}
	}
}

func createPod(ctx context.Context, client kubernetes.Interface, p sim.Pod) error {
	obj := sim.KubePod(p)
	status := obj.Status
	obj.Status = corev1.PodStatus{}
	created, err := client.CoreV1().Pods(p.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	created.Status = status
	if _, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// recreatePods deletes each pod at once (no kubelet here to wait for) and
// creates it again as given: what a training operator does when a pod is
// evicted and rescheduled.
func recreatePods(ctx context.Context, client kubernetes.Interface, pods []sim.Pod) error {
	zero := int64(0)
	for _, p := range pods {
		pc := client.CoreV1().Pods(p.Namespace)
		if err := pc.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			return fmt.Errorf("deleting pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		for {
			_, err := pc.Get(ctx, p.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("pod %s/%s not gone: %w", p.Namespace, p.Name, ctx.Err())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := createPod(ctx, client, p); err != nil {
			return err
		}
	}
	return nil
}

// exporter is one exporter process.
type exporter struct {
	node string
	addr string // host:port of /metrics
}

// startExporter runs the real exporter binary for one node, pointed at the
// node's fakes, the apiserver, and the dcgm-exporter page, with the chart's
// container securityContext (root holding CAP_BPF only, no_new_privs).
func startExporter(t *testing.T, bin, dir, kubeconfig, gpuPageURL string, f *nodeFakes) exporter {
	t.Helper()
	addr := exporterAddr(t, f.name) // its pod's IP (operator_test.go)
	testenv.StartAs(t, dir, "exporter-"+f.name, testenv.ChartSecurityContext(t), bin, append(probeArgs(t, addr),
		"--node-name="+f.name,
		"--kubeconfig="+kubeconfig,
		"--web.listen-address="+addr,
		"--hubble.address=unix://"+f.hubbleSock,
		"--gpu.source=dcgm-exporter",
		"--gpu.dcgm-exporter-url="+gpuPageURL+"/"+f.name+"/metrics",
		"--gpu.podresources-socket="+f.podresSock,
		// Each read may take an interval: 2s rides out a starved machine.
		"--gpu.interval=2s",
		// No ipcache map is pinned for these fakes (the ipcache source is
		// down): the lean node view (the default) would leave remote pods
		// on nodes it does not hold unplaced, and rightly raise
		// ZonewatchIPCacheSourceDown; watching every node, the pod CIDRs
		// place every address (docs/topology.md).
		"--kube.node-view=cluster",
		"--conntrack.bpffs-path="+f.bpfDir,
		"--conntrack.poll-interval=1s",
		// The fakes write Cilium 1.16+ entries; saying so keeps the source
		// up from the first poll (auto decides after a few polls).
		"--conntrack.layout=combined",
	)...)
	return exporter{node: f.name, addr: addr}
}

// scrapeExporter reads an exporter's /metrics page.
func scrapeExporter(addr string) (map[string]*dtoFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]*dtoFamily{}
	for name, f := range fams {
		df := &dtoFamily{}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
			df.series = append(df.series, dtoSeries{l, v})
		}
		out[name] = df
	}
	return out, nil
}

type dtoSeries struct {
	labels map[string]string
	value  float64
}

type dtoFamily struct{ series []dtoSeries }

// sum adds the values of the series whose labels include match.
func (f *dtoFamily) sum(match map[string]string) float64 {
	if f == nil {
		return 0
	}
	var s float64
next:
	for _, se := range f.series {
		for k, v := range match {
			if se.labels[k] != v {
				continue next
			}
		}
		s += se.value
	}
	return s
}

// waitReady waits until the exporter answers /readyz (every source up).
func waitReady(t *testing.T, e exporter, timeout time.Duration) bool {
	t.Helper()
	var last string
	return eventually(t, timeout, "exporter on "+e.node+" ready", func() (bool, string) {
		resp, err := http.Get("http://" + e.addr + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = strings.TrimSpace(string(b))
		return resp.StatusCode == http.StatusOK, last
	})
}

// waitHTTP waits until url answers 200.
func waitHTTP(t *testing.T, url string, timeout time.Duration) bool {
	t.Helper()
	return eventually(t, timeout, url, func() (bool, string) {
		resp, err := http.Get(url)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// startAlertmanager runs Alertmanager (no cluster) routing critical alerts
// to the pager webhook and everything else to the tickets webhook, with
// short group timers so notifications come within a second or two.
func startAlertmanager(t *testing.T, tools, dir, hookURL string) string {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	cfg := fmt.Sprintf(`route:
  receiver: tickets
  group_by: [alertname, namespace, job_name, node, source]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
  routes:
  - receiver: pager
    matchers: ['severity="critical"']
receivers:
- name: pager
  webhook_configs:
  - url: %[1]s/pager
    send_resolved: true
- name: tickets
  webhook_configs:
  - url: %[1]s/tickets
    send_resolved: true
`, hookURL)
	file := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, dir, "alertmanager", filepath.Join(tools, "alertmanager"),
		"--config.file="+file,
		"--storage.path="+filepath.Join(dir, "alertmanager-data"),
		"--web.listen-address="+addr,
		"--cluster.listen-address=",
		"--log.level=info",
	)
	waitHTTP(t, "http://"+addr+"/-/ready", 60*time.Second)
	return addr
}

// startPrometheus runs Prometheus scraping every exporter each second with
// the rule file, evaluated each second, sending alerts to Alertmanager.
func startPrometheus(t *testing.T, tools, dir string, rules []byte, amAddr string, exporters []exporter) *prom {
	t.Helper()
	rulesFile := filepath.Join(dir, "zonewatch.rules.yml")
	if err := os.WriteFile(rulesFile, rules, 0o644); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, e := range exporters {
		targets = append(targets, strconv.Quote(e.addr))
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
alerting:
  alertmanagers:
  - static_configs:
    - targets: [%q]
scrape_configs:
- job_name: zonewatch
  honor_labels: true
  static_configs:
  - targets: [%s]
`, rulesFile, amAddr, strings.Join(targets, ", "))
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return runPrometheus(t, tools, dir, file)
}

// runPrometheus runs Prometheus with the config file and waits until it is ready.
func runPrometheus(t *testing.T, tools, dir, file string) *prom {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	testenv.Start(t, dir, "prometheus", filepath.Join(tools, "prometheus"),
		"--config.file="+file,
		"--storage.tsdb.path="+filepath.Join(dir, "prometheus-data"),
		"--web.listen-address="+addr,
		"--log.level=info",
	)
	waitHTTP(t, "http://"+addr+"/-/ready", 90*time.Second)
	c, err := promapi.NewClient(promapi.Config{Address: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	return &prom{api: promv1.NewAPI(c), url: "http://" + addr}
}

// prom queries the Prometheus under test.
type prom struct {
	api promv1.API
	url string // its HTTP API
}

func (p *prom) query(q string, at time.Time) (model.Value, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, _, _, err := p.api.Query(ctx, q, at)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	return v, nil
}

// vector runs an instant query now and returns its vector.
func (p *prom) vector(q string) (model.Vector, error) {
	v, err := p.query(q, time.Now())
	if err != nil {
		return nil, err
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %s: got a %s, want a vector", q, v.Type())
	}
	return vec, nil
}

// value runs q and returns its single sample.
func (p *prom) value(q string) (float64, error) {
	vec, err := p.vector(q)
	if err != nil {
		return 0, err
	}
	if len(vec) != 1 {
		return 0, fmt.Errorf("query %s: %d series, want 1: %v", q, len(vec), vec)
	}
	return float64(vec[0].Value), nil
}

func (p *prom) rangeQuery(q string, start, end time.Time, step time.Duration) (model.Value, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, _, _, err := p.api.QueryRange(ctx, q, promv1.Range{Start: start, End: end, Step: step})
	if err != nil {
		return nil, fmt.Errorf("range query %s: %w", q, err)
	}
	return v, nil
}

// webhook is the receiver Alertmanager notifies; it keeps every
// notification with its arrival time.
type webhook struct {
	mu    sync.Mutex
	notes []notification
	url   string
}

type notification struct {
	At       time.Time
	Path     string    // /pager or /tickets
	Receiver string    `json:"receiver"`
	Status   string    `json:"status"`
	Alerts   []amAlert `json:"alerts"`
}

type amAlert struct {
	Status      string            `json:"status"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	StartsAt    time.Time         `json:"startsAt"`
	EndsAt      time.Time         `json:"endsAt"`
}

func newWebhook(t *testing.T) *webhook {
	h := &webhook{}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var n notification
	if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	n.At, n.Path = time.Now(), r.URL.Path
	h.mu.Lock()
	h.notes = append(h.notes, n)
	h.mu.Unlock()
}

// find returns the first alert of a notification to path ("" for any)
// for which match holds, with the notification's arrival time.
func (h *webhook) find(path string, match func(amAlert) bool) (amAlert, time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.notes {
		if path != "" && n.Path != path {
			continue
		}
		for _, a := range n.Alerts {
			if match(a) {
				return a, n.At, true
			}
		}
	}
	return amAlert{}, time.Time{}, false
}

func (h *webhook) all() []notification {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]notification(nil), h.notes...)
}

// alertIs matches an alert by name, status and labels.
func alertIs(name, status string, labels ...string) func(amAlert) bool {
	return func(a amAlert) bool {
		if a.Labels["alertname"] != name || a.Status != status {
			return false
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if a.Labels[labels[i]] != labels[i+1] {
				return false
			}
		}
		return true
	}
}
