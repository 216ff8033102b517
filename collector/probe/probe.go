// Package probe measures the round trip between zones the way a training
// job's traffic pays it: each exporter serves a tiny TCP echo on the pod
// network, and every interval probes a bounded, rotating sample of peer
// exporters in each zone (never all of them), recording the RTT of small
// frames on an established connection (the handshake is not counted) in
// zonewatch_zone_rtt_seconds{src_zone,dst_zone}.
package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FrameSize is the size of one probe frame, each way. Small frames, like an
// all-reduce's latency-bound messages: the RTT is the network's, not a
// bandwidth figure.
const FrameSize = 16

// DefaultPort is the probe port, next to the metrics port 19420.
const DefaultPort = 19421

// Peer is another exporter to probe.
type Peer struct {
	Node, Zone string
	// Addr is host:port on the pod network.
	Addr string
	// Pod is the peer's pod, namespace/name ("" when not known): whom
	// PolicyDrops asks about.
	Pod string
}

// Peers lists the exporters to probe (the index of exporter pods).
type Peers interface {
	Peers() []Peer
}

// Config holds the prober's knobs.
type Config struct {
	// Node and Zone are this exporter's; peers on Node are skipped. Zone
	// returns "" while it is not known: no round runs then.
	Node string
	Zone func() string
	// PerZone is at most how many peers of each zone one round probes.
	PerZone int
	// Count is how many frames each probed peer echoes.
	Count    int
	Interval time.Duration
	Timeout  time.Duration
	// Drops, when set, is asked about every probe that timed out: one
	// whose packets a network policy dropped counts as policy_denied.
	Drops PolicyDrops
}

// Metrics are the prober's series.
type Metrics struct {
	RTT      *prometheus.HistogramVec
	Failures *prometheus.CounterVec
	Sent     *prometheus.CounterVec
	// InboundDenied counts peers' probes to this exporter that this
	// node's datapath dropped by a policy (Config.Drops an InboundDrops).
	InboundDenied *prometheus.CounterVec
}

// NewMetrics registers the probe metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		RTT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "zonewatch_zone_rtt_seconds",
			Help: "Round-trip time of a 16-byte frame on an established TCP connection to a peer exporter, by this exporter's zone and the peer's.",
			// Classic buckets from 25 µs (same host) to 100 ms (far regions);
			// a Prometheus that scrapes native histograms gets those instead.
			Buckets:                         prometheus.ExponentialBucketsRange(25e-6, 0.1, 16),
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  160,
			NativeHistogramMinResetDuration: time.Hour,
		}, []string{"src_zone", "dst_zone"}),
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zonewatch_probe_failures_total",
			Help: "Probes of peer exporters that failed, by this exporter's zone, the peer's zone and why (refused, timeout, reset, policy_denied: dropped by a network policy, as this node's Hubble saw it; other).",
		}, []string{"src_zone", "dst_zone", "reason"}),
		Sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zonewatch_probe_sent_bytes_total",
			Help: "Probe payload bytes sent to peer exporters, by the peer's zone (echoed back the same; TCP/IP headers not included).",
		}, []string{"dst_zone"}),
		InboundDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zonewatch_probe_inbound_denied_total",
			Help: "Probe packets from peer exporters in src_zone to this exporter (in dst_zone) that this node's datapath dropped by a network policy, as the node's Hubble saw them: an ingress zone fence, which the prober in src_zone can only count as a timeout.",
		}, []string{"src_zone", "dst_zone"}),
	}
	reg.MustRegister(m.RTT, m.Failures, m.Sent, m.InboundDenied)
	return m
}

// Serve echoes probe frames on l until ctx ends.
func Serve(ctx context.Context, l net.Listener, logger *slog.Logger) {
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				logger.Warn("probe listener stopped", "err", err)
			}
			return
		}
		go echo(c)
	}
}

func echo(c net.Conn) {
	defer c.Close()
	var buf [FrameSize]byte
	for {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(c, buf[:]); err != nil {
			return
		}
		if _, err := c.Write(buf[:]); err != nil {
			return
		}
	}
}

