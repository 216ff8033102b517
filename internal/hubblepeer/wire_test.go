package hubblepeer

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/cilium/pkg/hubble/testutils"
	"github.com/cilium/cilium/pkg/identity"
	"github.com/cilium/cilium/pkg/monitor"
	monitorAPI "github.com/cilium/cilium/pkg/monitor/api"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/topology"
)

// rawCodec hands the test each response's bytes as Cilium's server sent
// them.
type rawCodec struct{ encoding.CodecV2 }

type rawMessage struct{ b []byte }

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawMessage); ok {
		r.b = data.Materialize()
		return nil
	}
	return c.CodecV2.Unmarshal(data, v)
}

// wireRecorder keeps the bytes of every response of one stream.
type wireRecorder struct {
	mu   sync.Mutex
	msgs [][]byte
}

func (r *wireRecorder) messages() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.msgs...)
}

func recordWire(t *testing.T, n *node, req *observerpb.GetFlowsRequest) *wireRecorder {
	t.Helper()
	n.streams++
	conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := observerpb.NewObserverClient(conn).GetFlows(ctx, req, grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)}))
	if err != nil {
		t.Fatal(err)
	}
	r := &wireRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var m rawMessage
			if err := stream.RecvMsg(&m); err != nil {
				return
			}
			r.mu.Lock()
			r.msgs = append(r.msgs, m.b)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; conn.Close() })
	return r
}

// Pod link-local addresses (IPv6 on in the pods, off in Cilium).
var llmW0LinkLocal = netip.MustParseAddr("fe80::5c1e:2dff:fe3a:9b41")

// routerSolicitation is llmW0's IPv6 router solicitation (fe80:: ->
// ff02::2) dropped by bpf_lxc on its way out as DROP_UNKNOWN_L3 (139), as
// an agent with IPv6 off reports it (bpf/bpf_lxc.c, v1.20.2: the pod's
// identity, no destination identity, the endpoint as the source of the
// notification).
func routerSolicitation(n *node, src *pod) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	eth := &layers.Ethernet{SrcMAC: mac, DstMAC: net.HardwareAddr{0x33, 0x33, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv6}
	ip := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolICMPv6, HopLimit: 255, SrcIP: llmW0LinkLocal.AsSlice(),
		DstIP: netip.MustParseAddr("ff02::2").AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeRouterSolicitation, 0)}
	dn := monitor.DropNotify{Type: byte(monitorAPI.MessageTypeDrop), SubType: 139, Source: src.ep, SrcLabel: src.id,
		Flags: monitor.DropNotifyFlagIsIPv6}
	n.perf(testutils.MustCreateL3L4Payload(dn, []gopacket.SerializableLayer{eth, ip, icmp, gopacket.Payload(make([]byte, 4))}...))
}

// routerAddressA is gpu-a1's cilium_host address, in its pod CIDR.
var routerAddressA = netip.MustParseAddr("10.244.1.1")

// hostAsWorld is a SYN from gpu-a1's host network (its cilium_host router
// address) to dst on node b, denied by dst's ingress policy, with the
// world identity the lab's agents gave that address (issue 26).
func hostAsWorld(b *node, dst *pod, sport uint16) {
	pkt := tcp(routerAddressA, dst.ip, sport, rendezvousPort, "S")
	dn := monitor.DropNotify{Type: byte(monitorAPI.MessageTypeDrop), SubType: 133, Source: dst.ep, SrcLabel: identity.ReservedIdentityWorld, DstLabel: dst.id}
	b.perf(testutils.MustCreateL3L4Payload(dn, pkt...))
}

// quiet waits until r has received responses and no more arrive.
func quiet(t *testing.T, what string, r *wireRecorder) {
	t.Helper()
	last := -1
	waitFor(t, what, func() bool {
		time.Sleep(200 * time.Millisecond)
		n := len(r.messages())
		stable := n > 0 && n == last
		last = n
		return stable
	})
}

