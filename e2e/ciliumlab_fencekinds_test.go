package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zonewatch/zonewatch/internal/ciliumlab"
)

// Issue 42, item 3: the fences users write most, each an allow-list that
// drops by default deny (Cilium names no policy, cilium#48588), on the real
// agents. Each is named by the exporter of the dropping node with
// policy_source="selected", its count equal to the agents' own.

// kindsNetPol: a Kubernetes NetworkPolicy on the coordinator, ingress from
// the coordinator's zone only.
func kindsNetPol(job string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml-team", Name: "coordinator-netpol"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{
				"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": "master"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": zoneB}}}}}},
		},
	}
}

// kindsEgressCIDR: worker 0 may send only to 10.0.0.0/8 but the
// coordinator's pod CIDR. A CIDR selects no pod (Cilium gives pods no
// cidr: labels), so the coordinator is denied either way; the drop is on
// the sender's node.
func kindsEgressCIDR(job string, coordinatorCIDR string) string {
	return fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: worker-egress-cidr
  namespace: ml-team
spec:
  endpointSelector:
    matchLabels:
      training.kubeflow.org/job-name: %s
      training.kubeflow.org/replica-type: worker
      training.kubeflow.org/replica-index: "0"
  egress:
  - toCIDRSet:
    - cidr: 10.0.0.0/8
      except: [%s]
`, job, coordinatorCIDR)
}

// kindsL4: the coordinator accepts the job's pods, on the rendezvous port
// only.
func kindsL4(job string, port int) string {
	return fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: coordinator-l4
  namespace: ml-team
spec:
  endpointSelector:
    matchLabels:
      training.kubeflow.org/job-name: %[1]s
      training.kubeflow.org/replica-type: master
  ingress:
  - fromEndpoints:
    - matchLabels:
        training.kubeflow.org/job-name: %[1]s
    toPorts:
    - ports:
      - {port: "%[2]d", protocol: TCP}
`, job, port)
}

