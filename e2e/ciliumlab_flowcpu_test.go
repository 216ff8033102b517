package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/collector/probe"
	"github.com/zonewatch/zonewatch/internal/ciliumlab"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// cpuSample is what one look at the exporters and agents reads.
type cpuSample struct {
	exporter, agents, flows float64
	at                      time.Time
}

// measureFlowCPU runs one DaemonSet-mode exporter (the chart's args,
// ServiceAccount and securityContext) on each end's node and drives short
// TCP connections from src's node to dst: at the rate issue 34 was
// measured at (6,000 in 22 s), then from one pod one at a time as fast as
// it dials, then from four pods at once (the highest rate the lab drives
// here). For each burst it prints, from the same run, the exporters' CPU
// per Hubble flow they processed and the exporters' CPU against the two
// agents' CPU over the same window, both less their idle rates measured
// before:
//
//	flow-cpu: burst=<paced|serial|parallel> conns=N flows=F rate=R/s exporter_cpu_s=E agent_cpu_s=A us_per_flow=U exporter_vs_agents=X
//
// Measured, not asserted (issue 34's goals: <= 0.1x the agents, <= 5 us a
// flow at the highest rate); the figures are in docs/performance.md.
func measureFlowCPU(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, api *testenv.APIServer, src, dst *ciliumlab.Pod) {
	nodes := []*ciliumlab.Node{src.Node, dst.Node}
	addrs := startChartExporters(t, lab, api, nodes, noGPU)
	// Three more client pods beside src: a pod's sandbox makes one socket
	// at a time, so four pods dial four at once.
	clients := []*ciliumlab.Pod{src}
	for i := range 3 {
		p, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: src.Spec.Namespace, Name: fmt.Sprintf("%s-load-%d", src.Spec.Name, i),
			Node: src.Node.Name, Labels: src.Spec.Labels})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.SettledIdentity(ctx); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, p)
	}

	sample := func() cpuSample {
		s := cpuSample{
			exporter: sumExporters(t, addrs, "process_cpu_seconds_total", nil),
			flows:    sumExporters(t, addrs, "zonewatch_hubble_flows_processed_total", nil),
			at:       time.Now(),
		}
		for _, n := range nodes {
			c, err := testenv.ProcCPU(n.Agent().Cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			s.agents += c
		}
		return s
	}
	// settle waits until the flows counter stands still for a second.
	settle := func() cpuSample {
		prev := sample()
		for range 30 {
			time.Sleep(time.Second)
			cur := sample()
			if cur.flows == prev.flows {
				return cur
			}
			prev = cur
		}
		return prev
	}
	// The idle rates (informers, probes, conntrack polls; the agents'
	// controllers) over 10 s, subtracted from each burst's.
	i0 := settle()
	time.Sleep(10 * time.Second)
	i1 := sample()
	idleSecs := i1.at.Sub(i0.at).Seconds()
	idleExp, idleAgents := (i1.exporter-i0.exporter)/idleSecs, (i1.agents-i0.agents)/idleSecs
	t.Logf("idle: exporters %.4f CPU-s/s (%.0f flows in %.1f s), agents %.4f CPU-s/s", idleExp, i1.flows-i0.flows, idleSecs, idleAgents)

	target := net.JoinHostPort(dst.IP.String(), strconv.Itoa(probe.DefaultPort))
	// burst opens and closes perPod connections from each pod, paced at
	// every (0: as fast as the pod's sandbox makes them).
	burst := func(name string, pods []*ciliumlab.Pod, perPod int, every time.Duration) {
		var failed atomic.Int64
		s0 := sample()
		var wg sync.WaitGroup
		for _, p := range pods {
			wg.Add(1)
			go func() {
				defer wg.Done()
				next := time.Now()
				for range perPod {
					if every > 0 {
						time.Sleep(time.Until(next))
						next = next.Add(every)
					}
					c, err := p.Dial(target, time.Second)
					if err != nil {
						failed.Add(1)
						continue
					}
					c.Close()
				}
			}()
		}
		wg.Wait()
		dialed := time.Since(s0.at)
		s1 := settle()
		secs := s1.at.Sub(s0.at).Seconds()
		flows := s1.flows - s0.flows
		if flows <= 0 {
			t.Fatalf("%s: the exporters processed no flows of %d connections (%d failed)", name, len(pods)*perPod, failed.Load())
		}
		exp := s1.exporter - s0.exporter - idleExp*secs
		agents := s1.agents - s0.agents - idleAgents*secs
		t.Logf("%s: %d connections (%d failed) from %d pod(s) on %s to %s in %s; %.0f Hubble flows on both nodes; exporters %.2f CPU-s (%.2f with idle), agents %.2f CPU-s (%.2f with idle)",
			name, len(pods)*perPod, failed.Load(), len(pods), src.Node.Name, dst.Ref(), dialed.Round(time.Millisecond), flows,
			exp, s1.exporter-s0.exporter, agents, s1.agents-s0.agents)
		t.Logf("flow-cpu: burst=%s conns=%d flows=%.0f rate=%.0f/s exporter_cpu_s=%.3f agent_cpu_s=%.3f us_per_flow=%.2f exporter_vs_agents=%.3f",
			name, len(pods)*perPod, flows, flows/dialed.Seconds(), exp, agents, exp/flows*1e6, exp/agents)
	}
	// The load issue 34 was measured on (6,000 short connections in 22 s),
	// then one pod as fast as it dials, then four.
	burst("paced", clients[:1], 6000, 22*time.Second/6000)
	burst("serial", clients[:1], 5000, 0)
	burst("parallel", clients, 2500, 0)
}
