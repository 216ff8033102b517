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
	"slices"
	"strings"
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
	// Maps to read; nil reads MapNames and, when the source is a Lister,
	// the per-endpoint maps of ConntrackLocal (LocalMap).
	Maps []string
	// Grace keeps the series of a job that is gone (default 5m).
	Grace  time.Duration
	Logger *slog.Logger
	// Self receives the poller's own metrics; nil keeps them unregistered.
	Self prometheus.Registerer
	// Ready reports whether the index is filled (informers synced); until
	// it is, growth is held rather than attributed to nobody. Nil: ready.
	Ready func() bool
	// CiliumVersion, when known ("1.16.3"), decides the layout (unless
	// Layout forces one) and narrows the advice on turning accounting on
	// to that version. SetCiliumVersion gives it later (Hubble's
	// ServerStatus).
	CiliumVersion string
}

// maxBytesPerSecond bounds a plausible delta: 100 GB/s is more than any
// single connection moves through a pod network. Larger deltas are garbage
// (cilium counters have been seen wrapped, castai/egressd#19) and skipped.
const maxBytesPerSecond = 100e9

// minVotes entries must agree (90%) before a map's layout is decided; a
// decided layout changes only when changeVotes young entries (created
// since) agree at 95% on the other one, as after a 1.15 -> 1.16 upgrade
// that kept the map (same 56-byte value).
const (
	minVotes    = 8
	changeVotes = 64
	maxWindow   = 256
)

// Down reasons, also the log keys.
const (
	reasonAbsent      = "absent"
	reasonPermission  = "permission"
	reasonOpen        = "open"
	reasonLayout      = "layout"
	reasonRead        = "read"
	reasonImplausible = "implausible"
	reasonAccounting  = "accounting_off"
	reasonAmbiguous   = "layout_ambiguous"
)

var errorReasons = []string{reasonAbsent, reasonPermission, reasonOpen, reasonLayout, reasonRead, reasonImplausible}

// advice is what an operator should change, logged once per state change;
// accounting_off is EnableAdvice.
var advice = map[string]string{
	reasonAbsent:     "no Cilium conntrack map found: is Cilium running on this node, is the host's /sys/fs/bpf mounted into the exporter (hostPath, mountPropagation HostToContainer), and does --conntrack.bpffs-path point at Cilium's tc/globals folder?",
	reasonPermission: "not allowed to read BPF maps: run the exporter as root with capability BPF (SYS_ADMIN on kernels before 5.8)",
	reasonOpen:       "opening a conntrack map failed",
	reasonLayout:     "a conntrack map has a layout this exporter does not know (a newer Cilium?): no bytes are counted from it",
	reasonRead:       "reading a conntrack map failed; counts from the other maps continue",
	reasonAmbiguous:  "the entries disagree about Cilium's ct_entry layout and the Cilium version is not known: set --conntrack.cilium-version (or --conntrack.layout=combined for Cilium 1.16 and later, split before 1.16); egress entries are counted, the growth of ingress entries is held until then",
}

// How to turn accounting on, by Cilium version (checked in each version's
// daemon/cmd/daemon_main.go, pkg/option and Helm chart).
const (
	// 1.14/1.15: the agent sets ConntrackAccounting on at start
	// (daemon_main.go: Opts.SetBool(option.ConntrackAccounting, true)).
	adviceUpTo115 = "Cilium 1.14/1.15 counts by default, so someone turned it off at run time: run `cilium-dbg config ConntrackAccounting=Enabled` (Cilium 1.14: `cilium config ...`) in every cilium agent pod, or restart the agents"
	// 1.16: SetBool(option.ConntrackAccounting, false), no flag, no value.
	advice116 = "Cilium 1.16 has no flag or Helm value for it: run `cilium-dbg config ConntrackAccounting=Enabled` in every cilium agent pod; the agent turns it off again whenever it restarts, so repeat it after each restart (or upgrade to 1.17)"
	// 1.17+: --bpf-conntrack-accounting (cilium#34921, #35142), Helm
	// bpf.ctAccounting; the 1.18+ chart writes the ConfigMap value as "1".
	advice117 = "Cilium 1.17 and later: set the Helm value bpf.ctAccounting=true (agent flag --bpf-conntrack-accounting; ConfigMap key bpf-conntrack-accounting, \"true\" in 1.17, \"1\" from 1.18) and restart the Cilium agents"
)

