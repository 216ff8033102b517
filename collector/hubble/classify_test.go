package hubble

import (
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zonewatch/zonewatch/topology"
)

// Pods of the test scenario.
var (
	bertCoord  = podEP{"research", "bert-slow-workers-0-0", "10.244.7.2", "gpu-c1"}
	bertWorker = podEP{"research", "bert-slow-workers-1-0", "10.244.1.4", "gpu-a1"}
	llmMaster  = podEP{"ml-team", "llm-blocked-master-0", "10.244.4.2", "gpu-b1"}
	llmWorker  = podEP{"ml-team", "llm-blocked-worker-0", "10.244.2.3", "gpu-a2"}
	resMaster  = podEP{"ml-team", "resnet-healthy-master-0", "10.244.1.2", "gpu-a1"}
	resWorker  = podEP{"ml-team", "resnet-healthy-worker-0", "10.244.1.3", "gpu-a1"}
	frontend   = podEP{"shop", "frontend-0", "10.244.3.2", "cpu-a1"}
)

type podEP struct{ ns, pod, ip, node string }

// flowOf builds a flow src -> dst observed on node, the way Hubble
// describes endpoints (an ID only for local ones).
func flowOf(node string, src, dst podEP, v flowpb.Verdict, event int32) *flowpb.Flow {
	ep := func(p podEP) *flowpb.Endpoint {
		e := &flowpb.Endpoint{Namespace: p.ns, PodName: p.pod, Identity: 30000}
		if p.node == node {
			e.ID = 1234
		}
		return e
	}
	return &flowpb.Flow{
		Time: timestamppb.New(t0), NodeName: "prod/" + node, Verdict: v,
		EventType: &flowpb.CiliumEventType{Type: event},
		IP:        &flowpb.IP{Source: src.ip, Destination: dst.ip},
		L4:        &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: 29500}}},
		Source:    ep(src), Destination: ep(dst),
	}
}

func trace(node string, src, dst podEP, point flowpb.TraceObservationPoint, reply bool) *flowpb.Flow {
	f := flowOf(node, src, dst, flowpb.Verdict_FORWARDED, eventTrace)
	f.TraceObservationPoint = point
	f.IsReply = wrapperspb.Bool(reply)
	return f
}

func TestForwardedCountedOnceOnTheSendingSide(t *testing.T) {
	c := NewClassifier(indexOf(testScenario()), "")
	policyAllowed := flowOf("gpu-c1", bertWorker, bertCoord, flowpb.Verdict_FORWARDED, eventPolicyVerdict)
	l7 := flowOf("gpu-a1", bertWorker, bertCoord, flowpb.Verdict_FORWARDED, 129)
	fromEndpoint := trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_FROM_ENDPOINT, false)
	toProxy := trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_PROXY, false)
	legacy := trace("gpu-a1", resWorker, resMaster, flowpb.TraceObservationPoint_TO_STACK, false)
	oldReply := trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
	oldReply.IsReply, oldReply.Reply = nil, true
	noPoint := flowOf("gpu-a1", bertWorker, bertCoord, flowpb.Verdict_FORWARDED, eventUnknown)
	noPoint.EventType = nil
	for _, tc := range []struct {
		name string
		f    *flowpb.Flow
		want Count
	}{
		{"egress at the sender", trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false), Forwarded},
		{"ingress at the receiver", trace("gpu-c1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_ENDPOINT, false), NotCounted},
		{"reply at the replier", trace("gpu-c1", bertCoord, bertWorker, flowpb.TraceObservationPoint_TO_OVERLAY, true), NotCounted},
		{"reply, old reply field", oldReply, NotCounted},
		{"same node to-endpoint", trace("gpu-a1", resWorker, resMaster, flowpb.TraceObservationPoint_TO_ENDPOINT, false), Forwarded},
		{"same node to-stack (legacy routing) counted at to-endpoint", legacy, NotCounted},
		{"from-endpoint precedes a to- point", fromEndpoint, NotCounted},
		{"to-proxy is a detour", toProxy, NotCounted},
		{"policy verdict allowed", policyAllowed, NotCounted},
		{"L7 event", l7, NotCounted},
		{"file line without event type or point", noPoint, Forwarded},
		{"audit verdict", flowOf("gpu-a1", bertWorker, bertCoord, flowpb.Verdict_AUDIT, eventPolicyVerdict), NotCounted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.Classify(tc.f)
			if r.Count != tc.want {
				t.Fatalf("count %v, want %v (%+v)", r.Count, tc.want, r)
			}
			if r.Count == Forwarded && (r.Job == nil || r.Verdict != VerdictForwarded) {
				t.Errorf("counted without job or verdict: %+v", r)
			}
		})
	}
}

