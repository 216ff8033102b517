package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/rules"
	"github.com/zonewatch/zonewatch/sim"
)

// The jobs of sim.Default() and what each shows.
const (
	blockedNS, blockedJob = "ml-team", "llm-blocked" // hard block: pages
	denyingPolicy         = "ml-team/zone-isolation"
	healthyNS, healthyJob = "ml-team", "resnet-healthy" // never alerts
	slowNS, slowJob       = "research", "bert-slow"     // cross-zone latency: warns
	costlyNS, costlyJob   = "research", "mpi-costly"    // cross-AZ cost: over budget
)

// Nodes the failure scenario breaks: the blocked job's coordinator node
// (where its drops are seen) loses Hubble, a node with costly-job workers
// loses its GPU source.
const (
	hubbleFailNode = "gpu-b1"
	gpuFailNode    = "gpu-c2"
)

// testRulesConfig is the committed rule pack's configuration with short
// `for:` durations, so alerts fire within seconds. The rate windows are
// fixed at 5m in the rules (not a Config field).
func testRulesConfig() rules.Config {
	cfg := rules.DefaultConfig()
	cfg.For = rules.ForDurations{
		IdleGPUSplitJob:   5 * time.Second,
		CrossZoneSlowdown: 5 * time.Second,
		CrossZoneCost:     5 * time.Second,
		// Longer than a split job's drops or cross-zone flows take to show
		// up, so a job about to page or warn does not first open a ticket.
		SplitZonePlacement: 20 * time.Second,
		// Longer than the GPU series take to show a blocked job idle, so
		// the page's job does not first open the blocked ticket.
		BlockedSplitJob: 20 * time.Second,
		PeerPolicyDrops: 10 * time.Second,
		ExporterDown:    10 * time.Second,
		ExporterAbsent:  10 * time.Second,
		// The health alerts wait out a starved test machine: its fakes can
		// stall for seconds when every core is busy.
		HubbleDisconnected:    10 * time.Second,
		HubbleLostEvents:      10 * time.Second,
		GPUSourceDown:         10 * time.Second,
		ByteSourceUnavailable: 10 * time.Second,
		// Longer than a job's first flows take to show in a 5m rate: no
		// job of the scenarios may raise it.
		SplitJobTrafficUnseen: time.Minute,
		// Longer than the informers take to sync at start.
		KubernetesSourceDown: time.Minute,
		// The exporters here read no ipcache map (none is pinned where
		// they look), but they watch every node (startExporter) and the
		// pod CIDRs place every address: no flow goes unplaced, so no
		// scenario may raise it.
		IPCacheSourceDown:     10 * time.Second,
		SourceDownOnManyNodes: 10 * time.Second,
	}
	return cfg
}

// testRuleFile generates the rule file for cfg and checks that it differs
// from the committed configuration's only in `for:` lines.
func testRuleFile(t *testing.T, cfg rules.Config) []byte {
	t.Helper()
	got, committed := mustGenerate(t, cfg), mustGenerate(t, rules.DefaultConfig())
	a, b := strings.Split(string(committed), "\n"), strings.Split(string(got), "\n")
	if len(a) != len(b) {
		t.Fatalf("test rule file has %d lines, the committed one %d", len(b), len(a))
	}
	for i := range a {
		if a[i] != b[i] && !(strings.HasPrefix(strings.TrimSpace(a[i]), "for: ") && strings.HasPrefix(strings.TrimSpace(b[i]), "for: ")) {
			t.Fatalf("test rule file differs from the committed one beyond for: at line %d: %q vs %q", i+1, b[i], a[i])
		}
	}
	return got
}

