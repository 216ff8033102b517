package sim

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"net/netip"
	"sort"
	"strings"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Ports the simulated jobs talk on: the rendezvous store on the
// coordinator, and the collective traffic back to the workers.
const (
	rendezvousPort = 29500
	collectivePort = 29400
	httpsPort      = 443
	s3Port         = 9000 // the storage service's S3 API
)

// worldIP is the internet peer of non-job pods.
var worldIP = netip.MustParseAddr("93.184.216.34")

// generator holds the fractional events of each stream between calls, so
// rates below one per interval come out right over time.
type generator struct {
	acc map[string]float64
	ids map[string]uint32 // endpoint IDs by namespace/pod
}

type timedFlow struct {
	at int64
	f  *flowpb.Flow
}

// Run publishes the scenario's flows in real time, every tick, until ctx
// ends.
func (h *Hubble) Run(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.Generate(last, now.Sub(last))
			last = now
		}
	}
}

// Generate publishes the flows the scenario's behaviours produce in
// [from, from+d), as Cilium's Hubble shows them: every cross-node packet
// event on both nodes (egress at the sender, ingress at the receiver),
// replies, policy-verdict events next to the trace and drop events, and
// for a blocked job the policy-verdict and drop events of each denied
// packet on the coordinator's node. It returns how many flows this
// server published (only its node's, or all for a Relay-like server).
//
// Per worker<->coordinator pair and second a job produces
// FlowsPerSecond connection events worker->coordinator and as many
// coordinator->worker; a blocked job (coordinator in another zone) only
// tries worker->coordinator and is dropped. Non-job pods talk to the
// internet once a second.
func (h *Hubble) Generate(from time.Time, d time.Duration) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := &h.gen
	if g.acc == nil {
		g.acc = map[string]float64{}
		g.ids = map[string]uint32{}
		for i, p := range h.scenario.AllPods() {
			g.ids[p.Namespace+"/"+p.Name] = uint32(100 + i)
		}
	}
	var out []timedFlow
	emit := func(stream string, rate float64, fn func(at int64) []*flowpb.Flow) {
		g.acc[stream] += rate * d.Seconds()
		n := math.Floor(g.acc[stream])
		g.acc[stream] -= n
		for i := 0; i < int(n); i++ {
			at := from.Add(time.Duration((float64(i) + 0.5) * float64(d) / n)).UnixNano()
			for _, f := range fn(at) {
				out = append(out, timedFlow{at, f})
			}
		}
	}
	for ji := range h.scenario.Jobs {
		j := &h.scenario.Jobs[ji]
		c := j.Coordinator()
		for wi := range j.Pods {
			w := &j.Pods[wi]
			if w == c {
				continue
			}
			key := j.Namespace + "/" + w.Name
			rate := j.Behaviour.FlowsPerSecond
			if j.Behaviour.BlockedBy != "" && h.zone(w) != h.zone(c) {
				emit(key+"->coordinator", rate, func(at int64) []*flowpb.Flow {
					return h.blocked(at, w, c, j.Behaviour.BlockedBy)
				})
				continue
			}
			emit(key+"->coordinator", rate, func(at int64) []*flowpb.Flow {
				return h.connection(at, w, c, rendezvousPort)
			})
			if peer := h.pod(j.Behaviour.DeniedPeer); peer != nil {
				emit(key+"->"+j.Behaviour.DeniedPeer, rate, func(at int64) []*flowpb.Flow {
					return h.deniedEgress(at, w, peer, j.Behaviour.PeerBlockedBy)
				})
			}
			emit("coordinator->"+key, rate, func(at int64) []*flowpb.Flow {
				return h.connection(at, c, w, collectivePort)
			})
		}
	}
	for i := range h.scenario.Others {
		p := &h.scenario.Others[i]
		emit(p.Namespace+"/"+p.Name+"->world", 1, func(at int64) []*flowpb.Flow { return h.toWorld(at, p) })
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].at < out[b].at })
	n := 0
	for _, tf := range out {
		if h.node != "" && tf.f.GetNodeName() != h.nodeName(h.node) {
			continue
		}
		tf.f.Time = timestamppb.New(time.Unix(0, h.nextStampLocked(time.Unix(0, tf.at))))
		h.appendLocked(&observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: tf.f}, NodeName: tf.f.GetNodeName(), Time: tf.f.GetTime()})
		n++
	}
	if n > 0 {
		h.wakeLocked()
	}
	return n
}

func (h *Hubble) zone(p *Pod) string {
	if n := h.scenario.NodeByName(p.Node); n != nil {
		return n.Zone
	}
	return ""
}

