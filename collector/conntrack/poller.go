// Package conntrack counts the bytes of training jobs' connections from
// Cilium's BPF conntrack maps (with bpf.ctAccounting=true): per poll, the
// byte delta of every entry, attributed to the local endpoint's job and
// counted once cluster-wide. It never estimates: when the maps are absent,
// unreadable, of an unknown layout or without accounting, the source is
// down and no bytes are added.
package conntrack

import (
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/jobcounter"
	"github.com/zonewatch/zonewatch/topology"
)

// Index places IPs and tells which jobs exist; the topology index
// satisfies it.
type Index interface {
	LookupIP(netip.Addr) (topology.Endpoint, bool)
	JobExists(namespace, name string) bool
}

// Poller reads the conntrack maps every interval and keeps the per-job byte
// counters. It is a collector.Collector (Update) and collector.Source (Up).
type Poller struct {
	src Source
	idx Index
	cfg Config
	log *slog.Logger

	bytes *jobcounter.Vec[bytesKey]
	up    atomic.Bool

	mu     sync.Mutex // one poll at a time; guards what follows
	tables map[string]*tableState
	epoch  uint32    // polls made; tables mark the entries each one saw
	spare  []pending // the last poll's deltas, emptied: reused, not state
	// waiting are deltas of jobs whose peer's node was being read
	// (count); waitSpare the emptied buffer of the last count's.
	waiting, waitSpare []waitingDelta
	names              []string // maps of the last poll
	// layout is the forced layout, or the last one decided for any map:
	// maps without a decision of their own use it (layoutOf), as the
	// same datapath writes them all.
	layout     Layout
	accountOff bool
	// touchedPolls counts the polls in a row with touched entries and no
	// growth.
	touchedPolls int
	localSeen    bool   // per-endpoint maps reported
	reason       string // why down, "" when up or before the first poll
	polled       bool
	// version is the Cilium version known (flag, SetCiliumVersion);
	// versionLayout the layout it says (LayoutAuto: none, or forced).
	version       string
	versionLayout Layout
	undecidedSaid bool // "layout not known yet" logged

	// The index's cursor of departed job pods, as Run last saw it, and the
	// buffer it reads them into (see podsWent); only Run touches them.
	goneSeen  uint64
	goneKnown bool
	departed  []topology.Departure
	// recent remembers where job pods were (see lookup).
	recent      map[netip.Addr]recentPod
	recentSwept time.Time

	m selfMetrics
}

// New returns a poller over src. It registers its own metrics on cfg.Self.
func New(src Source, idx Index, cfg Config) (*Poller, error) {
	if cfg.Grace == 0 {
		cfg.Grace = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Poller{
		src: src, idx: idx, cfg: cfg, log: cfg.Logger,
		bytes:  jobcounter.New[bytesKey](bytesDesc, idx, cfg.Grace),
		tables: map[string]*tableState{},
		recent: map[netip.Addr]recentPod{},
		layout: cfg.Layout,
		m:      newSelfMetrics(),
	}
	p.m.layout.WithLabelValues(p.layout.String()).Set(1)
	if cfg.CiliumVersion != "" {
		p.setVersion(cfg.CiliumVersion)
	}
	if cfg.Self != nil {
		for _, c := range p.m.collectors() {
			if err := cfg.Self.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// Up reports whether the last poll read every present map, accounting is
// on and the layout is known.
func (p *Poller) Up() bool { return p.up.Load() }

// Update emits zonewatch_job_network_bytes_total. Counts already made stay
// while the source is down, but they do not advance: the collector fails
// (zonewatch_scrape_collector_success 0).
func (p *Poller) Update(ch chan<- prometheus.Metric) error {
	p.bytes.Collect(ch)
	if !p.Up() {
		return errNotCounting
	}
	return nil
}

var errNotCounting = errors.New("conntrack source down: byte counters are not advancing (see zonewatch_source_up and the log)")

// Bytes returns the counter of one series, for tests and reports.
func (p *Poller) Bytes(namespace, job, srcZone, dstZone, locality string) float64 {
	return p.bytes.Value(bytesKey{namespace, job, srcZone, dstZone, locality})
}