// EnableAdvice says how to turn Cilium's conntrack accounting on: for
// version when it is known ("1.16.3", "v1.17.0"), else for the layout the
// maps have (split: 1.14/1.15; combined: 1.16 and later), else for all.
func EnableAdvice(version string, layout Layout) string {
	const tail = "; no bytes are counted until then"
	minor := versionMinor(version)
	switch {
	case minor >= 14 && minor <= 15:
		return adviceUpTo115 + tail
	case minor == 16:
		return advice116 + tail
	case minor >= 17:
		return advice117 + tail
	case layout == LayoutSplit:
		return adviceUpTo115 + tail
	case layout == LayoutCombined:
		return advice116 + ". " + advice117 + tail
	}
	return adviceUpTo115 + ". " + advice116 + ". " + advice117 + tail
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
	tuple  Tuple
	bytes  uint64
	limit  uint64
	secID  uint32
	layout Layout
	// both: a split ingress entry opened by no Cilium endpoint, whose
	// counter is tx+rx (what both sides sent; see read).
	both bool
}

// pollStats is what one poll saw, for the accounting and layout checks.
type pollStats struct {
	entries  int // connection entries (no service or related ones)
	counting int // of which with a non-zero counter
	// on / off: evidence that accounting is on now (a counter grew, a
	// young entry counted its first packet) or off (a young entry without
	// the counts its creation would have set).
	on, off    int
	touched    int // entries whose lifetime moved while their counter did not (combined)
	resets     int
	deleted    int
	activeGone int  // of the deleted, those that had grown in the read before
	undecided  bool // a map with entries has no layout yet
	ambiguous  bool
	local      int // per-endpoint (ConntrackLocal) maps read
	localN     int // their entries
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
	names   []string // maps of this poll
	// layout is the last layout decided for any map (or the forced one):
	// maps without a decision of their own use it, as the same datapath
	// writes them all.
	layout     Layout
	ready      bool // the index was filled when this poll began
	accountOff bool
	// touchedPolls counts the polls in a row with touched entries and no
	// growth.
	touchedPolls int
	localSeen    bool   // per-endpoint maps reported
	reason       string // why down, "" when up or before the first poll
	polled       bool
	// version is the Cilium version known (flag, SetCiliumVersion);
	// versionLayout the layout it says (LayoutAuto: none).
	version       string
	versionLayout Layout
	undecidedSaid bool // "layout not known yet" logged

	// The index's count of this node's job pods gone, as Run last saw it
	// (see podsWent); only Run touches it.
	goneSeen  uint64
	goneKnown bool
	// recent remembers where job pods were (see lookup); now is the time
	// of the poll in progress.
	recent      map[netip.Addr]recentPod
	recentSwept time.Time
	now         time.Time

	m selfMetrics
}

type selfMetrics struct {
	errors        *prometheus.CounterVec
	entries       *prometheus.GaugeVec
	maxEntries    *prometheus.GaugeVec
	deleted       prometheus.Counter
	activeGone    prometheus.Counter
	resets        prometheus.Counter
	unattributed  *prometheus.CounterVec
	duration      prometheus.Gauge
	layout        *prometheus.GaugeVec
	layoutChanges *prometheus.CounterVec
}

// localMapLabel is the map label of the per-endpoint maps, summed: one
// series per endpoint would grow with the pods.
const localMapLabel = "per_endpoint"

func mapLabel(name string) string {
	if LocalMap(name) {
		return localMapLabel
	}
	return name
}

