package rules

import "strings"

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
	RecJobZones          = "namespace_job_name:zonewatch_job_zones:max"
	RecJobSplitZone      = "namespace_job_name:zonewatch_job_split_zone:max"
	RecJobPods           = "namespace_job_name_role_zone:zonewatch_job_pods:count"
	RecGPUs              = "namespace_job_name:zonewatch_gpus:count"
	RecGPUUtilization    = "namespace_job_name:zonewatch_gpu_utilization_ratio:avg"
	RecGPUSMActive       = "namespace_job_name:zonewatch_gpu_sm_active_ratio:avg"
	RecGPUTensorActive   = "namespace_job_name:zonewatch_gpu_tensor_active_ratio:avg"
	RecGPUGraphicsEngine = "namespace_job_name:zonewatch_gpu_graphics_engine_active_ratio:avg"
	// RecGPUActivity is the one activity signal per job: SM activity where
	// reported, else tensor-pipe, else graphics-engine activity, else
	// GPU_UTIL; its signal label says which.
	RecGPUActivity = "namespace_job_name_signal:zonewatch_gpu_activity_ratio:avg"
	// RecGPUBusy says whether anything runs, for idleness: GPU_UTIL, else
	// graphics-engine, SM or tensor activity (MIG has no GPU_UTIL).
	RecGPUBusy              = "namespace_job_name:zonewatch_gpu_busy_ratio:avg"
	RecPolicyDrops          = "namespace_job_name_locality:zonewatch_job_policy_drops:rate5m"
	RecCrossZonePolicyDrops = "namespace_job_name_peer_src_zone_dst_zone_policy_policy_source:zonewatch_job_cross_zone_policy_drops:rate5m"
	// RecOwnCrossZonePolicyDrops: drops between the job's own pods across
	// zones (peer="job"), the evidence of the page and the blocked alert.
	RecOwnCrossZonePolicyDrops = "namespace_job_name:zonewatch_job_own_cross_zone_policy_drops:rate5m"
	// RecPeerPolicyDrops: cross-zone drops toward peers outside the job, by
	// the peer's workload.
	RecPeerPolicyDrops     = "namespace_job_name_peer_peer_namespace_peer_workload_policy_policy_source:zonewatch_job_peer_cross_zone_policy_drops:rate5m"
	RecCrossZoneFlowEvents = "namespace_job_name:zonewatch_job_cross_zone_flow_events:rate5m"
	// RecOwnCrossZoneFlowEvents: flow events between the job's own pods
	// across zones, the slowdown's evidence that collectives cross zones.
	RecOwnCrossZoneFlowEvents = "namespace_job_name:zonewatch_job_own_cross_zone_flow_events:rate5m"
	RecCrossZoneBytes         = "namespace_job_name:zonewatch_job_cross_zone_bytes:rate5m"
	// RecLocalityBytes: the cross-zone bytes by locality (cross_zone,
	// cross_region), which are priced apart.
	RecLocalityBytes = "namespace_job_name_locality:zonewatch_job_cross_zone_bytes:rate5m"
	// RecTransferPrice is the configured USD per GB by locality, and
	// RecGPUPrice the USD per GPU-hour: the one set of prices the cost
	// rules, the dashboards' chart values and the report read.
	RecTransferPrice          = "locality:zonewatch_transfer_price_dollars_per_gigabyte:config"
	RecGPUPrice               = "global:zonewatch_gpu_price_dollars_per_hour:config"
	RecCrossZoneCost          = "namespace_job_name:zonewatch_cross_zone_cost_dollars_per_hour:rate5m"
	RecNamespaceCrossZoneCost = "namespace:zonewatch_cross_zone_cost_dollars_per_hour:rate5m"
	RecSplitIdleGPUCost       = "namespace_job_name:zonewatch_split_idle_gpu_cost_dollars_per_hour:sum"
	// RecZonePairRTT is the probe round trip between two zones (src_zone
	// == dst_zone inside a zone), one series per quantile label (0.5,
	// 0.9), from native or classic histogram buckets alike.
	RecZonePairRTT = "src_zone_dst_zone_quantile:zonewatch_zone_rtt_seconds:histogram_quantile"
	// RecZoneRTT is the in-zone round trip (the baseline) by zone.
	RecZoneRTT = "zone_quantile:zonewatch_zone_rtt_seconds:histogram_quantile"
	// RecJobZonePairRTT: the p50 RTT of each zone pair the job's own pods'
	// cross-zone flows (peer="job") cross, the job's exposure.
	RecJobZonePairRTT = "namespace_job_name_src_zone_dst_zone:zonewatch_zone_rtt_seconds:p50"
	// RecJobInZoneRTT: the in-zone p50 of the job's zones (their average),
	// what the same collectives would pay in one zone.
	RecJobInZoneRTT = "namespace_job_name:zonewatch_zone_rtt_in_zone_seconds:p50"
	// RecJobUnseenNetwork: a split job with busy GPUs whose pods exchange
	// no flow Hubble sees; value: the GPU busy ratio.
	RecJobUnseenNetwork = "namespace_job_name:zonewatch_job_unseen_network_gpu_busy_ratio:avg"
)