// kindsClusterEgress: cluster-wide, zone a's pods may send to zone a only.
func kindsClusterEgress() string {
	return fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: zone-a-egress
spec:
  endpointSelector:
    matchLabels: {zone: %[1]s}
  egress:
  - toEndpoints:
    - matchLabels: {zone: %[1]s}
`, zoneA)
}

// TestCiliumLabFenceKinds: one lab, one split job (the coordinator in
// zone b, two workers in zone a), four allow-list fences in turn: a
// Kubernetes NetworkPolicy, a CiliumNetworkPolicy egress allow-list with a
// CIDR entry (dropped on the sender's node), an L4-only allow-list and a
// cluster-wide egress allow-list. For each, the agents' own drop counters
// on the dropping nodes give the ground truth; the DaemonSet exporters
// count each SYN once, named with policy_source="selected", and none with
// policy="" while the fence is in the cluster.
func TestCiliumLabFenceKinds(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts four Cilium agents")
	}
	inLane(t)
	began := time.Now()
	lab, api, _ := startCiliumLab(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const job, port, other, syns = "kinds-job", 29500, 29501, 10
	add := func(name, node, role, index, zone string) *ciliumlab.Pod {
		p, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: "ml-team", Name: name, Node: node,
			Labels: map[string]string{"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": role,
				"training.kubeflow.org/replica-index": index, "zone": zone},
			OwnerAPIVersion: "kubeflow.org/v1", OwnerKind: "PyTorchJob", OwnerName: job, Ports: []int32{port, other}})
		if err != nil {
			t.Fatal(err)
		}
		// The fences select on the job labels and on zone.
		if _, err := p.SettledIdentity(ctx, "zone", "training.kubeflow.org/job-name", "training.kubeflow.org/replica-type",
			"training.kubeflow.org/replica-index"); err != nil {
			t.Fatal(err)
		}
		return p
	}
	master := add(job+"-master-0", "cpu-b1", "master", "0", zoneB)
	w0, w1 := add(job+"-worker-0", "gpu-a1", "worker", "0", zoneA), add(job+"-worker-1", "gpu-a2", "worker", "1", zoneA)
	workers := []*ciliumlab.Pod{w0, w1}
	for _, p := range []int{port, other} {
		acceptAndClose(t, master, p)
	}
	// The DaemonSet exporters of the coordinator's node (ingress drops)
	// and of the workers' nodes (egress drops).
	addrs := startChartExporters(t, lab, api, []*ciliumlab.Node{lab.Node("gpu-a1"), lab.Node("gpu-a2"), lab.Node("cpu-b1")}, noGPU)
	drops := "zonewatch_job_policy_drops_total"
	everyDrop := map[string]string{}
	unnamed := map[string]string{"policy": ""}
	allPolicyDrops := func() float64 {
		d := agentDrops(t, lab)
		var n float64
		for _, node := range lab.Nodes {
			n += agentPolicyDrops(d, node.Name)
		}
		return n
	}
	// The ledger: every policy drop of the agents (all four nodes) is
	// counted by an exporter, from here on.
	agentStart, zwStart := allPolicyDrops(), sumExporters(t, addrs, drops, everyDrop)
	unnamedStart := sumExporters(t, addrs, drops, unnamed)
	ledger := func(what string) {
		t.Helper()
		eventually(t, time.Minute, what+": every agent policy drop counted by an exporter", func() (bool, string) {
			a, z := allPolicyDrops()-agentStart, sumExporters(t, addrs, drops, everyDrop)-zwStart
			return a == z, fmt.Sprintf("agents %g, exporters %g", a, z)
		})
	}
	dial := func(w *ciliumlab.Pod, p int) bool {
		c, err := w.Dial(net.JoinHostPort(master.IP.String(), fmt.Sprint(p)), 500*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	// reach waits until each of from gets the answer want on port p, each
	// dial a look at the datapath as it is.
	reach := func(from []*ciliumlab.Pod, p int, want bool) bool {
		for _, w := range from {
			ok := false
			for range 60 {
				if dial(w, p) == want {
					ok = true
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			if !ok {
				return false
			}
		}
		return true
	}
	if !reach(workers, port, true) || !reach(workers, other, true) {
		t.Fatal("without a fence the workers do not reach the coordinator")
	}

	type result struct {
		name, policy                                    string
		agent, zw, all, verdicts, hubDrops, empty, gone float64
	}
	var results []result
	ledger("before the fences")
	// gone: drops with policy="" after a fence was deleted (no policy in
	// the cluster selects the endpoint then) while the agent still
	// enforced it: the probes that wait for the fence to leave the
	// datapath.
	var gone float64
	for _, fc := range []struct {
		name, policy string
		apply        func() (remove func() error)
		from         []*ciliumlab.Pod
		port         int
		nodes        []string // where the drops are
		open         int      // a port the fence leaves open to from (0: none)
	}{
		{name: "Kubernetes NetworkPolicy (ingress, the coordinator's zone only)", policy: "ml-team/coordinator-netpol",
			apply: func() func() error {
				np := kindsNetPol(job)
				if _, err := lab.Client.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				return func() error {
					return lab.Client.NetworkingV1().NetworkPolicies(np.Namespace).Delete(ctx, np.Name, metav1.DeleteOptions{})
				}
			}, from: workers, port: port, nodes: []string{"cpu-b1"}},
		{name: "egress allow-list with a CIDR entry (worker 0)", policy: "ml-team/worker-egress-cidr",
			apply: ciliumApply(ctx, t, lab, kindsEgressCIDR(job, master.Node.PodCIDR.String())),
			from:  []*ciliumlab.Pod{w0}, port: port, nodes: []string{"gpu-a1"}},
		{name: "L4-only allow-list (the job's pods on :29500 only)", policy: "ml-team/coordinator-l4",
			apply: ciliumApply(ctx, t, lab, kindsL4(job, port)),
			from:  workers, port: other, nodes: []string{"cpu-b1"}, open: port},
		{name: "cluster-wide egress allow-list (zone a to zone a only)", policy: "zone-a-egress",
			apply: ciliumApply(ctx, t, lab, kindsClusterEgress()),
			from:  workers, port: port, nodes: []string{"gpu-a1", "gpu-a2"}},
	} {
		onNodes := func(d map[string]float64) float64 {
			var n float64
			for _, node := range fc.nodes {
				n += agentPolicyDrops(d, node)
			}
			return n
		}
		jobDrops := map[string]string{"job_name": job}
		before, allBefore := onNodes(agentDrops(t, lab)), sumExporters(t, addrs, drops, jobDrops)
		emptyBefore := sumExporters(t, addrs, drops, unnamed)
		remove := fc.apply()
		// The fence in the datapath: each sender's dial fails (and the
		// allowed port still answers).
		if !reach(fc.from, fc.port, false) {
			t.Fatalf("%s: the senders still reach the coordinator on :%d", fc.name, fc.port)
		}
		if fc.open != 0 && !reach(fc.from, fc.open, true) {
			t.Errorf("%s: the fence drops the allowed port :%d too", fc.name, fc.open)
		}
		eventually(t, time.Minute, fc.name+": the probes' drops reach the exporters", func() (bool, string) {
			agent := onNodes(agentDrops(t, lab)) - before
			zw := sumExporters(t, addrs, drops, jobDrops) - allBefore
			return agent > 0 && zw == agent, fmt.Sprintf("agents %g, exporters %g", agent, zw)
		})
		selected := map[string]string{"namespace": "ml-team", "job_name": job, "policy": fc.policy, "policy_source": "selected", "reason": "POLICY_DENIED"}
		agent0, zw0, all0 := onNodes(agentDrops(t, lab)), sumExporters(t, addrs, drops, selected), sumExporters(t, addrs, drops, jobDrops)
		since := time.Now()
		for _, w := range fc.from {
			for range syns / len(fc.from) {
				if dial(w, fc.port) {
					t.Errorf("%s: %s reached the coordinator on :%d", fc.name, w.Spec.Name, fc.port)
				}
			}
		}
		agent := onNodes(agentDrops(t, lab)) - agent0
		var zw, all float64
		deadline := time.Now().Add(time.Minute)
		for {
			zw = sumExporters(t, addrs, drops, selected) - zw0
			all = sumExporters(t, addrs, drops, jobDrops) - all0
			if all >= agent || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		empty := sumExporters(t, addrs, drops, unnamed) - emptyBefore
		hub := map[string]int{}
		var hubDrops, verdicts float64
		for _, node := range fc.nodes {
			for k, v := range policyDrops(t, lab.Node(node), master, fc.port, since) {
				hub[node+" "+k] += v
				if strings.Contains(k, "type 1 ") {
					hubDrops += float64(v)
				}
				if strings.Contains(k, "type 5 ") {
					verdicts += float64(v)
				}
				if strings.Contains(k, "/") {
					t.Errorf("%s: Hubble named a policy (%s): not a default-deny drop", fc.name, k)
				}
			}
		}
		t.Logf("%s: %d SYNs tried; the agents on %v counted %.0f policy drops, Hubble %v; zonewatch %.0f with policy=%q policy_source=\"selected\" (%.0f in all, %.0f with policy=\"\" since the fence was applied): series %v",
			fc.name, syns/len(fc.from)*len(fc.from), fc.nodes, agent, hub, zw, fc.policy, all, empty,
			seriesOf(t, addrs, drops, jobDrops))
		if agent == 0 || zw != agent || all != agent {
			t.Errorf("%s: the agents dropped %.0f, zonewatch counted %.0f named %q (%.0f in all)", fc.name, agent, zw, fc.policy, all)
		}
		if empty != 0 {
			t.Errorf("%s: %.0f drops with policy=\"\" while the fence selected the endpoint: %v", fc.name, empty, seriesOf(t, addrs, drops, unnamed))
		}
		atDelete := sumExporters(t, addrs, drops, unnamed)
		if err := remove(); err != nil {
			t.Fatal(err)
		}
		// The fence out of the datapath before the next one.
		if !reach(fc.from, fc.port, true) {
			t.Fatalf("%s: deleted, the senders still do not reach the coordinator on :%d", fc.name, fc.port)
		}
		ledger("after " + fc.name)
		g := sumExporters(t, addrs, drops, unnamed) - atDelete
		gone += g
		results = append(results, result{fc.name, fc.policy, agent, zw, all, verdicts, hubDrops, empty, g})
	}
	// Every policy="" drop of the test came after its fence was deleted.
	if u := sumExporters(t, addrs, drops, unnamed) - unnamedStart; u != gone {
		t.Errorf("%.0f drops with policy=\"\", %.0f of them after a fence was deleted: %v", u, gone, seriesOf(t, addrs, drops, unnamed))
	}
	for _, r := range results {
		t.Logf("fence-kind %q: agents %.0f, exporters %.0f named %s (%.0f in all, %.0f with policy=\"\"), Hubble %.0f policy verdicts and %.0f drop events; after the delete, %.0f unnamed drops while the agents still enforced it",
			r.name, r.agent, r.zw, r.policy, r.all, r.empty, r.verdicts, r.hubDrops, r.gone)
	}
	t.Logf("TestCiliumLabFenceKinds: %s (the lab's start %s)", time.Since(began).Round(time.Millisecond), lab.StartTime.Round(time.Millisecond))
}

// ciliumApply applies a CiliumNetworkPolicy or
// CiliumClusterwideNetworkPolicy manifest when called and returns its
// removal.
func ciliumApply(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, manifest string) func() func() error {
	return func() func() error {
		ns, name, err := lab.ApplyPolicy(ctx, manifest)
		if err != nil {
			t.Fatal(err)
		}
		return func() error { return lab.DeletePolicy(ctx, ns, name) }
	}
}
