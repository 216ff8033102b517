package hubblepeer

// The harness: two nodes, each a Cilium local Observer (v1.20.2
// pkg/hubble/observer.NewLocalServer, the server the agent embeds) fed
// through Cilium's parser (pkg/hubble/parser.New) with the monitor events
// the datapath emits (pkg/monitor TraceNotify, DropNotify,
// PolicyVerdictNotify around gopacket-built Ethernet/IPv4/TCP packets;
// accesslog.LogRecord for L7; LostEvent), served on a unix socket to one
// zonewatch client per node (DaemonSet mode). The only hand-written part
// is the cluster state the agent would know: which IP is which endpoint
// and identity (Cilium's testutils getters).

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/cilium/pkg/hubble/container"
	"github.com/cilium/cilium/pkg/hubble/observer"
	"github.com/cilium/cilium/pkg/hubble/observer/namespace"
	"github.com/cilium/cilium/pkg/hubble/observer/observeroption"
	observerTypes "github.com/cilium/cilium/pkg/hubble/observer/types"
	"github.com/cilium/cilium/pkg/hubble/parser"
	"github.com/cilium/cilium/pkg/hubble/parser/getters"
	"github.com/cilium/cilium/pkg/hubble/parser/options"
	"github.com/cilium/cilium/pkg/hubble/testutils"
	"github.com/cilium/cilium/pkg/identity"
	"github.com/cilium/cilium/pkg/ipcache"
	ciliumutils "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/utils"
	"github.com/cilium/cilium/pkg/labels"
	"github.com/cilium/cilium/pkg/monitor"
	monitorAPI "github.com/cilium/cilium/pkg/monitor/api"
	"github.com/cilium/cilium/pkg/policy"
	"github.com/cilium/cilium/pkg/proxy/accesslog"
	"github.com/google/uuid"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/topology"
)

const (
	zoneA, zoneB = "us-east-1a", "us-east-1b"
	region       = "us-east-1"
	nodeA, nodeB = "gpu-a1", "gpu-b1"

	rendezvousPort = 29500
	collectivePort = 29400

	denyingPolicyNamespace, denyingPolicyName = "ml-team", "zone-fence"
)

type pod struct {
	ns, name, node string
	ip             netip.Addr
	ep             uint16 // endpoint ID on its node
	id             identity.NumericIdentity
	kind, job      string
	role           string
}

var (
	// llm-train: two workers on gpu-a1, the coordinator on gpu-b1 behind
	// a policy that denies the workers.
	llmW0 = &pod{"ml-team", "llm-train-worker-0", nodeA, netip.MustParseAddr("10.244.1.3"), 101, 30001, "PyTorchJob", "llm-train", topology.RoleWorker}
	llmW1 = &pod{"ml-team", "llm-train-worker-1", nodeA, netip.MustParseAddr("10.244.1.4"), 102, 30001, "PyTorchJob", "llm-train", topology.RoleWorker}
	llmC  = &pod{"ml-team", "llm-train-master-0", nodeB, netip.MustParseAddr("10.244.4.2"), 201, 30002, "PyTorchJob", "llm-train", topology.RoleCoordinator}
	// bert: a healthy job across the two nodes.
	bertW = &pod{"research", "bert-worker-0", nodeA, netip.MustParseAddr("10.244.1.5"), 103, 30003, "PyTorchJob", "bert", topology.RoleWorker}
	bertC = &pod{"research", "bert-master-0", nodeB, netip.MustParseAddr("10.244.4.3"), 202, 30004, "PyTorchJob", "bert", topology.RoleCoordinator}

	pods = []*pod{llmW0, llmW1, llmC, bertW, bertC}

	// worldIP is an internet peer selected by a CIDR policy: Cilium gives
	// it a local-scope identity (1<<24 | n) whose labels carry the world
	// marker.
	worldIP = netip.MustParseAddr("93.184.216.34")
	cidrID  = identity.NumericIdentity(1<<24 | 7)
)

func (p *pod) labels() []string {
	return []string{"k8s:io.kubernetes.pod.namespace=" + p.ns, "k8s:app=" + p.job}
}

