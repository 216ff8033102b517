package conntrack

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

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
