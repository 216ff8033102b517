package conntrack_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
)

// TestHeldGrowthJudgedOverItsTime (issue 33, item 3): growth held while
// the informers are not synced, or while ingress entries wait for the
// layout, is counted when the hold ends. A fast connection (20 GB/s, a
// 200 Gb/s NIC's worth) held for ten minutes moved 12 TB: judged against
// one 10 s interval (at most 100 GB/s, 1 TB) it would be thrown away as
// implausible; judged against the ten minutes since its bytes were last
// counted it is 20 GB/s, and all of it is counted.
func TestHeldGrowthJudgedOverItsTime(t *testing.T) {
	const rate, every, polls = 20e9, 10 * time.Second, 60 // 20 GB/s, polled every 10 s for 10 minutes
	step := uint64(rate * every.Seconds())
	for _, hold := range []string{"index not synced", "layout not known"} {
		t.Run(hold, func(t *testing.T) {
			src := conntrack.NewMemSource()
			reg := prometheus.NewRegistry()
			ready := hold != "index not synced"
			cfg := conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Self: reg, Ready: func() bool { return ready }}
			// The master opened it; worker0's replies are the tx of n1's
			// ingress entry (split), held until the version tells the layout.
			c := conn{from: master, to: worker0, fromNode: "n2", toNode: "n1", sport: 40000, dport: 29500, sent: 500, reply: 1000, sentPkts: 1, replyPkts: 1}
			layout := conntrack.LayoutSplit
			if hold == "layout not known" {
				cfg.Layout = conntrack.LayoutAuto
			} else {
				// worker0 opened it: n1's egress entry, held until the index is synced.
				c = conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 1000, reply: 500, sentPkts: 1, replyPkts: 1}
				layout = conntrack.LayoutCombined
			}
			p, err := conntrack.New(src, newIndex(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			grow := func() {
				if layout == conntrack.LayoutSplit {
					c.reply, c.replyPkts = c.reply+step, c.replyPkts+step/9000
				} else {
					c.sent, c.sentPkts = c.sent+step, c.sentPkts+step/9000
				}
			}
			at := t0
			src.Set(conntrack.MapTCP4, table(c.entries("n1", layout)...))
			p.Poll(at) // the baseline
			for range polls {
				grow()
				at = at.Add(every)
				src.Set(conntrack.MapTCP4, table(c.entries("n1", layout)...))
				p.Poll(at)
			}
			if got := series(t, p); len(got) != 0 {
				t.Fatalf("counted during the hold: %v", got)
			}
			// The hold ends: the informers synced, or the agent's version came.
			if hold == "index not synced" {
				ready = true
			} else {
				p.SetCiliumVersion("1.15.19")
			}
			grow()
			at = at.Add(every)
			src.Set(conntrack.MapTCP4, table(c.entries("n1", layout)...))
			p.Poll(at)
			want := float64((polls + 1) * step)
			if got := series(t, p)[key("z-a", "z-b", "cross_zone")]; got != want {
				t.Errorf("%s for %v at %.0f GB/s: %v bytes counted, want %v (errors_total{reason=\"implausible\"} %v)", hold, polls*every, rate/1e9, got, want,
					selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "implausible"))
			}
		})
	}
}