func newSelfMetrics() selfMetrics {
	m := selfMetrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_conntrack_errors_total",
			Help: "Conntrack map reads that failed, by reason: absent (no map at all), permission, open, layout (unknown ct_entry layout), read, implausible (a delta above 100 GB/s, skipped)."}, []string{"reason"}),
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_conntrack_entries",
			Help: "Entries read from each Cilium conntrack map in the last poll (map=\"per_endpoint\": all ConntrackLocal maps together)."}, []string{"map"}),
		maxEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_conntrack_map_max_entries",
			Help: "Size of each Cilium conntrack map (it follows node memory with bpf-map-dynamic-size-ratio); a full LRU map evicts entries, and their last bytes are not counted."}, []string{"map"}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_conntrack_deleted_entries_total",
			Help: "Conntrack entries that disappeared between two polls; bytes they moved after the earlier poll were not counted."}),
		activeGone: prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_conntrack_deleted_active_entries_total",
			Help: "Of the deleted entries, those whose counter had grown in the poll before they went: bytes they moved after it may be uncounted. The maps are read at once when a local job pod goes; these are mostly entries deleted without warning (a pod killed before its informer event, LRU eviction, a short connection collected between polls)."}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_conntrack_entry_resets_total",
			Help: "Conntrack entries whose byte counter went down between polls (entry recreated); their whole new counter was counted."}),
		unattributed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_conntrack_unattributed_bytes_total",
			Help: "Measured bytes not added to any job, by reason: no_job (local endpoint is no training-job pod), not_local (no endpoint of the entry on this node), opened_outside_cluster (connection opened from outside the cluster into a pod)."}, []string{"reason"}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "zonewatch_conntrack_poll_duration_seconds",
			Help: "Time the last conntrack poll took."}),
		layout: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_conntrack_layout_info",
			Help: "The Cilium ct_entry layout in use (1): split (before 1.16), combined (1.16 and later) or auto (not decided yet)."}, []string{"layout"}),
		layoutChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_conntrack_layout_changes_total",
			Help: "Times a map's decided ct_entry layout was changed because the entries created since said otherwise (e.g. a Cilium upgrade from 1.15 to 1.16 that kept the map)."}, []string{"map"}),
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
	return []prometheus.Collector{m.errors, m.entries, m.maxEntries, m.deleted, m.activeGone, m.resets, m.unattributed, m.duration, m.layout, m.layoutChanges}
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

// SetCiliumVersion gives the Cilium version the agent reports (Hubble's
// ServerStatus); unless --conntrack.layout forces one, it decides the
// layout of every map at once, without waiting for entries to tell.
func (p *Poller) SetCiliumVersion(version string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setVersion(version)
}

func (p *Poller) setVersion(version string) {
	p.version = version
	if p.cfg.Layout != LayoutAuto {
		return
	}
	l, ok := VersionLayout(version)
	if !ok {
		p.log.Info("the Cilium version does not tell the conntrack layout; it is told from the entries", "version", version)
		return
	}
	if l == p.versionLayout {
		return
	}
	p.versionLayout = l
	p.log.Info("conntrack layout decided from the Cilium version", "version", version, "layout", l.String())
	for name, ts := range p.tables {
		if ts.layout == l {
			continue
		}
		if ts.layout != LayoutAuto {
			p.log.Warn("conntrack layout changed: the Cilium version says otherwise than the entries did", "map", name, "was", ts.layout.String(), "layout", l.String(), "version", version)
			p.m.layoutChanges.WithLabelValues(mapLabel(name)).Inc()
		}
		p.setLayout(ts, l)
	}
	p.useLayout(l)
}

// Run polls every interval until ctx ends. When a job pod of this node
// stops counting (terminating, finished or deleted), it reads at once and
// then every fastInterval for goingWindow: Cilium deletes the CT entries
// of an endpoint with it, and what they moved since the last read would
// be lost (docs/conntrack.md, "What can be missed between polls").
func (p *Poller) Run(ctx context.Context, interval time.Duration) {
	s := schedule{interval: interval}
	tick := time.NewTicker(min(interval, watchEvery))
	defer tick.Stop()
	for {
		now := time.Now()
		// The first call takes the count there is now.
		went, wake := p.podsWent()
		if s.due(now, went) {
			p.Poll(now)
			s.polled(now, time.Since(now))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-wake: // a job pod went, here or on another node
		}
	}
}

// How Run follows pods that go: the index wakes it at once when one does
// (and it looks every watchEvery); after a pod went, the maps are read
// every fastInterval (or five times the last poll's duration, if longer)
// for goingWindow: the pod's termination grace period (30 s by default)
// and its CNI DEL, after which Cilium has deleted its entries.
const (
	watchEvery   = time.Second
	fastInterval = time.Second
	goingWindow  = 45 * time.Second
)

