package hubble

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

// nodesOnly is the view before its pod informers have delivered: the
// nodes, no job pod.
func nodesOnly(s *sim.Scenario) *topology.Index {
	x := topology.NewIndex()
	for _, n := range s.Nodes {
		x.UpsertNode(topology.Node{Name: n.Name, Zone: n.Zone, Region: s.Region, Addresses: []netip.Addr{n.IP}, PodCIDRs: []netip.Prefix{n.PodCIDR}})
	}
	return x
}

// catchUp delivers the scenario's job pods to x, as late informer
// handlers do.
func catchUp(x *topology.Index, s *sim.Scenario) {
	for _, j := range s.Jobs {
		for _, p := range j.Pods {
			x.UpsertPod(0, topology.Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Node, IPs: []netip.Addr{p.IP},
				Identity: topology.Identity{Kind: j.Kind, Name: j.Name, Role: p.Role}})
		}
	}
}

// clock is a settable time for the hold.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func holdingAggregator(x *topology.Index, node string) (*Aggregator, *clock) {
	a := NewAggregator(x, node, time.Minute, nil)
	a.SetHold(DefaultHold)
	c := &clock{t: time.Unix(1e9, 0)}
	a.held.now = c.now
	return a, c
}

// blockedSYN is the policy-verdict and drop event pair of one denied SYN
// of llm-blocked's worker to its master, as the master's node reports it.
func blockedSYN(sec int) []*flowpb.Flow {
	v := flowOf("gpu-b1", llmWorker, llmMaster, flowpb.Verdict_DROPPED, eventPolicyVerdict)
	v.Time = timestamppb.New(t0.Add(time.Duration(sec) * time.Second))
	v.DropReasonDesc, v.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
	v.IngressDeniedBy = []*flowpb.Policy{{Namespace: "ml-team", Name: "zone-isolation", Kind: "CiliumNetworkPolicy"}}
	d := flowOf("gpu-b1", llmWorker, llmMaster, flowpb.Verdict_DROPPED, eventDrop)
	d.Time = timestamppb.New(v.Time.AsTime().Add(time.Microsecond))
	d.DropReasonDesc, d.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
	return []*flowpb.Flow{v, d}
}

func uncounted(a *Aggregator, reason string) float64 {
	return testutil.ToFloat64(a.m.Uncounted[reason])
}

// accounted checks that every processed flow is counted, uncounted with a
// reason, or held.
func accounted(t *testing.T, a *Aggregator) {
	t.Helper()
	var counted float64
	a.Events().Each(func(_ EventKey, v float64) { counted += v })
	var un float64
	for _, c := range a.m.Uncounted {
		un += testutil.ToFloat64(c)
	}
	if p := testutil.ToFloat64(a.m.Processed); p != counted+un+float64(a.Held()) {
		t.Errorf("processed %g flows: %g counted, %g uncounted, %d held", p, counted, un, a.Held())
	}
}

// TestDropsBeforeTheViewPlacesTheJobAreCounted: the first SYNs of a job
// are dropped while its node's exporter does not yet hold the job's pods
// (informers still listing, handlers late on a busy node); once the view
// has them, every drop is counted for the job with its zones and policy,
// none lost.
func TestDropsBeforeTheViewPlacesTheJobAreCounted(t *testing.T) {
	s := testScenario()
	x := nodesOnly(s)
	a, clk := holdingAggregator(x, "gpu-b1")
	for sec := range 10 {
		for _, f := range blockedSYN(sec) {
			a.Observe(f)
		}
	}
	if n := a.Drops().Len(); n != 0 {
		t.Fatalf("%d drop series before the view knows the job", n)
	}
	if h := a.Held(); h != 10 {
		t.Fatalf("held %d flows, want the 10 drops (their paired events are uncounted as kind)", h)
	}
	accounted(t, a)

	clk.advance(5 * time.Second)
	a.Retry()
	if h := a.Held(); h != 10 {
		t.Fatalf("held %d after a retry with the view still empty, want 10", h)
	}
	catchUp(x, s)
	clk.advance(time.Second)
	a.Retry()
	want := DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: zoneA, DstZone: zoneB,
		Locality: "cross_zone", Peer: PeerJob, Reason: ReasonPolicyDenied, PolicyNamespace: "ml-team", PolicyName: "zone-isolation",
		PolicySource: PolicySourceCilium}
	if got := a.Drops().Value(want); got != 10 {
		var all []string
		a.Drops().Each(func(k DropKey, v float64) { all = append(all, k.Job+" "+k.SrcZone+">"+k.DstZone+" "+k.Peer) })
		t.Fatalf("drops %+v: %g, want 10 (series: %v)", want, got, all)
	}
	if h := a.Held(); h != 0 {
		t.Errorf("%d flows still held", h)
	}
	accounted(t, a)
	if n := uncounted(a, uncountedNoJob); n != 0 {
		t.Errorf("%g flows uncounted as no_job", n)
	}
}

