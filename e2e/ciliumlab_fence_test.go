package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/collector/probe"
	"github.com/zonewatch/zonewatch/internal/ciliumlab"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// Cluster-wide zone fences as users write them (the seed's fence is a
// CiliumNetworkPolicy in ml-team: it selects ml-team's pods only, and its
// fromEndpoints are confined to ml-team, so it never touches zonewatch).
// Every pod carries its zone in the label "zone" (an admission webhook
// copying the node's zone sets it on zonewatch's pods too).

// allowFence: each zone's pods accept connections from their own zone only
// (default deny, then an allow).
func allowFence() string {
	var b strings.Builder
	b.WriteString("apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata:\n  name: zone-fence-allow\nspecs:")
	for _, z := range []string{zoneA, zoneB, zoneC} {
		fmt.Fprintf(&b, `
- endpointSelector:
    matchLabels: {zone: %[1]s}
  ingress:
  - fromEndpoints:
    - matchLabels: {zone: %[1]s}`, z)
	}
	return b.String() + "\n"
}

// denyFence: the seed's fence made cluster-wide, an explicit ingressDeny
// from the other zones; exempt leaves zonewatch's pods out on both sides
// (docs/runbooks.md, "zonewatch's own traffic").
func denyFence(exempt bool) string {
	name, sel, from := "zone-fence-deny", "", ""
	if exempt {
		name = "zone-fence-deny-exempt"
		sel = "\n    matchExpressions:\n    - {key: app.kubernetes.io/name, operator: NotIn, values: [zonewatch]}"
		from = "\n      - {key: app.kubernetes.io/name, operator: NotIn, values: [zonewatch]}"
	}
	var b strings.Builder
	b.WriteString("apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata:\n  name: " + name + "\nspecs:")
	for _, z := range []string{zoneA, zoneB, zoneC} {
		fmt.Fprintf(&b, `
- endpointSelector:
    matchLabels: {zone: %[1]s}%[2]s
  ingress:
  - fromEntities: [all]
  ingressDeny:
  - fromEndpoints:
    - matchExpressions:
      - {key: zone, operator: NotIn, values: [%[1]s]}%[3]s`, z, sel, from)
	}
	return b.String() + "\n"
}