// schedule decides when Run reads the maps.
type schedule struct {
	interval  time.Duration
	last      time.Time // start of the last poll; zero before the first
	took      time.Duration
	fastUntil time.Time
}

// due reports whether to poll at now; went: a pod went since the last call.
func (s *schedule) due(now time.Time, went bool) bool {
	if went {
		s.fastUntil = now.Add(goingWindow)
		return true
	}
	if s.last.IsZero() {
		return true
	}
	every := s.interval
	if now.Before(s.fastUntil) {
		every = min(every, max(fastInterval, 5*s.took))
	}
	// Half a tick of slack: ticks and polls do not start on the dot.
	return now.Sub(s.last)+watchEvery/2 >= every
}

func (s *schedule) polled(at time.Time, took time.Duration) { s.last, s.took = at, took }

// podIndex is what the topology index tells about pods that go; an Index
// without it gets no reads on pod changes.
type podIndex interface {
	PodsGone(node string) (uint64, <-chan struct{})
}

// podsWent reports whether a job pod of this node (of any node with an
// empty Config.Node) stopped counting for placement since the last call
// (terminating, finished or deleted), and returns the channel closed at
// the next pod's going (nil without a podIndex). It counts the index's
// events rather than comparing the pods seen at each call: a pod that
// came and went between two calls, as a short-lived one does (created,
// moving its bytes and deleted within a second), is not missed. Only Run
// calls it.
func (p *Poller) podsWent() (bool, <-chan struct{}) {
	pi, ok := p.idx.(podIndex)
	if !ok {
		return false, nil
	}
	n, wake := pi.PodsGone(p.cfg.Node)
	first := !p.goneKnown
	went := !first && n != p.goneSeen
	if went {
		p.log.Debug("job pod went: reading the conntrack maps now", "node", p.cfg.Node, "pods", n-p.goneSeen)
	}
	p.goneSeen, p.goneKnown = n, true
	return went, wake
}

// LocalMap reports whether name is a per-endpoint CT map, which Cilium
// 1.14-1.17 creates for endpoints with the (deprecated, opt-in) option
// ConntrackLocal: the global map's name with the endpoint ID in 5 digits
// instead of "global" (pkg/maps/ctmap/ctmap.go and bpf.LocalMapName,
// v1.14.0-v1.17.0; removed in 1.18). Same key and value layout.
func LocalMap(name string) bool {
	for _, prefix := range [...]string{"cilium_ct4_", "cilium_ct6_", "cilium_ct_any4_", "cilium_ct_any6_"} {
		if id, ok := strings.CutPrefix(name, prefix); ok && len(id) == 5 {
			for _, c := range id {
				if c < '0' || c > '9' {
					return false
				}
			}
			return true
		}
	}
	return false
}

// mapNames returns the maps to read this poll: the configured ones, or the
// global ones plus every per-endpoint map the source lists.
func (p *Poller) mapNames() []string {
	if p.cfg.Maps != nil {
		return p.cfg.Maps
	}
	p.names = append(p.names[:0], MapNames...)
	if l, ok := p.src.(Lister); ok {
		names, err := l.List()
		if err == nil {
			for _, n := range names {
				if LocalMap(n) {
					p.names = append(p.names, n)
				}
			}
		}
	}
	return p.names
}