// TestPodOfNoJobHeldOnceThenUncounted: a pod of no job has its flows held
// in its first seconds only; after its window they are counted as
// uncounted (no_job) and its later flows are not held.
func TestPodOfNoJobHeldOnceThenUncounted(t *testing.T) {
	s := testScenario()
	x := indexOf(s)
	a, clk := holdingAggregator(x, "cpu-a1")
	out := podEP{"shop", "checkout-0", "10.244.1.9", "gpu-a1"} // a remote pod of no job
	send := func() {
		a.Observe(trace("cpu-a1", frontend, out, flowpb.TraceObservationPoint_TO_OVERLAY, false))
	}
	for range 5 {
		send()
	}
	if h := a.Held(); h != 5 {
		t.Fatalf("held %d, want 5", h)
	}
	clk.advance(DefaultHold / 2)
	send()
	a.Retry()
	if h := a.Held(); h != 6 {
		t.Fatalf("held %d within the window, want 6", h)
	}
	clk.advance(DefaultHold / 2)
	a.Retry()
	if h, n := a.Held(), uncounted(a, uncountedNoJob); h != 0 || n != 6 {
		t.Fatalf("after the window: held %d, no_job %g; want 0 and 6", h, n)
	}
	send()
	if h, n := a.Held(), uncounted(a, uncountedNoJob); h != 0 || n != 7 {
		t.Fatalf("a later flow: held %d, no_job %g; want 0 and 7", h, n)
	}
	accounted(t, a)
}

// TestHoldBounded: one pod holds at most maxHeldPerPod flows; the rest
// are counted as uncounted (hold_full), none silently.
func TestHoldBounded(t *testing.T) {
	s := testScenario()
	a, _ := holdingAggregator(nodesOnly(s), "gpu-b1")
	n := maxHeldPerPod + 40
	for i := range n {
		f := blockedSYN(i)[1] // drop events only
		a.Observe(f)
	}
	if h, full := a.Held(), uncounted(a, uncountedHoldFull); h != maxHeldPerPod || full != 40 {
		t.Fatalf("held %d, hold_full %g; want %d and 40", h, full, maxHeldPerPod)
	}
	accounted(t, a)
}

// TestNoHoldWithoutSetHold: files and analyze see a complete view: a
// flow of no job is uncounted at once.
func TestNoHoldWithoutSetHold(t *testing.T) {
	s := testScenario()
	a := NewAggregator(nodesOnly(s), "gpu-b1", time.Minute, nil)
	for _, f := range blockedSYN(0) {
		a.Observe(f)
	}
	if h, n := a.Held(), uncounted(a, uncountedNoJob); h != 0 || n != 1 {
		t.Fatalf("held %d, no_job %g; want 0 and 1", h, n)
	}
	accounted(t, a)
}

// TestHeldFlowsDoNotViewTheStreamBuffer: a held flow keeps its own
// strings; the buffer the stream decoded it from is reused for the next
// message.
func TestHeldFlowsDoNotViewTheStreamBuffer(t *testing.T) {
	s := testScenario()
	x := nodesOnly(s)
	a, clk := holdingAggregator(x, "gpu-b1")
	f := blockedSYN(0)[0]
	x1 := FieldsOf(f)
	pod, ip := []byte(f.Source.PodName), []byte(f.IP.Source)
	x1.Src.PodName, x1.SrcIP = unsafe.String(&pod[0], len(pod)), unsafe.String(&ip[0], len(ip))
	a.ObserveFields(&x1)
	copy(pod, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
	copy(ip, "10.9.9.9.9.9.9.9.9.9.9.9.9.9")
	catchUp(x, s)
	clk.advance(time.Second)
	a.Retry()
	want := DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: zoneA, DstZone: zoneB,
		Locality: "cross_zone", Peer: PeerJob, Reason: ReasonPolicyDenied, PolicyNamespace: "ml-team", PolicyName: "zone-isolation",
		PolicySource: PolicySourceCilium}
	if a.Drops().Value(want) != 1 || a.Held() != 0 {
		t.Fatalf("the held flow was not counted as it arrived: %d series, %d held", a.Drops().Len(), a.Held())
	}
}

