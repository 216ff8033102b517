package conntrack_test

import (
	"fmt"
	"io/fs"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/zonewatch/zonewatch/collector/conntrack"
)

// flakyLister is the BPF filesystem source whose listing fails once (as
// os.ReadDir does when the process is out of file descriptors, EMFILE):
// the maps and their reads stay real.
type flakyLister struct {
	conntrack.BPFSource
	fail bool
}

func (s *flakyLister) List() ([]string, error) {
	if s.fail {
		s.fail = false
		return nil, &fs.PathError{Op: "open", Path: s.Dir, Err: syscall.EMFILE}
	}
	return s.BPFSource.List()
}

// TestListingFailureKeepsPerEndpointBaselines (issue 33, item 2): Cilium
// 1.14-1.17 with ConntrackLocal keeps an endpoint's connections in a
// per-endpoint map. One failed listing of the maps folder must not make
// the poller forget that map, or its next read is a baseline and what it
// moved meanwhile is lost with no metric moving: the poll reads the maps
// it listed last, counts a read error and says the source is down for
// that poll. (An IPv4 node's two global maps and three endpoints' maps:
// the poller forgot maps only when it held more than the four global
// names it reads after a failed listing.)
func TestListingFailureKeepsPerEndpointBaselines(t *testing.T) {
	env := newBPFEnv(t)
	if env.dir == "" {
		t.Skip("SKIP: no bpffs mounted: a listing needs pinned maps")
	}
	global := env.create(t, conntrack.MapTCP4, ebpf.LRUHash, conntrack.KeySize4, conntrack.ValueSize, 1024)
	put(t, global, established(40000, 5, 5000))
	env.create(t, conntrack.MapAny4, ebpf.LRUHash, conntrack.KeySize4, conntrack.ValueSize, 1024) // an IPv4 node has both
	var locals []*ebpf.Map
	for ep := range 3 {
		m := env.create(t, fmt.Sprintf("cilium_ct4_%05d", 42+ep), ebpf.LRUHash, conntrack.KeySize4, conntrack.ValueSize, 1024)
		put(t, m, established(uint16(41000+ep), 5, 5000))
		locals = append(locals, m)
	}
	grow := func(pkts, bytes uint64) {
		for ep, m := range locals {
			put(t, m, established(uint16(41000+ep), pkts, bytes))
		}
	}
	src := &flakyLister{BPFSource: conntrack.BPFSource{Dir: env.dir}}
	p, reg, logs := logPoller(t, src, conntrack.Config{Layout: conntrack.LayoutCombined})
	cross := key("z-a", "z-b", "cross_zone")

	p.Poll(t0) // baselines
	grow(7, 7000)
	src.fail = true
	p.Poll(t0.Add(10 * time.Second))
	if p.Up() {
		t.Error("source up after a failed listing of the maps")
	}
	if got := selfValue(t, reg, "zonewatch_conntrack_errors_total", "reason", "read"); got != 1 {
		t.Errorf(`errors_total{reason="read"} = %v after a failed listing, want 1`, got)
	}
	if !strings.Contains(logs.String(), "listing") {
		t.Errorf("the failed listing is not logged:\n%s", logs)
	}
	grow(10, 10000)
	p.Poll(t0.Add(20 * time.Second))
	if got := series(t, p)[cross]; got != 3*5000 {
		t.Errorf("3 per-endpoint maps across a failed listing: %v bytes counted, want 15000 (3 x (2000 + 3000))", got)
	}
	if !p.Up() {
		t.Error("source still down after a good listing")
	}
}
