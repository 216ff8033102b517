// Package report builds the cost report a FinOps team files: cross-zone and
// cross-region bytes, their cost, and the idle GPU-hours of split jobs per
// namespace and job over a period, from any Prometheus HTTP API (Prometheus,
// Thanos, Mimir) that holds zonewatch's series and its rule pack.
//
// It counts as the rule pack does: bytes once, at the sender, as increase()
// of zonewatch_job_network_bytes_total over the period (counter resets
// handled by Prometheus), each locality at the rule pack's own price series,
// and idle GPUs by integrating the rule pack's split-idle-GPU cost series.
package report

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"

	"github.com/zonewatch/zonewatch/rules"
)

// Querier is the one call of the Prometheus HTTP API the report needs
// (client_golang's v1.API satisfies it through QueryAPI).
type Querier interface {
	Query(ctx context.Context, query string, ts time.Time) (model.Vector, error)
}

// Options say what to report on.
type Options struct {
	From, To time.Time
	// Selector selects the series scraped from zonewatch (the rules
	// config's selector), e.g. `job="zonewatch"`.
	Selector string
}

// HoursPerMonth is the average month (365 * 24 / 12) the projection uses.
const HoursPerMonth = 730

// Prices are the rule pack's prices as Prometheus has them at the end of
// the period.
type Prices struct {
	CrossZoneDollarsPerGB   float64 `json:"cross_zone_usd_per_gb"`
	CrossRegionDollarsPerGB float64 `json:"cross_region_usd_per_gb"`
	GPUDollarsPerHour       float64 `json:"gpu_usd_per_hour"`
}

// Line is one job's, one namespace's or the whole period's figures.
type Line struct {
	Namespace        string   `json:"namespace,omitempty"`
	Job              string   `json:"job_name,omitempty"`
	CrossZoneGB      float64  `json:"cross_zone_gb"`
	CrossRegionGB    float64  `json:"cross_region_gb"`
	TransferDollars  float64  `json:"transfer_usd"`
	IdleGPUHours     float64  `json:"idle_gpu_hours"`
	IdleGPUDollars   float64  `json:"idle_gpu_usd"`
	TotalDollars     float64  `json:"total_usd"`
	DenyingPolicies  []string `json:"denying_policies"`
	PolicyDropEvents float64  `json:"policy_drop_events"`
}

// Report is the whole report. Its JSON form is documented in docs/cost.md
// and versioned by SchemaVersion.
type Report struct {
	SchemaVersion int       `json:"schema_version"`
	From          time.Time `json:"from"`
	To            time.Time `json:"to"`
	Prices        Prices    `json:"prices"`
	Jobs          []Line    `json:"jobs"`
	Namespaces    []Line    `json:"namespaces"`
	Total         Line      `json:"total"`
	// MonthlyProjection is Total scaled from the period to HoursPerMonth.
	MonthlyProjection Line     `json:"monthly_projection"`
	Notes             []string `json:"notes"`
}

// SchemaVersion is the JSON report's version; it changes only when a field
// changes meaning or goes.
const SchemaVersion = 1

// Blind spots, in every report.
var notes = []string{
	"Bytes are counted once, at the sender, from Cilium's conntrack accounting: traffic that bypasses the pod network (RDMA, EFA, InfiniBand, secondary networks) and bytes sent before accounting was on or while a byte source was down are not in it.",
	"Bytes are packet lengths at Cilium's hook, not the provider's billed bytes; compare the totals with the inter-zone line of the cloud bill.",
	"Prices are the rule pack's at the end of the period (list prices unless the chart values were changed); discounts and private pricing are not applied.",
}

// ErrMissingSeries is returned (wrapped) when Prometheus lacks the rule
// pack's series the report needs.
var ErrMissingSeries = errors.New("series missing")