// chartCNP is the chart's CiliumNetworkPolicy, rendered by helm with
// ciliumNetworkPolicy.enabled=true and Prometheus in namespace monitoring
// (docs/runbooks.md's example).
// With defaults false, prometheusSelectors keeps the chart's default (no
// namespace).
func chartCNP(t *testing.T, defaults bool) string {
	t.Helper()
	root := testenv.RepoRoot()
	helm := filepath.Join(testenv.ToolsBin(t, "helm"), "helm")
	args := []string{"template", "zonewatch", filepath.Join(root, "deploy", "helm", "zonewatch"),
		"--namespace", "zonewatch", "--set", "ciliumNetworkPolicy.enabled=true", "--show-only", "templates/ciliumnetworkpolicy.yaml"}
	if !defaults {
		args = append(args, "--set-json", `ciliumNetworkPolicy.prometheusSelectors=[{"matchLabels":{"app.kubernetes.io/name":"prometheus","k8s:io.kubernetes.pod.namespace":"monitoring"}}]`)
	}
	out, err := exec.Command(helm, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	return string(out)
}

// inNetNS runs fn on a thread in the named network namespace (a pod's or a
// node's): sockets fn opens are that namespace's.
func inNetNS(name string, fn func() error) error {
	f, err := os.Open(filepath.Join("/run/netns", name))
	if err != nil {
		return err
	}
	defer f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread ends with the goroutine
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// ownTraffic is what one look at zonewatch's own traffic saw.
type ownTraffic struct {
	// probe[src zone][dst zone]: the prober's outcome, "rtt" or its
	// failure reason.
	probe map[string]string
	// scrape: Prometheus in zone c connecting to the exporters' metrics
	// port in zones a and b ("ok" or the error).
	scrape map[string]string
	// inbound[src zone>dst zone]: the probes from src that dst's
	// exporter counted as dropped by a policy on its node.
	inbound map[string]float64
	// host: a host-network prober (the lab's exporters) on gpu-a1 dialing
	// the zone b exporter pod's probe port.
	host string
}

func (o ownTraffic) String() string {
	return fmt.Sprintf("probes %v (counted inbound denied by the peer: %v), scrapes %v, host-network probe %s", o.probe, o.inbound, o.scrape, o.host)
}

func short(zone string) string { return zone[len(zone)-1:] }

func (o ownTraffic) allPass() bool {
	for _, v := range o.probe {
		if v != "rtt" {
			return false
		}
	}
	for _, v := range o.scrape {
		if v != "ok" {
			return false
		}
	}
	return true
}

func (o ownTraffic) noneOf() bool {
	for _, v := range o.probe {
		if strings.HasPrefix(v, "rtt") {
			return false
		}
	}
	for _, v := range o.scrape {
		if v == "ok" {
			return false
		}
	}
	return true
}

type zwPod struct {
	pod  *ciliumlab.Pod
	zone string
}

// look runs one probe round of the real prober (collector/probe) in each
// exporter pod's network namespace toward the other, with PolicyDrops
// asking the prober's node's Hubble socket, and Prometheus' connection to
// each exporter's metrics port.
func look(t *testing.T, zw []zwPod, prom *ciliumlab.Pod, hostNS string) ownTraffic {
	t.Helper()
	o := ownTraffic{probe: map[string]string{}, scrape: map[string]string{}, inbound: map[string]float64{}}
	type prober struct {
		src   zwPod
		p     *probe.Prober
		m     *probe.Metrics
		reg   *prometheus.Registry
		peers staticPeers
	}
	var probers []prober
	for _, src := range zw {
		// The exporter pod itself among the peers, as the pod index has it
		// (never probed: same node), so that it counts inbound drops.
		var peers staticPeers
		for _, dst := range zw {
			peers = append(peers, probe.Peer{Node: dst.pod.Node.Name, Zone: dst.zone,
				Addr: net.JoinHostPort(dst.pod.IP.String(), fmt.Sprint(probe.DefaultPort)), Pod: dst.pod.Ref()})
		}
		conn, err := grpc.NewClient("unix://"+src.pod.Node.HubbleSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		reg := prometheus.NewRegistry()
		m := probe.NewMetrics(reg)
		p := probe.NewProber(probe.Config{Node: src.pod.Node.Name, Zone: func() string { return src.zone }, Count: 3,
			Timeout: time.Second, Drops: probe.HubbleDrops{Client: observerpb.NewObserverClient(conn)}},
			peers, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
		probers = append(probers, prober{src: src, p: p, m: m, reg: reg, peers: peers})
	}
	// Two rounds each, every exporter after the other: in the second,
	// each counts the drops of the other's first-round probes to it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		for _, pr := range probers {
			if err := inNetNS(pr.src.pod.NetNS, func() error { pr.p.Round(ctx); return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, pr := range probers {
		for _, dst := range pr.peers {
			if dst.Node == pr.src.pod.Node.Name {
				continue
			}
			k := short(pr.src.zone) + ">" + short(dst.Zone)
			o.probe[k] = outcome(t, pr.reg, dst.Zone)
			// What dst's exporter counted of pr's probes.
			for _, other := range probers {
				if other.src.zone == dst.Zone {
					o.inbound[k] = testutil.ToFloat64(other.m.InboundDenied.WithLabelValues(pr.src.zone, dst.Zone))
				}
			}
		}
	}
	for _, dst := range zw {
		c, err := prom.Dial(net.JoinHostPort(dst.pod.IP.String(), "19420"), time.Second)
		if err != nil {
			o.scrape["c>"+dst.zone[len(dst.zone)-1:]] = reason(err)
			continue
		}
		c.Close()
		o.scrape["c>"+dst.zone[len(dst.zone)-1:]] = "ok"
	}
	o.host = "ok"
	_ = inNetNS(hostNS, func() error {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(zw[1].pod.IP.String(), fmt.Sprint(probe.DefaultPort)), time.Second)
		if err != nil {
			o.host = reason(err)
			return nil
		}
		return c.Close()
	})
	return o
}

func reason(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return err.Error()
}

// outcome is "rtt" when the round recorded a round trip toward dst, else
// the failure reason it counted.
func outcome(t *testing.T, reg *prometheus.Registry, dst string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	rtt, failed := false, ""
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if labelOf(m, "dst_zone") != dst {
				continue
			}
			switch mf.GetName() {
			case "zonewatch_zone_rtt_seconds":
				rtt = rtt || m.GetHistogram().GetSampleCount() > 0
			case "zonewatch_probe_failures_total":
				if m.GetCounter().GetValue() > 0 {
					failed = labelOf(m, "reason")
				}
			}
		}
	}
	switch {
	case rtt && failed != "":
		return "rtt+" + failed // a policy reached the datapath between two rounds
	case rtt:
		return "rtt"
	case failed != "":
		return failed
	}
	return "nothing"
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

type staticPeers []probe.Peer

func (s staticPeers) Peers() []probe.Peer { return s }

// policyDrops counts, on node n's Hubble, the policy drops of TCP toward
// pod on port since then, by the policy named and direction.
func policyDrops(t *testing.T, n *ciliumlab.Node, pod *ciliumlab.Pod, port int, since time.Time) map[string]int {
	t.Helper()
	out := map[string]int{}
	nodeFlows(t, n, 10*time.Second, &observerpb.GetFlowsRequest{
		Since: timestamppb.New(since),
		Whitelist: []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}, DestinationIp: []string{pod.IP.String()},
			DestinationPort: []string{fmt.Sprint(port)}}},
	}, func(f *flowpb.Flow) {
		var by []string
		for _, p := range append(f.GetIngressDeniedBy(), f.GetEgressDeniedBy()...) {
			by = append(by, p.GetKind()+"/"+p.GetName())
		}
		out[fmt.Sprintf("type %d %s %s %v", f.GetEventType().GetType(), f.GetTrafficDirection(), f.GetDropReasonDesc(), by)]++
	})
	return out
}

// TestCiliumLabOwnTraffic: zonewatch's own traffic (RTT probes between
// exporter pods, Prometheus' scrapes) under cluster-wide zone fences on
// the real agents, with and without the chart's CiliumNetworkPolicy.
func TestCiliumLabOwnTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts four Cilium agents")
	}
	inLane(t)
	began := time.Now()
	lab, api, _ := startCiliumLab(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	chartLabels := map[string]string{"app.kubernetes.io/name": "zonewatch", "app.kubernetes.io/instance": "zonewatch", "app.kubernetes.io/component": "exporter"}
	var zw []zwPod
	for _, node := range []string{"gpu-a1", "cpu-b1"} {
		n := lab.Node(node)
		labels := map[string]string{"zone": n.Zone}
		for k, v := range chartLabels {
			labels[k] = v
		}
		p, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: "zonewatch", Name: "zonewatch-" + node, Node: node, Labels: labels,
			Ports: []int32{19420, int32(probe.DefaultPort)}})
		if err != nil {
			t.Fatal(err)
		}
		// The fences select on zone and the chart's name label.
		if _, err := p.SettledIdentity(ctx, "zone", "app.kubernetes.io/name"); err != nil {
			t.Fatal(err)
		}
		for _, port := range []int{19420, probe.DefaultPort} {
			ln, err := p.Listen(port)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			go probe.Serve(ctx, ln, slog.New(slog.NewTextHandler(io.Discard, nil)))
		}
		zw = append(zw, zwPod{pod: p, zone: n.Zone})
	}
	prom, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: "monitoring", Name: "prometheus-0", Node: "gpu-c1",
		Labels: map[string]string{"app.kubernetes.io/name": "prometheus", "zone": zoneC}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prom.SettledIdentity(ctx, "zone", "app.kubernetes.io/name"); err != nil {
		t.Fatal(err)
	}
	hostNS := lab.Node("gpu-a1").NetNS
	t.Logf("exporter pods and Prometheus wired %s after the test began", time.Since(began).Round(time.Millisecond))

	// until looks again (policies take a moment to reach every agent's
	// datapath) until cond holds or 30 s pass, and returns the last look.
	until := func(what string, cond func(ownTraffic) bool) ownTraffic {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			o := look(t, zw, prom, hostNS)
			if cond(o) || time.Now().After(deadline) {
				t.Logf("%s: %s", what, o)
				return o
			}
			time.Sleep(time.Second)
		}
	}
	apply := func(manifest string) (string, string) {
		t.Helper()
		ns, name, err := lab.ApplyPolicy(ctx, manifest)
		if err != nil {
			t.Fatal(err)
		}
		return ns, name
	}
	remove := func(ns, name string) {
		t.Helper()
		if err := lab.DeletePolicy(ctx, ns, name); err != nil {
			t.Fatal(err)
		}
	}

	if o := until("no fence", ownTraffic.allPass); !o.allPass() {
		t.Fatalf("without a fence zonewatch's own traffic fails: %s", o)
	}
	// The seed's fence, namespaced in ml-team: zonewatch is not selected.
	sns, sname := apply(zoneFence())
	time.Sleep(3 * time.Second) // no change expected: nothing to wait for
	if o := look(t, zw, prom, hostNS); !o.allPass() {
		t.Errorf("the seed's fence (CiliumNetworkPolicy in ml-team) dropped zonewatch's traffic: %s", o)
	} else {
		t.Logf("the seed's fence (ml-team only): %s", o)
	}
	remove(sns, sname)

	// 1. A cluster-wide allow-only fence drops the probes and scrapes.
	fns, fname := apply(allowFence())
	since := time.Now()
	o := until("cluster-wide allow-only fence", ownTraffic.noneOf)
	if !o.noneOf() {
		t.Errorf("the allow-only fence left some of zonewatch's traffic through: %s", o)
	}
	// The RTT matrix says "denied by policy" for every pair: the prober
	// counts policy_denied, or the peer counts the probes dropped on its
	// node (an ingress fence: the prober's node sees nothing).
	for pr, r := range o.probe {
		if r != "policy_denied" && o.inbound[pr] == 0 {
			t.Errorf("probe %s under the allow-only fence: reason %q at the prober and nothing counted inbound at the peer", pr, r)
		}
	}
	t.Logf("policy drops of probes toward zone b's exporter, on its node cpu-b1: %v; on the prober's node gpu-a1: %v",
		policyDrops(t, lab.Node("cpu-b1"), zw[1].pod, probe.DefaultPort, since), policyDrops(t, lab.Node("gpu-a1"), zw[1].pod, probe.DefaultPort, since))
	if o.host != "ok" {
		t.Logf("the host-network probe is dropped too: %s", o.host)
	}

	// 2. The chart's CiliumNetworkPolicy admits them again. With the
	// default prometheusSelectors (no namespace) Cilium confines them to
	// the policy's namespace: Prometheus in monitoring stays out.
	dcns, dcname := apply(chartCNP(t, true))
	o = until("allow-only fence + the chart's CiliumNetworkPolicy, default prometheusSelectors", func(o ownTraffic) bool {
		return o.probe["a>b"] == "rtt" && o.probe["b>a"] == "rtt"
	})
	if o.probe["a>b"] != "rtt" || o.probe["b>a"] != "rtt" {
		t.Errorf("the chart's CiliumNetworkPolicy did not admit the probes through an allow-only fence: %s", o)
	}
	if o.scrape["c>a"] == "ok" || o.scrape["c>b"] == "ok" {
		t.Errorf("default prometheusSelectors admitted Prometheus from another namespace: %s", o)
	}
	remove(dcns, dcname)
	cns, cname := apply(chartCNP(t, false))
	if o := until("allow-only fence + the chart's CiliumNetworkPolicy", ownTraffic.allPass); !o.allPass() {
		t.Errorf("the chart's CiliumNetworkPolicy did not admit zonewatch's traffic through an allow-only fence: %s", o)
	}
	remove(fns, fname)

	// 3. A fence with ingressDeny wins over the chart's allow.
	dns, dname := apply(denyFence(false))
	since = time.Now()
	o = until("deny fence + the chart's CiliumNetworkPolicy", ownTraffic.noneOf)
	if !o.noneOf() {
		t.Errorf("the chart's allow lifted an ingressDeny: %s", o)
	}
	for pr, r := range o.probe {
		if r != "policy_denied" && o.inbound[pr] == 0 {
			t.Errorf("probe %s under the deny fence: reason %q at the prober and nothing counted inbound at the peer", pr, r)
		}
	}
	t.Logf("under the deny fence, policy drops of probes toward zone b's exporter on cpu-b1: %v; toward zone a's on gpu-a1: %v",
		policyDrops(t, lab.Node("cpu-b1"), zw[1].pod, probe.DefaultPort, since), policyDrops(t, lab.Node("gpu-a1"), zw[0].pod, probe.DefaultPort, since))
	remove(dns, dname)

	// 4. ...unless the fence exempts zonewatch.
	ens, ename := apply(denyFence(true))
	if o := until("deny fence exempting zonewatch", ownTraffic.allPass); !o.allPass() {
		t.Errorf("the fence exempting zonewatch still drops its traffic: %s", o)
	}
	remove(ens, ename)
	remove(cns, cname)
	t.Logf("zonewatch's own traffic under the fences: %s after the test began", time.Since(began).Round(time.Millisecond))

	// The whole exporter's CPU per Hubble flow beside the agents' own
	// (issues 29 and 34): e2e/ciliumlab_flowcpu_test.go.
	t.Run("cpu per flow", func(t *testing.T) {
		measureFlowCPU(ctx, t, lab, api, zw[1].pod, zw[0].pod)
	})
	t.Logf("TestCiliumLabOwnTraffic: %s", time.Since(began).Round(time.Millisecond))
}