// TestEndToEnd runs the three symptoms, failing sources and the fix on the
// real exporter, one process per simulated GPU node, against a real
// kube-apiserver, Prometheus and Alertmanager. The steps share one cluster
// and run in order.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts etcd, kube-apiserver, Prometheus, Alertmanager and six exporters")
	}
	t.Parallel() // beside the lane (stack_test.go)
	tools := testenv.ToolsBin(t, "etcd", "kube-apiserver", "prometheus", "alertmanager", "helm", "prometheus-operator")
	began := time.Now()
	bin := exporterBinary(t)
	t.Logf("exporter built in %s", time.Since(began).Round(time.Millisecond))

	dir := t.TempDir()
	bpffs := bpffsIn(t, dir)

	api := testenv.StartAPIServer(t)
	client := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	w := newWorld(t, filepath.Join(dir, "nodes"), bpffs)
	createObjects(ctx, t, client, w.s)
	gpuPages := httptest.NewServer(http.HandlerFunc(w.serveGPUPage))
	t.Cleanup(gpuPages.Close)

	cfg := testRulesConfig()
	ruleFile := testRuleFile(t, cfg)
	hook := newWebhook(t)
	amAddr := startAlertmanager(t, tools, dir, hook.url)
	// The exporters log in as the chart's ServiceAccount, bound to the
	// chart's ClusterRole (deploy/manifests), under RBAC.
	exporterKubeconfig := api.ChartIdentity(t, nil).Kubeconfig
	var exporters []exporter
	for _, f := range w.nodes {
		exporters = append(exporters, startExporter(t, bin, dir, exporterKubeconfig, gpuPages.URL, f))
	}
	for _, e := range exporters {
		if !waitReady(t, e, 2*time.Minute) {
			t.FailNow()
		}
	}
	// The chart's PodMonitor and PrometheusRule through the real Prometheus Operator.
	p := startOperatorPrometheus(ctx, t, tools, dir, api, cfg, ruleFile, amAddr, exporters)
	byNode := map[string]exporter{}
	for _, e := range exporters {
		byNode[e.node] = e
	}

	// Traffic starts once every exporter follows its Hubble.
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { stopTraffic(); <-done })
	w.watchFirstDrop(trafficCtx, t, w.job(blockedNS, blockedJob).Coordinator().Node)
	go func() { defer close(done); w.run(trafficCtx, t, 250*time.Millisecond) }()
	trafficStart := time.Now()
	t.Logf("stack up in %s: etcd, kube-apiserver, %d exporters, Prometheus, Alertmanager", trafficStart.Sub(began).Round(time.Millisecond), len(exporters))

	if !eventually(t, time.Minute, "Prometheus scrapes every exporter", func() (bool, string) {
		v, err := p.value(`sum(up{job="zonewatch"})`)
		return err == nil && int(v) == len(exporters), fmt.Sprint(v, err)
	}) {
		t.FailNow()
	}

	t.Run("hard block pages", func(t *testing.T) {
		var page amAlert
		var at time.Time
		if !eventually(t, 2*time.Minute, "ZonewatchIdleGPUSplitJob at the pager", func() (bool, string) {
			var ok bool
			page, at, ok = hook.find("/pager", alertIs(rules.AlertIdleGPUSplitJob, "firing", "namespace", blockedNS, "job_name", blockedJob))
			return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
		}) {
			return
		}
		if first := w.firstDrop.Load(); first != nil {
			t.Logf("time to page: %.1fs from the first dropped flow to the page at the webhook (for: %s)", at.Sub(*first).Seconds(), cfg.For.IdleGPUSplitJob)
		} else {
			t.Error("no dropped flow was seen on the coordinator's Hubble")
		}
		if page.Labels["severity"] != "critical" {
			t.Errorf("page severity = %q, want critical", page.Labels["severity"])
		}
		desc := page.Annotations["description"]
		for _, want := range []string{blockedNS + "/" + blockedJob, "us-east-1a", "us-east-1b", "policy " + denyingPolicy} {
			if !strings.Contains(desc, want) {
				t.Errorf("page description does not name %q: %s", want, desc)
			}
		}
		if !strings.Contains(page.Annotations["runbook_url"], "#"+strings.ToLower(rules.AlertIdleGPUSplitJob)) {
			t.Errorf("page runbook_url = %q", page.Annotations["runbook_url"])
		}
		t.Logf("page: %s | %s", page.Annotations["summary"], desc)

		vec, err := p.vector(fmt.Sprintf(`%s{namespace=%q, job_name=%q}`, rules.RecCrossZonePolicyDrops, blockedNS, blockedJob))
		if err != nil || len(vec) != 1 || string(vec[0].Metric["policy"]) != denyingPolicy ||
			vec[0].Metric["src_zone"] != "us-east-1a" || vec[0].Metric["dst_zone"] != "us-east-1b" {
			t.Errorf("cross-zone drops of %s: %v %v, want one series us-east-1a -> us-east-1b by %s", blockedJob, vec, err, denyingPolicy)
		}
		vec, err = p.vector(fmt.Sprintf(`ALERTS{alertname=%q}`, rules.AlertIdleGPUSplitJob))
		for _, s := range vec {
			if s.Metric["job_name"] != blockedJob {
				t.Errorf("%s also for %s/%s", rules.AlertIdleGPUSplitJob, s.Metric["namespace"], s.Metric["job_name"])
			}
		}
		if err != nil {
			t.Error(err)
		}
		assertQuiet(t, p, hook, healthyNS, healthyJob)
	})

	t.Run("cross-zone latency warns", func(t *testing.T) {
		var warn amAlert
		if !eventually(t, 2*time.Minute, "ZonewatchCrossZoneSlowdown", func() (bool, string) {
			var ok bool
			warn, _, ok = hook.find("/tickets", alertIs(rules.AlertCrossZoneSlowdown, "firing", "namespace", slowNS, "job_name", slowJob))
			return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
		}) {
			return
		}
		if warn.Labels["severity"] != "warning" {
			t.Errorf("slowdown severity = %q, want warning", warn.Labels["severity"])
		}
		t.Logf("warning: %s", warn.Annotations["description"])
		if _, _, paged := hook.find("/pager", func(a amAlert) bool { return a.Labels["job_name"] == slowJob }); paged {
			t.Errorf("%s paged", slowJob)
		}
		// GPU_UTIL reads high while SM activity tells the truth.
		sel := fmt.Sprintf(`{namespace=%q, job_name=%q}`, slowNS, slowJob)
		util, err1 := p.value(rules.RecGPUUtilization + sel)
		sm, err2 := p.value(rules.RecGPUSMActive + sel)
		if err1 != nil || err2 != nil || util < 0.9 || sm > 0.2 {
			t.Errorf("%s: GPU utilization %.2f (%v), SM activity %.2f (%v); want > 0.9 and < 0.2", slowJob, util, err1, sm, err2)
		}
		if v, err := p.vector(fmt.Sprintf(`%s{namespace=%q, job_name=%q}`, rules.RecCrossZonePolicyDrops, slowNS, slowJob)); err != nil || len(v) > 0 {
			t.Errorf("%s has cross-zone drops: %v %v", slowJob, v, err)
		}
	})

	t.Run("zone round trip", func(t *testing.T) { zoneRTT(t, p) })

	t.Run("cross-AZ cost alert", func(t *testing.T) {
		var ticket amAlert
		if !eventually(t, 2*time.Minute, "ZonewatchCrossZoneCost", func() (bool, string) {
			var ok bool
			ticket, _, ok = hook.find("/tickets", alertIs(rules.AlertCrossZoneCost, "firing", "namespace", costlyNS, "job_name", costlyJob))
			return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
		}) {
			return
		}
		// warning, so kube-prometheus-stack's InfoInhibitor does not hold
		// it back (docs/rules.md#kube-prometheus-stack).
		if ticket.Labels["severity"] != "warning" {
			t.Errorf("cost alert severity = %q, want warning", ticket.Labels["severity"])
		}
		t.Logf("ticket: %s", ticket.Annotations["description"])
	})

	t.Run("sources failing", func(t *testing.T) {
		sourcesFailing(t, w, p, hook, byNode)
	})

	t.Run("idle GPU cost accrues", func(t *testing.T) { idleGPUCost(t, w, p, cfg) })

	// Every symptom is live here: the instant dashboard queries run at
	// this moment.
	snapshot := time.Now()

	t.Run("fix applied", func(t *testing.T) {
		fixAt := time.Now()
		before, after := w.moveWorkersToCoordinatorZone(blockedNS, blockedJob)
		if len(after) == 0 {
			t.Fatal("no worker to move")
		}
		if err := recreatePods(ctx, client, after); err != nil {
			t.Fatal(err)
		}
		for i := range before {
			t.Logf("%s: %s (%s) -> %s (%s)", after[i].Name, before[i].Node, before[i].IP, after[i].Node, after[i].IP)
		}
		var at time.Time
		if !eventually(t, 2*time.Minute, "resolved ZonewatchIdleGPUSplitJob at the pager", func() (bool, string) {
			var ok bool
			_, at, ok = hook.find("/pager", alertIs(rules.AlertIdleGPUSplitJob, "resolved", "namespace", blockedNS, "job_name", blockedJob))
			return ok, ""
		}) {
			return
		}
		t.Logf("time to resolve: %.1fs from the fix to the resolved notification at the webhook", at.Sub(fixAt).Seconds())
		eventually(t, 30*time.Second, blockedJob+" in one zone", func() (bool, string) {
			v, err := p.value(fmt.Sprintf(`%s{namespace=%q, job_name=%q}`, rules.RecJobZones, blockedNS, blockedJob))
			return err == nil && v == 1, fmt.Sprint(v, err)
		})

		// Rendezvous completes once the job sits in one zone: it trains.
		w.setBehaviour(blockedNS, blockedJob, w.job(healthyNS, healthyJob).Behaviour)
		eventually(t, time.Minute, blockedJob+" GPUs busy after the fix", func() (bool, string) {
			v, err := p.value(fmt.Sprintf(`%s{namespace=%q, job_name=%q}`, rules.RecGPUUtilization, blockedNS, blockedJob))
			return err == nil && v > 0.5, fmt.Sprint(v, err)
		})
	})

	t.Run("cost recording rules", func(t *testing.T) {
		costRecordingRules(t, w, p, cfg, trafficStart)
		t.Run("cost report", func(t *testing.T) { costReport(t, w, p, cfg) })
	})

	t.Run("only the expected alerts", func(t *testing.T) {
		onlyExpectedAlerts(t, hook)
		assertQuiet(t, p, hook, healthyNS, healthyJob)
	})

	t.Run("dashboards", func(t *testing.T) {
		checkDashboards(t, p, snapshot, trafficStart, time.Now())
		t.Run("health panels", func(t *testing.T) { checkHealthPanels(t, p, snapshot) })
	})
	t.Logf("e2e wall time %s (traffic ran %s)", time.Since(began).Round(time.Second), time.Since(trafficStart).Round(time.Second))
}

