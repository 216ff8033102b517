// Package conntrack counts the bytes of training jobs' connections from
// Cilium's BPF conntrack maps (with bpf.ctAccounting=true): per poll, the
// byte delta of every entry, attributed to the local endpoint's job and
// counted once cluster-wide. It never estimates: when the maps are absent,
// unreadable, of an unknown layout or without accounting, the source is
// down and no bytes are added.
package conntrack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
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

// Config tunes a Poller; the zero value reads every map with an
// auto-detected layout and counts every node's endpoints as local.
type Config struct {
	// Node is this exporter's node: only entries whose local endpoint runs
	// here are counted. Empty counts every known endpoint (one replica fed
	// with every node's entries, as in the simulation).
	Node string
	// Layout forces a ct_entry layout; LayoutAuto decides from entries.
	Layout Layout
	// Maps to read; nil reads MapNames.
	Maps []string
	// Grace keeps the series of a job that is gone (default 5m).
	Grace  time.Duration
	Logger *slog.Logger
	// Self receives the poller's own metrics; nil keeps them unregistered.
	Self prometheus.Registerer
	// Ready reports whether the index is filled (informers synced); until
	// it is, growth is held rather than attributed to nobody. Nil: ready.
	Ready func() bool
}

// maxBytesPerSecond bounds a plausible delta: 100 GB/s is more than any
// single connection moves through a pod network. Larger deltas are garbage
// (cilium counters have been seen wrapped, castai/egressd#19) and skipped.
const maxBytesPerSecond = 100e9

// minVotes entries must agree (90%) before the layout is decided.
const minVotes = 8

// Down reasons, also the log keys.
const (
	reasonAbsent      = "absent"
	reasonPermission  = "permission"
	reasonOpen        = "open"
	reasonLayout      = "layout"
	reasonRead        = "read"
	reasonImplausible = "implausible"
	reasonAccounting  = "accounting_off"
	reasonUndecided   = "layout_undecided"
	reasonAmbiguous   = "layout_ambiguous"
)

var errorReasons = []string{reasonAbsent, reasonPermission, reasonOpen, reasonLayout, reasonRead, reasonImplausible}

// advice is what an operator should change, logged once per state change.
var advice = map[string]string{
	reasonAbsent:     "no Cilium conntrack map found: is Cilium running on this node, is the host's /sys/fs/bpf mounted into the exporter (hostPath, mountPropagation HostToContainer), and does --conntrack.bpffs-path point at Cilium's tc/globals folder?",
	reasonPermission: "not allowed to read BPF maps: run the exporter as root with capability BPF (SYS_ADMIN on kernels before 5.8)",
	reasonOpen:       "opening a conntrack map failed",
	reasonLayout:     "a conntrack map has a layout this exporter does not know (a newer Cilium?): no bytes are counted from it",
	reasonRead:       "reading a conntrack map failed; counts from the other maps continue",
	reasonAccounting: "Cilium's conntrack accounting is off (every byte counter is zero): set the Helm value bpf.ctAccounting=true (agent flag --bpf-conntrack-accounting) and restart the Cilium agents; no bytes are counted until then",
	reasonUndecided:  "cannot yet tell Cilium's ct_entry layout from the entries; no bytes are counted until it can: set --conntrack.layout=combined (Cilium 1.16 and later) or split (before 1.16) to decide",
	reasonAmbiguous:  "the entries disagree about Cilium's ct_entry layout; set --conntrack.layout=combined (Cilium 1.16 and later) or split (before 1.16)",
}

// Unattributed reasons.
const (
	unattrNoJob    = "no_job"
	unattrNotLocal = "not_local"
	unattrOutside  = "opened_outside_cluster"
)

var bytesDesc = prometheus.NewDesc("zonewatch_job_network_bytes_total",
	"Bytes of a training job's connections measured by Cilium conntrack accounting, counted once cluster-wide: by the sender (Cilium before 1.16) or, with Cilium 1.16 and later, both directions by the side that opened the connection.",
	[]string{"namespace", "job_name", "src_zone", "dst_zone", "locality"}, nil)

