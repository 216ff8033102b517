package dashboards

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/text"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/grafana/grafana-foundation-sdk/go/units"

	"github.com/zonewatch/zonewatch/rules"
)

// gen carries the options and the panel ID counter of one dashboard.
type gen struct {
	o  Options
	id uint32
}

func newGen(o Options) *gen { return &gen{o: o} }

func (g *gen) nextID() uint32 {
	g.id++
	return g.id
}

// Every query goes to the dashboard's `datasource` variable.
func dsRef() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
}

// m writes a selector for metric with the cluster matcher ahead of the
// given matchers. The label name is the hidden cluster_label constant, so
// the chart sets it without regenerating; with the cluster variable at All
// (.*) the matcher also selects series that lack the label.
func (g *gen) m(metric string, matchers ...string) string {
	return metric + "{" + strings.Join(append([]string{clusterMatcher}, matchers...), ", ") + "}"
}

// self selects an exporter self-metric by its scrape job, the scrape_job
// variable.
func (g *gen) self(metric string, matchers ...string) string {
	return g.m(metric, append([]string{scrapeJobMatcher}, matchers...)...)
}

// orZero returns expr, or 0 when expr is empty but presence has series: an
// honest zero ("nothing matches") instead of "No data", while a missing
// metric (rules or exporter not deployed) still shows "No data".
func orZero(expr, presence string) string {
	return "(" + expr + ") or on() (0 * count(" + presence + "))"
}

// notMeasured maps orZero's 0 to text where a real value is never 0 (a
// round trip): "nothing measured" rather than a zero delay.
func notMeasured() []dashboard.ValueMapping { return valueText("0", "not measured", "text") }

// Matchers used across dashboards.
const (
	nsAny     = `namespace=~"$namespace"`
	jobAny    = `job_name=~"$job_name"`
	nsOne     = `namespace="$namespace"`
	jobOne    = `job_name="$job_name"`
	crossZone = `locality=~"cross_zone|cross_region"`

	clusterMatcher   = `${` + varClusterLabel + `}=~"$cluster"`
	scrapeJobMatcher = `job="$` + varScrapeJob + `"`
)

// query is one panel target. Instant queries are sent as tables, the shape
// the stat and table panels here expect.
type query struct {
	expr    string
	legend  string
	instant bool
}

func rangeQ(expr, legend string) query   { return query{expr: expr, legend: legend} }
func instantQ(expr, legend string) query { return query{expr: expr, legend: legend, instant: true} }

func targets(qs []query) []cog.Builder[variants.Dataquery] {
	out := make([]cog.Builder[variants.Dataquery], 0, len(qs))
	for i, q := range qs {
		b := prometheus.NewDataqueryBuilder().
			Datasource(dsRef()).
			RefId(string(rune('A' + i))).
			Expr(q.expr).
			EditorMode(prometheus.QueryEditorModeCode)
		if q.legend != "" {
			b.LegendFormat(q.legend)
		}
		if q.instant {
			b.Instant().Format(prometheus.PromQueryFormatTable)
		} else {
			b.Range()
		}
		out = append(out, b)
	}
	return out
}

type step struct {
	value *float64 // nil: the base step
	color string
}

func base(color string) step          { return step{color: color} }
func at(v float64, color string) step { return step{value: &v, color: color} }
func thresholds(steps ...step) *dashboard.ThresholdsConfigBuilder {
	ts := make([]dashboard.Threshold, 0, len(steps))
	for _, s := range steps {
		ts = append(ts, dashboard.Threshold{Value: s.value, Color: s.color})
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(ts)
}

// valueText maps exact values to text and color (e.g. 0/1 flags).
func valueText(pairs ...string) []dashboard.ValueMapping {
	opts := map[string]dashboard.ValueMappingResult{}
	for i := 0; i+2 < len(pairs); i += 3 {
		idx := int32(i / 3)
		opts[pairs[i]] = dashboard.ValueMappingResult{Text: cog.ToPtr(pairs[i+1]), Color: cog.ToPtr(pairs[i+2]), Index: &idx}
	}
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: opts}}}
}