// localOnly is the view once the node's own pods are delivered but the
// feeds of their jobs are still listing: the nodes and the job pods on
// node, none of the jobs' other pods.
func localOnly(s *sim.Scenario, node string) *topology.Index {
	x := nodesOnly(s)
	for _, j := range s.Jobs {
		for _, p := range j.Pods {
			if p.Node == node {
				x.UpsertPod(0, topology.Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Node, IPs: []netip.Addr{p.IP},
					Identity: topology.Identity{Kind: j.Kind, Name: j.Name, Role: p.Role}})
			}
		}
	}
	return x
}

// TestDropsBeforeTheJobFeedListsAreCountedWithTheirPeer: the node's pod
// informer has delivered the job's local pod (the master) but the job's
// feed is still listing its remote workers. The drops of the workers' SYNs
// find the job from the master's side; counted at once, they would be a
// peer drop from outside the job in an unknown zone (PeerPolicyDrops
// instead of the cross-zone page). They are held until the feed places
// the workers, then counted between the job's own pods, across zones.
func TestDropsBeforeTheJobFeedListsAreCountedWithTheirPeer(t *testing.T) {
	s := testScenario()
	x := localOnly(s, "gpu-b1")
	a, clk := holdingAggregator(x, "gpu-b1")
	for sec := range 10 {
		for _, f := range blockedSYN(sec) {
			a.Observe(f)
		}
	}
	if n, p := a.Drops().Len(), a.PeerDrops().Len(); n != 0 || p != 0 {
		t.Fatalf("%d drop and %d peer drop series before the job's feed placed its workers", n, p)
	}
	if h := a.Held(); h != 10 {
		t.Fatalf("held %d flows, want the 10 drops", h)
	}
	accounted(t, a)
	clk.advance(time.Second)
	a.Retry()
	if h := a.Held(); h != 10 {
		t.Fatalf("held %d after a retry with the workers still unplaced, want 10", h)
	}
	catchUp(x, s)
	clk.advance(time.Second)
	a.Retry()
	want := DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: zoneA, DstZone: zoneB,
		Locality: "cross_zone", Peer: PeerJob, Reason: ReasonPolicyDenied, PolicyNamespace: "ml-team", PolicyName: "zone-isolation",
		PolicySource: PolicySourceCilium}
	if got := a.Drops().Value(want); got != 10 || a.Drops().Len() != 1 || a.PeerDrops().Len() != 0 {
		var all []string
		a.Drops().Each(func(k DropKey, v float64) {
			all = append(all, fmt.Sprintf("%s %s>%s %s %g", k.Job, k.SrcZone, k.DstZone, k.Peer, v))
		})
		t.Fatalf("drops %+v: %g, want 10 and nothing else (series: %v; peer drop series %d)", want, got, all, a.PeerDrops().Len())
	}
	if h := a.Held(); h != 0 {
		t.Errorf("%d flows still held", h)
	}
	accounted(t, a)
}

