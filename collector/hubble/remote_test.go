package hubble

import (
	"net/netip"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/collector/fence"
	"github.com/zonewatch/zonewatch/topology"
)

// ipcacheOf is a node's ipcache: each address's identity and node.
type ipcacheOf map[netip.Addr]topology.RemoteEntry

func (c ipcacheOf) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	e, ok := c[a]
	return e, ok
}

// TestRemoteJobsDropCountedWhereDropped: in the per-node view, a pod of a
// job with no pod on this node dials a pod of no job here (a dataset
// server) and this node's fence drops the SYN. The drop counts for the
// remote job, here, as the cluster-wide view counts it: the job is named
// by the remote pod's security identity (the fence's CiliumIdentity
// labels), its node and zone by the ipcache.
func TestRemoteJobsDropCountedWhereDropped(t *testing.T) {
	s := testScenario()
	x := nodesOnly(s) // gpu-b1 holds no pod of llm-blocked in this test
	set := fence.NewSet()
	worker := addr("10.244.2.3") // llm-blocked-worker-0 on gpu-a2 (zone a)
	x.SetRemote("gpu-b1", ipcacheOf{
		worker:                  {NodeIP: addr("172.18.0.11"), Identity: 41000, Bits: 32},
		addr("10.244.4.9"):      {Identity: 42000, Bits: 32}, // the dataset server, here
		addr("10.244.2.7"):      {NodeIP: addr("172.18.0.11"), Identity: 43000, Bits: 32},
		netip.IPv4Unspecified(): {Identity: 2},
	}, set, topology.DefaultRules())
	set.PutIdentity(41000, fence.ParseLabels(map[string]string{
		"k8s:io.kubernetes.pod.namespace":        "ml-team",
		"k8s:training.kubeflow.org/job-name":     "llm-blocked",
		"k8s:training.kubeflow.org/replica-type": "worker",
		"k8s:io.cilium.k8s.policy.cluster":       "default",
	}))
	set.PutIdentity(42000, fence.ParseLabels(map[string]string{"k8s:io.kubernetes.pod.namespace": "data", "k8s:app": "dataset"}))
	agg := NewAggregator(x, "gpu-b1", time.Minute, nil)
	agg.SetFences(set)
	drop := func(src string, id uint32, sec int) *flowpb.Flow {
		return &flowpb.Flow{Time: timestamppb.New(t0.Add(time.Duration(sec) * time.Second)), NodeName: "prod/gpu-b1",
			Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, EventType: &flowpb.CiliumEventType{Type: eventDrop},
			TrafficDirection: flowpb.TrafficDirection_INGRESS,
			IP:               &flowpb.IP{Source: src, Destination: "10.244.4.9"},
			L4:               &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: 8080}}},
			Source:           &flowpb.Endpoint{Identity: id},
			Destination:      &flowpb.Endpoint{ID: 9, Identity: 42000, Namespace: "data", PodName: "dataset-0"}}
	}
	for sec := range 4 {
		agg.Observe(drop(worker.String(), 41000, sec))
	}
	agg.Observe(drop("10.244.2.7", 43000, 9)) // an identity not known here: no job
	want := DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: zoneA, DstZone: zoneB,
		Locality: topology.LocalityCrossZone, Peer: PeerCluster, Reason: ReasonPolicyDenied}
	if got := agg.Drops().Value(want); got != 4 {
		var all []DropKey
		agg.Drops().Each(func(k DropKey, _ float64) { all = append(all, k) })
		t.Fatalf("remote job's drops here: %g, want 4 (%+v)", got, all)
	}
	if n := agg.Drops().Len(); n != 1 {
		t.Errorf("%d drop series, want 1", n)
	}
	if n := uncounted(agg, uncountedNoJob); n != 1 {
		t.Errorf("no_job %g, want 1 (the unknown identity's drop)", n)
	}
	if !x.JobExists("ml-team", "llm-blocked") {
		t.Error("the remote job does not exist for the counters while its identity does")
	}
	set.DeleteIdentity(41000)
	if x.JobExists("ml-team", "llm-blocked") {
		t.Error("the remote job outlives its identity")
	}
}