type bytesKey struct{ namespace, job, srcZone, dstZone, locality string }

func (k bytesKey) JobKey() (string, string) { return k.namespace, k.job }
func (k bytesKey) LabelValues() []string {
	return []string{k.namespace, k.job, k.srcZone, k.dstZone, k.locality}
}

type pending struct {
	tuple Tuple
	bytes uint64
	limit uint64
}

// pollStats is what one poll saw, for the accounting and layout checks.
type pollStats struct {
	entries  int       // non-service entries
	out      int       // of which opened here (TUPLE_F_OUT)
	counting int       // of which with a non-zero packets or bytes counter
	votes    [3]uint64 // by Evidence
	resets   int
	deleted  int
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

	mu      sync.Mutex // one poll at a time; guards what follows
	tables  map[string]*tableState
	epoch   uint32
	pending []pending
	layout  Layout // decided (or forced) layout; LayoutAuto while unknown
	window  [3]uint64
	ambig   bool
	// contradicted: a forced layout was seen contradicted (logged once).
	contradicted bool
	reason       string // why down, "" when up or before the first poll
	polled       bool

	m selfMetrics
}

type selfMetrics struct {
	errors       *prometheus.CounterVec
	entries      *prometheus.GaugeVec
	deleted      prometheus.Counter
	resets       prometheus.Counter
	unattributed *prometheus.CounterVec
	duration     prometheus.Gauge
	layout       *prometheus.GaugeVec
}

func newSelfMetrics() selfMetrics {
	m := selfMetrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_conntrack_errors_total",
			Help: "Conntrack map reads that failed, by reason: absent (no map at all), permission, open, layout (unknown ct_entry layout), read, implausible (a delta above 100 GB/s, skipped)."}, []string{"reason"}),
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_conntrack_entries",
			Help: "Entries read from each Cilium conntrack map in the last poll."}, []string{"map"}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_conntrack_deleted_entries_total",
			Help: "Conntrack entries that disappeared between two polls; bytes they moved after the earlier poll were not counted."}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_conntrack_counter_resets_total",
			Help: "Conntrack entries whose byte counter went down between polls (entry recreated); their whole new counter was counted."}),
		unattributed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_conntrack_unattributed_bytes_total",
			Help: "Measured bytes not added to any job, by reason: no_job (local endpoint is no training-job pod), not_local (no endpoint of the entry on this node), opened_outside_cluster (Cilium 1.16+: connection opened from outside the cluster, which no exporter counts)."}, []string{"reason"}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "zonewatch_conntrack_poll_duration_seconds",
			Help: "Time the last conntrack poll took."}),
		layout: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_conntrack_layout_info",
			Help: "The Cilium ct_entry layout in use (1): split (before 1.16), combined (1.16 and later) or auto (not decided yet)."}, []string{"layout"}),
	}
	for _, r := range errorReasons {
		m.errors.WithLabelValues(r)
	}
	for _, r := range []string{unattrNoJob, unattrNotLocal, unattrOutside} {
		m.unattributed.WithLabelValues(r)
	}
	return m
}

func (m selfMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.errors, m.entries, m.deleted, m.resets, m.unattributed, m.duration, m.layout}
}

