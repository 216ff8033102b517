package hubble

import (
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/collector/fence"
	"github.com/zonewatch/zonewatch/topology"
)

// A default-deny drop (POLICY_DENIED, no denied-by: Cilium names no policy)
// counts with the policies that select the coordinator and allow none of
// the worker, policy_source="selected"; a drop Cilium names keeps its name,
// policy_source="cilium"; a peer whose identity the set does not know
// names nothing.
func TestDefaultDenyDropNamesTheSelectingFence(t *testing.T) {
	s := testScenario()
	agg := NewAggregator(indexOf(s), "gpu-b1", time.Minute, nil)
	set := fence.NewSet()
	agg.SetFences(set)
	p, err := fence.Parse([]byte(`{"metadata":{"namespace":"ml-team","name":"coordinator-fence"},
	  "spec":{"endpointSelector":{"matchLabels":{"app":"llm-blocked-master-0"}},
	  "ingress":[{"fromEndpoints":[{"matchExpressions":[{"key":"zone","operator":"In","values":["us-east-1b","us-east-1c"]}]}]}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	set.Put(p)
	lbl := func(app, zone string) fence.Labels {
		return fence.ParseLabels(map[string]string{"k8s:app": app, "k8s:zone": zone, "k8s:io.kubernetes.pod.namespace": "ml-team"})
	}
	set.PutIdentity(30001, lbl("llm-blocked-master-0", zoneB))
	set.PutIdentity(30002, lbl("llm-blocked-worker-0", zoneA))
	drop := func(srcID uint32, port uint32, sec int64, by []*flowpb.Policy) *flowpb.Flow {
		return &flowpb.Flow{Time: timestamppb.New(t0.Add(time.Duration(sec) * time.Second)), NodeName: "gpu-b1",
			Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, EventType: &flowpb.CiliumEventType{Type: 5},
			TrafficDirection: flowpb.TrafficDirection_INGRESS, IngressDeniedBy: by,
			IP:          &flowpb.IP{Source: "10.244.2.3", Destination: "10.244.4.2"},
			L4:          &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000 + port, DestinationPort: port}}},
			Source:      &flowpb.Endpoint{Identity: srcID, Namespace: "ml-team", PodName: "llm-blocked-worker-0"},
			Destination: &flowpb.Endpoint{ID: 7, Identity: 30001, Namespace: "ml-team", PodName: "llm-blocked-master-0"}}
	}
	key := DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: zoneA, DstZone: zoneB,
		Locality: topology.LocalityCrossZone, Peer: PeerJob, Reason: ReasonPolicyDenied}
	agg.Observe(drop(30002, 29500, 0, nil))
	agg.Observe(drop(30002, 29500, 1, nil))
	agg.Observe(drop(30002, 29501, 2, []*flowpb.Policy{{Namespace: "ml-team", Name: "named-by-cilium"}}))
	agg.Observe(drop(40404, 29502, 3, nil)) // identity unknown here
	selected := key
	selected.PolicyName, selected.PolicySource = "ml-team/coordinator-fence", PolicySourceSelected
	named := key
	named.PolicyNamespace, named.PolicyName, named.PolicySource = "ml-team", "named-by-cilium", PolicySourceCilium
	for k, want := range map[DropKey]float64{selected: 2, named: 1, key: 1} {
		if v := agg.Drops().Value(k); v != want {
			t.Errorf("%s policy_source=%q: %v drops, want %v", k.PolicyName, k.PolicySource, v, want)
		}
	}
	again := drop(30002, 29500, 9, nil)
	if a := testing.AllocsPerRun(50, func() { again.Time.Seconds++; agg.Observe(again) }); a != 0 {
		t.Errorf("a named default-deny drop allocates %v times once its series exists", a)
	}
}