// assertQuiet checks that a job raised no alert at all.
func assertQuiet(t *testing.T, p *prom, hook *webhook, namespace, job string) {
	t.Helper()
	if a, _, ok := hook.find("", func(a amAlert) bool { return a.Labels["namespace"] == namespace && a.Labels["job_name"] == job }); ok {
		t.Errorf("%s/%s raised %s (%s)", namespace, job, a.Labels["alertname"], a.Status)
	}
	if v, err := p.vector(fmt.Sprintf(`ALERTS{namespace=%q, job_name=%q}`, namespace, job)); err != nil || len(v) > 0 {
		t.Errorf("alerts for %s/%s: %v %v", namespace, job, v, err)
	}
}

// onlyExpectedAlerts checks every notification against what the scenarios
// should raise, and that only the blocked job paged.
func onlyExpectedAlerts(t *testing.T, hook *webhook) {
	t.Helper()
	type key struct{ alert, a, b string }
	expected := map[key]bool{
		{rules.AlertIdleGPUSplitJob, blockedNS, blockedJob}:   true,
		{rules.AlertCrossZoneSlowdown, slowNS, slowJob}:       true,
		{rules.AlertCrossZoneCost, costlyNS, costlyJob}:       true,
		{rules.AlertSplitZonePlacement, costlyNS, costlyJob}:  true,
		{rules.AlertPeerPolicyDrops, costlyNS, costlyJob}:     true,
		{rules.AlertBlockedSplitJob, spinningNS, spinningJob}: true,
		{rules.AlertHubbleDisconnected, hubbleFailNode, ""}:   true,
		{rules.AlertGPUSourceDown, gpuFailNode, ""}:           true,
	}
	seen := map[string]int{}
	for _, n := range hook.all() {
		for _, a := range n.Alerts {
			l := a.Labels
			k := key{l["alertname"], l["namespace"], l["job_name"]}
			if l["node"] != "" {
				k = key{l["alertname"], l["node"], ""}
			}
			if !expected[k] {
				t.Errorf("unexpected notification to %s: %s %v", n.Path, a.Status, l)
			}
			if n.Path == "/pager" && k.alert != rules.AlertIdleGPUSplitJob {
				t.Errorf("paged for %v", l)
			}
			seen[fmt.Sprintf("%s %s %s", n.Path, a.Status, l["alertname"])]++
		}
	}
	t.Logf("notifications: %v", seen)
}