func TestJobAttribution(t *testing.T) {
	c := NewClassifier(indexOf(testScenario()), "")
	// A non-job pod talking to a job pod: the job of the peer.
	r := c.Classify(trace("cpu-a1", frontend, resMaster, flowpb.TraceObservationPoint_TO_STACK, false))
	if r.Count != Forwarded || r.Job == nil || r.Job.Name != "resnet-healthy" || r.Local != SideSource {
		t.Fatalf("non-job sender to a job pod: %+v", r)
	}
	if r.Src.Zone != zoneA || r.Dst.Zone != zoneA || r.Locality != topology.LocalitySameZone {
		t.Errorf("zones %s -> %s (%s)", r.Src.Zone, r.Dst.Zone, r.Locality)
	}
	// Job pod to job pod of another job: the local side's job.
	r = c.Classify(trace("gpu-a1", bertWorker, llmMaster, flowpb.TraceObservationPoint_TO_OVERLAY, false))
	if r.Job == nil || r.Job.Name != "bert-slow" {
		t.Errorf("job %v, want the local side's (bert-slow)", r.Job)
	}
	d := flowOf("gpu-b1", bertWorker, llmMaster, flowpb.Verdict_DROPPED, eventDrop)
	d.DropReasonDesc, d.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
	r = c.Classify(d)
	if r.Job == nil || r.Job.Name != "llm-blocked" || r.Local != SideDestination {
		t.Errorf("ingress drop: job %v local %v, want the destination's (llm-blocked)", r.Job, r.Local)
	}
	// Neither side a job pod: counted, but no job.
	r = c.Classify(trace("cpu-a1", frontend, podEP{"shop", "x", "10.244.1.99", "gpu-a1"}, flowpb.TraceObservationPoint_TO_STACK, false))
	if r.Count != Forwarded || r.Job != nil {
		t.Errorf("non-job traffic: %+v", r)
	}
}

func TestPolicyVerdictAndDropEventCountedOnce(t *testing.T) {
	verdict := func(sec int) *flowpb.Flow {
		f := flowOf("gpu-b1", llmWorker, llmMaster, flowpb.Verdict_DROPPED, eventPolicyVerdict)
		f.Time = timestamppb.New(t0.Add(time.Duration(sec) * time.Second))
		f.DropReasonDesc, f.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
		f.IngressDeniedBy = []*flowpb.Policy{{Namespace: "ml-team", Name: "zone-isolation", Kind: "CiliumNetworkPolicy"}}
		return f
	}
	drop := func(sec int) *flowpb.Flow {
		f := verdict(sec)
		f.EventType.Type, f.IngressDeniedBy = eventDrop, nil
		f.Time = timestamppb.New(f.Time.AsTime().Add(time.Microsecond))
		return f
	}
	for _, tc := range []struct {
		name  string
		flows []*flowpb.Flow
		want  int
	}{
		{"verdict then drop", []*flowpb.Flow{verdict(0), drop(0)}, 1},
		{"drop then verdict", []*flowpb.Flow{drop(0), verdict(0)}, 1},
		{"three retransmissions", []*flowpb.Flow{verdict(0), drop(0), verdict(1), drop(1), verdict(3), drop(3)}, 3},
		{"drop events only", []*flowpb.Flow{drop(0), drop(1), drop(3)}, 3},
		{"verdict events only", []*flowpb.Flow{verdict(0), verdict(1)}, 2},
		{"verdict, and a drop seconds later is another packet", []*flowpb.Flow{verdict(0), drop(2)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClassifier(indexOf(testScenario()), "gpu-b1")
			n, named := 0, 0
			for _, f := range tc.flows {
				r := c.Classify(f)
				if r.Count == Dropped {
					n++
					if !r.PolicyDrop() || r.Reason != ReasonPolicyDenied {
						t.Errorf("not a policy drop: %+v", r)
					}
					if r.Policy() == "ml-team/zone-isolation" {
						named++
					}
				}
			}
			if n != tc.want {
				t.Errorf("counted %d drops, want %d", n, tc.want)
			}
			if tc.flows[0].EventType.Type == eventPolicyVerdict && named == 0 {
				t.Error("the policy name of the verdict event was lost")
			}
		})
	}
}