// Poll reads every map once and adds the byte deltas since the previous
// poll.
func (p *Poller) Poll(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	p.epoch++
	p.now = now
	p.pending = p.pending[:0]
	p.ready = p.cfg.Ready == nil || p.cfg.Ready()

	var st pollStats
	present, failed := 0, 0
	var failReason string
	var failErr error
	names := p.mapNames()
	for _, name := range names {
		t, err := p.src.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			delete(p.tables, name)
			p.m.entries.DeleteLabelValues(name)
			p.m.maxEntries.DeleteLabelValues(name)
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
	p.forgetGone(names)
	p.reportLocal(st)
	p.m.deleted.Add(float64(st.deleted))
	p.m.activeGone.Add(float64(st.activeGone))
	p.m.resets.Add(float64(st.resets))

	// Accounting is decided from what changed: a counter that grew, or a
	// young entry with counts, says on; young entries without the counts
	// their creation sets, or nothing but zero counters, say off. Frozen
	// counters (accounting turned off keeps the last values) say nothing.
	// Entries that passed packets without counting them say off too (a
	// node with long-lived connections only), in two polls running: the
	// datapath writes the lifetime before it adds to the counters, so one
	// read can fall in between.
	if st.on == 0 && st.touched > 0 {
		p.touchedPolls++
	} else {
		p.touchedPolls = 0
	}
	switch {
	case st.on > 0:
		p.accountOff = false
	case st.off > 0, st.entries > 0 && st.counting == 0, p.touchedPolls >= 2:
		p.accountOff = true
	}
	// Deltas are counted unless accounting is off; a map that failed
	// midway still gives what was read before the failure. Without a
	// layout, egress entries count (the same in both layouts) and the
	// growth of ingress entries is held: nothing is wrong yet, so the
	// source stays up and says so once, unless the entries disagree.
	reason := ""
	switch {
	case p.accountOff:
		reason = reasonAccounting
	case st.ambiguous:
		reason = reasonAmbiguous
	}
	if !p.accountOff {
		p.count()
	}
	p.forgetRecent()
	if st.undecided && !p.undecidedSaid {
		p.undecidedSaid = true
		p.log.Info("conntrack layout not known yet (no Cilium version, too few ingress entries): counting egress entries, which read the same in both layouts; the growth of ingress entries is counted once the layout is known")
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

// forgetGone drops the state of maps no longer listed (an endpoint's map
// goes with the endpoint).
func (p *Poller) forgetGone(names []string) {
	if len(p.tables) <= len(names) {
		return
	}
	for name := range p.tables {
		if !slices.Contains(names, name) {
			delete(p.tables, name)
		}
	}
}

// reportLocal exports the per-endpoint maps' entries and logs once that
// they are read.
func (p *Poller) reportLocal(st pollStats) {
	if st.local == 0 {
		p.m.entries.DeleteLabelValues(localMapLabel)
		return
	}
	p.m.entries.WithLabelValues(localMapLabel).Set(float64(st.localN))
	if !p.localSeen {
		p.localSeen = true
		p.log.Info("per-endpoint conntrack maps found (Cilium ConntrackLocal, 1.14-1.17): reading them too", "maps", st.local)
	}
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

// table returns the state of a map, new when the map was recreated.
func (p *Poller) table(name string, t Table) *tableState {
	var id uint64
	if i, ok := t.(interface{ MapID() uint64 }); ok {
		id = i.MapID()
	}
	ts := p.tables[name]
	if ts != nil && id != 0 && ts.id != 0 && id != ts.id {
		p.log.Info("conntrack map recreated: its entries are read as new baselines and its layout decided again", "map", name)
		ts = nil
	}
	if ts == nil {
		ts = newTableState()
		ts.id = id
		ts.layout = p.cfg.Layout
		if ts.layout == LayoutAuto {
			ts.layout = p.versionLayout
		}
		p.tables[name] = ts
		p.m.layoutChanges.WithLabelValues(mapLabel(name))
	}
	return ts
}

// read walks one map: baselines, deltas, and the evidence for the checks.
func (p *Poller) read(name string, t Table, now time.Time, st *pollStats) error {
	ts := p.table(name, t)
	var max uint32
	if m, ok := t.(interface{ MaxEntries() uint32 }); ok && !LocalMap(name) {
		if max = m.MaxEntries(); max > 0 {
			p.m.maxEntries.WithLabelValues(name).Set(float64(max))
		}
	}
	var limit uint64 = maxBytesPerSecond
	if last := ts.last; !last.IsZero() {
		if s := now.Sub(last).Seconds(); s > 1 {
			limit = uint64(s * maxBytesPerSecond)
		}
	}
	layout := ts.layout
	if layout == LayoutAuto {
		layout = p.layout
	}
	// Until the index is filled, growth is held in the baselines rather
	// than dropped, and counted once it is; so is the growth of ingress
	// entries until the layout is known. Egress entries read the same in
	// both layouts: offset 24 is what the opener sent (split tx_bytes) or
	// both directions (combined bytes), counted for the opener either way.
	epoch, n, entries := p.epoch, 0, 0
	hold := !p.ready
	holdIn := hold || layout == LayoutAuto
	voteAll := ts.layout == LayoutAuto || p.cfg.Layout != LayoutAuto
	err := t.Each(func(key, val []byte) {
		n++
		flags := keyFlags(key)
		if flags&(tupleSvc|tupleRel) != 0 {
			return
		}
		v := decodeValue(val)
		entries++
		if v.Packets != 0 || v.Bytes != 0 || plausible(v.Word0, v.Word1) {
			st.counting++
		}
		ev := Classify(flags, v)
		if voteAll {
			ts.window[ev]++
		}
		// A split ingress entry that no Cilium endpoint opened (the host
		// network, the world) is the only entry of its connection: it
		// tracks both directions, tx+rx, as combined entries do. (Before
		// the layout is known too: a combined ingress entry has zero in
		// word 1, so its counter reads the same.)
		ingress, counter, both := flags&tupleIn != 0, v.Bytes, false
		if ingress && layout != LayoutCombined && !endpointIdentity(v.SrcSecID) && !p.podOpened(key) {
			counter, both = v.Bytes+v.Word1, true
		}
		delta, o, young := ts.observe(key, counter, v.Lifetime, epoch, hold || ingress && holdIn)
		switch o {
		case obsReset:
			st.resets++
			fallthrough
		case obsFresh:
			ts.young[ev]++
		case obsGrown:
			st.on++
		case obsTouched:
			// Combined: every looked-up packet moves the lifetime and,
			// with accounting, the one counter (__ct_lookup). Split
			// counts rx apart, which is not kept here.
			if layout == LayoutCombined {
				st.touched++
			}
		}
		if young && o != obsGrown {
			// Counts set at creation say on once, at first sight: they
			// stay when accounting is turned off afterwards.
			switch accountingEvidence(v, layout) {
			case acctOn:
				if o == obsFresh || o == obsReset {
					st.on++
				}
			case acctOff:
				st.off++
			}
		}
		if delta == 0 {
			return
		}
		tu, _ := DecodeKey(key)
		p.pending = append(p.pending, pending{tuple: tu, bytes: delta, limit: limit, secID: v.SrcSecID, layout: layout, both: both})
	})
	st.entries += entries
	if err != nil {
		return fmt.Errorf("%w: %w", errRead, err)
	}
	deleted, active := ts.complete(epoch, now)
	st.deleted += deleted
	st.activeGone += active
	if LocalMap(name) {
		st.local++
		st.localN += n
	} else {
		p.m.entries.WithLabelValues(name).Set(float64(n))
	}
	// A full LRU map evicts live entries, whose last bytes are lost; its
	// size follows node memory (bpf-map-dynamic-size-ratio), so say so.
	if full := max > 0 && uint64(n)*10 >= uint64(max)*9; full != ts.full {
		ts.full = full
		if full {
			p.log.Warn("conntrack map nearly full: Cilium evicts entries (LRU) and their last bytes are not counted; raise bpf-ct-global-tcp-max / -any-max or bpf.mapDynamicSizeRatio",
				"map", name, "entries", n, "max_entries", max)
		}
	}
	p.decideLayout(name, ts)
	if entries > 0 && ts.layout == LayoutAuto && p.layout == LayoutAuto {
		st.undecided = true
		st.ambiguous = st.ambiguous || ts.ambig
	}
	return nil
}

// acct is what one young entry says about accounting.
type acct uint8

const (
	acctNone acct = iota
	acctOn
	acctOff
)

// accountingEvidence tells what a young entry (created while the exporter
// watched) says about accounting: its creation sets the first packet's
// counts when accounting is on (ct_create4/6 in bpf/lib/conntrack.h):
// combined (1.16+) sets packets=1 only with accounting, split (1.14/1.15)
// sets one side's first packet always but adds later packets only with it.
func accountingEvidence(v Value, layout Layout) acct {
	zero := v.Packets == 0 && v.Bytes == 0 && !plausible(v.Word0, v.Word1)
	switch layout {
	case LayoutSplit:
		pkts := v.Word0 + v.Packets
		switch {
		case pkts > 1:
			return acctOn
		case v.TxFlagsSeen != 0 && v.RxFlagsSeen != 0:
			// A TCP handshake went both ways, yet one packet counted.
			return acctOff
		}
	case LayoutCombined:
		if v.Packets > 0 {
			return acctOn
		}
		return acctOff
	default:
		if zero {
			return acctOff // no layout leaves every counter at zero
		}
	}
	return acctNone
}

// verdict returns the layout that at least pct% of votes (and at least
// min) agree on.
func verdict(votes [3]uint64, min, pct uint64) (Layout, bool) {
	total := votes[EvidenceSplit] + votes[EvidenceCombined]
	switch {
	case total < min:
	case votes[EvidenceSplit]*100 >= total*pct:
		return LayoutSplit, true
	case votes[EvidenceCombined]*100 >= total*pct:
		return LayoutCombined, true
	}
	return LayoutAuto, false
}

// decideLayout decides a map's layout once: from the entries created
// while the exporter watched when enough of them vote, else from all
// entries (minVotes at 90%). A decided layout changes only when
// changeVotes entries created since agree at 95% on the other one; a
// change is logged and counted. A forced layout never changes, but
// entries that clearly contradict it are logged once.
func (p *Poller) decideLayout(name string, ts *tableState) {
	if p.cfg.Layout != LayoutAuto {
		if l, ok := verdict(ts.window, minVotes, 90); ok && l != p.cfg.Layout && !ts.contradicted {
			ts.contradicted = true
			p.log.Warn("--conntrack.layout contradicts the conntrack entries; bytes may be misattributed",
				"map", name, "layout", p.cfg.Layout.String(), "entries_look", l.String())
		}
		if ts.window[EvidenceSplit]+ts.window[EvidenceCombined] >= maxWindow {
			ts.window = [3]uint64{}
		}
		return
	}
	if ts.layout == LayoutAuto {
		l, ok := verdict(ts.young, minVotes, 90)
		if !ok {
			l, ok = verdict(ts.window, minVotes, 90)
		}
		if !ok {
			if ts.window[EvidenceSplit]+ts.window[EvidenceCombined] >= maxWindow {
				ts.ambig, ts.window = true, [3]uint64{}
			}
			return
		}
		p.log.Info("conntrack layout decided from the entries", "map", name, "layout", l.String(),
			"split_votes", ts.window[EvidenceSplit]+ts.young[EvidenceSplit], "combined_votes", ts.window[EvidenceCombined]+ts.young[EvidenceCombined])
		p.setLayout(ts, l)
		return
	}
	if l, ok := verdict(ts.young, changeVotes, 95); ok && l != ts.layout {
		was := ts.layout
		p.log.Warn("conntrack layout changed: the entries created since say otherwise (Cilium upgraded or downgraded across 1.16?)",
			"map", name, "was", was.String(), "layout", l.String(),
			"split_votes", ts.young[EvidenceSplit], "combined_votes", ts.young[EvidenceCombined])
		p.m.layoutChanges.WithLabelValues(mapLabel(name)).Inc()
		p.setLayout(ts, l)
		// One datapath writes every map: the others that had the old
		// layout (a UDP map may see too few new entries to vote) follow.
		for other, ots := range p.tables {
			if ots.layout == was {
				p.log.Warn("conntrack layout changed with another map's", "map", other, "with", name, "layout", l.String())
				p.m.layoutChanges.WithLabelValues(mapLabel(other)).Inc()
				p.setLayout(ots, l)
			}
		}
		return
	}
	if ts.young[EvidenceSplit]+ts.young[EvidenceCombined] >= maxWindow {
		ts.young = [3]uint64{}
	}
}

func (p *Poller) setLayout(ts *tableState, l Layout) {
	ts.layout, ts.window, ts.young, ts.ambig = l, [3]uint64{}, [3]uint64{}, false
	p.useLayout(l)
}

// useLayout makes l the layout of maps without a decision of their own.
func (p *Poller) useLayout(l Layout) {
	if p.layout != l {
		p.m.layout.Reset()
		p.m.layout.WithLabelValues(l.String()).Set(1)
		p.layout = l
	}
}

// podOpened reports whether the opener of a raw key's connection (its
// first address) is a pod the index holds: job pods, never host-network
// ones. Their node's egress entry holds the connection's bytes, whatever
// identity the acceptor's entry names.
func (p *Poller) podOpened(key []byte) bool {
	var a netip.Addr
	if len(key) == KeySize4 {
		a = netip.AddrFrom4([4]byte(key[0:4]))
	} else {
		a = netip.AddrFrom16([16]byte(key[0:16]))
	}
	return p.openerIsPod(a)
}

func (p *Poller) openerIsPod(a netip.Addr) bool {
	e, _ := p.idx.LookupIP(a)
	return e.Pod != ""
}

// lookup places an address through the index, or as the job pod it was
// until recently: a pod that finished or was deleted leaves the index at
// once, while the final reads of its entries (see Run) are still to be
// attributed to its job. A job pod's place is remembered from its first
// lookup; once the index no longer knows it, for goingWindow.
func (p *Poller) lookup(a netip.Addr) topology.Endpoint {
	e, _ := p.idx.LookupIP(a)
	r, ok := p.recent[a]
	switch {
	case e.Pod != "":
		if !ok || r.ep != e || !r.gone.IsZero() {
			p.recent[a] = recentPod{ep: e}
		}
		return e
	case !ok:
		return e
	case r.gone.IsZero():
		r.gone = p.now
		p.recent[a] = r
	}
	if p.now.Sub(r.gone) <= goingWindow {
		return r.ep
	}
	delete(p.recent, a)
	return e
}

// recentPod is a job pod's place as the index last told it, and when
// the index was first found without it.
type recentPod struct {
	ep   topology.Endpoint
	gone time.Time
}

// forgetRecent drops, every goingWindow, the places of pods gone from
// the index for that long (their addresses may not be looked up again).
func (p *Poller) forgetRecent() {
	if p.now.Sub(p.recentSwept) < goingWindow {
		return
	}
	p.recentSwept = p.now
	for a, r := range p.recent {
		if r.gone.IsZero() {
			if e, _ := p.idx.LookupIP(a); e.Pod == "" {
				r.gone = p.now
				p.recent[a] = r
			}
			continue
		}
		if p.now.Sub(r.gone) > goingWindow {
			delete(p.recent, a)
		}
	}
}

// count attributes the poll's deltas to jobs. Every delta lands in a job
// or in an unattributed reason, except the ingress entries of connections
// a Cilium endpoint opened: its own node counts their bytes, from its
// egress entry.
func (p *Poller) count() {
	var noJob, notLocal, outside uint64
	for _, d := range p.pending {
		if d.bytes > d.limit {
			p.m.errors.WithLabelValues(reasonImplausible).Inc()
			continue
		}
		t := d.tuple
		local, peer := t.Src, t.Dst
		openerIsPeer := false
		if t.Ingress() {
			switch {
			case d.layout == LayoutSplit && !d.both:
				// tx_bytes of an ingress entry: what the acceptor sent.
				local, peer = t.Dst, t.Src
			case d.both || !endpointIdentity(d.secID) && !p.openerIsPod(t.Src):
				// Opened by no Cilium endpoint: the host network of a node
				// (host, remote-node, kube-apiserver, or world on a node's
				// cilium_host address), or outside the cluster. No egress
				// entry holds these bytes: the acceptor's node counts both
				// directions, with the opener's zone as src_zone.
				if !hostIdentity(d.secID) {
					if _, ok := p.idx.LookupIP(t.Src); !ok {
						outside += d.bytes
						continue
					}
				}
				local, peer, openerIsPeer = t.Dst, t.Src, true
			default:
				// Combined, opened by a Cilium endpoint: its node counts it.
				continue
			}
		}
		le := p.lookup(local)
		if le.Node == "" || (p.cfg.Node != "" && le.Node != p.cfg.Node) {
			notLocal += d.bytes
			continue
		}
		if le.Job == nil {
			noJob += d.bytes
			continue
		}
		pe := p.lookup(peer)
		src, dst := le.Zone, pe.Zone
		if openerIsPeer {
			src, dst = dst, src
		}
		p.bytes.Add(bytesKey{le.Job.Namespace, le.Job.Name, src, dst, topology.Locality(le, pe)}, float64(d.bytes))
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
	fix := advice[reason]
	if reason == reasonAccounting {
		fix = "Cilium's conntrack accounting is off (connections created since the exporter started count no packets): " + EnableAdvice(p.version, p.layout)
	}
	args := []any{"reason", reason, "fix", fix}
	if err != nil && reason == errReason(err) {
		args = append(args, "err", err)
	}
	p.log.Warn("conntrack source down: no bytes counted", args...)
}
