package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/zonewatch/zonewatch/rules"
)

// zoneRTT checks the probe round trip end to end (issue 22): the exporters
// probe each other over TCP, Prometheus records the zone-pair p50 (from
// whichever buckets it scrapes, native or classic), the slowed job's
// exposure names the pairs its own pods cross, and the slowdown's
// description, as Prometheus renders it now, says what round trip it pays.
func zoneRTT(t *testing.T, p *prom) {
	t.Helper()
	// The exporters find their peers among the exporter pod objects; until
	// they send a probe there is nothing to check (the dashboards' RTT
	// panels read "not measured" then).
	var sent model.Vector
	for deadline := time.Now().Add(30 * time.Second); len(sent) == 0 && time.Now().Before(deadline); time.Sleep(time.Second) {
		sent, _ = p.vector(`sum(zonewatch_probe_sent_bytes_total)`)
	}
	if len(sent) == 0 {
		t.Skip("the e2e exporters sent no probe (zonewatch_probe_sent_bytes_total absent): no peers found among the exporter pods")
	}
	pairs := rules.RecZonePairRTT + `{quantile="0.5"}`
	var cross, inZone int
	if !eventually(t, 2*time.Minute, "zone-pair round trip recorded", func() (bool, string) {
		v, err := p.vector(pairs)
		if err != nil {
			return false, err.Error()
		}
		cross, inZone = 0, 0
		for _, s := range v {
			if f := float64(s.Value); f <= 0 || f > 1 {
				return false, fmt.Sprintf("implausible round trip %v", s)
			}
			if s.Metric["src_zone"] == s.Metric["dst_zone"] {
				inZone++
			} else {
				cross++
			}
		}
		return cross > 0, fmt.Sprintf("%d cross-zone, %d in-zone pairs: %v", cross, inZone, v)
	}) {
		// Say where it stopped: no probes sent, all failing, or not scraped.
		for _, q := range []string{
			`sum by (instance, dst_zone) (zonewatch_probe_sent_bytes_total)`,
			`sum by (instance, dst_zone, reason) (zonewatch_probe_failures_total) > 0`,
			`count by (__name__) ({__name__=~"zonewatch_zone_rtt_seconds.*"})`,
		} {
			v, err := p.vector(q)
			t.Logf("%s: %v %v", q, v, err)
		}
		return
	}
	t.Logf("round trip p50 recorded for %d cross-zone and %d in-zone pairs", cross, inZone)

	sel := fmt.Sprintf(`{namespace=%q, job_name=%q}`, slowNS, slowJob)
	eventually(t, time.Minute, slowJob+"'s exposure", func() (bool, string) {
		v, err := p.vector(rules.RecJobZonePairRTT + sel)
		return err == nil && len(v) > 0, fmt.Sprint(v, err)
	})
	eventually(t, time.Minute, "the slowdown description names the round trip", func() (bool, string) {
		d, err := activeDescription(p, rules.AlertCrossZoneSlowdown, slowNS, slowJob)
		return err == nil && strings.Contains(d, " It crosses ") && strings.Contains(d, " p50"), fmt.Sprint(d, err)
	})
}

// activeDescription is the description Prometheus renders now for the
// alert of one job (re-rendered every evaluation, unlike a notification).
func activeDescription(p *prom, alert, namespace, job string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := p.api.Alerts(ctx)
	if err != nil {
		return "", err
	}
	for _, a := range res.Alerts {
		if a.Labels["alertname"] == model.LabelValue(alert) && a.Labels["namespace"] == model.LabelValue(namespace) && a.Labels["job_name"] == model.LabelValue(job) {
			return string(a.Annotations["description"]), nil
		}
	}
	return "", fmt.Errorf("no active %s for %s/%s", alert, namespace, job)
}