// sourcesFailing kills the Hubble server of one node and the GPU source of
// another mid-run: the health alerts fire and resolve, and the drop
// counters continue from their values (no reset) without counting the
// flows replayed after the reconnect twice.
func sourcesFailing(t *testing.T, w *world, p *prom, hook *webhook, byNode map[string]exporter) {
	hub := w.node(hubbleFailNode)
	e := byNode[hubbleFailNode]
	drops := func() (float64, float64, error) {
		fams, err := scrapeExporter(e.addr)
		if err != nil {
			return 0, 0, err
		}
		return fams["zonewatch_job_policy_drops_total"].sum(map[string]string{"namespace": blockedNS, "job_name": blockedJob}),
			fams["zonewatch_hubble_reconnects_total"].sum(nil), nil
	}
	// settled pauses traffic and waits until the exporter has counted
	// every denied packet published on the node so far. Only the blocked
	// job's coordinator runs there: each denied packet is a policy-verdict
	// and a drop event, which count once. Traffic started after the
	// exporter followed Hubble, so nothing was published before it looked.
	settled := func(what string) (counted float64, published uint64, resume func()) {
		resume = w.pause()
		published = hub.hubble.Seen() / 2
		eventually(t, time.Minute, what+": every denied packet counted once", func() (bool, string) {
			v, _, err := drops()
			if err != nil {
				return false, err.Error()
			}
			counted = v
			return v == float64(published), fmt.Sprintf("%v counted, %d published", v, published)
		})
		return counted, published, resume
	}

	d1, p1, resume := settled("before the failure")
	t.Logf("before: %v drops counted, %d denied packets published on %s", d1, p1, hubbleFailNode)
	hub.hubble.Stop()
	w.node(gpuFailNode).gpuDown.Store(true)
	failedAt := time.Now()
	resume()

	eventually(t, 2*time.Minute, "health alerts fire", func() (bool, string) {
		_, _, h := hook.find("/tickets", alertIs(rules.AlertHubbleDisconnected, "firing", "node", hubbleFailNode))
		_, _, g := hook.find("/tickets", alertIs(rules.AlertGPUSourceDown, "firing", "node", gpuFailNode, "source", "gpu"))
		return h && g, fmt.Sprintf("hubble disconnected: %v, gpu source down: %v", h, g)
	})
	t.Logf("health alerts at the webhook %.1fs after the failures", time.Since(failedAt).Seconds())

	if err := hub.hubble.Start(hub.hubbleSock); err != nil {
		t.Fatal(err)
	}
	testenv.CiliumSocket(t, hub.hubbleSock)
	w.node(gpuFailNode).gpuDown.Store(false)
	restoredAt := time.Now()
	eventually(t, 2*time.Minute, "health alerts resolve", func() (bool, string) {
		_, _, h := hook.find("/tickets", alertIs(rules.AlertHubbleDisconnected, "resolved", "node", hubbleFailNode))
		_, _, g := hook.find("/tickets", alertIs(rules.AlertGPUSourceDown, "resolved", "node", gpuFailNode, "source", "gpu"))
		return h && g, fmt.Sprintf("hubble: %v, gpu: %v", h, g)
	})
	t.Logf("health alerts resolved at the webhook %.1fs after the sources came back", time.Since(restoredAt).Seconds())

	d2, p2, resume := settled("after the reconnect")
	defer resume()
	_, reconnects, err := drops()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after: %v drops counted, %d denied packets published; %v reconnects", d2, p2, reconnects)
	if reconnects < 1 {
		t.Errorf("zonewatch_hubble_reconnects_total = %v, want >= 1", reconnects)
	}
	switch {
	case d2 < d1:
		t.Errorf("drop counter went back from %v to %v", d1, d2)
	case d2-d1 != float64(p2-p1):
		t.Errorf("drops counted across the outage: %v, denied packets published: %d (double counted or lost)", d2-d1, p2-p1)
	}
	q := fmt.Sprintf(`sum(resets(zonewatch_job_policy_drops_total{instance=%q}[15m]))`, e.addr)
	if v, err := p.value(q); err != nil || v != 0 {
		t.Errorf("%s = %v (%v), want 0", q, v, err)
	}
	eventually(t, 30*time.Second, "Prometheus has the settled counter", func() (bool, string) {
		v, err := p.value(fmt.Sprintf(`sum(zonewatch_job_policy_drops_total{instance=%q, job_name=%q})`, e.addr, blockedJob))
		return err == nil && v == d2, fmt.Sprint(v, err)
	})
}

