package rules

// The rule definitions are written once, with placeholders (tokens) where a
// Config value goes. render.go fills the tokens with a Config's values, or
// with Helm expressions for the chart template.

// Tokens of the knobs that are not plain values.
const (
	tSelector       = "@@selector@@"        // label matchers; always right after "{"
	tClusterBy      = "@@cluster_by@@"      // ", <cluster label>" or ""
	tClusterMatcher = "@@cluster_matcher@@" // ",<cluster label>=%q" in template queries
	tClusterArg     = "@@cluster_arg@@"     // " $labels.<cluster label>" in template queries
	tRunbook        = "@@runbookBaseURL@@"
)

func tok(key string) string { return "@@" + key + "@@" }

// Recording rule names. Dashboards and the e2e tests query these.
const (
	RecJobZones               = "namespace_job_name:zonewatch_job_zones:max"
	RecJobSplitZone           = "namespace_job_name:zonewatch_job_split_zone:max"
	RecJobPods                = "namespace_job_name_role_zone:zonewatch_job_pods:count"
	RecGPUs                   = "namespace_job_name:zonewatch_gpus:count"
	RecGPUUtilization         = "namespace_job_name:zonewatch_gpu_utilization_ratio:avg"
	RecGPUSMActive            = "namespace_job_name:zonewatch_gpu_sm_active_ratio:avg"
	RecPolicyDrops            = "namespace_job_name_locality:zonewatch_job_policy_drops:rate5m"
	RecCrossZonePolicyDrops   = "namespace_job_name_src_zone_dst_zone_policy:zonewatch_job_cross_zone_policy_drops:rate5m"
	RecCrossZoneFlowEvents    = "namespace_job_name:zonewatch_job_cross_zone_flow_events:rate5m"
	RecCrossZoneBytes         = "namespace_job_name:zonewatch_job_cross_zone_bytes:rate5m"
	RecCrossZoneCost          = "namespace_job_name:zonewatch_cross_zone_cost_dollars_per_hour:rate5m"
	RecNamespaceCrossZoneCost = "namespace:zonewatch_cross_zone_cost_dollars_per_hour:rate5m"
	RecSplitIdleGPUCost       = "namespace_job_name:zonewatch_split_idle_gpu_cost_dollars_per_hour:sum"
)

// Alert names.
const (
	AlertIdleGPUSplitJob       = "ZonewatchIdleGPUSplitJob"
	AlertCrossZoneSlowdown     = "ZonewatchCrossZoneSlowdown"
	AlertCrossZoneCost         = "ZonewatchCrossZoneCost"
	AlertSplitZonePlacement    = "ZonewatchSplitZonePlacement"
	AlertExporterDown          = "ZonewatchExporterDown"
	AlertExporterAbsent        = "ZonewatchExporterAbsent"
	AlertHubbleDisconnected    = "ZonewatchHubbleDisconnected"
	AlertHubbleLostEvents      = "ZonewatchHubbleLostEvents"
	AlertGPUSourceDown         = "ZonewatchGPUSourceDown"
	AlertByteSourceUnavailable = "ZonewatchByteSourceUnavailable"
)

type group struct {
	Name  string `yaml:"name"`
	Rules []rule `yaml:"rules"`
}