// Prober probes peers.
type Prober struct {
	cfg    Config
	peers  Peers
	m      *Metrics
	logger *slog.Logger
	dial   func(ctx context.Context, addr string) (net.Conn, error)

	mu sync.Mutex
	// cursor is each zone's rotation offset: successive rounds probe the
	// next PerZone peers of the zone, so every peer is probed in turn.
	cursor map[string]int
	// denied holds the zones whose probes were last seen dropped by a
	// policy, so that it is logged when it starts, not every round.
	denied map[string]bool
	// inboundAfter is, per own exporter pod, the time of the newest
	// inbound policy drop counted (the prober's start at first);
	// deniedFrom the source zones last seen dropped here.
	inboundAfter map[string]time.Time
	deniedFrom   map[string]bool
	started      time.Time
}

// NewProber returns a prober of peers.
func NewProber(cfg Config, peers Peers, m *Metrics, logger *slog.Logger) *Prober {
	if cfg.PerZone < 1 {
		cfg.PerZone = 1
	}
	if cfg.Count < 1 {
		cfg.Count = 1
	}
	d := net.Dialer{}
	return &Prober{cfg: cfg, peers: peers, m: m, logger: logger, cursor: map[string]int{}, denied: map[string]bool{},
		inboundAfter: map[string]time.Time{}, deniedFrom: map[string]bool{}, started: time.Now(),
		dial: func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }}
}

