package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/internal/ciliumlab"
)

// allowListFence is issue 32's fence: an endpointSelector on the
// coordinator, ingress only fromEndpoints of the job's zones, no
// ingressDeny. Cilium drops the other zones' SYNs as POLICY_DENIED and
// names no policy (cilium#48588).
func allowListFence(job string) string {
	return fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: coordinator-fence
  namespace: ml-team
spec:
  endpointSelector:
    matchLabels:
      training.kubeflow.org/job-name: %s
      training.kubeflow.org/replica-type: master
  ingress:
  - fromEndpoints:
    - matchExpressions:
      - {key: zone, operator: In, values: [%s, %s]}
`, job, zoneB, zoneC)
}

// TestCiliumLabAllowListFence: the real agents drop a split job's SYNs
// under an allow-list fence (a CiliumNetworkPolicy, then a
// CiliumClusterwideNetworkPolicy) by default deny; the agents' drop
// counters and Hubble give the ground truth (Hubble names no policy),
// the DaemonSet exporter on the coordinator's node counts each SYN once
// with the fence named, policy_source="selected".
func TestCiliumLabAllowListFence(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts four Cilium agents")
	}
	inLane(t)
	began := time.Now()
	lab, api, _ := startCiliumLab(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const job, port, tries = "fence-job", 29500, 5
	labels := func(role, zone string) map[string]string {
		return map[string]string{"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": role, "zone": zone}
	}
	add := func(name, node, role, zone string) *ciliumlab.Pod {
		p, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: "ml-team", Name: name, Node: node, Labels: labels(role, zone),
			OwnerAPIVersion: "kubeflow.org/v1", OwnerKind: "PyTorchJob", OwnerName: job, Ports: []int32{port}})
		if err != nil {
			t.Fatal(err)
		}
		// The fence selects the master by its job labels and its peers by zone.
		if _, err := p.SettledIdentity(ctx, "zone", "training.kubeflow.org/job-name", "training.kubeflow.org/replica-type"); err != nil {
			t.Fatal(err)
		}
		return p
	}
	master := add(job+"-master-0", "cpu-b1", "master", zoneB)
	workers := []*ciliumlab.Pod{add(job+"-worker-0", "gpu-a1", "worker", zoneA), add(job+"-worker-1", "gpu-a2", "worker", zoneA)}
	acceptAndClose(t, master, port)

	// The DaemonSet exporter of the coordinator's node: the chart's args,
	// ServiceAccount and ClusterRole (list/watch cilium.io).
	n := lab.Node("cpu-b1")
	addrs := startChartExporters(t, lab, api, []*ciliumlab.Node{n}, noGPU)
	dst := net.JoinHostPort(master.IP.String(), fmt.Sprint(port))
	// blocked waits until the fence reaches the coordinator's datapath.
	blocked := func() bool {
		for range 60 {
			c, err := workers[0].Dial(dst, 500*time.Millisecond)
			if err != nil {
				return true
			}
			c.Close()
			time.Sleep(500 * time.Millisecond)
		}
		return false
	}
	for _, fc := range []struct{ name, manifest, policy string }{
		{"CiliumNetworkPolicy", allowListFence(job), "ml-team/coordinator-fence"},
		{"CiliumClusterwideNetworkPolicy", allowFence(), "zone-fence-allow"},
	} {
		before := agentPolicyDrops(agentDrops(t, lab), "cpu-b1")
		allBefore := sumExporters(t, addrs, "zonewatch_job_policy_drops_total", map[string]string{"job_name": job})
		ns, name, err := lab.ApplyPolicy(ctx, fc.manifest)
		if err != nil {
			t.Fatal(err)
		}
		if !blocked() {
			t.Fatalf("%s: the workers still reach the coordinator", fc.name)
		}
		// The probing SYNs' drops: counted by the exporter before the
		// baseline is taken (a fixed pause was too short on a loaded machine).
		eventually(t, time.Minute, fc.name+": the probes' drops reach the exporter", func() (bool, string) {
			agent := agentPolicyDrops(agentDrops(t, lab), "cpu-b1") - before
			zw := sumExporters(t, addrs, "zonewatch_job_policy_drops_total", map[string]string{"job_name": job}) - allBefore
			return agent > 0 && zw == agent, fmt.Sprintf("agent %g, zonewatch %g", agent, zw)
		})
		selected := map[string]string{"namespace": "ml-team", "job_name": job, "policy": fc.policy, "policy_source": "selected", "reason": "POLICY_DENIED"}
		agent0, zw0 := agentDrops(t, lab), sumExporters(t, addrs, "zonewatch_job_policy_drops_total", selected)
		all0 := sumExporters(t, addrs, "zonewatch_job_policy_drops_total", map[string]string{"job_name": job})
		since := time.Now()
		for _, w := range workers {
			for range tries {
				if c, err := w.Dial(dst, 500*time.Millisecond); err == nil {
					c.Close()
					t.Errorf("%s: %s reached the coordinator", fc.name, w.Spec.Name)
				}
			}
		}
		// The agent counts a drop in its datapath as it drops (a dial's
		// 500 ms is past it); the exporter once Hubble's event arrives.
		agent := agentPolicyDrops(agentDrops(t, lab), "cpu-b1") - agentPolicyDrops(agent0, "cpu-b1")
		hub := policyDrops(t, n, master, port, since)
		var zw, all float64
		deadline := time.Now().Add(time.Minute)
		for {
			zw = sumExporters(t, addrs, "zonewatch_job_policy_drops_total", selected) - zw0
			all = sumExporters(t, addrs, "zonewatch_job_policy_drops_total", map[string]string{"job_name": job}) - all0
			if all >= agent || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		t.Logf("%s: %d SYNs tried; the agent on cpu-b1 counted %.0f policy drops, its Hubble %v; zonewatch %.0f with policy=%q policy_source=\"selected\" (%.0f in all): series %v",
			fc.name, len(workers)*tries, agent, hub, zw, fc.policy, all,
			seriesOf(t, addrs, "zonewatch_job_policy_drops_total", map[string]string{"job_name": job}))
		for k := range hub {
			if strings.Contains(k, "/") {
				t.Errorf("%s: Hubble named a policy (%s): not a default-deny drop", fc.name, k)
			}
		}
		if agent == 0 || zw != agent || all != agent {
			t.Errorf("%s: the agent dropped %.0f, zonewatch counted %.0f named %q (%.0f in all)", fc.name, agent, zw, fc.policy, all)
		}
		if err := lab.DeletePolicy(ctx, ns, name); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("TestCiliumLabAllowListFence: %s", time.Since(began).Round(time.Millisecond))
}

// agentPolicyDrops sums an agentDrops reading's policy drops on one node.
func agentPolicyDrops(drops map[string]float64, node string) float64 {
	var n float64
	for k, v := range drops {
		if strings.HasPrefix(k, node+" ") && strings.Contains(k, "Policy denied") {
			n += v
		}
	}
	return n
}

// acceptAndClose makes p accept every connection on port and close it at
// once (a SYN that gets through is a connection), until the test ends.
func acceptAndClose(t *testing.T, p *ciliumlab.Pod, port int) {
	t.Helper()
	ln, err := p.Listen(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}