func (g *gen) stat(title, desc, unit string, qs ...query) *stat.PanelBuilder {
	return stat.NewPanelBuilder().
		Id(g.nextID()).
		Title(title).
		Description(desc).
		Datasource(dsRef()).
		Targets(targets(qs)).
		Unit(unit).
		Height(4).
		Span(4).
		GraphMode(common.BigValueGraphModeNone).
		Orientation(common.VizOrientationAuto).
		ColorMode(common.BigValueColorModeBackground).
		TextMode(common.BigValueTextModeAuto).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false)).
		Thresholds(thresholds(base("green")))
}

func (g *gen) timeseries(title, desc, unit string, qs ...query) *timeseries.PanelBuilder {
	return timeseries.NewPanelBuilder().
		Id(g.nextID()).
		Title(title).
		Description(desc).
		Datasource(dsRef()).
		Targets(targets(qs)).
		Unit(unit).
		Min(0).
		Height(8).
		Span(12).
		FillOpacity(10).
		LineWidth(1).
		ShowPoints(common.VisibilityModeNever).
		Legend(common.NewVizLegendOptionsBuilder().
			ShowLegend(true).
			DisplayMode(common.LegendDisplayModeTable).
			Placement(common.LegendPlacementBottom).
			Calcs([]string{"mean", "max", "lastNotNull"}).
			SortBy("Last *").
			SortDesc(true)).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)).
		Thresholds(thresholds(base("green")))
}

// column describes one value column of a merged instant table: the query
// that fills it, its header and its unit.
type column struct {
	header string
	unit   string
	expr   string
}

// table merges one instant query per value column on their shared labels
// (namespace, job_name, ...), renames the value columns and drops Time.
// Label columns come first, namespace and job_name leading.
func (g *gen) table(title, desc string, cols ...column) *table.PanelBuilder {
	return g.orderedTable(title, desc, []string{"namespace", "job_name"}, cols...)
}

// orderedTable is table with the label columns in the given order.
func (g *gen) orderedTable(title, desc string, labelOrder []string, cols ...column) *table.PanelBuilder {
	qs := make([]query, 0, len(cols))
	rename := map[string]any{}
	index := map[string]any{}
	for i, l := range labelOrder {
		index[l] = i
	}
	for i, c := range cols {
		qs = append(qs, instantQ(c.expr, ""))
		value := fmt.Sprintf("Value #%c", 'A'+i)
		rename[value] = c.header
		index[value] = len(labelOrder) + i
	}
	if len(cols) == 1 {
		// Grafana names the value column of a lone table query "Value".
		rename["Value"] = cols[0].header
		index["Value"] = len(labelOrder)
	}
	tb := table.NewPanelBuilder().
		Id(g.nextID()).
		Title(title).
		Description(desc).
		Datasource(dsRef()).
		Targets(targets(qs)).
		Unit(units.NoUnit).
		Height(9).
		Span(24).
		CellHeight(common.TableCellHeightSm).
		CellOptions(autoCell()).
		Thresholds(thresholds(base("text")))
	if len(cols) > 1 {
		tb.WithTransformation(dashboard.DataTransformerConfig{Id: "merge", Options: map[string]any{}})
	}
	tb.WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{
		"excludeByName": map[string]any{"Time": true},
		"indexByName":   index,
		"renameByName":  rename,
	}})
	for _, c := range cols {
		tb.OverrideByName(c.header, []dashboard.DynamicConfigValue{{Id: "unit", Value: c.unit}})
	}
	return tb
}

func sortDesc(header string) []cog.Builder[common.TableSortByFieldState] {
	return []cog.Builder[common.TableSortByFieldState]{common.NewTableSortByFieldStateBuilder().DisplayName(header).Desc(true)}
}

