package e2e

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
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
	inLane(t)
	step := func(format string, args ...any) { t.Helper(); t.Logf("==> "+format, args...) }
	interrupted, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	ctx, cancel := context.WithTimeout(interrupted, 30*time.Minute)
	defer cancel()

	step("starting etcd, kube-apiserver, the real kube-scheduler v1.37.2 and four real cilium-agent v1.20.2, one per node, each node a network and mount namespace (VXLAN between them)")
	lab, api, tools, sl := startCiliumLabSched(t, ciliumlab.Config{Nodes: labNodes})
	for _, spec := range labNodes {
		n := lab.Node(spec.Name)
		what := fmt.Sprintf("%s CPUs, %s memory", spec.CPU, spec.Memory)
		if spec.GPUs > 0 {
			what += fmt.Sprintf(", %d GPUs (nvidia.com/gpu), tainted %s=%s:%s", spec.GPUs, spec.Taints[0].Key, spec.Taints[0].Value, spec.Taints[0].Effect)
		}
		step("node %s in %s: %s, pods from %s; %s", n.Name, n.Zone, n.IP, n.PodCIDR, what)
	}
	step("lab up in %s", lab.StartTime.Round(time.Millisecond))

	gpus := newLabGPUs(t, lab)
	step("GPUs are simulated (no GPU here): a dcgm-exporter page per node at %s/<node>/metrics and a kubelet PodResources socket per node", gpus.url)
	step("starting one zonewatch exporter per node, in the node's namespaces, with the chart's args, ServiceAccount and securityContext")
	addrs := startLabExporters(t, lab, api, gpus)

	step("starting the Kubeflow training operator v1.9.3 against the lab's apiserver, with its CRDs and webhooks (internal/trainlab), and Kueue v0.17.0 with its PyTorchJob integration and an administrator's one-time topology-aware setup: a Topology of zone and hostname, a ResourceFlavor of the GPU nodes, a ClusterQueue, the LocalQueue ml-team/%s (internal/kueuelab)", labQueue)
	op := startLabOperator(t, lab, sl, "ml-team")
	step("applying the zone fence ml-team/zone-isolation (ml-team pods accept only their own zone) and three PyTorchJobs, pods wired by cilium-cni")
	step("bert-slow and resnet-healthy are placed by the lab; llm-blocked is this PyTorchJob, its pods made by the training operator and placed by kube-scheduler:\n%s", blockedJobYAML)
	sc := startLabScenarioWith(ctx, t, lab, op)
	sc.simulateGPUs(gpus)
	for _, j := range []*labJob{sc.blocked, sc.slow, sc.healthy} {
		for _, p := range j.pods() {
			by := "placed by the lab"
			if p.ScheduledBy != "" {
				by = p.ScheduledBy + ": " + p.Scheduled
			}
			step("  %s on %s (%s): %s (%s)", p.Ref(), p.Node.Name, p.Node.Zone, p.IP, by)
		}
	}
	step("the seed's split: nothing in llm-blocked keeps it in one zone, so the scheduler's default scoring (least allocated) put the CPU-only master on the big CPU node in %s (its toleration permits the GPU nodes, it does not attract it) and the GPU workers in %s, where the free GPUs are", zoneB, zoneA)
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

	step("the fix: what zonewatch's analyze prints for llm-blocked, run on the lab's nodes and pods")
	stops[0]()
	fix, cmd := sc.fix(ctx, t, lab, gpus, dir)
	step("$ %s\n    Fix:\n%s", cmd, indent(fix, "      "))
	step("added to llm-blocked's manifest, the LocalQueue named (%s); the PyTorchJob deleted and re-created from it: Kueue admitted it whole into one zone with room, the training operator made its pods again, kube-scheduler bound every one in %s:", labQueue, sc.blocked.zones()[0])
	for _, p := range sc.blocked.pods() {
		step("  %s on %s (%s): %s (%s: %s)", p.Ref(), p.Node.Name, p.Node.Zone, p.IP, p.ScheduledBy, p.Scheduled)
	}
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

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}
