// Package dashboards generates zonewatch's Grafana dashboards with
// grafana-foundation-sdk and extracts their queries for the end-to-end test.
//
// The JSON under dashboards/json is generated: edit this package and run
// `go run ./dashboards/gen`, never the JSON.
package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/table"

	"github.com/zonewatch/zonewatch/rules"
)

// Options are the knobs of the generator. Zero values are not valid; start
// from DefaultOptions.
type Options struct {
	// ClusterLabel is the label that tells clusters apart in a Prometheus
	// holding several (match the rules' ClusterLabel). Every selector has a
	// ${cluster_label}=~"$cluster" matcher and every dashboard a `cluster`
	// variable fed by label_values(zonewatch_build_info, ${cluster_label});
	// set, the variable is shown and cluster_label holds this label. Empty:
	// the variable is hidden at All (.*, which selects every series, with
	// the label or without) and cluster_label is "cluster". The chart sets
	// both from values (templates/dashboards.yaml).
	ClusterLabel string
	// ScrapeJob is the default of the scrape_job variable, the Prometheus
	// `job` target label of the exporters that self-metric queries select.
	ScrapeJob string
	// RunbookBaseURL is the runbook document panels link to
	// (RunbookBaseURL#<section>), as the alerts' runbook_url do.
	RunbookBaseURL string
	// CrossZoneUSDPerGB and GPUUSDPerHour must match the rules config; the
	// cost dashboard shows them and prices byte counters with the first.
	CrossZoneUSDPerGB float64
	GPUUSDPerHour     float64
	// IdleGPUUtilization is the utilization ratio below which a GPU counts
	// as idle on the NOC overview (same threshold as the idle alert).
	IdleGPUUtilization float64
	// Folder is the Grafana folder the sidecar files the dashboards under.
	Folder string
}

// DefaultOptions returns the options the committed JSON is generated with.
func DefaultOptions() Options {
	return Options{
		ScrapeJob:          "zonewatch",
		RunbookBaseURL:     rules.DefaultRunbookBaseURL,
		CrossZoneUSDPerGB:  0.01,
		GPUUSDPerHour:      4.00,
		IdleGPUUtilization: 0.05,
		Folder:             "zonewatch",
	}
}

// Stable identities: links between dashboards and bookmarks depend on them.
const (
	UIDOverview = "zonewatch-noc-overview"
	UIDJob      = "zonewatch-job-drilldown"
	UIDCost     = "zonewatch-cost-report"

	// Tag carried by every zonewatch dashboard; the dashboard links use it.
	Tag = "zonewatch"

	// AlertIdleGPUSplitJob is the paging alert from the rule pack.
	AlertIdleGPUSplitJob = "ZonewatchIdleGPUSplitJob"
)

// Dashboard is one generated dashboard.
type Dashboard struct {
	Name  string // file stem: dashboards/json/<Name>.json
	UID   string
	Title string
	JSON  []byte // indented, newline-terminated
}

// Generate builds every dashboard.
func Generate(opts Options) ([]Dashboard, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	specs := []struct {
		name  string
		build func(Options) (dashboard.Dashboard, error)
	}{
		{"zonewatch-noc-overview", overview},
		{"zonewatch-job-drilldown", jobDrilldown},
		{"zonewatch-cost-report", costReport},
	}
	out := make([]Dashboard, 0, len(specs))
	for _, s := range specs {
		d, err := s.build(opts)
		if err != nil {
			return nil, fmt.Errorf("building dashboard %s: %w", s.name, err)
		}
		scrub(&d)
		b, err := marshal(d)
		if err != nil {
			return nil, fmt.Errorf("encoding dashboard %s: %w", s.name, err)
		}
		out = append(out, Dashboard{Name: s.name, UID: *d.Uid, Title: *d.Title, JSON: b})
	}
	return out, nil
}

func (o Options) validate() error {
	var errs []string
	if o.ScrapeJob == "" {
		errs = append(errs, "ScrapeJob is empty")
	}
	if o.CrossZoneUSDPerGB < 0 {
		errs = append(errs, "CrossZoneUSDPerGB must not be negative")
	}
	if o.GPUUSDPerHour <= 0 {
		errs = append(errs, "GPUUSDPerHour must be positive (GPU-hours are derived from dollars)")
	}
	if o.IdleGPUUtilization <= 0 || o.IdleGPUUtilization >= 1 {
		errs = append(errs, "IdleGPUUtilization must be in (0,1)")
	}
	if o.Folder == "" {
		errs = append(errs, "Folder is empty")
	}
	if o.ClusterLabel != "" && !labelNameRE.MatchString(o.ClusterLabel) {
		errs = append(errs, "ClusterLabel must be a plain label name")
	}
	if o.RunbookBaseURL == "" || strings.ContainsAny(o.RunbookBaseURL, "#\" ") {
		errs = append(errs, "RunbookBaseURL must be a URL without fragment, quotes or spaces")
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid dashboard options: %s", strings.Join(errs, "; "))
	}
	return nil
}

var labelNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// scrub removes defaults that grafana-foundation-sdk v0.0.22 emits but the
// current Grafana schema (@grafana/schema 13) no longer has; the schema
// check (hack/schema-check) finds any new ones.
//   - table options.footer: Grafana 12.2+ tables moved footers into the
//     field config.
//   - auto, auto_min, auto_count on variables: only interval variables had
//     them, and the schema dropped them.
func scrub(d *dashboard.Dashboard) {
	for _, p := range d.Panels {
		if p.Panel == nil {
			continue
		}
		if o, ok := p.Panel.Options.(*table.Options); ok {
			o.Footer = nil
		}
	}
	for i := range d.Templating.List {
		v := &d.Templating.List[i]
		v.Auto, v.AutoMin, v.AutoCount = nil, nil, nil
	}
}

// marshal encodes without HTML escaping so PromQL's <, > and & stay readable
// in the committed JSON.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
