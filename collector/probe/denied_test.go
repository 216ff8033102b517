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

			hub := sim.NewHubble(sim.Default(), "a", 0)
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
				Drops: probe.HubbleDrops{Client: observerpb.NewObserverClient(conn)}},
				staticPeers{peer}, m, slog.New(slog.NewTextHandler(&log, nil)))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p.Round(ctx)
			for _, r := range []string{"timeout", "policy_denied"} {
				want := 0.0
				if r == tc.want {
					want = 1
				}
				if got := testutil.ToFloat64(m.Failures.WithLabelValues("zone-b", r)); got != want {
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
