package probe_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/collector/probe"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
)

// blackhole is a loopback TCP port that drops SYNs, as a policy does: a
// listener with an accept backlog of 0 whose one queued connection is never
// accepted, so the kernel drops every further SYN and a dial times out.
func blackhole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the queue: these connect, and stay unaccepted.
	for range 2 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	if c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel accepts connections beyond a full backlog: no SYN-dropping port to test with")
	}
	return addr
}

// TestProbeDeniedByPolicy: a probe whose SYN is dropped times out on the
// socket; when the node's Hubble (the project's fake Observer, filtering as
// the server does) holds a policy drop of TCP to the peer's probe port, the
// failure is policy_denied and the log names the policy; a drop toward
// another port of the same pod, or no drop at all, leaves it a timeout.
// simHubble starts a simulated Hubble of the given node on a unix socket
// and returns it with a HubbleDrops that reads its flows.
func simHubble(t *testing.T, node string) (*sim.Hubble, probe.HubbleDrops) {
	t.Helper()
	hub := sim.NewHubble(sim.Default(), node, 0)
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	if err := hub.Start(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return hub, probe.HubbleDrops{Client: observerpb.NewObserverClient(conn)}
}

func TestProbeDeniedByPolicy(t *testing.T) {
	testenv.Integration(t)
	for _, tc := range []struct {
		name      string
		dropPort  int // 0: no drop event
		want      string
		wantInLog string
	}{
		{"dropped by a policy", -1, "policy_denied", `policy=ml/zone-fence`},
		{"a drop to another port", 19420, "timeout", ""},
		{"no drop event", 0, "timeout", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := blackhole(t)
			_, portStr, _ := net.SplitHostPort(addr)
			port, _ := strconv.Atoi(portStr)
			peer := probe.Peer{Node: "b", Zone: "zone-b", Addr: addr, Pod: "monitoring/zonewatch-b"}

			hub, drops := simHubble(t, "a")
			if tc.dropPort != 0 {
				dport := tc.dropPort
				if dport < 0 {
					dport = port
				}
				// The datapath's drop event, stamped as the SYN leaves.
				go func() {
					time.Sleep(50 * time.Millisecond)
					hub.Publish(&flowpb.Flow{
						Time: timestamppb.Now(), NodeName: "default/a", Verdict: flowpb.Verdict_DROPPED,
						DropReasonDesc: flowpb.DropReason_POLICY_DENIED, EventType: &flowpb.CiliumEventType{Type: 5},
						TrafficDirection: flowpb.TrafficDirection_EGRESS,
						Source:           &flowpb.Endpoint{Namespace: "monitoring", PodName: "zonewatch-a"},
						Destination:      &flowpb.Endpoint{Namespace: "monitoring", PodName: "zonewatch-b"},
						L4:               &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: uint32(dport)}}},
						EgressDeniedBy:   []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "ml", Name: "zone-fence"}},
					})
				}()
			}
			reg := prometheus.NewRegistry()
			m := probe.NewMetrics(reg)
			var log testenv.SyncBuffer
			p := probe.NewProber(probe.Config{Node: "a", Zone: func() string { return "zone-a" }, PerZone: 1, Count: 1,
				Interval: time.Hour, Timeout: 500 * time.Millisecond,
				Drops: drops},
				staticPeers{peer}, m, slog.New(slog.NewTextHandler(&log, nil)))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p.Round(ctx)
			for _, r := range []string{"timeout", "policy_denied"} {
				want := 0.0
				if r == tc.want {
					want = 1
				}
				if got := testutil.ToFloat64(m.Failures.WithLabelValues("zone-a", "zone-b", r)); got != want {
					t.Errorf("zonewatch_probe_failures_total{reason=%q} = %v, want %v\n%s", r, got, want, log.String())
				}
			}
			denied := strings.Contains(log.String(), "denied by policy")
			if (tc.wantInLog != "") != denied || !strings.Contains(log.String(), tc.wantInLog) {
				t.Errorf("log (want %q):\n%s", tc.wantInLog, log.String())
			}
		})
	}
}