// jobLink makes a table's job_name column open the job drill-down for that
// row, keeping the time range and data source.
func (g *gen) jobLink(tb *table.PanelBuilder) *table.PanelBuilder {
	url := "/d/" + UIDJob + "?${datasource:queryparam}&${" + varScrapeJob + ":queryparam}&${cluster:queryparam}"
	url += "&var-namespace=${__data.fields.namespace}&var-job_name=${__data.fields.job_name}&${__url_time_range}"
	return tb.OverrideByName("job_name", []dashboard.DynamicConfigValue{{
		Id:    "links",
		Value: []map[string]any{{"title": "Open the job drill-down", "url": url}},
	}})
}

func (g *gen) text(title, desc, markdown string) *text.PanelBuilder {
	return text.NewPanelBuilder().
		Id(g.nextID()).
		Title(title).
		Description(desc).
		Mode(text.TextModeMarkdown).
		Content(markdown).
		Height(6).
		Span(8)
}

func (g *gen) bargauge(title, desc, unit string, qs ...query) *bargauge.PanelBuilder {
	return bargauge.NewPanelBuilder().
		Id(g.nextID()).
		Title(title).
		Description(desc).
		Datasource(dsRef()).
		Targets(targets(qs)).
		Unit(unit).
		Min(0).
		Height(8).
		Span(8).
		Orientation(common.VizOrientationHorizontal).
		DisplayMode(common.BarGaugeDisplayModeBasic).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false)).
		Thresholds(thresholds(base("blue")))
}

func (g *gen) row(title string) *dashboard.RowBuilder {
	return dashboard.NewRowBuilder(title).Id(g.nextID())
}

func autoCell() common.TableCellOptions {
	return common.TableCellOptions{TableAutoCellOptions: common.NewTableAutoCellOptions()}
}

// Variables.

func datasourceVar() *dashboard.DatasourceVariableBuilder {
	return dashboard.NewDatasourceVariableBuilder("datasource").
		Label("Data source").
		Description("Prometheus that scrapes the zonewatch exporters and evaluates the zonewatch rules.").
		Type("prometheus")
}

// scrapeJobVar picks the exporters' Prometheus job label; its default is
// the generator's ScrapeJob (the chart's dashboards.variables.scrapeJob, else
// scrape.job).
func (g *gen) scrapeJobVar() *dashboard.QueryVariableBuilder {
	return g.queryVar(varScrapeJob, "Prometheus job",
		"The Prometheus job label of the zonewatch exporters' series (the chart's scrape.job).",
		"label_values(zonewatch_build_info, job)", false).
		Current(option(g.o.ScrapeJob, g.o.ScrapeJob))
}

// clusterVar picks clusters by the cluster_label constant. Hidden at All
// unless the generator (or the chart) names a cluster label: without one
// the matcher ${cluster_label}=~".*" selects every series.
func (g *gen) clusterVar() *dashboard.QueryVariableBuilder {
	q := fmt.Sprintf("label_values(%s, ${%s})", "zonewatch_build_info{"+scrapeJobMatcher+"}", varClusterLabel)
	v := g.queryVar("cluster", "Cluster", "Cluster whose exporters to show (its label is the hidden cluster_label constant).", q, true).
		Current(option("All", "$__all"))
	if g.o.ClusterLabel == "" {
		v.Hide(dashboard.VariableHideHideVariable)
	}
	return v
}

func option(text, value string) dashboard.VariableOption {
	return dashboard.VariableOption{
		Text:  dashboard.StringOrArrayOfString{String: cog.ToPtr(text)},
		Value: dashboard.StringOrArrayOfString{String: cog.ToPtr(value)},
	}
}

