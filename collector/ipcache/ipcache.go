// Package ipcache reads the node's own Cilium ipcache, the map through
// which Cilium's datapath places every address of the cluster: for an
// address it gives the security identity and, for an endpoint on another
// node, that node's IP (the tunnel endpoint; Cilium sets it in tunnel and
// in native routing alike). An exporter places a remote peer with it
// without watching the cluster's pods.
//
// The map is cilium_ipcache_v2 from Cilium 1.18 (24-byte values, IPv6
// tunnel endpoints) and cilium_ipcache in 1.14-1.17 (12-byte values),
// an LPM trie pinned beside the conntrack maps in <bpffs>/tc/globals; v2
// is read when both are pinned (a 1.18 agent leaves the old one after an
// upgrade and no longer writes it). What Cilium writes, as seen on real
// agents (docs/conntrack.md, "The ipcache"):
//
//   - a pod on another node: its /32 (/128), its identity, the node's IP
//     as tunnel endpoint (FlagHasTunnelEndpoint);
//   - a pod on this node: its identity, no tunnel endpoint;
//   - a node's own addresses: identity 6 (remote-node) or 1 (this host),
//     no tunnel endpoint;
//   - world prefixes (0.0.0.0/0, CIDR policies) and, in tunnel mode,
//     other nodes' pod CIDRs with the node as tunnel endpoint.
//
// # API
//
// A Reader keeps a snapshot of the map, refreshed by Run (on the
// conntrack poll's cadence) or on demand (Refresh; Kick asks Run for an
// early one, as when a flow names an address the snapshot lacks).
// Lookup is safe for concurrent use and allocates nothing:
//
//	r, _ := ipcache.New(ipcache.BPFSource{Dir: "/sys/fs/bpf/tc/globals"}, ipcache.Config{Self: reg})
//	go r.Run(ctx, 10*time.Second)
//	if e, ok := r.Lookup(addr); ok && e.NodeIP.IsValid() {
//		// addr is an endpoint on the node e.NodeIP, of identity e.Identity
//	}
//
// Lookup is a longest-prefix match as the datapath's: a /32 entry wins
// over a pod CIDR. Entries of another cluster ID (overlapping pod CIDRs in
// a cluster mesh) are not placed; neither are malformed ones: both are
// counted in zonewatch_ipcache_skipped_entries. While the map cannot be
// read the last snapshot is kept and the source is down.
package ipcache

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Entry is what the ipcache says of an address.
type Entry struct {
	// NodeIP is the node the address lives on when that is another node
	// (the entry's tunnel endpoint); the zero Addr for this node's own
	// endpoints and addresses and for world prefixes.
	NodeIP netip.Addr
	// Identity is Cilium's security identity (Identity* for the reserved
	// ones; 256-65535 cluster-wide label identities; with bit 24 set, a
	// CIDR identity local to the node).
	Identity uint32
	// Flags are the entry's Flag* bits.
	Flags uint8
	// Bits is the prefix length of the entry that matched (32 or 128 for
	// an endpoint's own entry).
	Bits uint8
}

// Reserved identities (pkg/identity's ReservedIdentity*).
const (
	IdentityHost          uint32 = 1
	IdentityWorld         uint32 = 2
	IdentityRemoteNode    uint32 = 6
	IdentityKubeAPIServer uint32 = 7
	IdentityWorldIPv4     uint32 = 9
	IdentityWorldIPv6     uint32 = 10
)

// Config tunes a Reader; the zero value is usable.
type Config struct {
	// Maps to try, in order: the first present is read. Default MapV2,
	// MapV1.
	Maps []string
	// MinInterval between refreshes Kick asks for (default 1s).
	MinInterval time.Duration
	Logger      *slog.Logger
	// Self receives the reader's own metrics; nil keeps them unregistered.
	Self prometheus.Registerer
}

// Read failures, the values of zonewatch_ipcache_errors_total's reason.
const (
	reasonAbsent     = "absent"
	reasonPermission = "permission"
	reasonOpen       = "open"
	reasonLayout     = "layout"
	reasonRead       = "read"
)

var errorReasons = []string{reasonAbsent, reasonPermission, reasonOpen, reasonLayout, reasonRead}

var advice = map[string]string{
	reasonAbsent:     "no Cilium ipcache map (cilium_ipcache_v2, cilium_ipcache) found: is Cilium running on this node and the host's /sys/fs/bpf mounted into the exporter?",
	reasonPermission: "not allowed to read BPF maps: run the exporter as root with capability BPF (SYS_ADMIN on kernels before 5.8)",
	reasonOpen:       "opening the ipcache map failed",
	reasonLayout:     "the ipcache map has a layout this exporter does not know (a newer Cilium?): remote peers are not placed through it",
	reasonRead:       "reading the ipcache map failed; the last snapshot is kept",
}

// Reader holds a snapshot of the ipcache. It is a collector.Source (Up).
type Reader struct {
	src Source
	cfg Config
	log *slog.Logger

	mu  sync.RWMutex // guards cur's identity, not its contents
	cur *snapshot

	refreshMu sync.Mutex // one refresh at a time; guards what follows
	spare     *snapshot
	reason    string
	last      time.Time

	up    atomic.Bool
	tried atomic.Bool
	kick  chan struct{}
	m     selfMetrics
}

