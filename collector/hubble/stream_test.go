package hubble

import (
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

var (
	blockedDrops = DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: zoneA, DstZone: zoneB,
		Locality: topology.LocalityCrossZone, Peer: PeerJob, Reason: ReasonPolicyDenied, PolicyNamespace: "ml-team", PolicyName: "zone-isolation", PolicySource: PolicySourceCilium}
	blockedForwarded = EventKey{Namespace: "ml-team", Job: "llm-blocked", SrcZone: zoneA, DstZone: zoneB, Locality: topology.LocalityCrossZone, Peer: PeerJob, Verdict: VerdictForwarded}
	blockedDropped   = EventKey{Namespace: "ml-team", Job: "llm-blocked", SrcZone: zoneA, DstZone: zoneB, Locality: topology.LocalityCrossZone, Peer: PeerJob, Verdict: VerdictDropped}
	bertToCoord      = EventKey{Namespace: "research", Job: "bert-slow", SrcZone: zoneA, DstZone: zoneC, Locality: topology.LocalityCrossZone, Peer: PeerJob, Verdict: VerdictForwarded}
	bertFromCoord    = EventKey{Namespace: "research", Job: "bert-slow", SrcZone: zoneC, DstZone: zoneA, Locality: topology.LocalityCrossZone, Peer: PeerJob, Verdict: VerdictForwarded}
	resnetLocal      = EventKey{Namespace: "ml-team", Job: "resnet-healthy", SrcZone: zoneA, DstZone: zoneA, Locality: topology.LocalitySameZone, Peer: PeerJob, Verdict: VerdictForwarded}
)

// want is the count of each series after seconds of the test scenario.
func want(seconds float64) (map[DropKey]float64, map[EventKey]float64) {
	return map[DropKey]float64{
			blockedDrops: 2 * 1 * seconds, // 2 workers, 1 packet/s each; verdict + drop event counted once
		}, map[EventKey]float64{
			blockedForwarded: 2 * seconds, // the SYNs leave the workers' node
			blockedDropped:   2 * seconds,
			bertToCoord:      2 * 2 * seconds, // 2 workers, 2/s, seen on both nodes, counted once
			bertFromCoord:    2 * 2 * seconds,
			resnetLocal:      2 * 2 * 2 * seconds, // 2 workers, both directions, 2/s
		}
}

// settle waits until the clients' aggregators hold the wanted counts and
// the clients have received every flow the servers sent, so that a double
// count would show, then checks the counts.
func settle(t *testing.T, seconds float64, hs []*sim.Hubble, cs ...*Client) {
	t.Helper()
	var aggs []*Aggregator
	for _, c := range cs {
		aggs = append(aggs, c.agg)
	}
	drops, events := want(seconds)
	sumDrops := func(k DropKey) (v float64) {
		for _, a := range aggs {
			v += a.Drops().Value(k)
		}
		return v
	}
	sumEvents := func(k EventKey) (v float64) {
		for _, a := range aggs {
			v += a.Events().Value(k)
		}
		return v
	}
	reached := func() bool {
		for k, v := range drops {
			if sumDrops(k) < v {
				return false
			}
		}
		for k, v := range events {
			if sumEvents(k) < v {
				return false
			}
		}
		return true
	}
	waitFor(t, "the expected counts and every flow sent", func() bool { return reached() && delivered(hs, cs...) })
	for k, v := range drops {
		if got := sumDrops(k); got != v {
			t.Errorf("drops %+v = %v, want %v", k, got, v)
		}
	}
	for k, v := range events {
		if got := sumEvents(k); got != v {
			t.Errorf("flow events %+v = %v, want %v", k, got, v)
		}
	}
	total := 0
	for _, a := range aggs {
		total += a.Drops().Len()
	}
	if total != len(drops) {
		for _, a := range aggs {
			a.Drops().Each(func(k DropKey, v float64) { t.Logf("drop series %+v = %v", k, v) })
		}
		t.Errorf("%d drop series, want %d", total, len(drops))
	}
}