// Run probes every interval until ctx ends.
func (p *Prober) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	// Until this node's zone is known (the topology syncing), try again
	// every second rather than every interval.
	for p.cfg.Zone() == "" {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	for {
		p.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample picks this round's peers: at most PerZone of each zone, rotating,
// never this node. Peers are ordered by address within a zone, so the
// rotation is stable while the peer set is.
func (p *Prober) Sample() []Peer {
	byZone := map[string][]Peer{}
	for _, peer := range p.peers.Peers() {
		if peer.Node == p.cfg.Node || peer.Addr == "" {
			continue
		}
		byZone[peer.Zone] = append(byZone[peer.Zone], peer)
	}
	zones := make([]string, 0, len(byZone))
	for z := range byZone {
		zones = append(zones, z)
	}
	sort.Strings(zones)
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Peer
	for _, z := range zones {
		ps := byZone[z]
		sort.Slice(ps, func(i, j int) bool { return ps[i].Addr < ps[j].Addr })
		n := min(p.cfg.PerZone, len(ps))
		start := p.cursor[z] % len(ps)
		for i := 0; i < n; i++ {
			out = append(out, ps[(start+i)%len(ps)])
		}
		p.cursor[z] = start + n
	}
	return out
}

// Round probes one sample, one peer after another: the probe traffic of a
// round stays a few frames in flight at a time.
func (p *Prober) Round(ctx context.Context) {
	src := p.cfg.Zone()
	if src == "" {
		return // this node's zone is not known yet
	}
	for _, peer := range p.Sample() {
		if ctx.Err() != nil {
			return
		}
		// Failure counters start at 0 for every reason, so rate() and
		// increase() see the first failure.
		for _, r := range reasons {
			p.m.Failures.WithLabelValues(src, peer.Zone, r)
		}
		start := time.Now()
		err := p.probe(ctx, src, peer)
		if err == nil {
			p.noteDenied(peer, "", false)
			continue
		}
		why := reason(err)
		if why == reasonTimeout && p.cfg.Drops != nil && ctx.Err() == nil {
			policy, dropped, derr := p.cfg.Drops.Dropped(ctx, peer, start)
			if derr != nil {
				p.logger.Debug("asking hubble whether a policy dropped the probe", "peer", peer.Addr, "err", derr)
			}
			if dropped {
				why = reasonDenied
			}
			p.noteDenied(peer, policy, dropped)
		}
		p.m.Failures.WithLabelValues(src, peer.Zone, why).Inc()
		p.logger.Debug("probe failed", "peer", peer.Addr, "node", peer.Node, "zone", peer.Zone, "reason", why, "err", err)
	}
	p.inbound(ctx, src)
}

// inbound counts the peers' probes to this node's exporter pod that this
// node's datapath dropped by a policy since the last round, by the peer's
// zone: the other half of a fence enforced on ingress, which the peers'
// probers see as timeouts.
func (p *Prober) inbound(ctx context.Context, dst string) {
	var selves []Peer
	zoneOf := map[string]string{}
	for _, peer := range p.peers.Peers() {
		if peer.Node == p.cfg.Node {
			selves = append(selves, peer)
			continue
		}
		// Each peer zone's series starts at 0, so increase() sees the
		// first drop.
		p.m.InboundDenied.WithLabelValues(peer.Zone, dst)
		if peer.Pod != "" {
			zoneOf[peer.Pod] = peer.Zone
		}
	}
	in, ok := p.cfg.Drops.(InboundDrops)
	if !ok || ctx.Err() != nil {
		return
	}
	from := map[string]bool{}
	for _, self := range selves {
		after, ok := p.inboundAfter[self.Pod]
		if !ok {
			after = p.started
		}
		counts, newest, err := in.DroppedFrom(ctx, self, after)
		if err != nil {
			p.logger.Debug("asking hubble for policy drops of peers' probes", "pod", self.Pod, "err", err)
		}
		p.inboundAfter[self.Pod] = newest
		for pod, n := range counts {
			z, ok := zoneOf[pod]
			if !ok {
				continue // not a peer exporter
			}
			p.m.InboundDenied.WithLabelValues(z, dst).Add(float64(n))
			from[z] = true
		}
	}
	for z := range from {
		if !p.deniedFrom[z] {
			p.logger.Warn("probes from a zone are denied by policy on this node: zonewatch's own traffic needs an exemption from the zone fence (Helm: ciliumNetworkPolicy.enabled; a deny rule must exclude zonewatch's pods: docs/runbooks.md)",
				"src_zone", z)
		}
	}
	p.deniedFrom = from
}

func (p *Prober) probe(ctx context.Context, src string, peer Peer) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	c, err := p.dial(ctx, peer.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	obs := p.m.RTT.WithLabelValues(src, peer.Zone)
	sent := p.m.Sent.WithLabelValues(peer.Zone)
	var out, in [FrameSize]byte
	for i := 0; i < p.cfg.Count; i++ {
		out[0] = byte(i)
		start := time.Now()
		if _, err := c.Write(out[:]); err != nil {
			return err
		}
		sent.Add(FrameSize)
		if _, err := io.ReadFull(c, in[:]); err != nil {
			return err
		}
		obs.Observe(time.Since(start).Seconds())
		if in[0] != out[0] {
			return fmt.Errorf("peer %s echoed frame %d as %d", peer.Addr, out[0], in[0])
		}
	}
	return nil
}

// noteDenied logs when probes toward a zone start being dropped by a
// policy, once, with what to change, and when they stop.
func (p *Prober) noteDenied(peer Peer, policy string, dropped bool) {
	p.mu.Lock()
	was := p.denied[peer.Zone]
	p.denied[peer.Zone] = dropped
	p.mu.Unlock()
	switch {
	case dropped && !was:
		p.logger.Warn("probes to a zone are denied by policy, not timing out: zonewatch's own traffic needs an exemption from the zone fence (Helm: ciliumNetworkPolicy.enabled; a deny rule must exclude zonewatch's pods: docs/runbooks.md)",
			"dst_zone", peer.Zone, "peer", peer.Pod, "policy", policy)
	case !dropped && was:
		p.logger.Info("probes to a zone are no longer denied by policy", "dst_zone", peer.Zone)
	}
}

// The failure reasons, the values of the reason label.
const (
	reasonTimeout = "timeout"
	reasonDenied  = "policy_denied"
)

var reasons = []string{"refused", reasonTimeout, "reset", reasonDenied, "other"}

// reason is a failure's label value.
func reason(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return reasonTimeout
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.EPIPE):
		return "reset"
	}
	return "other"
}
