package e2e

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/internal/ciliumlab"
	"github.com/zonewatch/zonewatch/rules"
)

// TestCiliumLabDemo is `make demo`: the seed's before/after on real Cilium
// agents for a newcomer. It prints each step, shows the page for the
// hard-blocked job and its resolution after the fix, then keeps the lab,
// the exporters, Prometheus and Alertmanager up until Ctrl-C.
func TestCiliumLabDemo(t *testing.T) {
	if os.Getenv("ZONEWATCH_DEMO") == "" {
		t.Skip("the demo runs only from `make demo` (ZONEWATCH_DEMO=1): it waits for Ctrl-C")
	}
	step := func(format string, args ...any) { t.Helper(); t.Logf("==> "+format, args...) }
	interrupted, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	ctx, cancel := context.WithTimeout(interrupted, 30*time.Minute)
	defer cancel()

	step("starting etcd, kube-apiserver and four real cilium-agent v1.20.2, one per node, each node a network and mount namespace (VXLAN between them)")
	lab, api, tools := startCiliumLab(t, false)
	for _, n := range lab.Nodes {
		step("node %s in %s: %s, pods from %s", n.Name, n.Zone, n.IP, n.PodCIDR)
	}
	step("lab up in %s", lab.StartTime.Round(time.Millisecond))

	gpus := newLabGPUs(t, lab)
	step("GPUs are simulated (no GPU here): a dcgm-exporter page per node at %s/<node>/metrics and a kubelet PodResources socket per node", gpus.url)
	step("starting one zonewatch exporter per node, in the node's namespaces, with the chart's args, ServiceAccount and securityContext")
	addrs := startLabExporters(t, lab, api, gpus)

	step("applying the zone fence ml-team/zone-isolation (ml-team pods accept only their own zone) and three PyTorchJobs, pods wired by cilium-cni")
	sc := startLabScenario(ctx, t, lab)
	sc.simulateGPUs(gpus)
	for _, j := range []*labJob{sc.blocked, sc.slow, sc.healthy} {
		for _, p := range j.pods() {
			step("  %s on %s (%s): %s", p.Ref(), p.Node.Name, p.Node.Zone, p.IP)
		}
	}
	dir := t.TempDir()
	hook := newWebhook(t)
	amAddr := startAlertmanager(t, tools, dir, hook.url)
	var exps []exporter
	for node, addr := range addrs {
		exps = append(exps, exporter{node: node, addr: addr})
	}
	sort.Slice(exps, func(i, j int) bool { return exps[i].node < exps[j].node })
	cfg := testRulesConfig()
	p := startPrometheus(t, tools, dir, testRuleFile(t, cfg), amAddr, exps)
	step("Prometheus %s (rule pack with short for: durations), Alertmanager http://%s", p.url, amAddr)

	step("traffic: llm-blocked's workers retry the rendezvous on :%d, bert-slow trains across zones, resnet-healthy trains in one zone", ciliumlab.RendezvousPort)
	ex := ciliumlab.Exchange{Up: 64 << 10, Down: 16 << 10, Steps: 20, DialTimeout: 500 * time.Millisecond}
	var stops []func()
	for _, j := range []*labJob{sc.blocked, sc.slow, sc.healthy} {
		if _, err := j.coordinator.Serve(ex.Up, ex.Down); err != nil {
			t.Fatal(err)
		}
		jctx, stop := context.WithCancel(ctx)
		done := j.loop(jctx, ex)
		stops = append(stops, func() { stop(); <-done })
	}
	defer func() {
		for _, s := range stops {
			s()
		}
	}()

	firing := alertIs(rules.AlertIdleGPUSplitJob, "firing", "namespace", sc.blocked.ns, "job_name", sc.blocked.name)
	step("waiting for the page (%s)", rules.AlertIdleGPUSplitJob)
	if !eventually(t, 5*time.Minute, "the page", func() (bool, string) {
		_, _, ok := hook.find("/pager", firing)
		return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
	}) {
		t.FailNow()
	}
	page, _, _ := hook.find("/pager", firing)
	step("PAGE: %s\n    %s", page.Annotations["summary"], page.Annotations["description"])

	warning := alertIs(rules.AlertCrossZoneSlowdown, "firing", "namespace", sc.slow.ns, "job_name", sc.slow.name)
	if eventually(t, 3*time.Minute, "the slowdown warning", func() (bool, string) {
		_, _, ok := hook.find("/tickets", warning)
		return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
	}) {
		w, _, _ := hook.find("/tickets", warning)
		step("WARNING: %s\n    %s", w.Annotations["summary"], w.Annotations["description"])
	}

	step("the fix: llm-blocked recreated with every pod in %s", zoneA)
	stops[0]()
	sc.fix(ctx, t, lab, gpus)
	if _, err := sc.blocked.coordinator.Serve(ex.Up, ex.Down); err != nil {
		t.Fatal(err)
	}
	fctx, stop := context.WithCancel(ctx)
	done := sc.blocked.loop(fctx, ex)
	stops[0] = func() { stop(); <-done }
	resolved := alertIs(rules.AlertIdleGPUSplitJob, "resolved", "namespace", sc.blocked.ns, "job_name", sc.blocked.name)
	if eventually(t, 5*time.Minute, "the page resolved", func() (bool, string) {
		_, _, ok := hook.find("/pager", resolved)
		return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
	}) {
		step("RESOLVED: the job trains in one zone, the fence drops nothing")
	}

	step("everything stays up until Ctrl-C:")
	step("  Prometheus API   %s/api/v1/query?query=ALERTS", p.url)
	step("  Alertmanager API http://%s/api/v2/alerts", amAddr)
	for _, e := range exps {
		step("  exporter %-7s http://%s/metrics", e.node, e.addr)
	}
	for _, n := range lab.Nodes {
		step("  cilium-agent %s metrics http://%s/metrics, log %s", n.Name, n.AgentMetrics, n.Agent().Log)
	}
	<-ctx.Done()
	step("stopping: every process, namespace, link and mount the lab made is removed")
}