// index is zonewatch's topology index of the two nodes and the pods.
func index() *topology.Index {
	x := topology.NewIndex()
	x.UpsertNode(topology.Node{Name: nodeA, Zone: zoneA, Region: region, Addresses: []netip.Addr{netip.MustParseAddr("172.18.0.10")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}})
	x.UpsertNode(topology.Node{Name: nodeB, Zone: zoneB, Region: region, Addresses: []netip.Addr{netip.MustParseAddr("172.18.1.10")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.4.0/24")}})
	for _, p := range pods {
		x.UpsertPod(0, topology.Pod{Namespace: p.ns, Name: p.name, Node: p.node, IPs: []netip.Addr{p.ip},
			Identity: topology.Identity{Kind: p.kind, Name: p.job, Role: p.role}})
	}
	return x
}

// newParser is Cilium's parser with what node's agent knows: its own
// endpoints (endpoint getter), every pod's IP, identity and name
// (ipcache), the identities' labels.
func newParser(t testing.TB, node string) *parser.Parser {
	byIP := map[netip.Addr]*pod{}
	for _, p := range pods {
		byIP[p.ip] = p
	}
	info := func(p *pod) getters.EndpointInfo {
		ep := &testutils.FakeEndpointInfo{ID: uint64(p.ep), Identity: p.id, PodName: p.name, PodNamespace: p.ns, Labels: p.labels()}
		if p == llmC {
			// The coordinator's ingress policy denies the workers'
			// identity on the rendezvous port; Cilium's policy
			// correlation names it on the policy-verdict event.
			ep.PolicyMap = map[policy.Key]labels.LabelArrayListString{
				policy.IngressKey().WithIdentity(llmW0.id).WithTCPPort(rendezvousPort): labels.LabelArrayList{
					ciliumutils.GetPolicyLabels(denyingPolicyNamespace, denyingPolicyName, "5c3e8a8e-1d8f-4b6e-9a55-3f0e2b7d2a11", ciliumutils.ResourceTypeCiliumNetworkPolicy),
				}.ArrayListString(),
			}
			ep.PolicyRevision = 7
		}
		return ep
	}
	eps := &testutils.FakeEndpointGetter{
		OnGetEndpointInfo: func(ip netip.Addr) (getters.EndpointInfo, bool) {
			if p := byIP[ip]; p != nil && p.node == node {
				return info(p), true
			}
			return nil, false
		},
		OnGetEndpointInfoByID: func(id uint16) (getters.EndpointInfo, bool) {
			for _, p := range pods {
				if p.node == node && p.ep == id {
					return info(p), true
				}
			}
			return nil, false
		},
	}
	ips := &testutils.FakeIPGetter{
		OnGetK8sMetadata: func(ip netip.Addr) *ipcache.K8sMetadata {
			if p := byIP[ip]; p != nil {
				return &ipcache.K8sMetadata{Namespace: p.ns, PodName: p.name}
			}
			return nil
		},
		OnLookupSecIDByIP: func(ip netip.Addr) (ipcache.Identity, bool) {
			if p := byIP[ip]; p != nil {
				return ipcache.Identity{ID: p.id}, true
			}
			if ip == worldIP {
				return ipcache.Identity{ID: cidrID}, true
			}
			return ipcache.Identity{}, false
		},
	}
	ids := &testutils.FakeIdentityGetter{OnGetIdentity: func(id uint32) (*identity.Identity, error) {
		if identity.NumericIdentity(id) == cidrID {
			return &identity.Identity{ID: cidrID, Labels: labels.NewLabelsFromModel([]string{"cidr:93.184.216.34/32", "reserved:world-ipv4"})}, nil
		}
		for _, p := range pods {
			if p.id == identity.NumericIdentity(id) {
				return &identity.Identity{ID: p.id, Labels: labels.NewLabelsFromModel(p.labels())}, nil
			}
		}
		return &identity.Identity{}, nil
	}}
	pp, err := parser.New(slog.New(slog.DiscardHandler), eps, ids, &testutils.NoopDNSGetter, ips,
		&testutils.NoopServiceGetter, &testutils.NoopLinkGetter, &testutils.NoopPodMetadataGetter,
		options.WithNetworkPolicyCorrelation(true))
	if err != nil {
		t.Fatal(err)
	}
	return pp
}

// node is one agent's Hubble: a local Observer and its gRPC server.
type node struct {
	name string
	obs  *observer.LocalObserverServer
	sock string

	mu   sync.Mutex
	srv  *grpc.Server
	last time.Time // the newest event time, so times increase
	sent int       // events pushed

	getFlows atomic.Int64 // GetFlows calls the server began
	streams  int          // GetFlows callers the test started
}

func startNode(t testing.TB, name string) *node {
	t.Helper()
	return startNodeRing(t, name, true)
}

// startNodeRing is startNode; filled false leaves the ring empty, as a
// freshly started agent's is.
func startNodeRing(t testing.TB, name string, filled bool) *node {
	t.Helper()
	dir, err := os.MkdirTemp("", "zwp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &node{name: name, sock: filepath.Join(dir, "hubble.sock")}
	calls := observeroption.OnGetFlowsFunc(func(ctx context.Context, _ *observerpb.GetFlowsRequest) (context.Context, error) {
		n.getFlows.Add(1)
		return ctx, nil
	})
	obs, err := observer.NewLocalServer(newParser(t, name), namespace.NewManager(), slog.New(slog.DiscardHandler),
		observeroption.WithMaxFlows(container.Capacity4095), observeroption.WithMonitorBuffer(4096),
		observeroption.WithOnGetFlows(calls))
	if err != nil {
		t.Fatal(err)
	}
	n.obs = obs
	go obs.Start()
	// A follower of an empty ring starts at LastWriteParallel = 0-2 and
	// waits for a ring's worth of events (TestCiliumEmptyRingFollowed):
	// most tests start with events in it.
	if filled {
		n.flush()
		n.flush()
		waitFor(t, "the ring to hold two events", func() bool { return obs.GetRingBuffer().Len() >= 2 })
	}
	n.serve(t)
	t.Cleanup(func() {
		n.stop()
		close(obs.GetEventsChannel())
		<-obs.GetStopped()
	})
	return n
}

// serve starts the gRPC server (again after stop: the agent's Hubble
// server restarted, its ring kept, as when only the listener went away).
func (n *node) serve(t testing.TB) {
	t.Helper()
	_ = os.Remove(n.sock)
	lis, err := net.Listen("unix", n.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	observerpb.RegisterObserverServer(srv, n.obs)
	n.mu.Lock()
	n.srv = srv
	n.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
}

func (n *node) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		n.srv.Stop()
		n.srv = nil
	}
}

// push hands one monitor event to the observer, stamped as the agent
// stamps it (when read), strictly after the previous one.
func (n *node) push(payload any) {
	if n.obs == nil {
		return
	}
	n.mu.Lock()
	now := time.Now()
	if !now.After(n.last) {
		now = n.last.Add(time.Microsecond)
	}
	n.last = now
	n.sent++
	n.mu.Unlock()
	n.obs.GetEventsChannel() <- &observerTypes.MonitorEvent{UUID: uuid.New(), Timestamp: now, NodeName: n.name, Payload: payload}
}

// a2 is the other end of single-node tests: what it would see is not
// observed.
func a2() *node { return &node{name: nodeB} }

func (n *node) perf(data []byte) { n.push(&observerTypes.PerfEvent{Data: data}) }

// flush pushes a reply trace nobody counts (the whitelist drops
// replies): Cilium's ring hides its newest entry from readers until the
// next write (container.Ring.read: readIdx < lastWriteIdx).
func (n *node) flush() {
	a, b := bertW, bertC
	if n.name == nodeB {
		a, b = bertC, bertW
	}
	n.perf(trace(monitorAPI.TraceToOverlay, a, b, monitor.TraceReasonCtReply, tcp(a.ip, b.ip, collectivePort, 40000, "A")))
}

// tcp is an Ethernet/IPv4/TCP packet; flags is a subset of "SAF".
func tcp(src, dst netip.Addr, sport, dport uint16, flags string) []gopacket.SerializableLayer {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	eth := &layers.Ethernet{SrcMAC: mac, DstMAC: mac, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	seg := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Window: 64240}
	for _, f := range flags {
		switch f {
		case 'S':
			seg.SYN = true
		case 'A':
			seg.ACK = true
		case 'F':
			seg.FIN = true
		}
	}
	return []gopacket.SerializableLayer{eth, ip, seg}
}

// trace is a trace notification at obs on the node of the endpoint
// "local" (the sender for to-overlay/to-stack, the receiver for
// to-endpoint/from-overlay).
func trace(obs uint8, src, dst *pod, reason uint8, pkt []gopacket.SerializableLayer) []byte {
	local := src
	if obs == monitorAPI.TraceToLxc || obs == monitorAPI.TraceFromOverlay {
		local = dst
	}
	tn := monitor.TraceNotify{Type: byte(monitorAPI.MessageTypeTrace), ObsPoint: obs, Source: local.ep,
		SrcLabel: src.id, DstLabel: dst.id, Reason: reason}
	return testutils.MustCreateL3L4Payload(tn, pkt...)
}

// send is one forwarded packet between pods on two nodes as both agents
// report it: to-overlay at the sender, to-endpoint at the receiver (the
// default monitor aggregation shows no from-* points).
func send(from, to *node, src, dst *pod, sport, dport uint16, reply bool, flags string) {
	reason := uint8(monitor.TraceReasonPolicy) // "new"
	if flags != "S" {
		reason = monitor.TraceReasonCtEstablished
	}
	if reply {
		reason = monitor.TraceReasonCtReply
	}
	pkt := tcp(src.ip, dst.ip, sport, dport, flags)
	from.perf(trace(monitorAPI.TraceToOverlay, src, dst, reason, pkt))
	to.perf(trace(monitorAPI.TraceToLxc, src, dst, reason, pkt))
}

// connect is one TCP connection src -> dst: the SYN (with the allowing
// policy verdict at the receiver), the SYN-ACK reply, and one data
// segment each way. Counted: one forwarded event per direction on the
// sender... of which only the non-reply events pass the whitelist: the
// SYN and src's data segment.
func connect(from, to *node, src, dst *pod, sport, dport uint16) {
	pkt := tcp(src.ip, dst.ip, sport, dport, "S")
	from.perf(trace(monitorAPI.TraceToOverlay, src, dst, monitor.TraceReasonPolicy, pkt))
	to.perf(policyVerdict(dst, src, 0, dport))
	to.perf(trace(monitorAPI.TraceToLxc, src, dst, monitor.TraceReasonPolicy, pkt))
	send(to, from, dst, src, dport, sport, true, "SA")
	send(from, to, src, dst, sport, dport, false, "A")
	send(to, from, dst, src, dport, sport, true, "A")
}

// policyVerdict is the ingress policy-verdict notification at local's
// endpoint for a packet from remote: verdict 0 allowed, -133 denied
// (POLICY_DENIED).
func policyVerdict(local, remote *pod, verdict int32, dport uint16) []byte {
	pvn := monitor.PolicyVerdictNotify{Type: byte(monitorAPI.MessageTypePolicyVerdict), Source: local.ep, RemoteLabel: remote.id,
		Verdict: verdict, DstPort: dport, Proto: 6, Flags: monitorAPI.PolicyIngress}
	return testutils.MustCreateL3L4Payload(pvn, tcp(remote.ip, local.ip, 40001, dport, "S")...)
}

// deny is one SYN from src on node from to dst on node to, denied by
// ingress policy at dst: to-overlay at the sender, then a policy verdict
// (denied) and a drop notification (reason 133) at the receiver.
func deny(from, to *node, src, dst *pod, sport, dport uint16) {
	pkt := tcp(src.ip, dst.ip, sport, dport, "S")
	from.perf(trace(monitorAPI.TraceToOverlay, src, dst, monitor.TraceReasonPolicy, pkt))
	pvn := monitor.PolicyVerdictNotify{Type: byte(monitorAPI.MessageTypePolicyVerdict), Source: dst.ep, RemoteLabel: src.id,
		Verdict: -133, DstPort: dport, Proto: 6, Flags: monitorAPI.PolicyIngress}
	to.perf(testutils.MustCreateL3L4Payload(pvn, pkt...))
	dn := monitor.DropNotify{Type: byte(monitorAPI.MessageTypeDrop), SubType: 133, Source: dst.ep, SrcLabel: src.id, DstLabel: dst.id}
	to.perf(testutils.MustCreateL3L4Payload(dn, pkt...))
}

// toWorld is one SYN from src to the CIDR-identity internet peer,
// leaving the node to the stack.
func toWorld(n *node, src *pod, sport uint16) {
	tn := monitor.TraceNotify{Type: byte(monitorAPI.MessageTypeTrace), ObsPoint: monitorAPI.TraceToStack, Source: src.ep,
		SrcLabel: src.id, DstLabel: cidrID, Reason: monitor.TraceReasonPolicy}
	n.perf(testutils.MustCreateL3L4Payload(tn, tcp(src.ip, worldIP, sport, 443, "S")...))
}

// l7Deny is an HTTP request from src refused by dst's L7 policy (403),
// as the proxy logs it (accesslog.LogRecord, an agent event).
func l7Deny(n *node, src, dst *pod, sport uint16) {
	rec := accesslog.LogRecord{
		Type: accesslog.TypeResponse, Timestamp: time.Now().UTC().Format(time.RFC3339Nano), ObservationPoint: accesslog.Ingress,
		SourceEndpoint:      accesslog.EndpointInfo{ID: 0, IPv4: src.ip.String(), Port: sport, Identity: uint64(src.id)},
		DestinationEndpoint: accesslog.EndpointInfo{ID: uint64(dst.ep), IPv4: dst.ip.String(), Port: 8080, Identity: uint64(dst.id)},
		IPVersion:           accesslog.VersionIPv4, Verdict: accesslog.VerdictDenied, TransportProtocol: 6,
		HTTP: &accesslog.LogRecordHTTP{Code: 403, Method: "GET", Protocol: "HTTP/1.1"},
	}
	n.push(&observerTypes.AgentEvent{Type: monitorAPI.MessageTypeAccessLog, Message: rec})
}

// lost is a LostEvent as the agent's monitor consumer reports it (perf
// ring overrun on a CPU, or the events queue full).
func lost(n *node, source int, count uint64) {
	now := time.Now()
	n.push(&observerTypes.LostEvent{Source: source, NumLostEvents: count, CPU: 1, First: now, Last: now})
}

// client is one exporter: a zonewatch client and aggregator for node,
// its self metrics in reg.
type client struct {
	*hubble.Client
	agg *hubble.Aggregator
	reg *prometheus.Registry
}

func follow(t testing.TB, n *node, cfg hubble.Config) *client {
	t.Helper()
	cfg.Address = "unix://" + n.sock
	n.streams++
	cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	reg := prometheus.NewRegistry()
	agg := hubble.NewAggregator(index(), n.name, time.Hour, hubble.NewMetrics(reg))
	c := &client{hubble.NewClient(cfg, agg), agg, reg}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func (c *client) processed() float64 { return testutil.ToFloat64(c.agg.Metrics().Processed) }

// live waits until each client's stream delivers: it pushes a
// from-overlay trace (whitelisted, never counted) until every client
// processed one more flow.
func live(t testing.TB, n *node, cs ...*client) {
	t.Helper()
	// First every stream's server side: an event written before a
	// follower's reader exists would be one of its "two back".
	waitFor(t, "the GetFlows calls", func() bool { return n.getFlows.Load() >= int64(n.streams) })
	time.Sleep(20 * time.Millisecond)
	base := make([]float64, len(cs))
	for i, c := range cs {
		base[i] = c.processed()
	}
	waitFor(t, "the streams to deliver", func() bool {
		n.perf(trace(monitorAPI.TraceFromOverlay, bertC, bertW, monitor.TraceReasonPolicy, tcp(bertC.ip, bertW.ip, 1, 2, "S")))
		n.flush()
		for i, c := range cs {
			if c.processed() <= base[i] {
				return false
			}
		}
		return true
	})
}

// totals are what a client counted.
type totals struct {
	policyDrops, forwarded, dropped float64 // all job series
	unresolvedDst, unresolvedSrc    float64
	lost                            float64
	processed                       float64
}

func (c *client) totals(t testing.TB) totals {
	var s totals
	c.agg.Drops().Each(func(k hubble.DropKey, v float64) { s.policyDrops += v })
	c.agg.Events().Each(func(k hubble.EventKey, v float64) {
		switch k.Verdict {
		case hubble.VerdictForwarded:
			s.forwarded += v
		case hubble.VerdictDropped:
			s.dropped += v
		}
	})
	m := c.agg.Metrics()
	s.unresolvedDst, s.unresolvedSrc = testutil.ToFloat64(m.UnresolvedDst), testutil.ToFloat64(m.UnresolvedSrc)
	s.processed = testutil.ToFloat64(m.Processed)
	s.lost = c.lost(t)
	return s
}

// lost is zonewatch_hubble_lost_events_total summed over its sources.
func (c *client) lost(t testing.TB) float64 {
	if c.reg == nil {
		return 0
	}
	mfs, err := c.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == "zonewatch_hubble_lost_events_total" {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

func (s totals) String() string {
	return fmt.Sprintf("policy drops %v, forwarded %v, dropped %v, unresolved %v/%v, lost %v, processed %v",
		s.policyDrops, s.forwarded, s.dropped, s.unresolvedSrc, s.unresolvedDst, s.lost, s.processed)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
