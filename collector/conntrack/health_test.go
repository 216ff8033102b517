package conntrack_test

import (
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
)

func TestDownReasons(t *testing.T) {
	zeroCounters := func() *conntrack.MemSource {
		s := conntrack.NewMemSource()
		tab := conntrack.NewMemTable(conntrack.KeySize4)
		for _, c := range twoNodeConns(true) {
			for _, e := range c.entries("n1", conntrack.LayoutCombined) {
				tab.Put(e.t, conntrack.Value{TxFlagsSeen: 0x12, RxFlagsSeen: 0x12})
			}
		}
		s.Set(conntrack.MapTCP4, tab)
		return s
	}
	for _, tc := range []struct {
		name   string
		src    conntrack.Source
		layout conntrack.Layout
		reason string // in the errors metric; "" when none
		log    string
	}{
		{"absent", conntrack.NewMemSource(), conntrack.LayoutAuto, "absent", "mountPropagation"},
		{"permission", funcSource(func(name string) (conntrack.Table, error) {
			return nil, fmt.Errorf("opening pinned map /sys/fs/bpf/tc/globals/%s: %w", name, syscall.EPERM)
		}), conntrack.LayoutAuto, "permission", "capability BPF"},
		{"unknown layout", funcSource(func(string) (conntrack.Table, error) { return badSizeTable{}, nil }), conntrack.LayoutAuto, "layout", "value size 72"},
		{"accounting off", zeroCounters(), conntrack.LayoutAuto, "", "bpf.ctAccounting=true"},
		{"accounting off, forced layout", zeroCounters(), conntrack.LayoutCombined, "", "bpf.ctAccounting=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuf
			reg := prometheus.NewRegistry()
			p, err := conntrack.New(tc.src, newIndex(), conntrack.Config{Node: "n1", Layout: tc.layout, Self: reg,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				p.Poll(t0.Add(time.Duration(i) * 10 * time.Second))
				if p.Up() {
					t.Fatalf("poll %d: source up", i)
				}
			}
			if got := series(t, p); len(got) != 0 {
				t.Fatalf("bytes counted while down: %v", got)
			}
			if tc.reason != "" {
				// absent: once per poll; the others once per map and poll.
				want := 3.0
				if tc.reason != "absent" {
					want = 3 * float64(len(conntrack.MapNames))
				}
				if got := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", tc.reason); got != want {
					t.Errorf("errors{reason=%q} = %v, want %v", tc.reason, got, want)
				}
			}
			out := logs.String()
			if n := strings.Count(out, "conntrack source down"); n != 1 {
				t.Errorf("logged %d times, want once:\n%s", n, out)
			}
			if !strings.Contains(out, tc.log) {
				t.Errorf("log does not say %q:\n%s", tc.log, out)
			}
		})
	}
}

func TestAccountingTurnedOn(t *testing.T) {
	src := conntrack.NewMemSource()
	p, _ := newPoller(t, src, "n1", conntrack.LayoutAuto)
	c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500}
	src.Set(conntrack.MapTCP4, table(c.entries("n1", conntrack.LayoutCombined)...)) // all zero
	p.Poll(t0)
	if p.Up() {
		t.Fatal("up with accounting off")
	}
	// Cilium restarted with bpf.ctAccounting=true: counters start at 0 and
	// grow; everything after the switch is counted.
	var es []ctEntry
	for i := 0; i < 10; i++ {
		c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: uint16(40000 + i), dport: 29500,
			sent: 5000, reply: 500, sentPkts: 5, replyPkts: 5}
		es = append(es, c.entries("n1", conntrack.LayoutCombined)...)
	}
	src.Set(conntrack.MapTCP4, table(es...))
	p.Poll(t0.Add(10 * time.Second))
	if !p.Up() {
		t.Fatal("still down with accounting on")
	}
	// This poll decided the layout; the growth it saw was held, not lost,
	// and is counted by the next one.
	p.Poll(t0.Add(20 * time.Second))
	// Entry 40000 was known (0 -> 5500); 40001-40009 are fresh.
	if got := series(t, p)[key("z-a", "z-b", "cross_zone")]; got != 10*5500 {
		t.Fatalf("bytes = %v, want %v", got, 10*5500)
	}
}

func TestImplausibleDeltaSkipped(t *testing.T) {
	src := conntrack.NewMemSource()
	p, reg := newPoller(t, src, "n1", conntrack.LayoutCombined)
	c := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 1000, sentPkts: 1, replyPkts: 1}
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	p.Poll(t0)
	c.sent = 1 << 63 // a garbage counter (cf. castai/egressd#19)
	src.Set(conntrack.MapTCP4, table(c.entries("n1", 0)...))
	p.Poll(t0.Add(10 * time.Second))
	if got := series(t, p); len(got) != 0 {
		t.Fatalf("implausible delta counted: %v", got)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "implausible"); got != 1 {
		t.Fatalf("implausible errors = %v, want 1", got)
	}
}

// deniedLister is the BPF folder as a user without the capability sees
// it: the listing fails with EACCES before any map is opened.
type deniedLister struct{ funcSource }

func (deniedLister) List() ([]string, error) {
	return nil, &fs.PathError{Op: "open", Path: "/sys/fs/bpf/tc/globals", Err: syscall.EACCES}
}

// TestListingDeniedIsPermission: the exporter run as a user without BPF
// rights fails at the listing first; the reason, the metric and the one
// log line must name the permission and its advice, not a read error
// (the chart test running the exporter as nobody caught it).
func TestListingDeniedIsPermission(t *testing.T) {
	var logs logBuf
	reg := prometheus.NewRegistry()
	src := deniedLister{funcSource(func(name string) (conntrack.Table, error) {
		return nil, fmt.Errorf("opening pinned map /sys/fs/bpf/tc/globals/%s: %w", name, syscall.EPERM)
	})}
	p, err := conntrack.New(src, newIndex(), conntrack.Config{Node: "n1", Self: reg,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	p.Poll(t0)
	if p.Up() {
		t.Fatal("source up")
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "read"); got != 0 {
		t.Errorf("errors{reason=read} = %v, want 0", got)
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "permission"); got < 1 {
		t.Errorf("errors{reason=permission} = %v, want the listing and the maps", got)
	}
	if out := logs.String(); !strings.Contains(out, "capability BPF") {
		t.Errorf("log does not give the permission advice:\n%s", out)
	}
}