// TestDropFromAPodOfNoJobHeldOnceThenCounted: a job's drop whose other
// side is a pod of its namespace that belongs to no job is held for that
// pod's window only, then counted (a peer drop, not lost); the pod's later
// drops are counted at once.
func TestDropFromAPodOfNoJobHeldOnceThenCounted(t *testing.T) {
	s := testScenario()
	a, clk := holdingAggregator(indexOf(s), "gpu-b1")
	notebook := podEP{"ml-team", "notebook-0", "10.244.2.9", "gpu-a2"} // a pod of no job
	send := func() {
		v := flowOf("gpu-b1", notebook, llmMaster, flowpb.Verdict_DROPPED, eventPolicyVerdict)
		v.DropReasonDesc, v.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
		v.IngressDeniedBy = []*flowpb.Policy{{Namespace: "ml-team", Name: "zone-isolation", Kind: "CiliumNetworkPolicy"}}
		a.Observe(v)
	}
	send()
	if h := a.Held(); h != 1 {
		t.Fatalf("held %d, want 1", h)
	}
	clk.advance(DefaultHold)
	a.Retry()
	send()
	var peer float64
	a.PeerDrops().Each(func(k PeerDropKey, v float64) {
		if k.Job == "llm-blocked" && k.Peer == PeerCluster {
			peer += v
		}
	})
	if h := a.Held(); h != 0 || peer != 2 {
		t.Fatalf("after the window: held %d, peer drops of llm-blocked %g; want 0 and 2", h, peer)
	}
	if n := uncounted(a, uncountedNoJob); n != 0 {
		t.Errorf("%g drops of a job uncounted as no_job", n)
	}
	accounted(t, a)
}

// pendingFences names every default-deny drop once its identity read is in
// (pending false), nothing before: the per-node view's reads by name.
type pendingFences struct {
	pending bool
	name    string
}

func (p *pendingFences) Name(bool, uint32, uint32, uint8, uint16) string {
	if p.pending {
		return ""
	}
	return p.name
}
func (p *pendingFences) NamePending(uint32, uint32) bool { return p.pending }

// defaultDenySYN is a default-deny drop (Cilium names no policy) of
// llm-blocked's worker to its master, as the master's node reports it.
func defaultDenySYN() []*flowpb.Flow {
	var out []*flowpb.Flow
	for _, ev := range []int32{eventPolicyVerdict, eventDrop} {
		f := flowOf("gpu-b1", llmWorker, llmMaster, flowpb.Verdict_DROPPED, ev)
		f.DropReasonDesc, f.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
		f.Source.Identity, f.Destination.Identity = 40001, 40002
		out = append(out, f)
	}
	return out
}

// TestDefaultDenyDropHeldWhileItsIdentityIsRead: in the per-node view an
// identity is read by name when a drop first names it (collector/fence);
// the job's drops that arrive before the read lands are held and counted
// with the policy's name once it is in (the lab's fence kinds counted the
// first 1-2 drops of each fence with policy="" before), and a read that
// never lands costs the name, never the drop.
func TestDefaultDenyDropHeldWhileItsIdentityIsRead(t *testing.T) {
	for _, lands := range []bool{true, false} {
		t.Run(fmt.Sprintf("read lands %v", lands), func(t *testing.T) {
			a, clk := holdingAggregator(indexOf(testScenario()), "gpu-b1")
			fences := &pendingFences{pending: true, name: "ml-team/fence"}
			a.SetFences(fences)
			for range 3 {
				for _, f := range defaultDenySYN() {
					a.Observe(f)
				}
			}
			if h, n := a.Held(), a.Drops().Len(); h != 3 || n != 0 {
				t.Fatalf("while the read is pending: held %d, %d drop series; want the 3 drops held, none counted", h, n)
			}
			accounted(t, a)
			wait := time.Second
			if lands {
				fences.pending = false
			} else {
				wait = DefaultHold
			}
			clk.advance(wait)
			a.Retry()
			var named, unnamed float64
			a.Drops().Each(func(k DropKey, v float64) {
				if k.Job != "llm-blocked" || k.Direction != DirectionIngress {
					t.Errorf("drop series %+v", k)
				}
				if k.PolicyName == "ml-team/fence" && k.PolicySource == PolicySourceSelected {
					named += v
				} else if k.PolicyName == "" {
					unnamed += v
				}
			})
			want := [2]float64{3, 0}
			if !lands {
				want = [2]float64{0, 3}
			}
			if h := a.Held(); h != 0 || [2]float64{named, unnamed} != want {
				t.Fatalf("after the retry: held %d, drops named %g, unnamed %g; want 0, %g, %g", h, named, unnamed, want[0], want[1])
			}
			accounted(t, a)
			// Once named, later drops are counted at once.
			fences.pending = false
			for _, f := range defaultDenySYN() {
				a.Observe(f)
			}
			if h := a.Held(); h != 0 {
				t.Errorf("a drop with its identity in was held")
			}
		})
	}
}