func (g *gen) queryVar(name, label, desc, q string, multi bool) *dashboard.QueryVariableBuilder {
	v := dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Description(desc).
		Datasource(dsRef()).
		Query(dashboard.StringOrMap{String: cog.ToPtr(q)}).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc)
	if multi {
		v.Multi(true).IncludeAll(true).AllValue(".*")
	}
	return v
}

// Hidden constant variables carry the rules config's prices and idle
// threshold into queries, descriptions and the price table, so the Helm
// chart can set them from the same values as the rules (see
// templates/dashboards.yaml) and Queries fills them in from the JSON.
const (
	varCrossZonePrice = "cross_zone_usd_per_gb"
	varGPUPrice       = "gpu_usd_per_hour"
	varIdleGPU        = "idle_gpu_utilization"
	// varClusterLabel names the label that tells clusters apart; the chart
	// sets it from dashboards.variables.clusterLabel (else rules.clusterLabel).
	varClusterLabel = "cluster_label"
	// varScrapeJob is the query variable of the exporters' job label.
	varScrapeJob = "scrape_job"
)

// defaultClusterLabel is cluster_label's value when no cluster label is
// configured: the cluster variable is hidden at All then, so the label need
// not exist.
const defaultClusterLabel = "cluster"

func constantVar(name, label, desc string, v float64) *dashboard.ConstantVariableBuilder {
	return textConstant(name, label, desc, strconv.FormatFloat(v, 'g', -1, 64))
}

func textConstant(name, label, desc, v string) *dashboard.ConstantVariableBuilder {
	return dashboard.NewConstantVariableBuilder(name).
		Label(label).
		Description(desc).
		Value(dashboard.StringOrMap{String: cog.ToPtr(v)})
}

// newDashboard sets what every zonewatch dashboard shares.
func (g *gen) newDashboard(uid, title, desc, from string) *dashboard.DashboardBuilder {
	b := dashboard.NewDashboardBuilder(title).
		Uid(uid).
		Description(desc).
		Tags([]string{Tag, "gpu", "network"}).
		Refresh("1m").
		Time(from, "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Readonly().
		Link(dashboard.NewDashboardLinkBuilder("zonewatch").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{Tag}).
			AsDropdown(true).
			IncludeVars(true).
			KeepTime(true)).
		WithVariable(datasourceVar()).
		WithVariable(g.scrapeJobVar()).
		WithVariable(textConstant(varClusterLabel, "Cluster label",
			"Label that tells clusters apart; the rules config's clusterLabel (cluster when none: the cluster variable stays hidden at All).", g.clusterLabel())).
		WithVariable(g.clusterVar())
	return b
}

func (g *gen) clusterLabel() string {
	if g.o.ClusterLabel == "" {
		return defaultClusterLabel
	}
	return g.o.ClusterLabel
}

// build adds the hidden constants after the visible variables and builds.
func (g *gen) build(b *dashboard.DashboardBuilder) (dashboard.Dashboard, error) {
	return b.
		WithVariable(constantVar(varCrossZonePrice, "USD per cross-zone GB",
			"Price of one GB (10^9 bytes) sent across zones; the rules config's crossZoneDollarsPerGB.", g.o.CrossZoneUSDPerGB)).
		WithVariable(constantVar(varGPUPrice, "USD per GPU-hour",
			"Price of one GPU-hour; the rules config's gpuDollarsPerHour.", g.o.GPUUSDPerHour)).
		WithVariable(constantVar(varIdleGPU, "Idle GPU utilization",
			"Utilization ratio below which a GPU counts as idle; the rules config's idleGPUUtilization.", g.o.IdleGPUUtilization)).
		Build()
}

// runbook is a section of docs/runbooks.md; an empty anchor is the
// document itself.
type runbook struct{ title, anchor string }

// alertRunbook is an alert's section, anchored as its runbook_url is.
func alertRunbook(alert string) runbook { return runbook{alert, strings.ToLower(alert)} }

