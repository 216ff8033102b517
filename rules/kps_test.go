package rules

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// kpsNode is one simulated exporter target: its node, its sources that are
// down and the job pods it hosts.
type kpsNode struct {
	name, zone string
	down       []string // sources with zonewatch_source_up 0
	lostEvents bool     // Hubble loses 1 event per 10 flows
}

// kpsJob is one training job: a coordinator and a worker in other zones,
// two GPUs on the worker's node, and what its traffic and GPUs do.
type kpsJob struct {
	namespace, name     string
	coordinator, worker string // node names
	extraWorker         string // a second worker's node, or ""
	util, sm            float64
	ownDrops, peerDrops bool // cross-zone policy drops between its pods / with a peer outside it
	flows               bool // cross-zone flows between its pods
	bytesPerSecond      float64
}

// The scenario: every zonewatch alert's condition holds, the job alerts in
// three namespaces: "blocked" (a critical and warnings), "solo" (info alerts
// alone), "mixed" (a warning beside an info alert); the source alerts of
// the exporters in "monitoring".
var (
	kpsNodes = []kpsNode{
		{name: "n1", zone: "zone-a", down: []string{"gpu"}},
		{name: "n2", zone: "zone-a", down: []string{"gpu"}},
		{name: "n3", zone: "zone-a", down: []string{"gpu"}},
		{name: "n4", zone: "zone-b", down: []string{"gpu"}},
		{name: "n5", zone: "zone-b", down: []string{"gpu", "hubble", "ipcache"}},
		{name: "n6", zone: "zone-b", down: []string{"kubernetes", "podresources", "conntrack"}, lostEvents: true},
	}
	kpsJobs = []kpsJob{
		{namespace: "blocked", name: "stuck", coordinator: "n4", worker: "n1", util: 0.01, ownDrops: true},
		{namespace: "blocked", name: "spinning", coordinator: "n4", worker: "n2", util: 0.9, ownDrops: true},
		{namespace: "blocked", name: "slow", coordinator: "n4", worker: "n3", util: 0.9, sm: 0.1, flows: true},
		{namespace: "solo", name: "peer", coordinator: "n5", worker: "n1", util: 0.9, flows: true, peerDrops: true},
		{namespace: "solo", name: "placed", coordinator: "n5", worker: "n2", util: 0.9, flows: true},
		{namespace: "solo", name: "rdma", coordinator: "n4", worker: "n3", util: 0.9},
		{namespace: "mixed", name: "costly", coordinator: "n4", worker: "n3", extraWorker: "n6", util: 0.9, flows: true, bytesPerSecond: 1e9},
	}
)