func TestDropReasonsAndPolicy(t *testing.T) {
	c := NewClassifier(indexOf(testScenario()), "")
	base := func() *flowpb.Flow {
		f := flowOf("gpu-a2", llmWorker, llmMaster, flowpb.Verdict_DROPPED, eventUnknown)
		f.TrafficDirection = flowpb.TrafficDirection_EGRESS
		return f
	}
	deny := base()
	deny.DropReasonDesc = flowpb.DropReason_POLICY_DENY
	deny.EgressDeniedBy = []*flowpb.Policy{{Namespace: "", Name: "no-cross-zone", Kind: "CiliumClusterwideNetworkPolicy"}}
	deny.IngressDeniedBy = []*flowpb.Policy{{Namespace: "x", Name: "wrong-direction"}}
	auth := base()
	auth.DropReasonDesc = flowpb.DropReason_AUTH_REQUIRED
	old := base()
	old.DropReason = 133 // pre-1.12 flows: numeric only
	other := base()
	other.DropReasonDesc = flowpb.DropReason_CT_MAP_INSERTION_FAILED
	for _, tc := range []struct {
		name           string
		f              *flowpb.Flow
		reason, policy string
	}{
		{"deny rule, cluster-wide policy named", deny, ReasonPolicyDeny, "no-cross-zone"},
		{"auth required", auth, ReasonAuthRequired, ""},
		{"numeric drop reason", old, ReasonPolicyDenied, ""},
		{"not a policy drop", other, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.Classify(tc.f)
			if r.Count != Dropped || r.Reason != tc.reason || r.Policy() != tc.policy || r.Direction != DirectionEgress {
				t.Errorf("got count %v reason %q policy %q direction %s", r.Count, r.Reason, r.Policy(), r.Direction)
			}
			if r.Job == nil || r.Job.Name != "llm-blocked" || r.Locality != topology.LocalityCrossZone {
				t.Errorf("job %v locality %s", r.Job, r.Locality)
			}
		})
	}
}