type selfMetrics struct {
	entries  *prometheus.GaugeVec
	skipped  *prometheus.GaugeVec
	errors   *prometheus.CounterVec
	duration prometheus.Gauge
}

func newSelfMetrics() selfMetrics {
	m := selfMetrics{
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_ipcache_entries",
			Help: "Entries of the Cilium ipcache map placed in the last read, by the map read (cilium_ipcache_v2 from Cilium 1.18, cilium_ipcache before)."}, []string{"map"}),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_ipcache_skipped_entries",
			Help: "Entries of the last ipcache read that were not placed, by reason: family (neither IPv4 nor IPv6), prefix (a prefix length out of range), cluster (another cluster ID: overlapping pod CIDRs in a cluster mesh), nodes (more than 65535 distinct tunnel endpoints)."}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_ipcache_errors_total",
			Help: "Cilium ipcache reads that failed, by reason: absent (no map), permission, open, layout (unknown key or value size), read."}, []string{"reason"}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "zonewatch_ipcache_read_duration_seconds",
			Help: "Time the last read of the ipcache map took."}),
	}
	for _, r := range errorReasons {
		m.errors.WithLabelValues(r)
	}
	for _, r := range skipReasons {
		m.skipped.WithLabelValues(r)
	}
	return m
}

// New returns a reader over src with an empty snapshot; it registers its
// metrics on cfg.Self.
func New(src Source, cfg Config) (*Reader, error) {
	if len(cfg.Maps) == 0 {
		cfg.Maps = []string{MapV2, MapV1}
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Reader{src: src, cfg: cfg, log: cfg.Logger, cur: newSnapshot(), spare: newSnapshot(),
		kick: make(chan struct{}, 1), m: newSelfMetrics()}
	if cfg.Self != nil {
		for _, c := range []prometheus.Collector{r.m.entries, r.m.skipped, r.m.errors, r.m.duration} {
			if err := cfg.Self.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// Up reports whether the last refresh read a map completely.
func (r *Reader) Up() bool { return r.up.Load() }

// Tried reports whether a refresh has run to its end, read or failed:
// until then no address is placed through the map (readiness waits on it).
func (r *Reader) Tried() bool { return r.tried.Load() }

// Lookup returns the entry of the longest prefix holding a.
func (r *Reader) Lookup(a netip.Addr) (Entry, bool) {
	r.mu.RLock()
	e, ok := r.cur.lookup(a)
	r.mu.RUnlock()
	return e, ok
}

// Len is the number of entries in the snapshot.
func (r *Reader) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cur.n
}

// Refresh reads the map now and replaces the snapshot. On error the
// snapshot is kept, except when no map is present at all (it empties).
func (r *Reader) Refresh() error {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	start := time.Now()
	r.last = start
	defer func() {
		r.m.duration.Set(time.Since(start).Seconds())
		r.tried.Store(true)
	}()

	name, t, err := r.open()
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			r.spare.reset()
			r.swap()
			r.m.entries.Reset()
		}
		return r.fail(classify(err), err)
	}
	s := r.spare
	s.reset()
	l, err := LayoutOf(t.KeySize(), t.ValueSize())
	if err == nil {
		err = t.Each(func(k, v []byte) { s.add(k, v, l) })
		if err != nil {
			err = &readError{err}
		}
	}
	t.Close()
	if err != nil {
		return r.fail(classify(err), err)
	}
	s.finish()
	r.swap()
	r.m.entries.Reset()
	r.m.entries.WithLabelValues(name).Set(float64(s.n))
	for _, reason := range skipReasons {
		r.m.skipped.WithLabelValues(reason).Set(float64(s.skipped[reason]))
	}
	if r.reason != "" {
		r.log.Info("ipcache readable again", "map", name, "entries", s.n)
	}
	r.reason = ""
	r.up.Store(true)
	return nil
}

type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

func (r *Reader) swap() {
	r.mu.Lock()
	r.cur, r.spare = r.spare, r.cur
	r.mu.Unlock()
}

func (r *Reader) open() (string, Table, error) {
	var first error
	for _, name := range r.cfg.Maps {
		t, err := r.src.Open(name)
		if err == nil {
			return name, t, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return name, nil, err
		}
		if first == nil {
			first = err
		}
	}
	return "", nil, first
}

func classify(err error) string {
	var re *readError
	switch {
	case errors.As(err, &re):
		return reasonRead
	case errors.Is(err, fs.ErrNotExist):
		return reasonAbsent
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return reasonPermission
	case errors.Is(err, errLayout):
		return reasonLayout
	}
	return reasonOpen
}

// fail counts a failed read; it logs when the reason changes.
func (r *Reader) fail(reason string, err error) error {
	r.m.errors.WithLabelValues(reason).Inc()
	r.up.Store(false)
	if reason != r.reason {
		r.log.Warn(advice[reason], "reason", reason, "err", err)
	}
	r.reason = reason
	return err
}

// Kick asks Run for a refresh soon (at most one per MinInterval); it
// never blocks.
func (r *Reader) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run refreshes now, then every interval and when kicked, until ctx ends.
func (r *Reader) Run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		_ = r.Refresh()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-r.kick:
			r.refreshMu.Lock()
			wait := r.cfg.MinInterval - time.Since(r.last)
			r.refreshMu.Unlock()
			if wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
	}
}