// exposition is what the exporter on node serves t seconds after the start.
func kpsExposition(node kpsNode, t float64) string {
	var b strings.Builder
	line := func(name, labels string, v float64) {
		fmt.Fprintf(&b, "%s{%s} %s\n", name, labels, strconv.FormatFloat(v, 'g', -1, 64))
	}
	for _, s := range []string{"kubernetes", "hubble", "gpu", "podresources", "conntrack", "ipcache"} {
		up := 1.0
		if slices.Contains(node.down, s) {
			up = 0
		}
		line("zonewatch_source_up", `source="`+s+`"`, up)
	}
	line("zonewatch_hubble_flows_processed_total", "", 100*t)
	if slices.Contains(node.down, "ipcache") {
		line("zonewatch_hubble_flows_unresolved_total", `side="destination"`, t)
	}
	if node.lostEvents {
		line("zonewatch_hubble_lost_events_total", `buffer="perf_event_ring_buffer"`, 10*t)
	}
	zoneOf := map[string]string{}
	for _, n := range kpsNodes {
		zoneOf[n.name] = n.zone
	}
	for _, j := range kpsJobs {
		job := fmt.Sprintf(`namespace=%q,job_name=%q`, j.namespace, j.name)
		src, dst := zoneOf[j.worker], zoneOf[j.coordinator]
		pair := fmt.Sprintf(`src_zone=%q,dst_zone=%q,locality="cross_zone"`, src, dst)
		pod := func(role, n string) {
			line("zonewatch_job_pod_info", fmt.Sprintf(`%s,job_kind="PyTorchJob",pod=%q,role=%q,node=%q,zone=%q`, job, j.name+"-"+role+"-"+n, role, n, zoneOf[n]), 1)
		}
		if node.name == j.coordinator {
			pod("coordinator", node.name)
			line("zonewatch_job_zones", job, 2)
			line("zonewatch_job_split_zone", job, 1)
			if j.ownDrops {
				line("zonewatch_job_policy_drops_total", job+`,direction="ingress",`+pair+`,peer="job",reason="POLICY_DENIED",policy="fence/deny-cross-zone",policy_source="cilium"`, t)
			}
		}
		for _, w := range []string{j.worker, j.extraWorker} {
			if node.name != w {
				continue
			}
			pod("worker", w)
			for g := range 2 {
				gpu := fmt.Sprintf(`node=%q,zone=%q,gpu="%d",uuid="GPU-%s-%s-%d",%s,pod=%q`, w, zoneOf[w], g, j.name, w, g, job, j.name+"-worker-"+w)
				line("zonewatch_gpu_utilization_ratio", gpu, j.util)
				if j.sm > 0 {
					line("zonewatch_gpu_sm_active_ratio", gpu, j.sm)
				}
			}
			if j.flows {
				line("zonewatch_job_flow_events_total", job+","+pair+`,peer="job",verdict="forwarded"`, 5*t)
			}
			if j.peerDrops {
				line("zonewatch_job_peer_policy_drops_total", job+`,peer="cluster",peer_namespace="storage",peer_workload="minio",locality="cross_zone",policy="fence/deny-cross-zone",policy_source="cilium"`, t)
			}
			if j.bytesPerSecond > 0 {
				line("zonewatch_job_network_bytes_total", job+","+pair, j.bytesPerSecond*t)
			}
		}
	}
	return b.String()
}

// kpsHook is the receiver's webhook: the last notification of each group.
type kpsHook struct {
	mu   sync.Mutex
	last map[string][]kpsAlert // groupKey -> firing alerts
	n    int
}

type kpsAlert struct {
	Status string            `json:"status"`
	Labels map[string]string `json:"labels"`
}

func (h *kpsHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var n struct {
		GroupKey string     `json:"groupKey"`
		Alerts   []kpsAlert `json:"alerts"`
	}
	if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last[n.GroupKey] = n.Alerts
	h.n++
}