// Alert names.
const (
	AlertIdleGPUSplitJob       = "ZonewatchIdleGPUSplitJob"
	AlertBlockedSplitJob       = "ZonewatchBlockedSplitJob"
	AlertPeerPolicyDrops       = "ZonewatchPeerPolicyDrops"
	AlertCrossZoneSlowdown     = "ZonewatchCrossZoneSlowdown"
	AlertCrossZoneCost         = "ZonewatchCrossZoneCost"
	AlertSplitZonePlacement    = "ZonewatchSplitZonePlacement"
	AlertSplitJobTrafficUnseen = "ZonewatchSplitJobTrafficUnseen"
	AlertExporterDown          = "ZonewatchExporterDown"
	AlertExporterAbsent        = "ZonewatchExporterAbsent"
	AlertHubbleDisconnected    = "ZonewatchHubbleDisconnected"
	AlertHubbleLostEvents      = "ZonewatchHubbleLostEvents"
	AlertGPUSourceDown         = "ZonewatchGPUSourceDown"
	AlertByteSourceUnavailable = "ZonewatchByteSourceUnavailable"
	AlertKubernetesSourceDown  = "ZonewatchKubernetesSourceDown"
	AlertIPCacheSourceDown     = "ZonewatchIPCacheSourceDown"
	AlertSourceDownOnManyNodes = "ZonewatchSourceDownOnManyNodes"
)

// AlertNames lists every alert of the rule pack, in the order of the rule
// file.
func AlertNames() []string {
	var out []string
	for _, g := range definitions() {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r.Alert)
			}
		}
	}
	return out
}

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
	Summary     string            `yaml:"summary"`
	Description block             `yaml:"description"`
	RunbookURL  string            `yaml:"runbook_url"`
	Extra       map[string]string `yaml:",inline"`
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
func perJob(metric string) string { return perJobWith(metric, "") }

// perJobWhere is perJob with a comparison after the selector (` > 0`).
func perJobWhere(metric, cmp string) string {
	return `(printf "` + metric + `{namespace=%q,job_name=%q` + tClusterMatcher + `}` + cmp + `" $labels.namespace $labels.job_name` + tClusterArg + `)`
}

// perJobWith is perJob with extra matchers (`,peer="job"`).
func perJobWith(metric, extra string) string {
	extra = strings.ReplaceAll(extra, `"`, `\"`)
	return `(printf "` + metric + `{namespace=%q,job_name=%q` + extra + tClusterMatcher + `}" $labels.namespace $labels.job_name` + tClusterArg + `)`
}

