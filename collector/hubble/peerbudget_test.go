package hubble

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/fence"
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

// The budget is spent per peer, not per series: a peer whose drops were
// counted before the policies were read (policy "", a fence not yet named)
// and again once they are (the fence named: a second series) holds one
// named slot, so MaxNamedPeers distinct peers are all named.
func TestPeerBudgetSpentPerPeerNotPerSeries(t *testing.T) {
	agg := NewAggregator(indexOf(testScenario()), "", time.Hour, nil)
	set := fence.NewSet()
	agg.SetFences(set)
	const workerID = 30100
	set.PutIdentity(workerID, fence.ParseLabels(map[string]string{"k8s:app": "llm-worker", "k8s:io.kubernetes.pod.namespace": "ml-team"}))
	drop := func(i int) {
		f := policyDrop("gpu-a2", llmWorker, podEP{"data", fmt.Sprintf("svc-%d-0", i), "10.244.7.9", "gpu-c1"})
		f.IngressDeniedBy, f.EgressDeniedBy = nil, nil // a default deny: Cilium names none
		f.Source.Identity = workerID
		f.Destination.Identity = uint32(40000 + i)
		f.Destination.Workloads = []*flowpb.Workload{{Name: fmt.Sprintf("svc-%d", i), Kind: "Deployment"}}
		set.PutIdentity(uint32(40000+i), fence.ParseLabels(map[string]string{"k8s:app": fmt.Sprintf("svc-%d", i), "k8s:io.kubernetes.pod.namespace": "data"}))
		agg.Observe(f)
	}
	drop(0) // before the policies synced: policy=""
	p, err := fence.Parse([]byte(`{"metadata":{"namespace":"ml-team","name":"worker-egress"},
	  "spec":{"endpointSelector":{"matchLabels":{"app":"llm-worker"}},"egress":[{"toEndpoints":[{"matchLabels":{"app":"nobody"}}]}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	set.Put(p)
	for i := range MaxNamedPeers {
		drop(i) // the fence named from now on
	}
	workloads := map[string]bool{}
	policies := map[string]bool{}
	agg.PeerDrops().Each(func(k PeerDropKey, _ float64) {
		workloads[k.PeerWorkload] = true
		policies[k.PolicyName] = true
	})
	if !policies[""] || !policies["ml-team/worker-egress"] {
		t.Fatalf("policies %v: want the peer counted unnamed, then named", policies)
	}
	for i := range MaxNamedPeers {
		if w := fmt.Sprintf("svc-%d", i); !workloads[w] {
			t.Errorf("peer %s not named (named: %v): its slot went to svc-0's second series", w, workloads)
		}
	}
	if workloads[""] {
		t.Errorf("a peer counted without its name: %v", workloads)
	}
}