type rule struct {
	Record      string            `yaml:"record,omitempty"`
	Alert       string            `yaml:"alert,omitempty"`
	Expr        block             `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations *annotations      `yaml:"annotations,omitempty"`
}

type annotations struct {
	Summary     string `yaml:"summary"`
	Description block  `yaml:"description"`
	RunbookURL  string `yaml:"runbook_url"`
}

// Label sets and selectors used throughout.
const (
	byJob      = "namespace, job_name" + tClusterBy
	byInstance = "instance" + tClusterBy
	crossZone  = `locality=~"cross_zone|cross_region"`
)

// sel returns the exporter selector plus extra matchers, in braces.
func sel(extra ...string) string {
	s := "{" + tSelector
	for _, m := range extra {
		s += ", " + m
	}
	return s + "}"
}

// perJob is the printf call of a template query for one job's series of a
// recorded metric: the alert's own namespace, job_name (and cluster).
func perJob(metric string) string {
	return `(printf "` + metric + `{namespace=%q,job_name=%q` + tClusterMatcher + `}" $labels.namespace $labels.job_name` + tClusterArg + `)`
}

// Description fragments that look up a job's placement, drops and traffic.
var (
	jobName        = `{{ $labels.namespace }}/{{ $labels.job_name }}`
	jobZones       = `{{ range $i, $s := query ` + perJob(RecJobPods) + ` | sortByLabel "zone" | sortByLabel "role" }}{{ if $i }}; {{ end }}{{ $s.Labels.role }} pods in {{ $s.Labels.zone }}: {{ $s.Value }}{{ end }}`
	jobDrops       = `{{ range $i, $s := query ` + perJob(RecCrossZonePolicyDrops) + ` | sortByLabel "policy" | sortByLabel "dst_zone" | sortByLabel "src_zone" }}{{ if $i }}; {{ end }}{{ $s.Labels.src_zone }} -> {{ $s.Labels.dst_zone }} denied by {{ with $s.Labels.policy }}policy {{ . }}{{ else }}an unnamed policy{{ end }}, {{ $s.Value | printf "%.2f" }} drops/s{{ end }}`
	jobBytes       = `{{ with query ` + perJob(RecCrossZoneBytes) + ` }}{{ . | first | value | humanize }}B/s{{ else }}{{ with query ` + perJob(RecCrossZoneFlowEvents) + ` }}{{ . | first | value | printf "%.2f" }} flow events/s, bytes not measured{{ end }}{{ end }}`
	jobIdleGPUCost = `{{ with query ` + perJob(RecSplitIdleGPUCost) + ` }}; its idle GPUs cost ${{ . | first | value | printf "%.2f" }} an hour{{ end }}`
)

// Job conditions shared by several alerts. Each yields one series per job.
var (
	condSplit = RecJobSplitZone + ` == 1`
	// Policy drops on the job's cross-zone traffic.
	condCrossZoneDrops = `sum by (` + byJob + `) (` + RecPolicyDrops + `{` + crossZone + `}) > ` + tok("dropRate")
	// Value: GPU utilization (SM activity where utilization is missing, e.g. MIG).
	condIdle = `(
  ` + RecGPUUtilization + `
  or ` + RecGPUSMActive + `
) < ` + tok("idleGPUUtilization")
	condIdleGPUSplitJob = condIdle + `
and on (` + byJob + `) (` + condSplit + `)
and on (` + byJob + `) (
  ` + condCrossZoneDrops + `
)`
	// Value: SM activity, or GPU utilization where SM activity is missing.
	condSlowdown = `(
  ` + RecGPUSMActive + ` < ` + tok("slowdownSMActive") + `
  or (
    ` + RecGPUUtilization + ` < ` + tok("slowdownGPUUtilization") + `
    unless on (` + byJob + `) ` + RecGPUSMActive + `
  )
)
and on (` + byJob + `) (` + condSplit + `)
and on (` + byJob + `) (
  ` + RecCrossZoneFlowEvents + ` > 0
  or ` + RecCrossZoneBytes + ` > 0
)
unless on (` + byJob + `) (
  ` + condCrossZoneDrops + `
)`
)

// nodeOf joins a per-exporter expression with the node of the training job
// pods that exporter hosts: it names the node and keeps nodes without job
// pods (where nothing zonewatch watches can break) out of the alerts.
func nodeOf(expr, podMatchers string) string {
	pods := "zonewatch_job_pod_info" + sel()
	if podMatchers != "" {
		pods = "zonewatch_job_pod_info" + sel(podMatchers)
	}
	return `(
  ` + expr + `
)
* on (` + byInstance + `) group_left (node)
  group by (instance, node` + tClusterBy + `) (` + pods + `)`
}

func runbook(anchor string) string { return tRunbook + "#" + anchor }

func alertRule(name, severity, forKey, expr, summary, description string) rule {
	return rule{
		Alert:  name,
		Expr:   block(expr),
		For:    tok("for." + forKey),
		Labels: map[string]string{"severity": severity},
		Annotations: &annotations{
			Summary:     summary,
			Description: block(description),
			RunbookURL:  runbook(anchorOf(name)),
		},
	}
}

func definitions() []group {
	recording := group{Name: "zonewatch.rules", Rules: []rule{
		{Record: RecJobZones, Expr: block(`max by (` + byJob + `) (zonewatch_job_zones` + sel() + `)`)},
		{Record: RecJobSplitZone, Expr: block(`max by (` + byJob + `) (zonewatch_job_split_zone` + sel() + `)`)},
		{Record: RecJobPods, Expr: block(`count by (namespace, job_name, role, zone` + tClusterBy + `) (zonewatch_job_pod_info` + sel() + `)`)},
		// A GPU counts once whichever of its ratios the source reports (MIG has no utilization).
		{Record: RecGPUs, Expr: block(`count by (` + byJob + `) (
  group by (namespace, job_name, node, gpu, uuid` + tClusterBy + `) (
    zonewatch_gpu_utilization_ratio` + sel(`job_name!=""`) + `
    or zonewatch_gpu_sm_active_ratio` + sel(`job_name!=""`) + `
  )
)`)},
		{Record: RecGPUUtilization, Expr: block(`avg by (` + byJob + `) (zonewatch_gpu_utilization_ratio` + sel(`job_name!=""`) + `)`)},
		{Record: RecGPUSMActive, Expr: block(`avg by (` + byJob + `) (zonewatch_gpu_sm_active_ratio` + sel(`job_name!=""`) + `)`)},
		{Record: RecPolicyDrops, Expr: block(`sum by (namespace, job_name, locality` + tClusterBy + `) (rate(zonewatch_job_policy_drops_total` + sel() + `[5m]))`)},
		{Record: RecCrossZonePolicyDrops, Expr: block(`sum by (namespace, job_name, src_zone, dst_zone, policy` + tClusterBy + `) (
  rate(zonewatch_job_policy_drops_total` + sel(crossZone) + `[5m])
)`)},
		{Record: RecCrossZoneFlowEvents, Expr: block(`sum by (` + byJob + `) (rate(zonewatch_job_flow_events_total` + sel(crossZone) + `[5m]))`)},
		{Record: RecCrossZoneBytes, Expr: block(`sum by (` + byJob + `) (rate(zonewatch_job_network_bytes_total` + sel(crossZone) + `[5m]))`)},
		// bytes/s * 3600 s/h / 1e9 B/GB * $/GB
		{Record: RecCrossZoneCost, Expr: block(RecCrossZoneBytes + ` * 3600 / 1e9 * ` + tok("crossZoneDollarsPerGB"))},
		{Record: RecNamespaceCrossZoneCost, Expr: block(`sum by (namespace` + tClusterBy + `) (` + RecCrossZoneCost + `)`)},
		{Record: RecSplitIdleGPUCost, Expr: block(`count by (` + byJob + `) (
  zonewatch_gpu_utilization_ratio` + sel(`job_name!=""`) + ` < ` + tok("idleGPUUtilization") + `
  and on (` + byJob + `) (` + condSplit + `)
) * ` + tok("gpuDollarsPerHour"))},
	}}

	jobs := group{Name: "zonewatch.jobs", Rules: []rule{
		alertRule(AlertIdleGPUSplitJob, "critical", "idleGPUSplitJob", condIdleGPUSplitJob,
			"A training job split across zones is blocked by a network policy while its GPUs sit idle.",
			jobName+` is split across zones (`+jobZones+`) and Cilium drops its cross-zone traffic (`+jobDrops+`). Its GPUs average {{ $value | humanizePercentage }} utilization`+jobIdleGPUCost+`.`),
		alertRule(AlertCrossZoneSlowdown, "warning", "crossZoneSlowdown", condSlowdown,
			"A training job split across zones is slowed down by cross-zone traffic.",
			jobName+` is split across zones (`+jobZones+`) and its traffic crosses zones (`+jobBytes+`) without policy drops. Its SM activity (GPU utilization where SM activity is not reported) averages {{ $value | humanizePercentage }}: collectives are likely waiting on the inter-zone round trip.`),
		alertRule(AlertCrossZoneCost, "info", "crossZoneCost",
			RecCrossZoneCost+` * 24 > `+tok("crossZoneDailyBudgetDollars"),
			"A training job's projected cross-zone transfer spend is over budget.",
			jobName+` sends `+jobBytes+` across zones (`+jobZones+`). At this rate its cross-zone transfer costs ${{ $value | printf "%.2f" }} a day, over the budget of $`+tok("crossZoneDailyBudgetDollars")+` a day.`),
		alertRule(AlertSplitZonePlacement, "info", "splitZonePlacement", `(`+condSplit+`)
and on (`+byJob+`) (`+RecGPUs+` > 0)
unless on (`+byJob+`) (
`+indent(condIdleGPUSplitJob)+`
)
unless on (`+byJob+`) (
`+indent(condSlowdown)+`
)`,
			"A GPU training job runs across zones.",
			jobName+` has pods in more than one zone (`+jobZones+`). No blocked traffic or slowdown is visible yet, but its collectives cross zones: constrain the job to one zone.`),
	}}

	health := group{Name: "zonewatch.health", Rules: []rule{
		alertRule(AlertExporterDown, "warning", "exporterDown", `up`+sel()+` == 0`,
			"Prometheus cannot scrape a zonewatch exporter.",
			`zonewatch at {{ $labels.instance }}{{ with $labels.pod }} (pod {{ . }}){{ end }} cannot be scraped: the training jobs on its node are not watched.`),
		alertRule(AlertExporterAbsent, "warning", "exporterAbsent", `absent(up`+sel()+`)`,
			"No zonewatch exporter is scraped.",
			`Prometheus has no target matching `+sel()+`: zonewatch is not deployed, or this Prometheus does not select its PodMonitor. No other zonewatch alert can fire.`),
		alertRule(AlertHubbleDisconnected, "warning", "hubbleDisconnected",
			nodeOf(`zonewatch_source_up`+sel(`source="hubble"`)+` == 0`, ""),
			"zonewatch is not connected to Hubble on a node with training jobs.",
			`zonewatch on node {{ $labels.node }} ({{ $labels.instance }}) is not connected to Hubble: policy drops and cross-zone flows of the training jobs on this node are not counted.`),
		alertRule(AlertHubbleLostEvents, "warning", "hubbleLostEvents",
			nodeOf(`sum by (`+byInstance+`) (rate(zonewatch_hubble_lost_events_total`+sel()+`[5m]))
  /
  (
    sum by (`+byInstance+`) (rate(zonewatch_hubble_lost_events_total`+sel()+`[5m]))
    + sum by (`+byInstance+`) (rate(zonewatch_hubble_flows_processed_total`+sel()+`[5m]))
  )
  > `+tok("hubbleLostEventsRatio"), ""),
			"Hubble is losing flow events on a node with training jobs.",
			`Hubble lost {{ $value | humanizePercentage }} of its flow events on node {{ $labels.node }} ({{ $labels.instance }}): zonewatch undercounts policy drops and flows of the training jobs there.`),
		// Only nodes with GPU workers: a coordinator may run on a node without GPUs.
		alertRule(AlertGPUSourceDown, "warning", "gpuSourceDown",
			nodeOf(`zonewatch_source_up`+sel(`source=~"gpu|podresources"`)+` == 0`, `role="worker"`),
			"zonewatch cannot read GPU metrics on a node with training jobs.",
			`The {{ $labels.source }} source of zonewatch on node {{ $labels.node }} ({{ $labels.instance }}) is down: GPU activity of the training jobs on this node is unknown, so the idle-GPU and slowdown alerts cannot fire for them.`),
		alertRule(AlertByteSourceUnavailable, "info", "byteSourceUnavailable",
			nodeOf(`sum by (`+byInstance+`) (rate(zonewatch_job_flow_events_total`+sel(crossZone)+`[5m])) > 0
  and on (`+byInstance+`) (zonewatch_source_up`+sel(`source="conntrack"`)+` == 0)`, ""),
			"zonewatch cannot count cross-zone bytes while Hubble sees cross-zone traffic.",
			`zonewatch on node {{ $labels.node }} ({{ $labels.instance }}) cannot read Cilium's conntrack byte counters while Hubble sees {{ $value | printf "%.2f" }} cross-zone flow events/s there: cross-zone bytes and their cost are not measured. Turn conntrack accounting on the way the node's Cilium version needs: 1.17 and later, Helm bpf.ctAccounting=true (agent flag --bpf-conntrack-accounting) and restart the agents; 1.16, cilium-dbg config ConntrackAccounting=Enabled in every agent pod, again after every agent restart; 1.14/1.15 count by default (if someone disabled it, the same command). The exporter's log on that node names the way for what it sees.`),
	}}
	return []group{recording, jobs, health}
}

func indent(s string) string {
	out := "  "
	for _, c := range s {
		out += string(c)
		if c == '\n' {
			out += "  "
		}
	}
	return out
}