type staticPeers []probe.Peer

func (s staticPeers) Peers() []probe.Peer { return s }

// TestProbeInboundDeniedByPolicy: a zone fence written as ingress rules is
// enforced on the peer's node (the real Cilium lab: the prober's node sees
// nothing, its probe times out). The peer's exporter counts the drop of
// the probe to its own pod on its node's Hubble, by the prober's zone, one
// per packet (not its verdict event too); a drop from a pod that is not an
// exporter, or to another port, is not counted, nor any drop twice.
func TestProbeInboundDeniedByPolicy(t *testing.T) {
	testenv.Integration(t)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go probe.Serve(ctx, echo, slog.New(slog.NewTextHandler(&testenv.SyncBuffer{}, nil)))
	self := probe.Peer{Node: "b", Zone: "zone-b", Addr: "10.0.1.7:19421", Pod: "monitoring/zonewatch-b"}
	peers := staticPeers{self, {Node: "a", Zone: "zone-a", Addr: echo.Addr().String(), Pod: "monitoring/zonewatch-a"}}

	hub, drops := simHubble(t, "b")
	// What the lab's agent on the peer's node emitted: an ingress drop,
	// POLICY_DENIED, no policy named (the fence's default deny).
	// Two events per packet, as the lab's agents emit them: the drop
	// (type 1) and the policy verdict (type 5).
	drop := func(srcPod string, dport uint32) {
		for _, typ := range []int32{1, 5} {
			hub.Publish(&flowpb.Flow{
				Time: timestamppb.Now(), NodeName: "default/b", Verdict: flowpb.Verdict_DROPPED,
				DropReasonDesc: flowpb.DropReason_POLICY_DENIED, EventType: &flowpb.CiliumEventType{Type: typ},
				TrafficDirection: flowpb.TrafficDirection_INGRESS,
				Source:           &flowpb.Endpoint{Namespace: "monitoring", PodName: srcPod},
				Destination:      &flowpb.Endpoint{Namespace: "monitoring", PodName: "zonewatch-b"},
				L4:               &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: dport}}},
			})
		}
	}
	reg := prometheus.NewRegistry()
	m := probe.NewMetrics(reg)
	var log testenv.SyncBuffer
	p := probe.NewProber(probe.Config{Node: "b", Zone: func() string { return "zone-b" }, PerZone: 1, Count: 1,
		Interval: time.Hour, Timeout: 2 * time.Second,
		Drops: drops},
		peers, m, slog.New(slog.NewTextHandler(&log, nil)))
	time.Sleep(10 * time.Millisecond) // the drops come after the prober started
	drop("zonewatch-a", 19421)
	drop("zonewatch-a", 19421)
	drop("zonewatch-a", 19420)  // another port
	drop("some-job-pod", 19421) // not an exporter
	p.Round(ctx)
	if got := testutil.ToFloat64(m.InboundDenied.WithLabelValues("zone-a", "zone-b")); got != 2 {
		t.Errorf("zonewatch_probe_inbound_denied_total{src_zone=zone-a,dst_zone=zone-b} = %v, want 2\n%s", got, log.String())
	}
	if n := testutil.CollectAndCount(m.InboundDenied); n != 1 {
		t.Errorf("%d inbound series, want 1", n)
	}
	if !strings.Contains(log.String(), "probes from a zone are denied by policy") || !strings.Contains(log.String(), "src_zone=zone-a") {
		t.Errorf("log:\n%s", log.String())
	}
	// The next round counts only what came since.
	time.Sleep(10 * time.Millisecond)
	drop("zonewatch-a", 19421)
	p.Round(ctx)
	if got := testutil.ToFloat64(m.InboundDenied.WithLabelValues("zone-a", "zone-b")); got != 3 {
		t.Errorf("after a second round and one more drop: %v, want 3", got)
	}
	// The outbound probe itself went through.
	if got := testutil.ToFloat64(m.Failures.WithLabelValues("zone-b", "zone-a", "timeout")); got != 0 {
		t.Errorf("the echo peer's probe failed: %v", got)
	}
}