// idleGPUCost checks that the blocked job, and only it, has idle GPUs
// priced by the cost rule (all its GPUs at the configured price), and waits
// until the cost report's integration of that rule holds it: the report
// and the cost report dashboard sum the rule at one-minute steps
// ([range:1m], aligned to the minute), so a job split and idle for less
// time than that may fall between two steps. The steps before take 40-60 s
// from the first scrape, often less than the minute: the blocked job stays
// split and idle here until a step has seen it, so the fix does not end its
// idle time before the cost report could count it.
func idleGPUCost(t *testing.T, w *world, p *prom, cfg rules.Config) {
	w.mu.Lock()
	gpus := 0
	for _, pod := range w.job(blockedNS, blockedJob).Pods {
		gpus += len(pod.GPUs)
	}
	w.mu.Unlock()
	want := float64(gpus) * cfg.GPUDollarsPerHour
	eventually(t, 30*time.Second, fmt.Sprintf("%s: %s/%s's %d GPUs only", rules.RecSplitIdleGPUCost, blockedNS, blockedJob, gpus), func() (bool, string) {
		vec, err := p.vector(rules.RecSplitIdleGPUCost)
		if err != nil {
			return false, err.Error()
		}
		return len(vec) == 1 && string(vec[0].Metric["namespace"]) == blockedNS && string(vec[0].Metric["job_name"]) == blockedJob &&
			float64(vec[0].Value) == want, fmt.Sprintf("%v, want %s/%s at %.2f $/h", vec, blockedNS, blockedJob, want)
	})
	began := time.Now()
	integral := fmt.Sprintf(`sum_over_time(%s{namespace=%q, job_name=%q}[1h:1m]) / 60`, rules.RecSplitIdleGPUCost, blockedNS, blockedJob)
	var dollars float64
	if eventually(t, 90*time.Second, "a one-minute step of the cost report with "+blockedJob+"'s idle GPUs", func() (bool, string) {
		vec, err := p.vector(integral)
		if err != nil {
			return false, err.Error()
		}
		if len(vec) == 1 {
			dollars = float64(vec[0].Value)
		}
		return len(vec) == 1 && dollars > 0, fmt.Sprint(vec)
	}) {
		t.Logf("idle GPUs of %s in the cost report after %s more: $%.2f", blockedJob, time.Since(began).Round(time.Second), dollars)
	}
}

