package probe

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkSample5000: choosing one round's peers among 5,000 exporters in
// 4 zones (the scale DESIGN.md plans for), default 2 per zone.
func BenchmarkSample5000(b *testing.B) {
	var peers staticPeers
	for i := 0; i < 5000; i++ {
		peers = append(peers, Peer{Node: fmt.Sprintf("node-%05d", i), Zone: fmt.Sprintf("zone-%d", i%4), Addr: fmt.Sprintf("10.%d.%d.1:19421", i>>8, i&255)})
	}
	p := NewProber(Config{Node: "node-00000", PerZone: 2}, peers, nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		if len(p.Sample()) != 8 {
			b.Fatal("sample size")
		}
	}
}

// BenchmarkRound: one whole round with the defaults (2 peers in each of 4
// zones, 5 frames each) against real probe servers on loopback: the
// exporter's CPU per interval, without the network's round trips.
func BenchmarkRound(b *testing.B) {
	var peers staticPeers
	for z := 0; z < 4; z++ {
		for i := 0; i < 2; i++ {
			l := listenB(b)
			go Serve(b.Context(), l, slog.New(slog.DiscardHandler))
			peers = append(peers, Peer{Node: fmt.Sprintf("n-%d-%d", z, i), Zone: fmt.Sprintf("zone-%d", z), Addr: l.Addr().String()})
		}
	}
	reg := prometheus.NewRegistry()
	p := NewProber(Config{Node: "self", Zone: func() string { return "zone-0" }, PerZone: 2, Count: 5, Timeout: 5 * time.Second}, peers, NewMetrics(reg), slog.New(slog.DiscardHandler))
	b.ReportAllocs()
	for b.Loop() {
		p.Round(b.Context())
	}
	b.ReportMetric(float64(8*5*FrameSize*2), "payload-B/round")
}
