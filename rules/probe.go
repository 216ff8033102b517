package rules

// The probe failures by zone pair, with the peers' half joined in.
const (
	// RecProbeInboundDenied: the peers' count of probe packets from
	// src_zone that their node's datapath dropped by policy, by zone pair.
	RecProbeInboundDenied = "src_zone_dst_zone:zonewatch_probe_inbound_denied:rate5m"
	// RecProbePeersDenying: the share of the exporters in dst_zone that
	// counted inbound policy drops of probes from src_zone, 0..1.
	RecProbePeersDenying = "src_zone_dst_zone:zonewatch_probe_peers_denying:ratio"
	// RecProbeFailures: the probe failures by zone pair and reason, where a
	// pair's timeouts are policy_denied while every peer in dst_zone counts
	// inbound policy drops of probes from src_zone (a fence enforced on the
	// peer's node, which the prober's node cannot see: docs/probe.md), and
	// timeout_or_policy_denied while only some do: the failures carry no
	// peer, so which timeouts were the denied ones cannot be told.
	RecProbeFailures = "src_zone_dst_zone_reason:zonewatch_probe_failures:rate5m"
)

// probeRules joins the two halves of a probe denied on the peer's node in
// Prometheus, the one place that sees both exporters: the prober cannot ask
// the peer, whose ports the same fence drops. Each exporter in dst_zone
// exports its own inbound series (from 0), so they count the peers.
func probeRules() []rule {
	pair := "src_zone, dst_zone" + tClusterBy
	failures := func(reason string) string {
		return `sum by (` + pair + `) (rate(zonewatch_probe_failures_total` + sel(`reason="`+reason+`"`) + `[5m]))`
	}
	inbound := `rate(zonewatch_probe_inbound_denied_total` + sel() + `[5m])`
	// The timeouts of the pairs whose peers match cond, else 0.
	timeoutsWhere := func(cond string) string {
		return failures("timeout") + `
      and on (` + pair + `) (` + RecProbePeersDenying + ` ` + cond + `)
    or 0 * ` + failures("timeout")
	}
	return []rule{
		{Record: RecProbeInboundDenied, Expr: block(`sum by (` + pair + `) (` + inbound + `)`)},
		{Record: RecProbePeersDenying, Expr: block(`count by (` + pair + `) (` + inbound + ` > 0)
  / on (` + pair + `) count by (` + pair + `) (` + inbound + `)
or
0 * count by (` + pair + `) (` + inbound + `)`)},
		{Record: RecProbeFailures, Expr: block(`sum by (` + pair + `, reason) (rate(zonewatch_probe_failures_total` + sel(`reason!~"timeout|policy_denied"`) + `[5m]))
or
label_replace(
  ` + failures("timeout") + `
    unless on (` + pair + `) (` + RecProbePeersDenying + ` > 0)
  or 0 * ` + failures("timeout") + `,
  "reason", "timeout", "", ""
)
or
label_replace(
  ` + failures("policy_denied") + `
  + on (` + pair + `) (
    ` + timeoutsWhere("== 1") + `
  ),
  "reason", "policy_denied", "", ""
)
or
label_replace(
  ` + timeoutsWhere("> 0 < 1") + `,
  "reason", "timeout_or_policy_denied", "", ""
)`)},
	}
}