// New returns a poller over src. It registers its own metrics on cfg.Self.
func New(src Source, idx Index, cfg Config) (*Poller, error) {
	if cfg.Maps == nil {
		cfg.Maps = MapNames
	}
	if cfg.Grace == 0 {
		cfg.Grace = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Poller{
		src: src, idx: idx, cfg: cfg, log: cfg.Logger.With("source", "conntrack"),
		bytes:  jobcounter.New[bytesKey](bytesDesc, idx, cfg.Grace),
		tables: map[string]*tableState{},
		layout: cfg.Layout,
		m:      newSelfMetrics(),
	}
	p.m.layout.WithLabelValues(p.layout.String()).Set(1)
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
// while the source is down.
func (p *Poller) Update(ch chan<- prometheus.Metric) error {
	p.bytes.Collect(ch)
	return nil
}

// Bytes returns the counter of one series, for tests and reports.
func (p *Poller) Bytes(namespace, job, srcZone, dstZone, locality string) float64 {
	return p.bytes.Value(bytesKey{namespace, job, srcZone, dstZone, locality})
}

// Run polls every interval until ctx ends.
func (p *Poller) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		p.Poll(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll reads every map once and adds the byte deltas since the previous
// poll.
func (p *Poller) Poll(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	p.epoch++
	p.pending = p.pending[:0]

	var st pollStats
	present, failed := 0, 0
	var failReason string
	var failErr error
	for _, name := range p.cfg.Maps {
		t, err := p.src.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			p.m.entries.DeleteLabelValues(name)
			continue
		}
		present++
		if err == nil {
			err = CheckSizes(name, t.KeySize(), t.ValueSize())
			if err == nil {
				err = p.read(name, t, now, &st)
			}
			t.Close()
		}
		if err != nil {
			failed++
			r := errReason(err)
			p.m.errors.WithLabelValues(r).Inc()
			if failErr == nil {
				failReason, failErr = r, err
			}
		}
	}
	p.m.deleted.Add(float64(st.deleted))
	p.m.resets.Add(float64(st.resets))

	// Deltas are counted unless accounting is off or the layout unknown;
	// a map that failed midway still gives what was read before the failure.
	reason := ""
	if st.entries > 0 && st.counting == 0 && (st.out > 0 || p.layout == LayoutCombined) {
		reason = reasonAccounting
	} else {
		p.decideLayout(st.votes)
		// Without entries there is nothing to count, so nothing to decide.
		if p.layout == LayoutAuto && st.entries > 0 {
			reason = reasonUndecided
			if p.ambig {
				reason = reasonAmbiguous
			}
		}
	}
	if reason == "" {
		p.count()
	}
	switch {
	case present == 0:
		reason = reasonAbsent
		p.m.errors.WithLabelValues(reasonAbsent).Inc()
	case failed == present, failed > 0 && reason == "":
		reason = failReason
	}
	p.setState(reason, failErr)
	p.m.duration.Set(time.Since(start).Seconds())
}

func errReason(err error) string {
	var le *ErrLayout
	switch {
	case errors.As(err, &le):
		return reasonLayout
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return reasonPermission
	case errors.Is(err, errRead):
		return reasonRead
	}
	return reasonOpen
}

var errRead = errors.New("conntrack map read failed")

// read walks one map: baselines, deltas, and the evidence for the checks.
func (p *Poller) read(name string, t Table, now time.Time, st *pollStats) error {
	ts := p.tables[name]
	if ts == nil {
		ts = newTableState()
		p.tables[name] = ts
	}
	var limit uint64 = maxBytesPerSecond
	if last := ts.last; !last.IsZero() {
		if s := now.Sub(last).Seconds(); s > 1 {
			limit = uint64(s * maxBytesPerSecond)
		}
	}
	// Until the layout is known and the index filled, growth is held in
	// the baselines rather than dropped, and counted once they are.
	epoch, n := p.epoch, 0
	hold := p.layout == LayoutAuto || (p.cfg.Ready != nil && !p.cfg.Ready())
	err := t.Each(func(key, val []byte) {
		n++
		flags := keyFlags(key)
		if flags&tupleSvc != 0 {
			return
		}
		v := decodeValue(val)
		st.entries++
		if flags&tupleIn == 0 {
			st.out++
		}
		if v.Packets != 0 || v.Bytes != 0 {
			st.counting++
		}
		st.votes[Classify(flags, v)]++
		delta, o := ts.observe(key, v.Bytes, epoch, hold)
		if o == obsReset {
			st.resets++
		}
		if delta == 0 {
			return
		}
		tu, _ := DecodeKey(key)
		p.pending = append(p.pending, pending{tuple: tu, bytes: delta, limit: limit})
	})
	if err != nil {
		return fmt.Errorf("%w: %w", errRead, err)
	}
	st.deleted += ts.complete(epoch, now)
	p.m.entries.WithLabelValues(name).Set(float64(n))
	return nil
}

// decideLayout adds a poll's evidence to the window and decides once
// minVotes entries mostly (90%) agree. A forced layout never changes, but
// entries that clearly contradict it are logged once.
func (p *Poller) decideLayout(votes [3]uint64) {
	p.window[EvidenceSplit] += votes[EvidenceSplit]
	p.window[EvidenceCombined] += votes[EvidenceCombined]
	total := p.window[EvidenceSplit] + p.window[EvidenceCombined]
	if total < minVotes {
		return
	}
	for _, c := range [...]struct {
		ev Evidence
		l  Layout
	}{{EvidenceSplit, LayoutSplit}, {EvidenceCombined, LayoutCombined}} {
		if p.window[c.ev]*10 < total*9 {
			continue
		}
		switch {
		case p.cfg.Layout != LayoutAuto:
			if c.l != p.cfg.Layout && !p.contradicted {
				p.contradicted = true
				p.log.Warn("--conntrack.layout contradicts the conntrack entries; bytes may be misattributed",
					"layout", p.cfg.Layout.String(), "entries_look", c.l.String())
			}
		case p.layout != c.l:
			p.log.Info("conntrack layout decided from the entries", "layout", c.l.String(),
				"split_votes", p.window[EvidenceSplit], "combined_votes", p.window[EvidenceCombined])
			p.m.layout.Reset()
			p.m.layout.WithLabelValues(c.l.String()).Set(1)
			p.layout = c.l
		}
		p.window, p.ambig = [3]uint64{}, false
		return
	}
	if total >= 256 {
		p.ambig = p.layout == LayoutAuto
		p.window = [3]uint64{}
	}
}

// count attributes the poll's deltas to jobs.
func (p *Poller) count() {
	var noJob, notLocal, outside uint64
	for _, d := range p.pending {
		if d.bytes > d.limit {
			p.m.errors.WithLabelValues(reasonImplausible).Inc()
			continue
		}
		t := d.tuple
		local, peer := t.Src, t.Dst
		switch {
		case p.layout == LayoutSplit && t.Ingress():
			// tx_bytes of an ingress entry: what the acceptor sent.
			local, peer = t.Dst, t.Src
		case p.layout == LayoutCombined && t.Ingress():
			// Both directions; the opener's node counts them, unless the
			// opener is outside the cluster and nobody does.
			if _, ok := p.idx.LookupIP(t.Src); !ok {
				outside += d.bytes
			}
			continue
		}
		le, _ := p.idx.LookupIP(local)
		if le.Node == "" || (p.cfg.Node != "" && le.Node != p.cfg.Node) {
			notLocal += d.bytes
			continue
		}
		if le.Job == nil {
			noJob += d.bytes
			continue
		}
		pe, _ := p.idx.LookupIP(peer)
		p.bytes.Add(bytesKey{le.Job.Namespace, le.Job.Name, le.Zone, pe.Zone, topology.Locality(le, pe)}, float64(d.bytes))
	}
	p.m.unattributed.WithLabelValues(unattrNoJob).Add(float64(noJob))
	p.m.unattributed.WithLabelValues(unattrNotLocal).Add(float64(notLocal))
	p.m.unattributed.WithLabelValues(unattrOutside).Add(float64(outside))
}

// setState records up/down and logs only when the state changes.
func (p *Poller) setState(reason string, err error) {
	p.up.Store(reason == "")
	if p.polled && reason == p.reason {
		return
	}
	p.polled = true
	p.reason = reason
	if reason == "" {
		p.log.Info("conntrack source up", "layout", p.layout.String())
		return
	}
	args := []any{"reason", reason, "fix", advice[reason]}
	if err != nil && reason == errReason(err) {
		args = append(args, "err", err)
	}
	p.log.Warn("conntrack source down: no bytes counted", args...)
}