// TestCiliumWireDecoderAgrees: every response Cilium's observer sends, as
// the exporter asks (whitelist and field mask) and unfiltered whole, for
// the test's traffic, a pod's link-local drop and a host connection with
// the world identity, decodes to the same Fields with the client's wire
// decoder as with the generated one.
func TestCiliumWireDecoderAgrees(t *testing.T) {
	a, b := startNode(t, nodeA), startNode(t, nodeB)
	var recs []*wireRecorder
	for _, n := range []*node{a, b} {
		recs = append(recs,
			recordWire(t, n, &observerpb.GetFlowsRequest{Follow: true, Whitelist: hubble.Whitelist(), FieldMask: &fieldmaskpb.FieldMask{Paths: hubble.FieldMaskPaths}}),
			recordWire(t, n, &observerpb.GetFlowsRequest{Follow: true}))
		waitFor(t, "the GetFlows calls", func() bool { return n.getFlows.Load() >= int64(n.streams) })
	}
	time.Sleep(20 * time.Millisecond)
	traffic(a, b)
	routerSolicitation(a, llmW0)
	hostAsWorld(b, llmC, 47000)
	a.flush()
	b.flush()
	flows, linkLocal, world := 0, 0, 0
	for i, r := range recs {
		quiet(t, "the stream", r)
		for j, m := range r.messages() {
			var resp observerpb.GetFlowsResponse
			if err := proto.Unmarshal(m, &resp); err != nil {
				t.Fatalf("stream %d response %d: the generated decoder refuses Cilium's message: %v", i, j, err)
			}
			got, ok, err := hubble.DecodeResponse(m)
			if err != nil || ok != (resp.GetFlow() != nil) {
				t.Fatalf("stream %d response %d: wire decoder: flow %v, %v; generated: %v", i, j, ok, err, resp.GetResponseTypes())
			}
			if !ok {
				continue
			}
			flows++
			if want := hubble.FieldsOf(resp.GetFlow()); got != want {
				t.Errorf("stream %d response %d:\n  wire      %+v\n  generated %+v", i, j, got, want)
			}
			if got.SrcIP == llmW0LinkLocal.String() {
				linkLocal++
			}
			if got.SrcIP == routerAddressA.String() && got.Src.Identity == identity.ReservedIdentityWorld.Uint32() {
				world++
			}
		}
	}
	if linkLocal != 2 || world != 2 {
		t.Errorf("the link-local drop reached %d streams, the host drop %d, want both streams of its node", linkLocal, world)
	}
	t.Logf("%d flows from Cilium's observer on 4 streams decoded alike", flows)
}

// TestCiliumLinkLocalAndHostAddress: the two classification differences
// the real datapath showed (issue 26), on the flows Cilium's parser makes.
// A pod's IPv6 router solicitation dropped as UNSUPPORTED_L3_PROTOCOL is
// not unresolved (link-local and multicast are no cluster address); a
// connection from a node's router address that Cilium gives the world
// identity is the cluster's, placed in that node's zone.
func TestCiliumLinkLocalAndHostAddress(t *testing.T) {
	a, b := startNode(t, nodeA), startNode(t, nodeB)
	ca, cb := follow(t, a, hubble.Config{}), follow(t, b, hubble.Config{})
	ua := follow(t, a, hubble.Config{NoFieldMask: true})
	live(t, a, ca, ua)
	live(t, b, cb)
	base := ca.processed()
	routerSolicitation(a, llmW0)
	routerSolicitation(a, llmW1)
	hostAsWorld(b, llmC, 47000)
	hostAsWorld(b, llmC, 47001)
	a.flush()
	b.flush()
	settle(t, "the drops", func() bool {
		return ca.processed() >= base+2 && ua.processed() >= base+2 && cb.totals(t).policyDrops >= 2
	})
	for name, c := range map[string]*client{"gpu-a1 masked": ca, "gpu-a1 unmasked": ua} {
		if s := c.totals(t); s.unresolvedSrc != 0 || s.unresolvedDst != 0 {
			t.Errorf("%s: the link-local drops are unresolved: %v", name, s)
		}
	}
	found := false
	cb.agg.Drops().Each(func(k hubble.DropKey, v float64) {
		if k.Job != "llm-train" {
			return
		}
		found = true
		if k.Peer != hubble.PeerCluster || k.SrcZone != zoneA || k.DstZone != zoneB || k.Locality != topology.LocalityCrossZone || v != 2 {
			t.Errorf("the host connection's drops: %+v = %v, want peer cluster from %s", k, v, zoneA)
		}
	})
	if !found {
		t.Error("the host connection's drops were not counted for llm-train")
	}
	if s := cb.totals(t); s.unresolvedSrc != 0 {
		t.Errorf("gpu-b1: %v", s)
	}
}
