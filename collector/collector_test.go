package collector

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type collectorFunc func(ch chan<- prometheus.Metric) error

func (f collectorFunc) Update(ch chan<- prometheus.Metric) error { return f(ch) }

// TestCollectorSuccess: a collector whose Update fails reports success 0,
// the others 1, and the scrape goes on.
func TestCollectorSuccess(t *testing.T) {
	e := New(slog.New(slog.DiscardHandler))
	fail := true
	e.Add("ok", collectorFunc(func(chan<- prometheus.Metric) error { return nil }))
	e.Add("down", collectorFunc(func(chan<- prometheus.Metric) error {
		if fail {
			return errors.New("input down")
		}
		return nil
	}))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	success := func(name string) float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "zonewatch_scrape_collector_success" {
				continue
			}
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == name {
					return m.GetGauge().GetValue()
				}
			}
		}
		t.Fatalf("no zonewatch_scrape_collector_success{collector=%q}", name)
		return 0
	}
	if got := success("down"); got != 0 {
		t.Errorf("failing collector: success %v, want 0", got)
	}
	if got := success("ok"); got != 1 {
		t.Errorf("working collector: success %v, want 1", got)
	}
	fail = false
	if got := success("down"); got != 1 {
		t.Errorf("recovered collector: success %v, want 1", got)
	}
	if n := testutil.CollectAndCount(e, "zonewatch_scrape_collector_duration_seconds"); n != 2 {
		t.Errorf("%d duration series, want 2", n)
	}
}