// Description fragments that look up a job's placement, drops and traffic.
var (
	jobName  = `{{ $labels.namespace }}/{{ $labels.job_name }}`
	jobZones = `{{ range $i, $s := query ` + perJob(RecJobPods) + ` | sortByLabel "zone" | sortByLabel "role" }}{{ if $i }}; {{ end }}{{ $s.Labels.role }} pods in {{ $s.Labels.zone }}: {{ $s.Value }}{{ end }}`
	jobDrops = `{{ range $i, $s := query ` + perJobWith(RecCrossZonePolicyDrops, `,peer="job"`) + ` | sortByLabel "policy" | sortByLabel "dst_zone" | sortByLabel "src_zone" }}{{ if $i }}; {{ end }}{{ $s.Labels.src_zone }} -> {{ $s.Labels.dst_zone }} denied by {{ with $s.Labels.policy }}policy {{ . }}{{ if eq $s.Labels.policy_source "selected" }} (default deny: it selects the denying pods and allows none of the peer; named by zonewatch, Cilium names none){{ end }}{{ else }}an unnamed policy{{ end }}, {{ $s.Value | printf "%.2f" }} drops/s{{ end }}`
	// A byte rate is stated only when bytes moved: a series that exists
	// but has not moved in its window (conntrack's first reads) would read
	// 0B/s while the alert fires on flow events; those are given instead.
	jobBytes       = `{{ with query ` + perJobWhere(RecCrossZoneBytes, ` > 0`) + ` }}{{ . | first | value | humanize }}B/s{{ else }}{{ with query ` + perJob(RecCrossZoneFlowEvents) + ` }}{{ . | first | value | printf "%.2f" }} flow events/s, {{ with query ` + perJob(RecCrossZoneBytes) + ` }}no bytes measured yet{{ else }}bytes not measured{{ end }}{{ end }}{{ end }}`
	jobIdleGPUCost = `{{ with query ` + perJob(RecSplitIdleGPUCost) + ` }}; its idle GPUs cost ${{ . | first | value | printf "%.2f" }} an hour{{ end }}`
	jobPeerDrops   = `{{ range $i, $s := query ` + perJob(RecPeerPolicyDrops) + ` | sortByLabel "policy" | sortByLabel "peer_workload" | sortByLabel "peer_namespace" | sortByLabel "peer" }}{{ if $i }}; {{ end }}{{ with $s.Labels.peer_workload }}{{ $s.Labels.peer_namespace }}/{{ . }}{{ else }}unnamed {{ $s.Labels.peer }} peers{{ end }} denied by {{ with $s.Labels.policy }}policy {{ . }}{{ if eq $s.Labels.policy_source "selected" }} (default deny: it selects the denying pods and allows none of the peer; named by zonewatch, Cilium names none){{ end }}{{ else }}an unnamed policy{{ end }}, {{ $s.Value | printf "%.2f" }} drops/s{{ end }}`
	// The zone pairs the job's own flows cross with their probe RTT, and
	// the in-zone baseline; empty where the exporters do not probe.
	jobRTT         = `{{ with query ` + perJob(RecJobZonePairRTT) + ` }} It crosses {{ range $i, $s := . | sortByLabel "dst_zone" | sortByLabel "src_zone" }}{{ if $i }}, {{ end }}{{ $s.Labels.src_zone }} -> {{ $s.Labels.dst_zone }} at {{ $s.Value | humanizeDuration }} p50{{ end }}{{ with query ` + perJob(RecJobInZoneRTT) + ` }} vs {{ . | first | value | humanizeDuration }} inside a zone{{ end }}.{{ end }}`
	activitySignal = `{{ with query ` + perJob(RecGPUActivity) + ` }}{{ . | first | label "signal" }}{{ end }}`
	jobBusy        = `{{ with query ` + perJobWhere(RecGPUBusy, ` < `+tok("idleGPUUtilization")) + ` }}Its GPUs are idle ({{ . | first | value | humanizePercentage }} busy), but it is under the idle-GPU page's floor (at least ` + tok("idleGPUPageMinGPUs") + ` GPUs, idle GPUs costing at least $` + tok("idleGPUPageMinDollarsPerHour") + ` an hour, drops within every ` + tok("idleGPUPageDropWindow") + `).{{ else }}{{ with query ` + perJob(RecGPUBusy) + ` }}Its GPUs are not idle ({{ . | first | value | humanizePercentage }} busy): NCCL kernels spinning on the blocked network keep GPU_UTIL up while nothing trains.{{ else }}zonewatch sees no GPU activity for it: no GPU telemetry, or the GPU source is off or down.{{ end }}{{ end }}`
)