// reached lists "alertname namespace" of the firing alerts in each group's
// last notification.
func (h *kpsHook) reached() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, alerts := range h.last {
		for _, a := range alerts {
			if a.Status == "firing" {
				out = append(out, a.Labels["alertname"]+" "+a.Labels["namespace"])
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %s", what, timeout, state)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestKubePrometheusStackAlertmanager fires every zonewatch alert from a
// real Prometheus (the rule pack with for: 1s, and kube-prometheus-stack's
// InfoInhibitor rule) into a real Alertmanager with kube-prometheus-stack's
// default configuration (rules/tests/kps/), and checks which alerts reach
// the receiver against docs/rules.md#kube-prometheus-stack: warnings and
// the critical always; info alerts only beside a firing warning or critical
// alert with the same namespace label (none for ZonewatchByteSourceUnavailable,
// which aggregates by instance).
func TestKubePrometheusStackAlertmanager(t *testing.T) {
	prometheus := tool(t, "prometheus")
	alertmanager := tool(t, "alertmanager")
	root := repoRoot(t)
	dir := t.TempDir()

	hook := &kpsHook{last: map[string][]kpsAlert{}}
	hookSrv := httptest.NewServer(hook)
	t.Cleanup(hookSrv.Close)

	// Alertmanager: the fixture, with the receiver every site sets.
	raw, err := os.ReadFile(filepath.Join(root, "rules", "tests", "kps", "alertmanager.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var am map[string]any
	if err := yaml.Unmarshal(raw, &am); err != nil {
		t.Fatal(err)
	}
	route := am["route"].(map[string]any)
	route["receiver"] = "site"
	route["group_wait"], route["group_interval"] = "1s", "1s"
	am["receivers"] = append(am["receivers"].([]any), map[string]any{
		"name":            "site",
		"webhook_configs": []any{map[string]any{"url": hookSrv.URL, "send_resolved": false}},
	})
	amFile := filepath.Join(dir, "alertmanager.yml")
	writeYAML(t, amFile, am)
	amAddr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	testenv.Start(t, dir, "alertmanager", alertmanager, "--config.file="+amFile,
		"--storage.path="+filepath.Join(dir, "am-data"), "--web.listen-address="+amAddr, "--cluster.listen-address=")

	// The exporters, and one that cannot be scraped (ZonewatchExporterDown).
	start := time.Now()
	type target struct{ addr, node string }
	var targets []target
	for _, n := range kpsNodes {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, kpsExposition(n, time.Since(start).Seconds()))
		}))
		t.Cleanup(srv.Close)
		targets = append(targets, target{strings.TrimPrefix(srv.URL, "http://"), n.name})
	}
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	targets = append(targets, target{dead.Addr().String(), "n7"})
	dead.Close()

	// The rule pack with short for:, ExporterAbsent alone on a selector
	// nothing matches, and kube-prometheus-stack's general rules.
	cfg := DefaultConfig()
	s := time.Second
	cfg.For = ForDurations{IdleGPUSplitJob: s, BlockedSplitJob: s, PeerPolicyDrops: s, CrossZoneSlowdown: s,
		CrossZoneCost: s, SplitZonePlacement: s, SplitJobTrafficUnseen: s, ExporterDown: s, ExporterAbsent: s,
		HubbleDisconnected: s, HubbleLostEvents: s, GPUSourceDown: s, ByteSourceUnavailable: s,
		KubernetesSourceDown: s, IPCacheSourceDown: s, SourceDownOnManyNodes: s}
	pack, err := Generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	absentCfg := DefaultConfig()
	absentCfg.Selector = `job="zonewatch-absent"`
	absentCfg.Disabled = map[string]bool{}
	for _, a := range AlertNames() {
		absentCfg.Disabled[a] = a != AlertExporterAbsent
	}
	absentCfg.For.ExporterAbsent = time.Second
	absent, err := configuredGroups(absentCfg)
	if err != nil {
		t.Fatal(err)
	}
	absent = slices.DeleteFunc(absent, func(g group) bool { return g.Name != "zonewatch.health" })
	absent[0].Name = "zonewatch.health.absent"
	files := []string{filepath.Join(dir, "zonewatch.rules.yml"), filepath.Join(dir, "absent.rules.yml"),
		filepath.Join(root, "rules", "tests", "kps", "general.rules.yml")}
	if err := os.WriteFile(files[0], pack, 0o644); err != nil {
		t.Fatal(err)
	}
	writeYAML(t, files[1], ruleFile{Groups: absent})

	var static []any
	for i, tg := range targets {
		static = append(static, map[string]any{
			"targets": []string{tg.addr},
			"labels":  map[string]string{"namespace": "monitoring", "pod": fmt.Sprintf("zonewatch-%d", i), "node": tg.node},
		})
	}
	promFile := filepath.Join(dir, "prometheus.yml")
	writeYAML(t, promFile, map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files": files,
		"alerting":   map[string]any{"alertmanagers": []any{map[string]any{"static_configs": []any{map[string]any{"targets": []string{amAddr}}}}}},
		// As the chart's PodMonitor: the exporter's labels win, the
		// target's namespace, pod and node (relabeled) fill the rest.
		"scrape_configs": []any{map[string]any{"job_name": "zonewatch", "honor_labels": true, "static_configs": static}},
	})
	promAddr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	testenv.Start(t, dir, "prometheus", prometheus, "--config.file="+promFile,
		"--storage.tsdb.path="+filepath.Join(dir, "prom-data"), "--web.listen-address="+promAddr)

	// Every zonewatch alert fires in Prometheus, and Alertmanager has them.
	waitFor(t, "every zonewatch alert firing in Prometheus", 3*time.Minute, func() (bool, string) {
		var r struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		if err := getJSON("http://"+promAddr+"/api/v1/alerts", &r); err != nil {
			return false, err.Error()
		}
		firing := map[string]bool{}
		for _, a := range r.Data.Alerts {
			if a.State == "firing" {
				firing[a.Labels["alertname"]] = true
			}
		}
		var missing []string
		for _, a := range append(AlertNames(), "InfoInhibitor") {
			if !firing[a] {
				missing = append(missing, a)
			}
		}
		return len(missing) == 0, fmt.Sprintf("not firing: %v", missing)
	})
	type amStatus struct {
		Labels map[string]string `json:"labels"`
		Status struct {
			State       string   `json:"state"`
			InhibitedBy []string `json:"inhibitedBy"`
		} `json:"status"`
	}
	var inAM []amStatus
	want := map[string]bool{ // "alertname namespace" -> reaches the receiver
		"ZonewatchIdleGPUSplitJob blocked":         true,
		"ZonewatchBlockedSplitJob blocked":         true,
		"ZonewatchCrossZoneSlowdown blocked":       true,
		"ZonewatchPeerPolicyDrops solo":            false,
		"ZonewatchSplitZonePlacement solo":         false,
		"ZonewatchSplitJobTrafficUnseen solo":      false,
		"ZonewatchCrossZoneCost mixed":             true,
		"ZonewatchSplitZonePlacement mixed":        true,
		"ZonewatchExporterDown monitoring":         true,
		"ZonewatchExporterAbsent ":                 true,
		"ZonewatchHubbleDisconnected monitoring":   true,
		"ZonewatchHubbleLostEvents ":               true,
		"ZonewatchGPUSourceDown monitoring":        true,
		"ZonewatchByteSourceUnavailable ":          true,
		"ZonewatchKubernetesSourceDown monitoring": true,
		"ZonewatchIPCacheSourceDown ":              true,
		"ZonewatchSourceDownOnManyNodes ":          true,
	}
	waitFor(t, "every expected alert in Alertmanager, the info alerts of solo inhibited", 2*time.Minute, func() (bool, string) {
		inAM = nil
		if err := getJSON("http://"+amAddr+"/api/v2/alerts", &inAM); err != nil {
			return false, err.Error()
		}
		seen := map[string]string{}
		for _, a := range inAM {
			seen[a.Labels["alertname"]+" "+a.Labels["namespace"]] = a.Status.State
		}
		for k, reaches := range want {
			if st, ok := seen[k]; !ok || (reaches != (st == "active")) {
				return false, fmt.Sprintf("%s: state %q in Alertmanager", k, st)
			}
		}
		return true, ""
	})
	// The receiver: the last notification of each group holds what reached it.
	var wantReached []string
	for k, reaches := range want {
		if reaches {
			wantReached = append(wantReached, k)
		}
	}
	sort.Strings(wantReached)
	var others []string
	waitFor(t, "the receiver's last notifications", time.Minute, func() (bool, string) {
		got, zw := hook.reached(), []string(nil)
		others = nil
		for _, k := range got {
			if strings.HasPrefix(k, "Zonewatch") {
				zw = append(zw, k)
			} else {
				others = append(others, k)
			}
		}
		return slices.Equal(zw, wantReached), fmt.Sprintf("reached %q, want %q", zw, wantReached)
	})
	// kube-prometheus-stack's own InfoInhibitor reaches the site's
	// receiver too unless the site routes it to null (its description
	// says so); Watchdog goes to null by the default route.
	t.Logf("other alerts at the receiver: %v", others)
	for _, a := range inAM {
		k := a.Labels["alertname"] + " " + a.Labels["namespace"]
		if reaches, ok := want[k]; ok && !reaches {
			if len(a.Status.InhibitedBy) == 0 {
				t.Errorf("%s does not reach the receiver but is not inhibited: %+v", k, a.Status)
			}
			t.Logf("%-45s severity=%-8s inhibited (by InfoInhibitor)", k, a.Labels["severity"])
		}
	}
	for _, k := range wantReached {
		t.Logf("%-45s reached the receiver", k)
	}
	t.Logf("kps-alertmanager: alerts=%d reached=%d inhibited=%d (notifications %d)", len(want), len(wantReached), len(want)-len(wantReached), hook.n)
}

func writeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
