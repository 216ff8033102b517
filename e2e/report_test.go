package e2e

import (
	"bytes"
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/report"
	"github.com/zonewatch/zonewatch/rules"
)

// costReport runs the cost report against the real Prometheus over the
// last five minutes of steady traffic and checks the costly job's and its
// namespace's bytes and dollars against the wire bytes the scenario made
// (within 1%), and that the four formats print the same cents.
func costReport(t *testing.T, w *world, p *prom, cfg rules.Config) {
	w.mu.Lock()
	costlyRate := crossZoneWireRate(w.s, costlyNS, costlyJob)
	slowRate := crossZoneWireRate(w.s, slowNS, slowJob)
	w.mu.Unlock()
	// The caller waited until five minutes of steady traffic are scraped:
	// four minutes ending a few scrapes ago hold nothing else.
	const window = 4 * time.Minute
	to := time.Now().Add(-3 * time.Second)
	r, err := report.Build(context.Background(), report.QueryAPI{API: p.api, Timeout: time.Minute}, report.Options{From: to.Add(-window), To: to})
	if err != nil {
		t.Fatal(err)
	}
	var job, ns *report.Line
	for i := range r.Jobs {
		if r.Jobs[i].Namespace == costlyNS && r.Jobs[i].Job == costlyJob {
			job = &r.Jobs[i]
		}
	}
	for i := range r.Namespaces {
		if r.Namespaces[i].Namespace == costlyNS {
			ns = &r.Namespaces[i]
		}
	}
	if job == nil || ns == nil {
		t.Fatalf("report has no line for %s/%s or its namespace: %+v", costlyNS, costlyJob, r.Jobs)
	}
	if r.Prices.CrossZoneDollarsPerGB != cfg.CrossZoneDollarsPerGB || r.Prices.GPUDollarsPerHour != cfg.GPUDollarsPerHour {
		t.Errorf("report prices %+v, rules config %v $/GB, %v $/GPU-h", r.Prices, cfg.CrossZoneDollarsPerGB, cfg.GPUDollarsPerHour)
	}
	wantJobGB := costlyRate * window.Seconds() / 1e9
	wantNSGB := (costlyRate + slowRate) * window.Seconds() / 1e9
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"job GB", job.CrossZoneGB + job.CrossRegionGB, wantJobGB},
		{"job $", job.TransferDollars, wantJobGB * cfg.CrossZoneDollarsPerGB},
		{"namespace GB", ns.CrossZoneGB + ns.CrossRegionGB, wantNSGB},
		{"namespace $", ns.TransferDollars, wantNSGB * cfg.CrossZoneDollarsPerGB},
	} {
		t.Logf("report %s = %.6g (wire %.6g, %+.3f%%)", c.what, c.got, c.want, 100*(c.got-c.want)/c.want)
		if math.Abs(c.got-c.want) > 0.01*c.want {
			t.Errorf("report %s = %.6g, the scenario's wire bytes make %.6g (more than 1%% apart)", c.what, c.got, c.want)
		}
	}
	// The tables print cents; JSON the whole number.
	cents := strconv.FormatFloat(job.TransferDollars, 'f', 2, 64)
	for _, format := range report.Formats {
		var b bytes.Buffer
		if err := r.Write(&b, format); err != nil {
			t.Fatal(err)
		}
		want := cents
		if format == "json" {
			want = strconv.FormatFloat(job.TransferDollars, 'g', -1, 64)
		}
		if !strings.Contains(b.String(), want) {
			t.Errorf("%s output lacks the job's %s $", format, want)
		}
	}
}