// connection is one forwarded connection event a -> b and its reply.
func (h *Hubble) connection(at int64, a, b *Pod, dport uint32) []*flowpb.Flow {
	sport := ephemeralPort(a, b)
	if a.Node == b.Node {
		return []*flowpb.Flow{
			h.trace(at, a.Node, a, b, sport, dport, false, flowpb.TraceObservationPoint_TO_ENDPOINT),
			h.trace(at, a.Node, b, a, dport, sport, true, flowpb.TraceObservationPoint_TO_ENDPOINT),
		}
	}
	return []*flowpb.Flow{
		h.trace(at, a.Node, a, b, sport, dport, false, flowpb.TraceObservationPoint_TO_OVERLAY),
		h.verdict(at, b.Node, a, b, sport, dport, flowpb.Verdict_FORWARDED, ""),
		h.trace(at, b.Node, a, b, sport, dport, false, flowpb.TraceObservationPoint_TO_ENDPOINT),
		h.trace(at, b.Node, b, a, dport, sport, true, flowpb.TraceObservationPoint_TO_OVERLAY),
		h.trace(at, a.Node, b, a, dport, sport, true, flowpb.TraceObservationPoint_TO_ENDPOINT),
	}
}

// blocked is a packet a -> b that leaves a's node and is denied by policy
// at b: Hubble shows the policy verdict (naming the policy) and the drop.
func (h *Hubble) blocked(at int64, a, b *Pod, policy string) []*flowpb.Flow {
	sport := ephemeralPort(a, b)
	drop := h.verdict(at, b.Node, a, b, sport, rendezvousPort, flowpb.Verdict_DROPPED, "")
	drop.EventType = &flowpb.CiliumEventType{Type: 1, SubType: int32(flowpb.DropReason_POLICY_DENIED)}
	return []*flowpb.Flow{
		h.trace(at, a.Node, a, b, sport, rendezvousPort, false, flowpb.TraceObservationPoint_TO_OVERLAY),
		h.verdict(at, b.Node, a, b, sport, rendezvousPort, flowpb.Verdict_DROPPED, policy),
		drop,
	}
}

// deniedEgress is a packet a -> b denied by policy on a's node, before it
// leaves: the egress policy verdict (naming the policy) and the drop.
func (h *Hubble) deniedEgress(at int64, a, b *Pod, policy string) []*flowpb.Flow {
	sport := ephemeralPort(a, b)
	v := h.verdict(at, a.Node, a, b, sport, s3Port, flowpb.Verdict_DROPPED, "")
	v.TrafficDirection = flowpb.TrafficDirection_EGRESS
	if ns, name, ok := strings.Cut(policy, "/"); ok {
		v.EgressDeniedBy = []*flowpb.Policy{{Name: name, Namespace: ns, Kind: "CiliumNetworkPolicy"}}
	}
	drop := h.verdict(at, a.Node, a, b, sport, s3Port, flowpb.Verdict_DROPPED, "")
	drop.EventType = &flowpb.CiliumEventType{Type: 1, SubType: int32(flowpb.DropReason_POLICY_DENIED)}
	drop.TrafficDirection = flowpb.TrafficDirection_EGRESS
	return []*flowpb.Flow{v, drop}
}

// pod finds one of the scenario's pods by "namespace/name"; nil for "".
func (h *Hubble) pod(ref string) *Pod {
	if ref == "" {
		return nil
	}
	for i := range h.scenario.Others {
		if p := &h.scenario.Others[i]; p.Namespace+"/"+p.Name == ref {
			return p
		}
	}
	return nil
}

func (h *Hubble) toWorld(at int64, p *Pod) []*flowpb.Flow {
	sport := ephemeralPort(p, p)
	out := h.trace(at, p.Node, p, nil, sport, httpsPort, false, flowpb.TraceObservationPoint_TO_STACK)
	back := h.trace(at, p.Node, nil, p, httpsPort, sport, true, flowpb.TraceObservationPoint_TO_ENDPOINT)
	return []*flowpb.Flow{out, back}
}

func (h *Hubble) trace(at int64, observer string, src, dst *Pod, sport, dport uint32, reply bool, point flowpb.TraceObservationPoint) *flowpb.Flow {
	f := h.base(at, observer, src, dst, sport, dport)
	f.Verdict = flowpb.Verdict_FORWARDED
	f.EventType = &flowpb.CiliumEventType{Type: 4, SubType: traceSubType(point)}
	f.TraceObservationPoint = point
	f.IsReply = wrapperspb.Bool(reply)
	f.TrafficDirection = flowpb.TrafficDirection_EGRESS
	if point == flowpb.TraceObservationPoint_TO_ENDPOINT {
		f.TrafficDirection = flowpb.TrafficDirection_INGRESS
	}
	if reply {
		f.L4.GetTCP().Flags = &flowpb.TCPFlags{ACK: true}
	} else {
		f.L4.GetTCP().Flags = &flowpb.TCPFlags{PSH: true, ACK: true}
	}
	return f
}

