// Package rules generates zonewatch's Prometheus recording rules and alerts
// from one Config (kubernetes-mixin style), as a plain rule file, as a
// PrometheusRule manifest and as a Helm template whose knobs are chart values.
package rules

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// DefaultRunbookBaseURL is where the alerts' runbook_url links point to.
const DefaultRunbookBaseURL = "https://github.com/zonewatch/zonewatch/blob/main/docs/runbooks.md"

// Config holds everything a site may want to change in the rule pack.
type Config struct {
	// Selector is the label matcher (without braces) that selects the
	// series scraped from zonewatch, e.g. `job="zonewatch"`.
	Selector string
	// ClusterLabel, when set, is added to every aggregation so that one
	// Prometheus can hold several clusters without mixing their jobs.
	ClusterLabel string
	// RunbookBaseURL is the runbook document; each alert links to
	// RunbookBaseURL + "#" + its section anchor.
	RunbookBaseURL string

	// CrossZoneDollarsPerGB is the price of one GB (10^9 bytes) crossing a
	// zone boundary. Bytes are counted once, on the sending side: on clouds
	// that bill both directions (AWS: 0.01 out + 0.01 in) use the sum.
	CrossZoneDollarsPerGB float64
	// CrossRegionDollarsPerGB is the price of one GB crossing a region
	// boundary, counted the same way (sending side once). PricePresets
	// holds the big clouds' published prices (docs/cost.md).
	CrossRegionDollarsPerGB float64
	// GPUDollarsPerHour is what one GPU-hour costs.
	GPUDollarsPerHour float64
	// CrossZoneDailyBudgetDollars is the cross-zone transfer spend per job
	// and day above which ZonewatchCrossZoneCost fires.
	CrossZoneDailyBudgetDollars float64

	// IdleGPUUtilization: a split job whose GPUs average below this (0..1)
	// while its cross-zone traffic is dropped is stuck; its GPUs also count
	// as idle in the idle-GPU cost rule.
	IdleGPUUtilization float64
	// SlowdownSMActive: a split job whose SM activity (0..1) averages below
	// this while its traffic crosses zones is slowed by the zone hop.
	SlowdownSMActive float64
	// SlowdownTensorActive replaces SlowdownSMActive for jobs whose GPU
	// source reports tensor-pipe activity but no SM activity (dcgm-exporter's
	// default counters). Tensor pipes idle while NCCL spins.
	SlowdownTensorActive float64
	// SlowdownGraphicsEngineActive is used where the source reports neither
	// (graphics-engine activity only).
	SlowdownGraphicsEngineActive float64
	// SlowdownGPUUtilization is used where the source reports only GPU_UTIL.
	SlowdownGPUUtilization float64
	// DropRate is the cross-zone policy drop rate (drops/s) above which a
	// job counts as blocked; 0 means any drop.
	DropRate float64
	// HubbleLostEventsRatio: lost Hubble events per flow zonewatch received
	// on a node above which ZonewatchHubbleLostEvents fires. Lost events
	// are of every kind (before the server-side filter), so this bounds the
	// share of zonewatch's flows lost from above.
	HubbleLostEventsRatio float64
	// SourceDownRollupNodes: a source down on at least this many nodes at
	// once raises one ZonewatchSourceDownOnManyNodes, which holds back that
	// source's per-node alerts (a GPU Operator upgrade restarts every
	// node's dcgm-exporter).
	SourceDownRollupNodes float64

	// The idle-GPU page's floor: a blocked split job under it gets
	// ZonewatchBlockedSplitJob (warning) instead of the page.
	// IdleGPUPageMinGPUs: the page needs at least this many GPUs in the job.
	IdleGPUPageMinGPUs float64
	// IdleGPUPageMinDollarsPerHour: the page needs its idle GPUs to cost at
	// least this much an hour (idle GPUs x GPUDollarsPerHour).
	IdleGPUPageMinDollarsPerHour float64
	// IdleGPUPageDropWindow: the page also needs drops between the job's
	// own pods across zones within this window at every evaluation of its
	// for:, so one burst (which keeps the 5m rate up for 5 minutes) does
	// not page. 5m: the 5m rate alone decides.
	IdleGPUPageDropWindow time.Duration

	// For holds every alert's `for:` duration.
	For ForDurations
	// Severity is every alert's severity label (critical, warning, info),
	// keyed as For is (idleGPUSplitJob, ...).
	Severity map[string]string
	// Disabled leaves out the alerts named (ZonewatchSplitZonePlacement:
	// true), as kube-prometheus-stack's defaultRules.disabled does.
	Disabled map[string]bool
	// AdditionalRuleLabels and AdditionalRuleAnnotations are added to every
	// alert (kube-prometheus-stack's defaultRules.additionalRuleLabels and
	// additionalRuleAnnotations); they cannot replace severity, summary,
	// description or runbook_url.
	AdditionalRuleLabels      map[string]string
	AdditionalRuleAnnotations map[string]string
}