// costRecordingRules checks the cost recording rules against the dollars
// the scenario's byte rates should cost, once the rules' 5m rate window
// holds nothing but steady traffic.
func costRecordingRules(t *testing.T, w *world, p *prom, cfg rules.Config, trafficStart time.Time) {
	w.mu.Lock()
	want := map[string]float64{
		costlyJob: crossZoneWireRate(w.s, costlyNS, costlyJob),
		slowJob:   crossZoneWireRate(w.s, slowNS, slowJob),
	}
	w.mu.Unlock()
	dollars := func(bytesPerSecond float64) float64 { return bytesPerSecond * 3600 / 1e9 * cfg.CrossZoneDollarsPerGB }
	checks := []struct {
		query, what string
		want        float64
	}{
		{fmt.Sprintf(`%s{namespace=%q, job_name=%q}`, rules.RecCrossZoneBytes, costlyNS, costlyJob), "bytes/s", want[costlyJob]},
		{fmt.Sprintf(`%s{namespace=%q, job_name=%q}`, rules.RecCrossZoneCost, costlyNS, costlyJob), "$/h", dollars(want[costlyJob])},
		{fmt.Sprintf(`%s{namespace=%q, job_name=%q}`, rules.RecCrossZoneCost, slowNS, slowJob), "$/h", dollars(want[slowJob])},
		{fmt.Sprintf(`%s{namespace=%q}`, rules.RecNamespaceCrossZoneCost, costlyNS), "$/h", dollars(want[costlyJob] + want[slowJob])},
	}
	// rate() over 5m underestimates until its window holds 5m of samples:
	// the first byte samples come a conntrack poll and a scrape after the
	// traffic started.
	full := trafficStart.Add(5*time.Minute + 5*time.Second)
	t.Logf("the 5m rate window is full in %s", time.Until(full).Round(time.Second))
	for _, c := range checks {
		var got float64
		eventually(t, time.Until(full)+time.Minute, c.query+" within 1%", func() (bool, string) {
			if time.Now().Before(full) {
				return false, "rate window not full yet"
			}
			v, err := p.value(c.query)
			if err != nil {
				return false, err.Error()
			}
			got = v
			return math.Abs(v-c.want) <= 0.01*c.want, fmt.Sprintf("%.6g, want %.6g", v, c.want)
		})
		t.Logf("%s = %.6g %s (expected %.6g, %+.3f%%)", c.query, got, c.what, c.want, 100*(got-c.want)/c.want)
	}
}