var (
	runbookAll        = runbook{"zonewatch runbooks", ""}
	runbookOneZone    = runbook{"Keep a training job in one zone", "keep-a-training-job-in-one-zone"}
	runbookOwnTraffic = runbook{"zonewatch's own traffic", "zonewatchs-own-traffic"}
	// The sources an operator restores: Hubble, GPU and PodResources, bytes.
	runbookSources = []runbook{
		alertRunbook(rules.AlertHubbleDisconnected),
		alertRunbook(rules.AlertGPUSourceDown),
		alertRunbook(rules.AlertByteSourceUnavailable),
	}
)

// runbookLinks are panel links to runbook sections, at the rules'
// runbook document (the chart rewrites the base from rules.runbookBaseURL).
func (g *gen) runbookLinks(rs ...runbook) []cog.Builder[dashboard.DashboardLink] {
	out := make([]cog.Builder[dashboard.DashboardLink], 0, len(rs))
	for _, r := range rs {
		url := g.o.RunbookBaseURL
		if r.anchor != "" {
			url += "#" + r.anchor
		}
		out = append(out, dashboard.NewDashboardLinkBuilder("Runbook: "+r.title).
			Type(dashboard.DashboardLinkTypeLink).
			Url(url).
			TargetBlank(true))
	}
	return out
}

// sourcesUp is every source's zonewatch_source_up and the scrape itself as
// source="scrape" (an exporter Prometheus cannot scrape reports no source),
// each through fn over $__range, or as is when fn is "".
func (g *gen) sourcesUp(fn string) string {
	sel := func(metric string) string {
		if fn == "" {
			return g.self(metric)
		}
		return fn + "(" + g.self(metric) + "[$__range])"
	}
	return "(" + sel("zonewatch_source_up") + ` or label_replace(` + sel("up") + `, "source", "scrape", "", ""))`
}

// onNode names the node of each series of expr (per exporter and source)
// from nodes (instance -> node, from the job pods each exporter places). An
// exporter that places pods on several nodes (Relay mode: one exporter for
// every node) gets no node: its series keep their instance only, as do
// exporters nodes does not name, which stay only when keepUnnamed.
func onNode(expr, nodes string, keepUnnamed bool) string {
	by := "instance, ${" + varClusterLabel + "}"
	one := nodes + " and on (" + by + ") (count by (" + by + ") (" + nodes + ") == 1)"
	rest := expr
	if !keepUnnamed {
		rest = "(" + expr + " and on (" + by + ") " + nodes + ")"
	}
	return "(" + expr + " * on (" + by + ") group_left (node) (" + one + "))\nor on (" + by + ", source) " + rest
}

// sourceGaps is a table of the sources (and scrapes) that were down at some
// time in the range, by node: up now and the share of the range up.
func (g *gen) sourceGaps(title, desc, nodes string, keepUnnamed bool) *table.PanelBuilder {
	by := "max by (node, instance, source, ${" + varClusterLabel + "}) (\n"
	gaps := g.sourcesUp("avg_over_time") + " < 1"
	return g.orderedTable(title, desc, []string{"node", "instance", "source"},
		column{"Up now", units.NoUnit, by + onNode("("+g.sourcesUp("")+" and on (instance, source, ${"+varClusterLabel+"}) "+gaps+")", nodes, keepUnnamed) + "\n)"},
		column{"Up over the range", units.PercentUnit, by + onNode("("+gaps+")", nodes, keepUnnamed) + "\n)"},
	).
		SortBy([]cog.Builder[common.TableSortByFieldState]{common.NewTableSortByFieldStateBuilder().DisplayName("Up over the range")}).
		OverrideByName("Up now", []dashboard.DynamicConfigValue{{Id: "mappings", Value: valueText("0", "down", "red", "1", "up", "green")}})
}

// alertNames selects zonewatch's alerts in ALERTS: the rule pack names
// every alert Zonewatch<Something> (rules' TestConventions).
const alertNames = `alertname=~"Zonewatch.+"`
