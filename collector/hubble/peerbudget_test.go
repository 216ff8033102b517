package hubble

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/topology"
)

// The budget of named peers bounds the series a job has: it is not given
// back while the job's named series are still exported. A job that goes
// (its pods restarted, re-created by its operator) and comes back within
// the grace period keeps its old named series and may not add
// MaxNamedPeers more.
func TestPeerBudgetHeldWhileItsSeriesRemain(t *testing.T) {
	s := testScenario()
	x := indexOf(s)
	reg := prometheus.NewPedanticRegistry()
	agg := NewAggregator(x, "", time.Hour, nil)
	reg.MustRegister(collectorFunc(agg.Update))
	named := func() (n int) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "zonewatch_job_peer_policy_drops_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "peer_workload" && l.GetValue() != "" {
						n++
					}
				}
			}
		}
		return n
	}
	dropToward := func(first, n int) {
		for i := first; i < first+n; i++ {
			f := policyDrop("gpu-a2", llmWorker, podEP{"data", fmt.Sprintf("svc-%d-0", i), "10.244.7.9", "gpu-c1"})
			f.Destination.Workloads = []*flowpb.Workload{{Name: fmt.Sprintf("svc-%d", i), Kind: "Deployment"}}
			agg.Observe(f)
		}
	}
	dropToward(0, MaxNamedPeers)
	if n := named(); n != MaxNamedPeers {
		t.Fatalf("%d named peer series, want %d", n, MaxNamedPeers)
	}
	// The job's pods go; a scrape sees it gone (its series stay for the
	// grace period); they come back.
	for _, j := range s.Jobs {
		if j.Name == "llm-blocked" {
			for _, p := range j.Pods {
				x.DeletePod(0, p.Namespace, p.Name)
			}
		}
	}
	if x.JobExists("ml-team", "llm-blocked") {
		t.Fatal("the job still exists")
	}
	if n := named(); n != MaxNamedPeers {
		t.Fatalf("%d named peer series within the grace period, want %d", n, MaxNamedPeers)
	}
	for _, j := range s.Jobs {
		if j.Name == "llm-blocked" {
			for _, p := range j.Pods {
				x.UpsertPod(0, topology.Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Node, IPs: []netip.Addr{p.IP},
					Identity: topology.Identity{Kind: j.Kind, Name: j.Name, Role: p.Role}})
			}
		}
	}
	dropToward(MaxNamedPeers, MaxNamedPeers)
	if n := named(); n > MaxNamedPeers {
		t.Errorf("%d named peer series of one job on this exporter, want at most %d (zonewatch_job_peer_policy_drops_total's bound)", n, MaxNamedPeers)
	}
}