// tunnelIPCache is a node's ipcache naming remote addresses' tunnel
// endpoints.
type tunnelIPCache map[netip.Addr]netip.Addr

func (c tunnelIPCache) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	ep, ok := c[a]
	return topology.RemoteEntry{NodeIP: ep, Identity: 70000, Bits: 32}, ok
}

// nodeReads stands for the lean node view (collector/kube's PeerNodes,
// tested against the real kube-apiserver there): it says whether the node
// behind a tunnel endpoint is being read.
type nodeReads struct {
	pending bool
	misses  int
}

func (r *nodeReads) Miss(netip.Addr, netip.Addr) { r.misses++ }
func (r *nodeReads) Pending(netip.Addr) bool     { return r.pending }

// TestJobFlowHeldWhileItsPeersNodeIsRead: a job's flow to a pod on a node
// the lean node view does not hold yet (a dataset server in another zone)
// is held while that node is read, then counted in the node's zone; when
// the read does not land within the hold window it is counted to an
// unknown zone, never lost; once the node is in, flows are counted at once.
func TestJobFlowHeldWhileItsPeersNodeIsRead(t *testing.T) {
	for _, lands := range []bool{true, false} {
		t.Run(fmt.Sprintf("read lands %v", lands), func(t *testing.T) {
			s := testScenario()
			x := topology.NewIndex()
			node := func(n sim.Node) topology.Node {
				return topology.Node{Name: n.Name, Zone: n.Zone, Region: s.Region, Addresses: []netip.Addr{n.IP}, PodCIDRs: []netip.Prefix{n.PodCIDR}}
			}
			c1 := s.Nodes[4]
			for _, n := range s.Nodes[:4] {
				x.UpsertNode(node(n))
			}
			dataset := podEP{"data", "dataset-0", "10.244.7.9", c1.Name}
			x.SetRemote("gpu-a1", tunnelIPCache{addr(dataset.ip): c1.IP}, nil, topology.DefaultRules())
			reads := &nodeReads{pending: true}
			x.SetNodeReads(reads)
			for _, p := range s.Jobs[0].Pods {
				x.UpsertPod(0, topology.Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Node, IPs: []netip.Addr{p.IP},
					Identity: topology.Identity{Kind: s.Jobs[0].Kind, Name: s.Jobs[0].Name, Role: p.Role}})
			}
			a, clk := holdingAggregator(x, "gpu-a1")
			send := func() { a.Observe(trace("gpu-a1", resWorker, dataset, flowpb.TraceObservationPoint_TO_OVERLAY, false)) }
			for range 3 {
				send()
			}
			if h, n := a.Held(), a.Events().Len(); h != 3 || n != 0 || reads.misses == 0 {
				t.Fatalf("while the node is read: held %d, %d event series, %d misses; want 3 held, none counted, the node asked for", h, n, reads.misses)
			}
			accounted(t, a)
			wait := time.Second
			if lands {
				x.UpsertNode(node(c1))
				reads.pending = false
			} else {
				wait = DefaultHold
			}
			clk.advance(wait)
			a.Retry()
			got := map[string]float64{}
			a.Events().Each(func(k EventKey, v float64) {
				if k.Job != "resnet-healthy" || k.SrcZone != zoneA {
					t.Errorf("event series %+v", k)
				}
				got[k.DstZone] += v
			})
			want := map[string]float64{topology.UnknownZone: 3}
			if lands {
				want = map[string]float64{zoneC: 3}
			}
			if h := a.Held(); h != 0 || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("after the retry: held %d, events by dst_zone %v; want 0, %v", h, got, want)
			}
			accounted(t, a)
			if lands {
				send()
				if h, v := a.Held(), a.Events().Value(EventKey{Namespace: "ml-team", Job: "resnet-healthy", SrcZone: zoneA, DstZone: zoneC,
					Locality: "cross_zone", Peer: PeerCluster, Verdict: VerdictForwarded}); h != 0 || v != 4 {
					t.Errorf("a flow once the node is in: held %d, %g events in zone-c; want 0 held, 4", h, v)
				}
			}
		})
	}
}