func TestResolveFallbacks(t *testing.T) {
	s := testScenario()
	c := NewClassifier(indexOf(s), "gpu-a1")
	// A job pod whose new IP the informer has not delivered yet: found by
	// namespace/pod_name.
	f := trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
	f.IP.Source = "10.99.0.1"
	r := c.Classify(f)
	if r.Count != Forwarded || r.Job == nil || r.Job.Name != "bert-slow" || r.SrcUnresolved {
		t.Errorf("pod-name fallback: %+v", r)
	}
	// An address the index cannot place, with a local endpoint ID (ENI
	// mode pod of no job): local, unresolved.
	f = trace("gpu-a1", podEP{"shop", "cart", "10.99.0.2", "gpu-a1"}, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
	r = c.Classify(f)
	if r.Count != Forwarded || r.Local != SideSource || !r.SrcUnresolved || r.Job == nil || r.Job.Name != "bert-slow" {
		t.Errorf("endpoint-ID fallback: %+v", r)
	}
	// Another node's flow (a DaemonSet exporter pointed at Relay).
	r = c.Classify(trace("gpu-c1", bertCoord, bertWorker, flowpb.TraceObservationPoint_TO_OVERLAY, false))
	if r.Count != NotCounted {
		t.Errorf("another node's flow counted: %+v", r)
	}
	// No node_name: taken as this node's.
	f = trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
	f.NodeName = ""
	if r := c.Classify(f); r.Count != Forwarded || r.Node != "gpu-a1" {
		t.Errorf("flow without node name: %+v", r)
	}
	// Garbage addresses are unresolved, not fatal.
	f = trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
	f.IP.Destination, f.Destination.PodName = "not-an-ip", ""
	if r := c.Classify(f); !r.DstUnresolved || r.Dst.Zone != topology.UnknownZone {
		t.Errorf("bad address: %+v", r)
	}
}

func TestObservingNode(t *testing.T) {
	for in, want := range map[string]string{"": "", "kind-worker": "kind-worker", "kind-kind/kind-worker": "kind-worker", "a/b/c": "c"} {
		if got := observingNode(in); got != want {
			t.Errorf("observingNode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestClassifyDoesNotAllocate(t *testing.T) {
	s := testScenario()
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	flows := []*flowpb.Flow{
		trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false),
		trace("gpu-c1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_ENDPOINT, false),
	}
	d := flowOf("gpu-b1", llmWorker, llmMaster, flowpb.Verdict_DROPPED, eventPolicyVerdict)
	d.DropReasonDesc, d.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
	d.IngressDeniedBy = []*flowpb.Policy{{Namespace: "ml-team", Name: "zone-isolation"}}
	flows = append(flows, d)
	for _, f := range flows {
		agg.Observe(f) // create the series
	}
	if n := testing.AllocsPerRun(200, func() {
		for _, f := range flows {
			agg.cls.Classify(f)
		}
	}); n != 0 {
		t.Errorf("Classify allocates %v times per run", n)
	}
	if n := testing.AllocsPerRun(200, func() {
		for _, f := range flows {
			agg.Observe(f)
		}
	}); n != 0 {
		t.Errorf("Observe allocates %v times per run once the series exist", n)
	}
}

// Host addresses the index places are the cluster's, whatever identity
// Hubble gave them: the drop of a connection from gpu-a1's cilium_host
// router address, which Cilium v1.20.2 showed with the world identity in
// the lab, is counted with gpu-a1's zone and peer "cluster", not "world".
func TestPlacedHostAddressIsNotWorld(t *testing.T) {
	agg := NewAggregator(indexOf(testScenario()), "gpu-b1", time.Minute, nil)
	f := policyDrop("gpu-b1", podEP{"", "", "10.244.1.1", "gpu-a1"}, llmMaster)
	f.Source = &flowpb.Endpoint{Identity: identityWorld, Labels: []string{"reserved:world"}}
	r := agg.Observe(f)
	if r.Peer != PeerCluster || r.Src.Zone != zoneA || r.Locality != topology.LocalityCrossZone || r.SrcUnresolved {
		t.Errorf("router address of gpu-a1: %+v", r)
	}
	if n := agg.PeerDrops().Len(); n != 1 {
		t.Fatalf("%d peer drop series", n)
	}
	agg.PeerDrops().Each(func(k PeerDropKey, _ float64) {
		if k.Peer != PeerCluster {
			t.Errorf("peer drop %+v", k)
		}
	})
}

// linkLocalDrop is a pod's IPv6 router solicitation as Cilium v1.20.2's
// parser shows it when the agent runs with IPv6 off (bpf_lxc drops the
// frame as DROP_UNKNOWN_L3, 139, with the pod's identity and no
// destination identity): the link-local source is no endpoint's address,
// so Hubble names no pod and gives no endpoint ID, and the direction comes
// out as ingress (the drop's endpoint is not the source's ID 0).
func linkLocalDrop(node string) *flowpb.Flow {
	return &flowpb.Flow{
		Time: timestamppb.New(t0), NodeName: "prod/" + node, Verdict: flowpb.Verdict_DROPPED,
		DropReason: 139, DropReasonDesc: flowpb.DropReason_UNSUPPORTED_L3_PROTOCOL,
		EventType:        &flowpb.CiliumEventType{Type: eventDrop, SubType: 139},
		TrafficDirection: flowpb.TrafficDirection_INGRESS,
		IP:               &flowpb.IP{Source: "fe80::5c1e:2dff:fe3a:9b41", Destination: "ff02::2", IpVersion: flowpb.IPVersion_IPv6},
		L4:               &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv6{ICMPv6: &flowpb.ICMPv6{Type: 133}}},
		Source:           &flowpb.Endpoint{Identity: 30000, Labels: []string{"k8s:io.kubernetes.pod.namespace=ml-team"}},
		Destination:      &flowpb.Endpoint{},
	}
}

// Link-local and multicast addresses are no cluster address the index
// could place: such a drop is counted as a drop but is not unresolved.
func TestLinkLocalMulticastNotUnresolved(t *testing.T) {
	agg := NewAggregator(indexOf(testScenario()), "gpu-a1", time.Minute, nil)
	for _, f := range []*flowpb.Flow{
		linkLocalDrop("gpu-a1"),
		func() *flowpb.Flow { // MLD report to ff02::16
			f := linkLocalDrop("gpu-a1")
			f.IP.Destination, f.L4 = "ff02::16", &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv6{ICMPv6: &flowpb.ICMPv6{Type: 143}}}
			return f
		}(),
		func() *flowpb.Flow { // MLDv2 report from the unspecified address (before the link-local address is ready)
			f := linkLocalDrop("gpu-a1")
			f.IP.Source, f.IP.Destination = "::", "ff02::16"
			f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv6{ICMPv6: &flowpb.ICMPv6{Type: 143}}}
			return f
		}(),
		func() *flowpb.Flow { // duplicate-address probe: neighbour solicitation from :: to the solicited-node group
			f := linkLocalDrop("gpu-a1")
			f.IP.Source, f.IP.Destination = "::", "ff02::1:ff3a:9b41"
			f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv6{ICMPv6: &flowpb.ICMPv6{Type: 135}}}
			return f
		}(),
		func() *flowpb.Flow { // IPv4 link-local and multicast
			f := linkLocalDrop("gpu-a1")
			f.IP.Source, f.IP.Destination = "169.254.3.7", "224.0.0.251"
			return f
		}(),
	} {
		r := agg.Observe(f)
		if r.Count != Dropped || r.SrcUnresolved || r.DstUnresolved {
			t.Errorf("%s -> %s: %+v", f.GetIP().GetSource(), f.GetIP().GetDestination(), r)
		}
	}
	m := agg.Metrics()
	if s, d := testutil.ToFloat64(m.UnresolvedSrc), testutil.ToFloat64(m.UnresolvedDst); s != 0 || d != 0 {
		t.Errorf("unresolved %v/%v, want 0", s, d)
	}
	// An address of the cluster's that the index cannot place still is.
	f := linkLocalDrop("gpu-a1")
	f.IP.Source = "10.250.0.9"
	if r := agg.Observe(f); !r.SrcUnresolved {
		t.Errorf("an unplaced cluster address: %+v", r)
	}
}
