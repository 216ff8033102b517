package conntrack_test

import (
	"strings"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/collector/conntrack"
)

// TestOneEntryVotesOnce (issue 33, item 6): the layout is decided when
// minVotes (8) entries agree, not when one entry has been seen in eight
// polls. A node whose only connection is one long-lived ingress entry
// keeps the layout undecided (zonewatch_conntrack_layout_info{layout=
// "auto"}) and its growth held until a version or more entries tell,
// however long it is polled; the layout then decided is counted from the
// entries, each once.
func TestOneEntryVotesOnce(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg, logs := logPoller(t, src, conntrack.Config{})
	// The master opened it; n1 holds the ingress entry (split: worker0's
	// replies are its tx, the master's bytes its rx).
	c := conn{from: master, to: worker0, fromNode: "n2", toNode: "n1", sport: 40000, dport: 29500, sent: 574, reply: 1074, sentPkts: 1, replyPkts: 2}
	for i := range 30 {
		c.sent, c.sentPkts = c.sent+9000, c.sentPkts+6
		c.reply, c.replyPkts = c.reply+90000, c.replyPkts+60
		src.Set(conntrack.MapTCP4, table(c.entries("n1", conntrack.LayoutSplit)...))
		p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_layout_info", "layout", "auto"); got != 1 {
		t.Errorf("one entry polled 30 times decided the layout: layout_info{layout=\"auto\"} = %v\n%s", got, logs)
	}
	if strings.Contains(logs.String(), "layout decided from the entries") {
		t.Errorf("one entry decided the layout:\n%s", logs)
	}
	if got := series(t, p); len(got) != 0 {
		t.Errorf("counted under a layout one entry decided: %v", got)
	}
	// Seven more connections (eight entries) agree: now it is decided.
	es := c.entries("n1", conntrack.LayoutSplit)
	for _, v := range voters(7) {
		es = append(es, v.entries("n1", conntrack.LayoutSplit)...)
	}
	src.Set(conntrack.MapTCP4, table(es...))
	p.Poll(t0.Add(300 * time.Second))
	if got := selfValue(t, reg, "zonewatch_conntrack_layout_info", "layout", "split"); got != 1 {
		t.Errorf("eight entries agreeing on split: layout_info{layout=\"split\"} = %v\n%s", got, logs)
	}
	if !strings.Contains(logs.String(), "split_votes=8 combined_votes=0") {
		t.Errorf("decision not from 8 votes:\n%s", logs)
	}
}