// Job conditions shared by several alerts. Each yields one series per job.
var (
	// A job whose pods say they are placed across zones on purpose
	// (zonewatch.io/multi-zone: intentional) is no split job: every job
	// alert reads this (the cost alert: optedOut).
	condSplit = `(` + RecJobSplitZone + ` == 1 ` + optedOut + `)`
	optedOut  = `unless on (` + byJob + `) zonewatch_job_multi_zone_info` + sel(`multi_zone="intentional"`)
	// Policy drops on cross-zone traffic between the job's own pods.
	condCrossZoneDrops = RecOwnCrossZonePolicyDrops + ` > ` + tok("dropRate")
	// Value: RecGPUBusy. Idle asks whether anything runs, so the signals
	// that read high when anything runs come first: a GPU spinning in NCCL
	// is not paged as idle (the blocked alert covers it).
	condIdle = RecGPUBusy + ` < ` + tok("idleGPUUtilization")
	// The page's floor (rules.idleGPUPage*): drops still coming within
	// the drop window, enough GPUs, enough idle spend. A job under it
	// gets the blocked ticket, whose condition excludes this one.
	condIdleGPUSplitJob = condIdle + `
and on (` + byJob + `) (` + condSplit + `)
and on (` + byJob + `) (
  ` + condCrossZoneDrops + `
)
and on (` + byJob + `) (
  sum by (` + byJob + `) (rate(zonewatch_job_policy_drops_total` + sel(crossZone, `peer="job"`) + `[` + tok("idleGPUPageDropWindow") + `])) > ` + tok("dropRate") + `
)
unless on (` + byJob + `) (` + RecGPUs + ` < ` + tok("idleGPUPageMinGPUs") + `)
unless on (` + byJob + `) (` + RecSplitIdleGPUCost + ` < ` + tok("idleGPUPageMinDollarsPerHour") + `)`
	// Value: the job's activity signal, each with its own threshold.
	condSlowdown = `max without (signal) (
  ` + RecGPUActivity + `{signal="sm_active"} < ` + tok("slowdownSMActive") + `
  or ` + RecGPUActivity + `{signal="tensor_active"} < ` + tok("slowdownTensorActive") + `
  or ` + RecGPUActivity + `{signal="graphics_engine_active"} < ` + tok("slowdownGraphicsEngineActive") + `
  or ` + RecGPUActivity + `{signal="utilization"} < ` + tok("slowdownGPUUtilization") + `
)
and on (` + byJob + `) (` + condSplit + `)
and on (` + byJob + `) (
  ` + RecOwnCrossZoneFlowEvents + ` > 0
  or ` + RecCrossZoneBytes + ` > 0
)
unless on (` + byJob + `) (
  ` + condCrossZoneDrops + `
)`
	// Value: the own cross-zone drop rate. Whatever the GPU data says, but
	// never together with the page: its condition excludes this one.
	condBlocked = `(` + condCrossZoneDrops + `)
and on (` + byJob + `) (` + condSplit + `)
unless on (` + byJob + `) (
` + indent(condIdleGPUSplitJob) + `
)`
	// Hubble is connected on every node of the job that reports it: no
	// flows there means none, not a source that is down.
	condHubbleSeesJob = `group by (` + byJob + `) (
  zonewatch_job_pod_info` + sel() + ` and on (` + byInstance + `) (zonewatch_source_up` + sel(`source="hubble"`) + ` == 1)
)
unless on (` + byJob + `) group by (` + byJob + `) (
  zonewatch_job_pod_info` + sel() + ` and on (` + byInstance + `) (zonewatch_source_up` + sel(`source="hubble"`) + ` == 0)
)`
	// Value: RecGPUBusy. Split, GPUs not idle, Hubble up, yet no flow
	// between the job's own pods in any zone or verdict: its collectives
	// use a network Cilium does not see. Bytes carry no peer label, so
	// the flows (and drops) decide.
	condUnseenNetwork = RecGPUBusy + ` > ` + tok("idleGPUUtilization") + `
and on (` + byJob + `) (` + condSplit + `)
and on (` + byJob + `) (
` + indent(condHubbleSeesJob) + `
)
unless on (` + byJob + `) (
  sum by (` + byJob + `) (rate(zonewatch_job_flow_events_total` + sel(`peer="job"`) + `[5m])) > 0
  or sum by (` + byJob + `) (rate(zonewatch_job_policy_drops_total` + sel(`peer="job"`) + `[5m])) > 0
)`
	// Value: the drop rate toward peers outside the job.
	condPeerDrops = `sum by (` + byJob + `) (` + RecPeerPolicyDrops + `) > ` + tok("dropRate") + `
and on (` + byJob + `) (` + condSplit + `)`
)