// crossZoneWireRate is the byte rate of a job's cross-zone connections as
// Cilium's combined CT counters see them on the opener's node: the
// scenario's BytesPerSecond of payload plus TCP/IP headers and ACKs, both
// directions, from the simulated TCP of sim.ConntrackEntries.
func crossZoneWireRate(s *sim.Scenario, namespace, job string) float64 {
	const span = 1000 * time.Second
	ips := map[string]bool{}
	for _, j := range s.Jobs {
		if j.Namespace == namespace && j.Name == job {
			for _, p := range j.Pods {
				ips[p.IP.String()] = true
			}
		}
	}
	zoneOf := map[string]string{}
	for _, p := range s.AllPods() {
		zoneOf[p.IP.String()] = s.NodeByName(p.Node).Zone
	}
	a, b := s.ConntrackEntries("", 0), s.ConntrackEntries("", span)
	var rate float64
	for i := range b {
		e := b[i]
		if e.Ingress || e.Service || !ips[e.Src.String()] || zoneOf[e.Src.String()] == zoneOf[e.Dst.String()] {
			continue
		}
		rate += float64(e.SentBytes+e.ReplyBytes-a[i].SentBytes-a[i].ReplyBytes) / span.Seconds()
	}
	return rate
}

// TestRuleFileOnlyForDiffers runs without the tools: the e2e rule file is
// the generator's, with nothing but shorter `for:` durations.
func TestRuleFileOnlyForDiffers(t *testing.T) {
	if bytes.Equal(testRuleFile(t, testRulesConfig()), mustGenerate(t, rules.DefaultConfig())) {
		t.Fatal("the test rule file has the committed for: durations")
	}
}

func mustGenerate(t *testing.T, cfg rules.Config) []byte {
	t.Helper()
	b, err := rules.Generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