// Build queries q and assembles the report.
func Build(ctx context.Context, q Querier, o Options) (*Report, error) {
	if !o.To.After(o.From) {
		return nil, fmt.Errorf("the period is empty: --from %s is not before --to %s", o.From.Format(time.RFC3339), o.To.Format(time.RFC3339))
	}
	if o.Selector == "" {
		o.Selector = rules.DefaultConfig().Selector
	}
	rng := promRange(o.To.Sub(o.From))
	r := &Report{SchemaVersion: SchemaVersion, From: o.From.UTC(), To: o.To.UTC(), Notes: notes}

	query := func(what, expr string) (model.Vector, error) {
		v, err := q.Query(ctx, expr, o.To)
		if err != nil {
			return nil, fmt.Errorf("querying %s (%s): %w", what, expr, err)
		}
		return v, nil
	}

	// Prices first: without the rule pack nothing else can be priced.
	price, err := query("prices", rules.RecTransferPrice)
	if err != nil {
		return nil, err
	}
	gpuPrice, err := query("the GPU price", rules.RecGPUPrice)
	if err != nil {
		return nil, err
	}
	var missing []string
	for locality, dst := range map[string]*float64{"cross_zone": &r.Prices.CrossZoneDollarsPerGB, "cross_region": &r.Prices.CrossRegionDollarsPerGB} {
		s := find(price, "locality", locality)
		if s == nil {
			missing = append(missing, fmt.Sprintf("%s{locality=%q}", rules.RecTransferPrice, locality))
			continue
		}
		*dst = float64(s.Value)
	}
	if len(gpuPrice) == 0 {
		missing = append(missing, rules.RecGPUPrice)
	} else {
		r.Prices.GPUDollarsPerHour = float64(gpuPrice[0].Value)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("%w: Prometheus has no %s at %s: the zonewatch rule pack is not loaded there (install the chart's PrometheusRule or rules/zonewatch.rules.yml; docs/cost.md)",
			ErrMissingSeries, strings.Join(missing, ", "), o.To.UTC().Format(time.RFC3339))
	}

	sel := "{" + o.Selector + `, locality=~"cross_zone|cross_region"}`
	bytes, err := query("bytes", fmt.Sprintf(`sum by (namespace, job_name, locality) (increase(zonewatch_job_network_bytes_total%s[%s]))`, sel, rng))
	if err != nil {
		return nil, err
	}
	// The rule pack's $/hour series at 1m steps, integrated: dollars.
	idle, err := query("idle GPUs", fmt.Sprintf(`sum by (namespace, job_name) (sum_over_time(%s[%s:1m])) / 60`, rules.RecSplitIdleGPUCost, rng))
	if err != nil {
		return nil, err
	}
	drops, err := query("policy drops", fmt.Sprintf(`sum by (namespace, job_name, policy) (increase(zonewatch_job_policy_drops_total%s[%s])) > 0`, sel, rng))
	if err != nil {
		return nil, err
	}

	jobs := map[[2]string]*Line{}
	line := func(m model.Metric) *Line {
		k := [2]string{string(m["namespace"]), string(m["job_name"])}
		l := jobs[k]
		if l == nil {
			l = &Line{Namespace: k[0], Job: k[1], DenyingPolicies: []string{}}
			jobs[k] = l
		}
		return l
	}
	for _, s := range bytes {
		l := line(s.Metric)
		gb := float64(s.Value) / 1e9
		switch s.Metric["locality"] {
		case "cross_zone":
			l.CrossZoneGB += gb
			l.TransferDollars += gb * r.Prices.CrossZoneDollarsPerGB
		case "cross_region":
			l.CrossRegionGB += gb
			l.TransferDollars += gb * r.Prices.CrossRegionDollarsPerGB
		}
	}
	for _, s := range idle {
		l := line(s.Metric)
		l.IdleGPUDollars += float64(s.Value)
		if r.Prices.GPUDollarsPerHour > 0 {
			l.IdleGPUHours += float64(s.Value) / r.Prices.GPUDollarsPerHour
		}
	}
	for _, s := range drops {
		l := line(s.Metric)
		l.PolicyDropEvents += float64(s.Value)
		if p := string(s.Metric["policy"]); p != "" && !slices.Contains(l.DenyingPolicies, p) {
			l.DenyingPolicies = append(l.DenyingPolicies, p)
		}
	}

	r.Jobs = []Line{}
	for _, l := range jobs {
		l.TotalDollars = l.TransferDollars + l.IdleGPUDollars
		sort.Strings(l.DenyingPolicies)
		r.Jobs = append(r.Jobs, *l)
	}
	// Sums in a fixed order: two runs on the same data print the same digits.
	sortLines(r.Jobs)
	namespaces := map[string]*Line{}
	r.Total = Line{DenyingPolicies: []string{}}
	r.Namespaces = []Line{}
	for i := range r.Jobs {
		l := &r.Jobs[i]
		n := namespaces[l.Namespace]
		if n == nil {
			n = &Line{Namespace: l.Namespace, DenyingPolicies: []string{}}
			namespaces[l.Namespace] = n
		}
		n.add(l)
		r.Total.add(l)
	}
	for _, n := range namespaces {
		r.Namespaces = append(r.Namespaces, *n)
	}
	sortLines(r.Namespaces)
	scale := HoursPerMonth / o.To.Sub(o.From).Hours()
	r.MonthlyProjection = Line{
		CrossZoneGB: r.Total.CrossZoneGB * scale, CrossRegionGB: r.Total.CrossRegionGB * scale,
		TransferDollars: r.Total.TransferDollars * scale, IdleGPUHours: r.Total.IdleGPUHours * scale,
		IdleGPUDollars: r.Total.IdleGPUDollars * scale, TotalDollars: r.Total.TotalDollars * scale,
		PolicyDropEvents: r.Total.PolicyDropEvents * scale, DenyingPolicies: []string{},
	}
	return r, nil
}

func (n *Line) add(l *Line) {
	n.CrossZoneGB += l.CrossZoneGB
	n.CrossRegionGB += l.CrossRegionGB
	n.TransferDollars += l.TransferDollars
	n.IdleGPUHours += l.IdleGPUHours
	n.IdleGPUDollars += l.IdleGPUDollars
	n.TotalDollars += l.TotalDollars
	n.PolicyDropEvents += l.PolicyDropEvents
	for _, p := range l.DenyingPolicies {
		if !slices.Contains(n.DenyingPolicies, p) {
			n.DenyingPolicies = append(n.DenyingPolicies, p)
		}
	}
	sort.Strings(n.DenyingPolicies)
}

// sortLines puts the costliest first, then by name, so a report reads
// top-down and two runs on the same data are byte-identical.
func sortLines(ls []Line) {
	sort.Slice(ls, func(i, j int) bool {
		a, b := ls[i], ls[j]
		if ra, rb := cents(a.TotalDollars), cents(b.TotalDollars); ra != rb {
			return ra > rb
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Job < b.Job
	})
}

func cents(d float64) int64 { return int64(math.Round(d * 100)) }

func find(v model.Vector, label, value string) *model.Sample {
	for _, s := range v {
		if string(s.Metric[model.LabelName(label)]) == value {
			return s
		}
	}
	return nil
}

// promRange formats d as a PromQL range in whole seconds.
func promRange(d time.Duration) string {
	s := int64(d / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10) + "s"
}