// ForDurations are the alerts' `for:` durations. All must be positive
// whole milliseconds.
type ForDurations struct {
	IdleGPUSplitJob       time.Duration
	BlockedSplitJob       time.Duration
	PeerPolicyDrops       time.Duration
	CrossZoneSlowdown     time.Duration
	CrossZoneCost         time.Duration
	SplitZonePlacement    time.Duration
	SplitJobTrafficUnseen time.Duration
	ExporterDown          time.Duration
	ExporterAbsent        time.Duration
	HubbleDisconnected    time.Duration
	HubbleLostEvents      time.Duration
	GPUSourceDown         time.Duration
	ByteSourceUnavailable time.Duration
	KubernetesSourceDown  time.Duration
	IPCacheSourceDown     time.Duration
	SourceDownOnManyNodes time.Duration
}

// DefaultConfig is the configuration of the committed rule files.
func DefaultConfig() Config {
	return Config{
		Selector:                    `job="zonewatch"`,
		RunbookBaseURL:              DefaultRunbookBaseURL,
		CrossZoneDollarsPerGB:       PricePresets[DefaultPricePreset].CrossZoneDollarsPerGB,
		CrossRegionDollarsPerGB:     PricePresets[DefaultPricePreset].CrossRegionDollarsPerGB,
		GPUDollarsPerHour:           4.00,
		CrossZoneDailyBudgetDollars: 50,
		IdleGPUUtilization:          0.05,
		SlowdownSMActive:            0.5,
		// Training kernels keep tensor pipes busy a smaller share of the
		// time than SMs; 0.2 is well under a healthy transformer's.
		SlowdownTensorActive:         0.2,
		SlowdownGraphicsEngineActive: 0.5,
		SlowdownGPUUtilization:       0.5,
		DropRate:                     0,
		HubbleLostEventsRatio:        0.01,
		SourceDownRollupNodes:        5,
		IdleGPUPageMinGPUs:           1,
		IdleGPUPageMinDollarsPerHour: 0,
		// Longer than the scrape interval twice over (a rate needs two
		// samples), shorter than the page's for: so a burst ages out.
		IdleGPUPageDropWindow: 2 * time.Minute,
		Severity: map[string]string{
			"idleGPUSplitJob":   "critical",
			"blockedSplitJob":   "warning",
			"peerPolicyDrops":   "info",
			"crossZoneSlowdown": "warning",
			// warning, not info: kube-prometheus-stack's default
			// Alertmanager config inhibits info alerts unless a warning
			// fires in the same namespace (docs/rules.md).
			"crossZoneCost":         "warning",
			"splitZonePlacement":    "info",
			"splitJobTrafficUnseen": "info",
			"exporterDown":          "warning",
			"exporterAbsent":        "warning",
			"hubbleDisconnected":    "warning",
			"hubbleLostEvents":      "warning",
			"gpuSourceDown":         "warning",
			"byteSourceUnavailable": "info",
			"kubernetesSourceDown":  "warning",
			"ipCacheSourceDown":     "warning",
			"sourceDownOnManyNodes": "warning",
		},
		For: ForDurations{
			// The page's evidence is conjunctive (split, own cross-zone
			// traffic denied, idle GPUs): 4m after the first rate, so
			// within 6m of the first drop with 30s scrapes and 1m rule
			// evaluation (docs/runbooks.md).
			IdleGPUSplitJob: 4 * time.Minute,
			// Without the GPU evidence a job starting up may see policy
			// drops while Cilium computes its endpoints' policy: longer.
			BlockedSplitJob:       10 * time.Minute,
			PeerPolicyDrops:       15 * time.Minute,
			CrossZoneSlowdown:     30 * time.Minute,
			CrossZoneCost:         time.Hour,
			SplitZonePlacement:    15 * time.Minute,
			SplitJobTrafficUnseen: 15 * time.Minute, // three 5m windows without one flow between its pods
			ExporterDown:          15 * time.Minute,
			ExporterAbsent:        15 * time.Minute,
			HubbleDisconnected:    10 * time.Minute,
			HubbleLostEvents:      15 * time.Minute,
			GPUSourceDown:         10 * time.Minute,
			ByteSourceUnavailable: 30 * time.Minute,
			KubernetesSourceDown:  10 * time.Minute,
			IPCacheSourceDown:     10 * time.Minute,
			SourceDownOnManyNodes: 10 * time.Minute,
		},
	}
}

var labelNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.Selector) == "" || strings.ContainsAny(c.Selector, "{}") {
		errs = append(errs, fmt.Errorf("selector %q: want label matchers without braces, e.g. job=\"zonewatch\"", c.Selector))
	}
	if c.ClusterLabel != "" && !labelNameRE.MatchString(c.ClusterLabel) {
		errs = append(errs, fmt.Errorf("cluster label %q is not a valid label name", c.ClusterLabel))
	}
	if c.RunbookBaseURL == "" || strings.ContainsAny(c.RunbookBaseURL, "#'\" \n") {
		errs = append(errs, fmt.Errorf("runbook base URL %q: want a URL without fragment, quotes or spaces", c.RunbookBaseURL))
	}
	for _, v := range []struct {
		name     string
		v, limit float64
	}{
		{"cross-zone dollars per GB", c.CrossZoneDollarsPerGB, -1},
		{"cross-region dollars per GB", c.CrossRegionDollarsPerGB, -1},
		{"GPU dollars per hour", c.GPUDollarsPerHour, -1},
		{"cross-zone daily budget", c.CrossZoneDailyBudgetDollars, -1},
		{"drop rate", c.DropRate, -1},
		{"idle GPU utilization", c.IdleGPUUtilization, 1},
		{"slowdown SM active", c.SlowdownSMActive, 1},
		{"slowdown tensor active", c.SlowdownTensorActive, 1},
		{"slowdown graphics engine active", c.SlowdownGraphicsEngineActive, 1},
		{"slowdown GPU utilization", c.SlowdownGPUUtilization, 1},
		{"Hubble lost events ratio", c.HubbleLostEventsRatio, 1},
		{"source down rollup nodes", c.SourceDownRollupNodes, -1},
		{"idle GPU page minimum GPUs", c.IdleGPUPageMinGPUs, -1},
		{"idle GPU page minimum dollars per hour", c.IdleGPUPageMinDollarsPerHour, -1},
	} {
		if v.v < 0 || v.v != v.v || (v.limit > 0 && v.v > v.limit) {
			errs = append(errs, fmt.Errorf("%s = %g: out of range", v.name, v.v))
		}
	}
	if c.SourceDownRollupNodes < 1 {
		errs = append(errs, fmt.Errorf("source down rollup nodes = %g: want at least 1", c.SourceDownRollupNodes))
	}
	if w := c.IdleGPUPageDropWindow; w < time.Second || w%time.Second != 0 {
		errs = append(errs, fmt.Errorf("idle GPU page drop window = %s: want a whole number of seconds, at least 1s", w))
	}
	keys := map[string]bool{}
	for _, f := range c.For.list() {
		keys[f.name] = true
		if f.d <= 0 || f.d%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("for %s = %s: want a positive whole number of milliseconds", f.name, f.d))
		}
		if s := c.Severity[f.name]; !severities[s] {
			errs = append(errs, fmt.Errorf("severity %s = %q: want critical, warning or info", f.name, s))
		}
	}
	for k := range c.Severity {
		if !keys[k] {
			errs = append(errs, fmt.Errorf("severity %s: no such alert (keys as in for)", k))
		}
	}
	alerts := map[string]bool{}
	for _, name := range AlertNames() {
		alerts[name] = true
	}
	for name := range c.Disabled {
		if !alerts[name] {
			errs = append(errs, fmt.Errorf("disabled %s: no such alert", name))
		}
	}
	for _, m := range []struct {
		what     string
		kv       map[string]string
		reserved []string
	}{
		{"additional rule label", c.AdditionalRuleLabels, []string{"severity", "alertname"}},
		{"additional rule annotation", c.AdditionalRuleAnnotations, []string{"summary", "description", "runbook_url"}},
	} {
		for k := range m.kv {
			if !labelNameRE.MatchString(k) || slices.Contains(m.reserved, k) {
				errs = append(errs, fmt.Errorf("%s %q: want a valid name other than %s", m.what, k, strings.Join(m.reserved, ", ")))
			}
		}
	}
	return errors.Join(errs...)
}

var severities = map[string]bool{"critical": true, "warning": true, "info": true}

type namedDuration struct {
	name string
	d    time.Duration
}

func (f ForDurations) list() []namedDuration {
	return []namedDuration{
		{"idleGPUSplitJob", f.IdleGPUSplitJob},
		{"blockedSplitJob", f.BlockedSplitJob},
		{"peerPolicyDrops", f.PeerPolicyDrops},
		{"crossZoneSlowdown", f.CrossZoneSlowdown},
		{"crossZoneCost", f.CrossZoneCost},
		{"splitZonePlacement", f.SplitZonePlacement},
		{"splitJobTrafficUnseen", f.SplitJobTrafficUnseen},
		{"exporterDown", f.ExporterDown},
		{"exporterAbsent", f.ExporterAbsent},
		{"hubbleDisconnected", f.HubbleDisconnected},
		{"hubbleLostEvents", f.HubbleLostEvents},
		{"gpuSourceDown", f.GPUSourceDown},
		{"byteSourceUnavailable", f.ByteSourceUnavailable},
		{"kubernetesSourceDown", f.KubernetesSourceDown},
		{"ipCacheSourceDown", f.IPCacheSourceDown},
		{"sourceDownOnManyNodes", f.SourceDownOnManyNodes},
	}
}

// promDuration formats d the way Prometheus writes durations ("1h30m").
func promDuration(d time.Duration) string {
	var b strings.Builder
	for _, u := range []struct {
		unit string
		d    time.Duration
	}{{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}} {
		if n := d / u.d; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.unit)
			d -= n * u.d
		}
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}