func TestDropsAttributedToJobZonesAndPolicy(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	reg := prometheus.NewPedanticRegistry()
	agg := NewAggregator(indexOf(s), "", time.Minute, NewMetrics(reg))
	c := follow(t, sock, agg, true)
	h.Generate(t0, 10*time.Second)
	settle(t, 10, []*sim.Hubble{h}, c)
	if !c.Up() {
		t.Error("client not up while streaming")
	}
	// The series render with the contract's labels.
	reg.MustRegister(collectorFunc(agg.Update))
	if n, err := testutil.GatherAndCount(reg, "zonewatch_job_policy_drops_total"); err != nil || n != 1 {
		t.Fatalf("gathered %d policy-drop series, err %v", n, err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "zonewatch_job_policy_drops_total" {
			continue
		}
		got := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		wantLabels := map[string]string{"namespace": "ml-team", "job_name": "llm-blocked", "direction": "ingress",
			"src_zone": zoneA, "dst_zone": zoneB, "locality": "cross_zone", "peer": "job", "reason": "POLICY_DENIED", "policy": "ml-team/zone-isolation", "policy_source": "cilium"}
		for k, v := range wantLabels {
			if got[k] != v {
				t.Errorf("label %s = %q, want %q", k, got[k], v)
			}
		}
		if len(got) != len(wantLabels) {
			t.Errorf("labels %v, want exactly %v", got, wantLabels)
		}
	}
}

// collectorFunc registers an Update function (unchecked collector).
type collectorFunc func(chan<- prometheus.Metric) error

func (f collectorFunc) Describe(chan<- *prometheus.Desc) {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) {
	if err := f(ch); err != nil {
		panic(err)
	}
}

// One exporter per node (DaemonSet): each connection is seen on both
// nodes, and the per-node exporters together count it once, like Relay.
func TestFlowSeenOnBothNodesCountedOnce(t *testing.T) {
	s := testScenario()
	x := indexOf(s)
	var aggs []*Aggregator
	var clients []*Client
	var servers []*sim.Hubble
	for _, n := range s.Nodes {
		h, sock := startHubble(t, s, n.Name, 0)
		agg := NewAggregator(x, n.Name, time.Minute, nil)
		clients = append(clients, follow(t, sock, agg, true))
		aggs = append(aggs, agg)
		servers = append(servers, h)
	}
	for _, h := range servers {
		h.Generate(t0, 10*time.Second)
	}
	settle(t, 10, servers, clients...)
	// Each node counts only what it sent.
	byNode := map[string]*Aggregator{}
	for i, n := range s.Nodes {
		byNode[n.Name] = aggs[i]
	}
	if v := byNode["gpu-c1"].Events().Value(bertToCoord); v != 0 {
		t.Errorf("the receiving node counted %v worker->coordinator events", v)
	}
	if v := byNode["gpu-a1"].Events().Value(bertToCoord); v != 40 {
		t.Errorf("the sending node counted %v worker->coordinator events, want 40", v)
	}
	if v := byNode["gpu-b1"].Drops().Value(blockedDrops); v != 20 {
		t.Errorf("the coordinator's node counted %v drops, want 20", v)
	}
}

func TestReconnectAfterServerRestartNoDoubleCount(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	c := follow(t, sock, agg, true)
	h.Generate(t0, 5*time.Second)
	settle(t, 5, []*sim.Hubble{h}, c)

	h.Stop()
	waitFor(t, "the client to notice", func() bool { return !c.Up() })
	h.Generate(t0.Add(5*time.Second), 5*time.Second) // flows during the gap stay in the ring
	if err := h.Start(sock); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reconnect", c.Up)
	h.Generate(t0.Add(10*time.Second), 5*time.Second)
	settle(t, 15, []*sim.Hubble{h}, c)
	if got := testutil.ToFloat64(agg.Metrics().Reconnects); got != 1 {
		t.Errorf("reconnects = %v, want 1", got)
	}
	// The resume point is the oldest node's last flow, so the server
	// replayed flows counted before; they were skipped.
	if testutil.ToFloat64(c.m.SkippedReplayed) == 0 {
		t.Error("no flow was replayed: the test does not exercise the resume")
	}
}

func TestLostEventsCounted(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "gpu-a1", 0)
	agg := NewAggregator(indexOf(s), "gpu-a1", time.Minute, nil)
	follow(t, sock, agg, true)
	h.SendLost(flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, 7)
	h.SendLost(flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE, 3)
	h.SendLost(flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, 1)
	m := agg.Metrics()
	waitFor(t, "lost events", func() bool {
		return testutil.ToFloat64(m.lost[flowpb.LostEventSource_PERF_EVENT_RING_BUFFER]) == 8 &&
			testutil.ToFloat64(m.lost[flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE]) == 3
	})
	if v := testutil.ToFloat64(m.lost[flowpb.LostEventSource_HUBBLE_RING_BUFFER]); v != 0 {
		t.Errorf("hubble_ring_buffer lost = %v, want 0", v)
	}
}