// verdict is a policy-verdict event at dst's node (ingress).
func (h *Hubble) verdict(at int64, observer string, src, dst *Pod, sport, dport uint32, v flowpb.Verdict, deniedBy string) *flowpb.Flow {
	f := h.base(at, observer, src, dst, sport, dport)
	f.Verdict = v
	f.EventType = &flowpb.CiliumEventType{Type: 5}
	f.TrafficDirection = flowpb.TrafficDirection_INGRESS
	f.L4.GetTCP().Flags = &flowpb.TCPFlags{SYN: true}
	if v == flowpb.Verdict_DROPPED {
		f.DropReason = uint32(flowpb.DropReason_POLICY_DENIED)
		f.DropReasonDesc = flowpb.DropReason_POLICY_DENIED
		if deniedBy != "" {
			ns, name, _ := strings.Cut(deniedBy, "/")
			f.IngressDeniedBy = []*flowpb.Policy{{Name: name, Namespace: ns, Kind: "CiliumNetworkPolicy",
				Labels: []string{"k8s:io.cilium.k8s.policy.derived-from=CiliumNetworkPolicy", "k8s:io.cilium.k8s.policy.name=" + name, "k8s:io.cilium.k8s.policy.namespace=" + ns}}}
		}
	}
	return f
}

// base is a TCP flow src -> dst observed on observer; a nil pod is the
// internet.
func (h *Hubble) base(at int64, observer string, src, dst *Pod, sport, dport uint32) *flowpb.Flow {
	srcIP, dstIP := worldIP, worldIP
	if src != nil {
		srcIP = src.IP
	}
	if dst != nil {
		dstIP = dst.IP
	}
	return &flowpb.Flow{
		Time:        timestamppb.New(time.Unix(0, at)),
		Uuid:        fmt.Sprintf("%016x-%s", at, observer),
		Type:        flowpb.FlowType_L3_L4,
		NodeName:    h.nodeName(observer),
		NodeLabels:  []string{"kubernetes.io/hostname=" + observer, "topology.kubernetes.io/zone=" + h.nodeZone(observer)},
		IP:          &flowpb.IP{Source: srcIP.String(), Destination: dstIP.String(), IpVersion: flowpb.IPVersion_IPv4},
		L4:          &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: sport, DestinationPort: dport}}},
		Source:      h.endpoint(src, observer),
		Destination: h.endpoint(dst, observer),
		Ethernet:    &flowpb.Ethernet{Source: "0a:58:0a:f4:00:01", Destination: "0a:58:0a:f4:00:02"},
	}
}

func (h *Hubble) nodeZone(node string) string {
	if n := h.scenario.NodeByName(node); n != nil {
		return n.Zone
	}
	return ""
}

// endpoint is how Hubble describes a pod: an endpoint ID only when the pod
// is local to the observing node, a security identity from its labels.
func (h *Hubble) endpoint(p *Pod, observer string) *flowpb.Endpoint {
	if p == nil {
		return &flowpb.Endpoint{Identity: 2, Labels: []string{"reserved:world"}}
	}
	labels := []string{"k8s:io.kubernetes.pod.namespace=" + p.Namespace}
	for k, v := range p.Labels {
		labels = append(labels, "k8s:"+k+"="+v)
	}
	sort.Strings(labels)
	id := fnv.New32a()
	for _, l := range labels {
		id.Write([]byte(l))
	}
	ep := &flowpb.Endpoint{
		Identity: 256 + id.Sum32()%65000, Namespace: p.Namespace, PodName: p.Name, Labels: labels,
		ClusterName: "zonewatch-sim",
	}
	if p.OwnerKind != "" {
		ep.Workloads = []*flowpb.Workload{{Name: p.OwnerName, Kind: p.OwnerKind}}
	}
	if p.Node == observer {
		ep.ID = h.gen.ids[p.Namespace+"/"+p.Name]
	}
	return ep
}

func ephemeralPort(a, b *Pod) uint32 {
	h := fnv.New32a()
	h.Write([]byte(a.Name + ">" + b.Name))
	return 32768 + h.Sum32()%28000
}

// traceSubType is Cilium's trace notification code for a point.
func traceSubType(p flowpb.TraceObservationPoint) int32 {
	if p == flowpb.TraceObservationPoint_TO_ENDPOINT {
		return 0
	}
	return int32(p)
}
