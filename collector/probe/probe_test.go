package probe

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

type staticPeers []Peer

func (s staticPeers) Peers() []Peer { return s }

func listen(t *testing.T) net.Listener { return listenB(t) }

func listenB(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// server is a real probe server on loopback.
func server(t *testing.T) string {
	l := listen(t)
	go Serve(t.Context(), l, slog.New(slog.DiscardHandler))
	return l.Addr().String()
}

// delayProxy forwards TCP to target, holding every chunk it reads from the
// client for delay before passing it on: one path of the round trip is
// delay longer, as a farther zone would make it.
// held reports the mean time the proxy really held a chunk: under load a
// sleep overshoots, and that overshoot is added delay too.
type held struct {
	mu    sync.Mutex
	total time.Duration
	n     int
}

func (h *held) mean() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0
	}
	return h.total / time.Duration(h.n)
}

func delayProxy(t *testing.T, target string, delay time.Duration) (string, *held) {
	h := &held{}
	l := listen(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(c, u) }()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					start := time.Now()
					time.Sleep(delay)
					h.mu.Lock()
					h.total += time.Since(start)
					h.n++
					h.mu.Unlock()
					if _, err := u.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), h
}

func histogram(t *testing.T, reg *prometheus.Registry, dst string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "zonewatch_zone_rtt_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "dst_zone" && l.GetValue() == dst {
					return m.GetHistogram()
				}
			}
		}
	}
	t.Fatalf("no zonewatch_zone_rtt_seconds for dst_zone %s", dst)
	return nil
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, _ := reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestRTTFollowsAddedDelay probes two exporters' probe servers over real
// TCP, one behind a proxy that holds each packet 40 ms: the measured RTT
// to it exceeds the direct one by the added delay, within 10%.
func TestRTTFollowsAddedDelay(t *testing.T) {
	const delay = 40 * time.Millisecond
	near, far := server(t), server(t)
	farAddr, hold := delayProxy(t, far, delay)
	peers := staticPeers{
		{Node: "n-a2", Zone: "zone-a", Addr: near},
		{Node: "n-b1", Zone: "zone-b", Addr: farAddr},
	}
	reg := prometheus.NewRegistry()
	p := NewProber(Config{Node: "n-a1", Zone: func() string { return "zone-a" }, PerZone: 2, Count: 10, Timeout: 10 * time.Second}, peers, NewMetrics(reg), slog.New(slog.DiscardHandler))
	p.Round(t.Context())

	a, b := histogram(t, reg, "zone-a"), histogram(t, reg, "zone-b")
	if a.GetSampleCount() != 10 || b.GetSampleCount() != 10 {
		t.Fatalf("samples: %d to zone-a, %d to zone-b; want 10 each", a.GetSampleCount(), b.GetSampleCount())
	}
	meanA := a.GetSampleSum() / float64(a.GetSampleCount())
	meanB := b.GetSampleSum() / float64(b.GetSampleCount())
	added := time.Duration((meanB - meanA) * float64(time.Second))
	want := hold.mean()
	t.Logf("mean RTT in zone %.3f ms, across %.3f ms: added %s (the proxy held each frame %s, asked for %s)", meanA*1e3, meanB*1e3, added, want, delay)
	if d := added - want; d < -want/10 || d > want/10 {
		t.Errorf("measured added RTT %s, want the proxy's %s within 10%%", added, want)
	}
	// Both classic buckets and native ones are exposed.
	if len(b.GetBucket()) == 0 || b.GetSchema() == 0 && len(b.GetPositiveSpan()) == 0 {
		t.Errorf("histogram lacks classic (%d) or native buckets (schema %d, %d spans)", len(b.GetBucket()), b.GetSchema(), len(b.GetPositiveSpan()))
	}
	if got := counter(t, reg, "zonewatch_probe_sent_bytes_total", "dst_zone", "zone-b"); got != 10*FrameSize {
		t.Errorf("sent bytes to zone-b = %v, want %d", got, 10*FrameSize)
	}
}

// TestSampleRotates: each round probes at most PerZone peers of each zone,
// never its own node, and successive rounds walk through every peer.
func TestSampleRotates(t *testing.T) {
	var peers staticPeers
	for _, z := range []string{"a", "b"} {
		for i := 0; i < 5; i++ {
			peers = append(peers, Peer{Node: "n-" + z + string(rune('0'+i)), Zone: "zone-" + z, Addr: "10.0.0." + z + string(rune('0'+i)) + ":1"})
		}
	}
	peers = append(peers, Peer{Node: "self", Zone: "zone-a", Addr: "10.0.0.1:1"})
	p := NewProber(Config{Node: "self", PerZone: 2}, peers, nil, nil)
	seen := map[string]int{}
	for round := 0; round < 5; round++ {
		s := p.Sample()
		perZone := map[string]int{}
		for _, peer := range s {
			if peer.Node == "self" {
				t.Fatalf("round %d probes its own node", round)
			}
			perZone[peer.Zone]++
			seen[peer.Node]++
		}
		if perZone["zone-a"] != 2 || perZone["zone-b"] != 2 {
			t.Fatalf("round %d: %v per zone, want 2 each", round, perZone)
		}
	}
	// 5 rounds x 2 = 10 probes over 5 peers a zone: each peer twice.
	var nodes []string
	for n, c := range seen {
		if c != 2 {
			t.Errorf("%s probed %d times in 5 rounds, want 2", n, c)
		}
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	if len(nodes) != 10 {
		t.Errorf("probed %v, want all 10 peers", nodes)
	}
}

// TestFailureReasons: a refused port, a peer that never echoes and one that
// hangs up are counted by reason, and the round goes on to the next peer.
func TestFailureReasons(t *testing.T) {
	refused := listen(t)
	refusedAddr := refused.Addr().String()
	refused.Close()
	silent := listen(t) // accepts (backlog) and never answers
	hangup := listen(t)
	go func() {
		for {
			c, err := hangup.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ok := server(t)
	peers := staticPeers{
		{Node: "n1", Zone: "z1", Addr: refusedAddr},
		{Node: "n2", Zone: "z2", Addr: silent.Addr().String()},
		{Node: "n3", Zone: "z3", Addr: hangup.Addr().String()},
		{Node: "n4", Zone: "z4", Addr: ok},
	}
	reg := prometheus.NewRegistry()
	p := NewProber(Config{Node: "self", Zone: func() string { return "z0" }, PerZone: 1, Count: 2, Timeout: 300 * time.Millisecond}, peers, NewMetrics(reg), slog.New(slog.DiscardHandler))
	p.Round(context.Background())
	for zone, want := range map[string]string{"z1": "refused", "z2": "timeout", "z3": "reset"} {
		// src_zone: the prober's own, which the rules join with the peer's
		// zonewatch_probe_inbound_denied_total{src_zone}.
		if got := counter(t, reg, "zonewatch_probe_failures_total", "src_zone", "z0", "dst_zone", zone, "reason", want); got != 1 {
			t.Errorf("%s: failures{reason=%q} = %v, want 1", zone, want, got)
		}
	}
	if h := histogram(t, reg, "z4"); h.GetSampleCount() != 2 {
		t.Errorf("the healthy peer after three failures got %d samples, want 2", h.GetSampleCount())
	}
	if got := counter(t, reg, "zonewatch_probe_failures_total", "dst_zone", "z4"); got != 0 {
		t.Errorf("healthy peer counted %v failures", got)
	}
}
