package hubble

import (
	"fmt"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

// policyDrop is a policy-verdict drop of src -> dst at dst's node.
func policyDrop(node string, src, dst podEP) *flowpb.Flow {
	f := flowOf(node, src, dst, flowpb.Verdict_DROPPED, eventPolicyVerdict)
	f.DropReasonDesc, f.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
	if src.node == node {
		f.TrafficDirection = flowpb.TrafficDirection_EGRESS
	}
	f.IngressDeniedBy = []*flowpb.Policy{{Namespace: "ml-team", Name: "zone-isolation"}}
	f.EgressDeniedBy = f.IngressDeniedBy
	return f
}

// Identities as Cilium v1.20 numbers them (pkg/identity/numericidentity.go,
// the datapath's reserved IDs): 1 host, 2 world, 6 remote-node, 9 world-ipv4,
// local scope 1<<24 for CIDR identities, remote-node scope 2<<24.
func TestPeerRelation(t *testing.T) {
	c := NewClassifier(indexOf(testScenario()), "")
	storage := podEP{"data", "minio-0", "10.244.7.9", "gpu-c1"} // no job; in gpu-c1's pod CIDR
	outside := podEP{"", "", "203.0.113.5", ""}
	withID := func(f *flowpb.Flow, src bool, id uint32, workload string) *flowpb.Flow {
		ep := f.Destination
		if src {
			ep = f.Source
		}
		ep.Identity = id
		if workload != "" {
			ep.Workloads = []*flowpb.Workload{{Name: workload, Kind: "StatefulSet"}}
		} else {
			ep.Namespace, ep.PodName = "", ""
		}
		return f
	}
	for _, tc := range []struct {
		name          string
		f             *flowpb.Flow
		job, peer     string
		peerNamespace string
		peerWorkload  string
	}{
		{"worker -> coordinator of one job", policyDrop("gpu-b1", llmWorker, llmMaster), "llm-blocked", PeerJob, "", ""},
		{"forward within one job", trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false), "bert-slow", PeerJob, "", ""},
		{"another training job, named by its job", policyDrop("gpu-a1", bertWorker, llmMaster), "bert-slow", PeerCluster, "ml-team", "llm-blocked"},
		{"the job is the drop's peer side", policyDrop("gpu-c1", llmWorker, storage), "llm-blocked", PeerCluster, "", ""},
		{"a non-job pod named by Hubble's workload", withID(policyDrop("gpu-a2", llmWorker, storage), false, 41234, "minio"), "llm-blocked", PeerCluster, "data", "minio"},
		{"a node address (host)", withID(policyDrop("gpu-b1", podEP{"", "", "172.18.0.11", "gpu-a2"}, llmMaster), true, 6, ""), "llm-blocked", PeerCluster, "", ""},
		{"remote-node scope, unknown address", withID(policyDrop("gpu-b1", outside, llmMaster), true, 2<<24|5, ""), "llm-blocked", PeerCluster, "", ""},
		{"world", withID(policyDrop("gpu-b1", outside, llmMaster), true, identityWorldIPv4, ""), "llm-blocked", PeerWorld, "", ""},
		// Cilium v1.20.2 in the lab (issue 26) gave a remote node's
		// cilium_host router address (in its pod CIDR) the world identity:
		// the index places it, so it is the cluster's.
		{"a router address the index places, with the world identity", withID(policyDrop("gpu-b1", podEP{"", "", "10.244.1.1", "gpu-a1"}, llmMaster), true, identityWorld, ""), "llm-blocked", PeerCluster, "", ""},
		{"a node address the index places, with the world identity", withID(policyDrop("gpu-b1", podEP{"", "", "172.18.0.11", "gpu-a2"}, llmMaster), true, identityWorldIPv4, ""), "llm-blocked", PeerCluster, "", ""},
		{"world by label", func() *flowpb.Flow {
			f := withID(policyDrop("gpu-b1", outside, llmMaster), true, 0, "")
			f.Source.Labels = []string{"reserved:world"}
			return f
		}(), "llm-blocked", PeerWorld, "", ""},
		{"an address nobody places", withID(policyDrop("gpu-b1", outside, llmMaster), true, 0, ""), "llm-blocked", PeerUnknown, "", ""},
	} {
		r := c.Classify(tc.f)
		if r.Job == nil || r.Job.Name != tc.job {
			t.Errorf("%s: job %v, want %s", tc.name, r.Job, tc.job)
			continue
		}
		if r.Peer != tc.peer || r.PeerNamespace != tc.peerNamespace || r.PeerWorkload != tc.peerWorkload {
			t.Errorf("%s: peer %s %q/%q, want %s %q/%q", tc.name, r.Peer, r.PeerNamespace, r.PeerWorkload, tc.peer, tc.peerNamespace, tc.peerWorkload)
		}
	}
	// A local-scope (CIDR) identity is never a cluster peer.
	if clusterIdentity(1<<24|1) || clusterIdentity(identityWorld) || clusterIdentity(0) || !clusterIdentity(1) || !clusterIdentity(70000) {
		t.Error("clusterIdentity misreads the scopes")
	}
}

