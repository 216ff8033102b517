package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/rules"
)

// The jobs of sim.Default() the detection test watches.
const (
	spinningNS, spinningJob = "ml-team", "t5-spinning" // blocked between its own pods, GPUs spin
	peerDeniedPeer          = "data/minio"             // mpi-costly's denied storage service
)

// TestBlockedWithoutGPUTelemetry runs the exporters of the nodes of a
// blocked split job with their GPU source off (--gpu.source=none, a
// cluster without dcgm-exporter) against a real kube-apiserver,
// Prometheus and Alertmanager: the job gets ZonewatchBlockedSplitJob at
// the tickets receiver and never a page, and the job on the same nodes
// whose drops go to another workload (research/mpi-costly -> data/minio)
// gets ZonewatchPeerPolicyDrops, not a page.
func TestBlockedWithoutGPUTelemetry(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts etcd, kube-apiserver, Prometheus, Alertmanager and two exporters")
	}
	inLane(t)
	tools := testenv.ToolsBin(t, "etcd", "kube-apiserver", "prometheus", "alertmanager")
	began := time.Now()
	bin := exporterBinary(t)

	dir := t.TempDir()
	bpffs := bpffsIn(t, dir)
	api := testenv.StartAPIServer(t)
	client := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	w := newWorld(t, filepath.Join(dir, "nodes"), bpffs)
	createObjects(ctx, t, client, w.s)
	job := w.job(spinningNS, spinningJob)
	nodes := map[string]bool{}
	for _, p := range job.Pods {
		nodes[p.Node] = true
	}

	cfg := testRulesConfig()
	hook := newWebhook(t)
	amAddr := startAlertmanager(t, tools, dir, hook.url)
	exporterKubeconfig := api.ChartIdentity(t, nil).Kubeconfig
	var exporters []exporter
	for _, f := range w.nodes {
		if nodes[f.name] {
			exporters = append(exporters, startExporterWithoutGPU(t, bin, dir, exporterKubeconfig, f))
		}
	}
	for _, e := range exporters {
		if !waitReady(t, e, 2*time.Minute) {
			t.FailNow()
		}
	}
	p := startPrometheus(t, tools, dir, testRuleFile(t, cfg), amAddr, exporters)

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { stopTraffic(); <-done })
	go func() { defer close(done); w.run(trafficCtx, t, 250*time.Millisecond) }()
	trafficStart := time.Now()
	t.Logf("stack up in %s: %d exporters without GPU source (%v)", trafficStart.Sub(began).Round(time.Millisecond), len(exporters), nodes)

	sel := fmt.Sprintf(`{namespace=%q, job_name=%q}`, spinningNS, spinningJob)
	var ticket amAlert
	var at time.Time
	if !eventually(t, 2*time.Minute, rules.AlertBlockedSplitJob+" at the tickets receiver", func() (bool, string) {
		var ok bool
		ticket, at, ok = hook.find("/tickets", alertIs(rules.AlertBlockedSplitJob, "firing", "namespace", spinningNS, "job_name", spinningJob))
		return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
	}) {
		t.FailNow()
	}
	t.Logf("blocked ticket %.1fs after the traffic started (for: %s): %s", at.Sub(trafficStart).Seconds(), cfg.For.BlockedSplitJob, ticket.Annotations["description"])
	if ticket.Labels["severity"] != "warning" {
		t.Errorf("blocked ticket severity = %q, want warning", ticket.Labels["severity"])
	}
	for _, want := range []string{spinningNS + "/" + spinningJob, "us-east-1b", "us-east-1c", "policy " + denyingPolicy, "no GPU telemetry"} {
		if !strings.Contains(ticket.Annotations["description"], want) {
			t.Errorf("blocked ticket description does not say %q: %s", want, ticket.Annotations["description"])
		}
	}
	// The evidence: drops between its own pods, and no GPU series at all.
	if v, err := p.value(rules.RecOwnCrossZonePolicyDrops + sel); err != nil || v <= 0 {
		t.Errorf("%s own cross-zone drops = %v (%v), want > 0", spinningJob, v, err)
	}
	if v, err := p.vector(rules.RecGPUBusy + sel); err != nil || len(v) > 0 {
		t.Errorf("%s has GPU series although its nodes have no GPU source: %v %v", spinningJob, v, err)
	}

	// Drops toward another workload: their own info alert, naming the peer.
	var peer amAlert
	if eventually(t, time.Minute, rules.AlertPeerPolicyDrops+" for "+costlyJob, func() (bool, string) {
		var ok bool
		peer, _, ok = hook.find("/tickets", alertIs(rules.AlertPeerPolicyDrops, "firing", "namespace", costlyNS, "job_name", costlyJob))
		return ok, fmt.Sprintf("%d notifications so far", len(hook.all()))
	}) {
		if d := peer.Annotations["description"]; !strings.Contains(d, peerDeniedPeer) || !strings.Contains(d, "research/same-zone-egress") {
			t.Errorf("peer-drops description does not name %s and its policy: %s", peerDeniedPeer, d)
		}
		if peer.Labels["severity"] != "info" {
			t.Errorf("peer-drops severity = %q, want info", peer.Labels["severity"])
		}
	}

	// Hold on a while: nothing pages, and the ticket stays the only job
	// alert of the blocked job.
	time.Sleep(15 * time.Second)
	if a, _, paged := hook.find("/pager", func(amAlert) bool { return true }); paged {
		t.Errorf("paged: %s %v", a.Status, a.Labels)
	}
	if v, err := p.vector(fmt.Sprintf(`ALERTS{alertname=%q}`, rules.AlertIdleGPUSplitJob)); err != nil || len(v) > 0 {
		t.Errorf("%s pending or firing: %v %v", rules.AlertIdleGPUSplitJob, v, err)
	}
	for _, n := range hook.all() {
		for _, a := range n.Alerts {
			if a.Labels["job_name"] == spinningJob && a.Labels["alertname"] != rules.AlertBlockedSplitJob {
				t.Errorf("%s also raised %s (%s)", spinningJob, a.Labels["alertname"], a.Status)
			}
		}
	}
	t.Logf("e2e wall time %s", time.Since(began).Round(time.Second))
}

// startExporterWithoutGPU runs the exporter for one node as on a cluster
// without GPU telemetry: Hubble and conntrack as in startExporter, no GPU
// source.
func startExporterWithoutGPU(t *testing.T, bin, dir, kubeconfig string, f *nodeFakes) exporter {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	testenv.StartAs(t, dir, "exporter-"+f.name, testenv.ChartSecurityContext(t), bin,
		"--node-name="+f.name,
		"--kubeconfig="+kubeconfig,
		"--web.listen-address="+addr,
		"--hubble.address=unix://"+f.hubbleSock,
		"--gpu.source=none",
		"--no-probe.enabled",
		// No ipcache map is pinned (startExporter): every node watched.
		"--kube.node-view=cluster",
		"--conntrack.bpffs-path="+f.bpfDir,
		"--conntrack.poll-interval=1s",
		"--conntrack.layout=combined",
	)
	return exporter{node: f.name, addr: addr}
}
