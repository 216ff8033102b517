package rules

// The probe failures by zone pair, with the peers' half joined in.
const (
	// RecProbeInboundDenied: the peers' count of probe packets from
	// src_zone that their node's datapath dropped by policy, by zone pair.
	RecProbeInboundDenied = "src_zone_dst_zone:zonewatch_probe_inbound_denied:rate5m"
	// RecProbeFailures: the probe failures by zone pair and reason, where a
	// pair's timeouts are policy_denied while the peers in dst_zone count
	// inbound policy drops of probes from src_zone (a fence enforced on the
	// peer's node, which the prober's node cannot see: docs/probe.md).
	RecProbeFailures = "src_zone_dst_zone_reason:zonewatch_probe_failures:rate5m"
)

// probeRules joins the two halves of a probe denied on the peer's node in
// Prometheus, the one place that sees both exporters: the prober cannot ask
// the peer, whose ports the same fence drops.
func probeRules() []rule {
	pair := "src_zone, dst_zone" + tClusterBy
	failures := func(reason string) string {
		return `sum by (` + pair + `) (rate(zonewatch_probe_failures_total` + sel(`reason="`+reason+`"`) + `[5m]))`
	}
	deniedThere := `(` + RecProbeInboundDenied + ` > 0)`
	// The timeouts of the pairs the peers saw denied, else 0.
	deniedTimeouts := failures("timeout") + `
      and on (` + pair + `) ` + deniedThere + `
    or 0 * ` + failures("timeout")
	return []rule{
		{Record: RecProbeInboundDenied, Expr: block(`sum by (` + pair + `) (rate(zonewatch_probe_inbound_denied_total` + sel() + `[5m]))`)},
		{Record: RecProbeFailures, Expr: block(`sum by (` + pair + `, reason) (rate(zonewatch_probe_failures_total` + sel(`reason!~"timeout|policy_denied"`) + `[5m]))
or
label_replace(
  ` + failures("timeout") + `
    unless on (` + pair + `) ` + deniedThere + `
  or 0 * ` + failures("timeout") + `,
  "reason", "timeout", "", ""
)
or
label_replace(
  ` + failures("policy_denied") + `
  + on (` + pair + `) (
    ` + deniedTimeouts + `
  ),
  "reason", "policy_denied", "", ""
)`)},
	}
}