func TestPeerDropsNamedAndBounded(t *testing.T) {
	agg := NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
	// The job's own drop: peer job, not in the peer counter.
	agg.Observe(policyDrop("gpu-b1", llmWorker, llmMaster))
	// Drops toward MaxNamedPeers+3 workloads of another namespace.
	for i := range MaxNamedPeers + 3 {
		f := policyDrop("gpu-a2", llmWorker, podEP{"data", fmt.Sprintf("svc-%d-0", i), "10.244.7.9", "gpu-c1"})
		f.Destination.Workloads = []*flowpb.Workload{{Name: fmt.Sprintf("svc-%d", i), Kind: "Deployment"}}
		agg.Observe(f)
		agg.Observe(f)
	}
	named, unnamed := 0, 0.0
	agg.PeerDrops().Each(func(k PeerDropKey, v float64) {
		if k.Peer != PeerCluster || k.Locality != topology.LocalityCrossZone || k.PolicyName != "zone-isolation" {
			t.Errorf("peer drop %+v", k)
		}
		if k.PeerWorkload == "" {
			unnamed += v
			return
		}
		named++
		if v != 2 {
			t.Errorf("%s: %v drops, want 2", k.PeerWorkload, v)
		}
	})
	if named != MaxNamedPeers || unnamed != 6 {
		t.Errorf("%d named peers and %v unnamed drops, want %d and 6", named, unnamed, MaxNamedPeers)
	}
	own := DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: zoneA, DstZone: zoneB,
		Locality: topology.LocalityCrossZone, Peer: PeerJob, Reason: ReasonPolicyDenied, PolicyNamespace: "ml-team", PolicyName: "zone-isolation", PolicySource: PolicySourceCilium}
	if v := agg.Drops().Value(own); v != 1 {
		t.Errorf("own drop = %v, want 1", v)
	}
	// The exposition carries the peer labels.
	agg = NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
	agg.Observe(policyDrop("gpu-a2", llmWorker, podEP{"data", "minio-0", "10.244.7.9", "gpu-c1"}))
	want := `
# HELP zonewatch_job_peer_policy_drops_total ` + peerDropsHelp() + `
# TYPE zonewatch_job_peer_policy_drops_total counter
zonewatch_job_peer_policy_drops_total{job_name="llm-blocked",locality="cross_zone",namespace="ml-team",peer="cluster",peer_namespace="",peer_workload="",policy="ml-team/zone-isolation",policy_source="cilium"} 1
`
	if err := testutil.CollectAndCompare(agg.PeerDrops(), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func peerDropsHelp() string {
	s := peerDropsDesc.String()
	i := strings.Index(s, `help: "`) + len(`help: "`)
	return s[i : i+strings.Index(s[i:], `"`)]
}

// TestPeerDropsDoNotAllocate extends the hot-path check to a drop toward
// a peer outside the job and a forward toward the world.
func TestPeerDropsDoNotAllocate(t *testing.T) {
	agg := NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
	toStorage := policyDrop("gpu-a2", llmWorker, podEP{"data", "minio-0", "10.244.7.9", "gpu-c1"})
	toStorage.Destination.Workloads = []*flowpb.Workload{{Name: "minio", Kind: "StatefulSet"}}
	toWorld := trace("gpu-a1", bertWorker, podEP{"", "", "203.0.113.5", ""}, flowpb.TraceObservationPoint_TO_STACK, false)
	toWorld.Destination.Identity = identityWorld
	flows := []*flowpb.Flow{toStorage, toWorld, policyDrop("gpu-b1", llmWorker, llmMaster)}
	for _, f := range flows {
		agg.Observe(f)
	}
	if n := testing.AllocsPerRun(200, func() {
		for _, f := range flows {
			agg.Observe(f)
		}
	}); n != 0 {
		t.Errorf("Observe allocates %v times per run once the series exist", n)
	}
}

// TestFieldMaskKeepsPeerWorkload: the live client's field mask, applied by
// Cilium's own fieldmask package (sim.MaskFlow), keeps what names the peer
// workload; without source/destination.workloads a masked drop would count
// unnamed.
func TestFieldMaskKeepsPeerWorkload(t *testing.T) {
	f := policyDrop("gpu-a2", llmWorker, podEP{"data", "minio-0", "10.244.7.9", "gpu-c1"})
	f.Destination.Workloads = []*flowpb.Workload{{Name: "minio", Kind: "StatefulSet"}}
	masked, err := sim.MaskFlow(f, FieldMaskPaths)
	if err != nil {
		t.Fatal(err)
	}
	r := NewClassifier(indexOf(testScenario()), "").Classify(masked)
	if r.Peer != PeerCluster || r.PeerNamespace != "data" || r.PeerWorkload != "minio" {
		t.Errorf("masked drop: peer %s %q/%q, want cluster data/minio (FieldMaskPaths: %v)", r.Peer, r.PeerNamespace, r.PeerWorkload, FieldMaskPaths)
	}
}