// The rollup of the per-node source alerts: a source down on many nodes at
// once is one alert, and the per-node ones hold back (unless) meanwhile.
// conntrack and ipcache are left out: their alerts need traffic they
// fail to count or place (clusters without conntrack accounting have it
// down everywhere; without the ipcache the pod CIDRs often suffice).
var (
	condRollup = `count by (source` + tClusterBy + `) (
  zonewatch_source_up` + sel(`source=~"kubernetes|hubble|gpu|podresources"`) + ` == 0
) >= ` + tok("sourceDownRollupNodes")
	exceptRollup = `unless on (source` + tClusterBy + `) (
` + indent(condRollup) + `
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

// alertRule is an alert whose for: and severity are the knobs
// for.<forKey> and severity.<forKey>.
func alertRule(name, forKey, expr, summary, description string) rule {
	return rule{
		Alert:  name,
		Expr:   block(expr),
		For:    tok("for." + forKey),
		Labels: map[string]string{"severity": tok("severity." + forKey)},
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
` + indent(indent(gpuRatios(`job_name!=""`))) + `
  )
)`)},
		{Record: RecGPUUtilization, Expr: block(`avg by (` + byJob + `) (zonewatch_gpu_utilization_ratio` + sel(`job_name!=""`) + `)`)},
		{Record: RecGPUSMActive, Expr: block(`avg by (` + byJob + `) (zonewatch_gpu_sm_active_ratio` + sel(`job_name!=""`) + `)`)},
		{Record: RecGPUTensorActive, Expr: block(`avg by (` + byJob + `) (zonewatch_gpu_tensor_active_ratio` + sel(`job_name!=""`) + `)`)},
		{Record: RecGPUGraphicsEngine, Expr: block(`avg by (` + byJob + `) (zonewatch_gpu_graphics_engine_active_ratio` + sel(`job_name!=""`) + `)`)},
		// NCCL kernels spinning on the network keep GPU_UTIL and the
		// graphics engine busy, but use few SMs and no tensor pipe: the
		// signals that see through the spin come first (docs/runbooks.md).
		{Record: RecGPUActivity, Expr: block(`label_replace(` + RecGPUSMActive + `, "signal", "sm_active", "", "")
or on (` + byJob + `)
  label_replace(` + RecGPUTensorActive + `, "signal", "tensor_active", "", "")
or on (` + byJob + `)
  label_replace(` + RecGPUGraphicsEngine + `, "signal", "graphics_engine_active", "", "")
or on (` + byJob + `)
  label_replace(` + RecGPUUtilization + `, "signal", "utilization", "", "")`)},
		{Record: RecGPUBusy, Expr: block(RecGPUUtilization + `
or ` + RecGPUGraphicsEngine + `
or ` + RecGPUSMActive + `
or ` + RecGPUTensorActive)},
		{Record: RecPolicyDrops, Expr: block(`sum by (namespace, job_name, locality` + tClusterBy + `) (rate(zonewatch_job_policy_drops_total` + sel() + `[5m]))`)},
		{Record: RecCrossZonePolicyDrops, Expr: block(`sum by (namespace, job_name, peer, src_zone, dst_zone, policy, policy_source` + tClusterBy + `) (
  rate(zonewatch_job_policy_drops_total` + sel(crossZone) + `[5m])
)`)},
		{Record: RecOwnCrossZonePolicyDrops, Expr: block(`sum by (` + byJob + `) (` + RecCrossZonePolicyDrops + `{peer="job"})`)},
		{Record: RecPeerPolicyDrops, Expr: block(`sum by (namespace, job_name, peer, peer_namespace, peer_workload, policy, policy_source` + tClusterBy + `) (
  rate(zonewatch_job_peer_policy_drops_total` + sel(crossZone) + `[5m])
)`)},
		{Record: RecCrossZoneFlowEvents, Expr: block(`sum by (` + byJob + `) (rate(zonewatch_job_flow_events_total` + sel(crossZone) + `[5m]))`)},
		{Record: RecOwnCrossZoneFlowEvents, Expr: block(`sum by (` + byJob + `) (rate(zonewatch_job_flow_events_total` + sel(crossZone, `peer="job"`) + `[5m]))`)},
		{Record: RecCrossZoneBytes, Expr: block(`sum by (` + byJob + `) (rate(zonewatch_job_network_bytes_total` + sel(crossZone) + `[5m]))`)},
		{Record: RecLocalityBytes, Expr: block(`sum by (namespace, job_name, locality` + tClusterBy + `) (rate(zonewatch_job_network_bytes_total` + sel(crossZone) + `[5m]))`)},
		{Record: RecTransferPrice, Expr: block(`vector(` + tok("crossZoneDollarsPerGB") + `)`), Labels: map[string]string{"locality": "cross_zone"}},
		{Record: RecTransferPrice, Expr: block(`vector(` + tok("crossRegionDollarsPerGB") + `)`), Labels: map[string]string{"locality": "cross_region"}},
		{Record: RecGPUPrice, Expr: block(`vector(` + tok("gpuDollarsPerHour") + `)`)},
		// bytes/s * $/GB (by locality) * 3600 s/h / 1e9 B/GB
		{Record: RecCrossZoneCost, Expr: block(`sum by (` + byJob + `) (` + RecLocalityBytes + ` * on (locality) group_left ` + RecTransferPrice + `) * 3600 / 1e9`)},
		{Record: RecNamespaceCrossZoneCost, Expr: block(`sum by (namespace` + tClusterBy + `) (` + RecCrossZoneCost + `)`)},
		// Native histograms where scraped, else the classic buckets.
		zonePairRTT("0.5"),
		zonePairRTT("0.9"),
		// The pairs with src_zone == dst_zone: label_replace makes the
		// in-zone pair of each source zone to match on.
		{Record: RecZoneRTT, Expr: block(`max without (src_zone, dst_zone) (
  label_replace(
    ` + RecZonePairRTT + `
    and on (src_zone, dst_zone` + tClusterBy + `)
      label_replace(group by (src_zone` + tClusterBy + `) (` + RecZonePairRTT + `), "dst_zone", "$1", "src_zone", "(.*)"),
    "zone", "$1", "src_zone", "(.*)"
  )
)`)},
		{Record: RecJobZonePairRTT, Expr: block(`group by (namespace, job_name, src_zone, dst_zone` + tClusterBy + `) (
  rate(zonewatch_job_flow_events_total` + sel(crossZone, `peer="job"`) + `[5m]) > 0
)
* on (src_zone, dst_zone` + tClusterBy + `) group_left ()
  ` + RecZonePairRTT + `{quantile="0.5"}`)},
		{Record: RecJobInZoneRTT, Expr: block(`avg by (` + byJob + `) (
  group by (namespace, job_name, zone` + tClusterBy + `) (` + RecJobPods + `)
  * on (zone` + tClusterBy + `) group_left ()
    ` + RecZoneRTT + `{quantile="0.5"}
)`)},
		{Record: RecJobUnseenNetwork, Expr: block(condUnseenNetwork)},
		// Per GPU, the ratio condIdle reads, in the same order.
		{Record: RecSplitIdleGPUCost, Expr: block(`count by (` + byJob + `) (
  (
` + indent(indent(gpuRatios(`job_name!=""`))) + `
  ) < ` + tok("idleGPUUtilization") + `
  and on (` + byJob + `) (` + condSplit + `)
) * ` + tok("gpuDollarsPerHour"))},
	}}

	recording.Rules = append(recording.Rules, probeRules()...)

	jobs := group{Name: "zonewatch.jobs", Rules: []rule{
		alertRule(AlertIdleGPUSplitJob, "idleGPUSplitJob", condIdleGPUSplitJob,
			"A training job split across zones is blocked by a network policy while its GPUs sit idle.",
			jobName+` is split across zones (`+jobZones+`) and Cilium drops its cross-zone traffic (`+jobDrops+`). Its GPUs average {{ $value | humanizePercentage }} utilization`+jobIdleGPUCost+`.`),
		alertRule(AlertBlockedSplitJob, "blockedSplitJob", condBlocked,
			"A training job split across zones is blocked by a network policy between its own pods.",
			jobName+` is split across zones (`+jobZones+`) and Cilium drops traffic between its own pods across zones (`+jobDrops+`): it cannot make progress. `+jobBusy+` The idle-GPU page cannot fire for it; this ticket stands in.`),
		alertRule(AlertCrossZoneSlowdown, "crossZoneSlowdown", condSlowdown,
			"A training job split across zones is slowed down by cross-zone traffic.",
			jobName+` is split across zones (`+jobZones+`) and its traffic crosses zones (`+jobBytes+`) without policy drops between its pods. Its GPU activity averages {{ $value | humanizePercentage }} (`+activitySignal+`): collectives are likely waiting on the inter-zone round trip.`+jobRTT),
		alertRule(AlertPeerPolicyDrops, "peerPolicyDrops", condPeerDrops,
			"Cilium drops a split training job's cross-zone traffic with peers outside the job.",
			jobName+` is split across zones (`+jobZones+`) and Cilium drops its cross-zone traffic with peers outside the job (`+jobPeerDrops+`). Co-locating the job does not fix these drops: the policy, or the peer's zone, does.`),
		alertRule(AlertCrossZoneCost, "crossZoneCost",
			RecCrossZoneCost+` * 24 > `+tok("crossZoneDailyBudgetDollars")+`
`+optedOut,
			"A training job's projected cross-zone transfer spend is over budget.",
			jobName+` sends `+jobBytes+` across zones (`+jobZones+`). At this rate its cross-zone transfer costs ${{ $value | printf "%.2f" }} a day, over the budget of $`+tok("crossZoneDailyBudgetDollars")+` a day.`),
		alertRule(AlertSplitZonePlacement, "splitZonePlacement", `(`+condSplit+`)
and on (`+byJob+`) (`+RecGPUs+` > 0)
unless on (`+byJob+`) (
  `+condCrossZoneDrops+`
)
unless on (`+byJob+`) (
`+indent(condSlowdown)+`
)
unless on (`+byJob+`) (
`+indent(condPeerDrops)+`
)
unless on (`+byJob+`) (
  `+RecJobUnseenNetwork+`
)`,
			"A GPU training job runs across zones.",
			jobName+` has pods in more than one zone (`+jobZones+`). No blocked traffic or slowdown is visible yet, but its collectives cross zones: constrain the job to one zone.`),
		alertRule(AlertSplitJobTrafficUnseen, "splitJobTrafficUnseen", RecJobUnseenNetwork,
			"A busy training job split across zones exchanges no traffic between its pods that Cilium sees.",
			jobName+` is split across zones (`+jobZones+`) and its GPUs are {{ $value | humanizePercentage }} busy, yet Hubble, connected on its nodes, sees no flow between its pods in any zone. Its collectives most likely run over RDMA (EFA, InfiniBand, RoCE) or a secondary network that Cilium does not see: the absence of policy drops and cross-zone bytes does not mean it is healthy, and zonewatch cannot measure what its zone hop costs.`),
	}}

	health := group{Name: "zonewatch.health", Rules: []rule{
		alertRule(AlertExporterDown, "exporterDown", `up`+sel()+` == 0`,
			"Prometheus cannot scrape a zonewatch exporter.",
			`zonewatch at {{ $labels.instance }}{{ with $labels.pod }} (pod {{ . }}){{ end }}{{ with $labels.node }} on node {{ . }}{{ end }} cannot be scraped: the training jobs on its node are not watched.`),
		alertRule(AlertExporterAbsent, "exporterAbsent", `absent(up`+sel()+`)`,
			"No zonewatch exporter is scraped.",
			`Prometheus has no target matching `+sel()+`: zonewatch is not deployed, or this Prometheus does not select its PodMonitor. No other zonewatch alert can fire.`),
		alertRule(AlertHubbleDisconnected, "hubbleDisconnected",
			nodeOf(`zonewatch_source_up`+sel(`source="hubble"`)+` == 0`, "")+"\n"+exceptRollup,
			"zonewatch is not connected to Hubble on a node with training jobs.",
			`zonewatch on node {{ $labels.node }} ({{ $labels.instance }}) is not connected to Hubble: policy drops and cross-zone flows of the training jobs on this node are not counted.`),
		// Lost events are of every event kind, before zonewatch's filter;
		// processed flows passed it. Their ratio is lost events per flow
		// received, not a share of one population: an upper bound of the
		// share of zonewatch's flows lost (docs/runbooks.md).
		alertRule(AlertHubbleLostEvents, "hubbleLostEvents",
			nodeOf(`sum by (`+byInstance+`) (rate(zonewatch_hubble_lost_events_total`+sel()+`[5m]))
  /
  sum by (`+byInstance+`) (rate(zonewatch_hubble_flows_processed_total`+sel()+`[5m]))
  > `+tok("hubbleLostEventsRatio"), ""),
			"Hubble is losing flow events on a node with training jobs.",
			`Hubble reported {{ $value | humanizePercentage }} as many lost events as the flows zonewatch received on node {{ $labels.node }} ({{ $labels.instance }}). Lost events are of every kind, so this overstates the share of zonewatch's flows lost, but some policy drops and flows of the training jobs there are not counted.`),
		// Only nodes with GPU workers: a coordinator may run on a node without GPUs.
		alertRule(AlertGPUSourceDown, "gpuSourceDown",
			nodeOf(`zonewatch_source_up`+sel(`source=~"gpu|podresources"`)+` == 0`, `role="worker"`)+"\n"+exceptRollup,
			"zonewatch cannot read GPU metrics on a node with training jobs.",
			`The {{ $labels.source }} source of zonewatch on node {{ $labels.node }} ({{ $labels.instance }}) is down: GPU activity of the training jobs on this node is unknown, so the idle-GPU and slowdown alerts cannot fire for them.`),
		alertRule(AlertByteSourceUnavailable, "byteSourceUnavailable",
			nodeOf(`sum by (`+byInstance+`) (rate(zonewatch_job_flow_events_total`+sel(crossZone)+`[5m])) > 0
  and on (`+byInstance+`) (zonewatch_source_up`+sel(`source="conntrack"`)+` == 0)`, ""),
			"zonewatch cannot count cross-zone bytes while Hubble sees cross-zone traffic.",
			`zonewatch on node {{ $labels.node }} ({{ $labels.instance }}) cannot read Cilium's conntrack byte counters while Hubble sees {{ $value | printf "%.2f" }} cross-zone flow events/s there: cross-zone bytes and their cost are not measured. Turn conntrack accounting on the way the node's Cilium version needs: 1.17 and later, Helm bpf.ctAccounting=true (agent flag --bpf-conntrack-accounting) and restart the agents; 1.16, cilium-dbg config ConntrackAccounting=Enabled in every agent pod, again after every agent restart; 1.14/1.15 count by default (if someone disabled it, the same command). The exporter's log on that node names the way for what it sees.`),
		// Every exporter, job pods or not: without its informers it knows
		// no pod, so it cannot tell whether its node has any. The node
		// label is the target's (the chart's scrape relabeling).
		alertRule(AlertKubernetesSourceDown, "kubernetesSourceDown",
			`zonewatch_source_up`+sel(`source="kubernetes"`)+` == 0
`+exceptRollup,
			"zonewatch cannot watch the Kubernetes API on a node.",
			`zonewatch at {{ $labels.instance }}{{ with $labels.node }} on node {{ . }}{{ end }} has not synced its Kubernetes informers: it places no pod, so the training jobs on its node are not watched (no placement, and their drops, flows and bytes are not counted to them).`),
		// Only where it costs something: without the ipcache the pod
		// CIDRs place remote pods (and flows), except where pods take
		// addresses outside them (ENI-style IPAM): then flows go unplaced.
		alertRule(AlertIPCacheSourceDown, "ipCacheSourceDown",
			nodeOf(`sum by (`+byInstance+`) (rate(zonewatch_hubble_flows_unresolved_total`+sel()+`[5m])) > 0
  and on (`+byInstance+`) (zonewatch_source_up`+sel(`source="ipcache"`)+` == 0)`, ""),
			"zonewatch cannot read Cilium's ipcache on a node where flows go unplaced.",
			`zonewatch on node {{ $labels.node }} ({{ $labels.instance }}) cannot read the node's Cilium ipcache map, and {{ $value | printf "%.2f" }} flows/s there have a cluster address it cannot place: pods it does not watch (other jobs' pods, other workloads) are placed by the nodes' pod CIDRs only, which do not hold them where pods take addresses outside them (ENI-style IPAM). Drops, flows and bytes of the training jobs here with such peers count to an unknown zone.`),
		alertRule(AlertSourceDownOnManyNodes, "sourceDownOnManyNodes", condRollup,
			"A zonewatch source is down on many nodes at once.",
			`The {{ $labels.source }} source of zonewatch is down on {{ $value }} nodes (at least `+tok("sourceDownRollupNodes")+`): a cause common to them (an upgrade of Cilium or the GPU Operator, a chart or RBAC change) rather than one node. The per-node alerts of this source are held back while this fires; zonewatch_source_up{source="{{ $labels.source }}"} == 0 lists the nodes.`),
	}}
	return []group{recording, jobs, health}
}