// A client that falls behind the ring gets lost_events from the server
// (HUBBLE_RING_BUFFER), as with real Hubble.
func TestRingOverrunCountedAsLost(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 16)
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	follow(t, sock, agg, true)
	// Each second of the scenario is far more than 16 flows, published at
	// once: a follower wakes up behind the ring.
	lost := func() float64 {
		return testutil.ToFloat64(agg.Metrics().lost[flowpb.LostEventSource_HUBBLE_RING_BUFFER])
	}
	for i := 0; lost() == 0; i++ {
		if i == 2000 {
			t.Fatal("no ring-buffer lost events")
		}
		h.Generate(t0.Add(time.Duration(i)*time.Second), time.Second)
		time.Sleep(5 * time.Millisecond)
	}
}

func TestUnknownIPsCountedAsUnresolved(t *testing.T) {
	s := testScenario()
	h, sock := startHubble(t, s, "", 0)
	agg := NewAggregator(indexOf(s), "", time.Minute, nil)
	follow(t, sock, agg, true)
	at := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	master := &flowpb.Endpoint{ID: 7, Namespace: "ml-team", PodName: "llm-blocked-master-0"}
	h.Publish(
		// Denied from an address nobody knows (not the world identity).
		&flowpb.Flow{Time: at(1), NodeName: "gpu-b1", Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENIED,
			EventType: &flowpb.CiliumEventType{Type: 1}, TrafficDirection: flowpb.TrafficDirection_INGRESS,
			IP: &flowpb.IP{Source: "192.0.2.7", Destination: "10.244.4.2"}, Source: &flowpb.Endpoint{Identity: 6}, Destination: master},
		// Sent to an unknown address.
		&flowpb.Flow{Time: at(2), NodeName: "gpu-b1", Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4},
			TraceObservationPoint: flowpb.TraceObservationPoint_TO_STACK, IsReply: wrapperspb.Bool(false),
			IP: &flowpb.IP{Source: "10.244.4.2", Destination: "198.51.100.9"}, Source: master, Destination: &flowpb.Endpoint{}},
		// Sent to the internet: not unresolved.
		&flowpb.Flow{Time: at(3), NodeName: "gpu-b1", Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4},
			TraceObservationPoint: flowpb.TraceObservationPoint_TO_STACK, IsReply: wrapperspb.Bool(false),
			IP: &flowpb.IP{Source: "10.244.4.2", Destination: "93.184.216.34"}, Source: master, Destination: &flowpb.Endpoint{Identity: 2}},
		// Sent to a CIDR-policy peer: a local-scope identity (1<<24 | n)
		// whose world label the mask removed: still the internet.
		&flowpb.Flow{Time: at(4), NodeName: "gpu-b1", Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4},
			TraceObservationPoint: flowpb.TraceObservationPoint_TO_STACK, IsReply: wrapperspb.Bool(false),
			IP: &flowpb.IP{Source: "10.244.4.2", Destination: "198.51.100.77"}, Source: master, Destination: &flowpb.Endpoint{Identity: 16777217}},
	)
	m := agg.Metrics()
	waitFor(t, "four flows", func() bool { return testutil.ToFloat64(m.Processed) == 4 })
	if v := testutil.ToFloat64(m.UnresolvedSrc); v != 1 {
		t.Errorf("unresolved sources = %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.UnresolvedDst); v != 1 {
		t.Errorf("unresolved destinations = %v, want 1", v)
	}
	k := DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: topology.UnknownZone, DstZone: zoneB,
		Locality: topology.LocalityUnknown, Peer: PeerCluster, Reason: ReasonPolicyDenied} // remote-node identity
	if v := agg.Drops().Value(k); v != 1 {
		t.Errorf("drop from the unknown address not attributed to the coordinator's job: %v", v)
	}
	toUnknown := EventKey{Namespace: "ml-team", Job: "llm-blocked", SrcZone: zoneB, DstZone: topology.UnknownZone,
		Locality: topology.LocalityUnknown, Verdict: VerdictForwarded}
	var v float64
	agg.Events().Each(func(k EventKey, n float64) {
		if k.Verdict == VerdictForwarded && (k.Peer == PeerCluster || k.Peer == PeerJob) {
			t.Errorf("%+v: a peer outside the cluster counted as %s", k, k.Peer)
		}
		k.Peer = ""
		if k == toUnknown {
			v += n
		}
	})
	if v != 3 {
		t.Errorf("forwarded events to unknown peers = %v, want 3", v)
	}
}