// zonePairRTT records quantile q of the probe RTT by zone pair: the native
// histogram's, or where only classic buckets are scraped, theirs. "> 0"
// drops the NaN of a pair without answered probes in the window, so it
// reads "not measured" rather than NaN.
func zonePairRTT(q string) rule {
	return rule{Record: RecZonePairRTT, Labels: map[string]string{"quantile": q}, Expr: block(`histogram_quantile(` + q + `, sum by (src_zone, dst_zone` + tClusterBy + `) (rate(zonewatch_zone_rtt_seconds` + sel() + `[5m]))) > 0
or
histogram_quantile(` + q + `, sum by (src_zone, dst_zone, le` + tClusterBy + `) (rate(zonewatch_zone_rtt_seconds_bucket` + sel() + `[5m]))) > 0`)}
}

// gpuRatios is every per-GPU ratio, in condIdle's order: a GPU counts once
// whichever its source reports.
func gpuRatios(matchers string) string {
	var b strings.Builder
	for i, m := range []string{"zonewatch_gpu_utilization_ratio", "zonewatch_gpu_graphics_engine_active_ratio",
		"zonewatch_gpu_sm_active_ratio", "zonewatch_gpu_tensor_active_ratio"} {
		if i > 0 {
			b.WriteString("\nor ")
		}
		b.WriteString(m + sel(matchers))
	}
	return b.String()
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
