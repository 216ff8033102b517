package hubble

import (
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
)

// TestTwoShardsCountEveryFlowOnce runs two Relay replicas (shard 0 and 1
// of 2) against one fake Relay, which applies the node_name filter
// server-side (sim/hubble.go): between them they count every flow of the
// scenario once, each only flows observed on its own nodes. Shard 1 starts
// without one of its nodes (the informer has not seen it yet): when the
// node arrives its stream restarts and resumes, counting nothing twice.
func TestTwoShardsCountEveryFlowOnce(t *testing.T) {
	s := testScenario()
	x := indexOf(s)
	h, sock := startHubble(t, s, "", 0)
	var all []string
	for _, n := range s.Nodes {
		all = append(all, n.Name)
	}
	var mu sync.Mutex
	late := ""
	nodesOf := func(shard Shard) func() []string {
		return func() []string {
			mu.Lock()
			defer mu.Unlock()
			var out []string
			for _, n := range all {
				if n != late || shard.Index == 0 {
					out = append(out, n)
				}
			}
			return out
		}
	}
	var aggs []*Aggregator
	var clients []*Client
	var filters []*NodeShard
	owned := map[string]int{}
	for i := range 2 {
		shard := Shard{Index: i, Total: 2, Cluster: "zonewatch-sim"}
		if err := shard.Validate(); err != nil {
			t.Fatal(err)
		}
		for _, n := range all {
			if shard.Owns(n) {
				owned[n]++
				if i == 1 && late == "" {
					late = n
				}
			}
		}
		f := NewNodeShard(shard, nodesOf(shard))
		agg := NewAggregator(x, "", time.Minute, nil)
		c := NewClient(Config{Address: "unix://" + sock, Since: t0.Add(-time.Second), Nodes: f,
			BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, agg)
		runClient(t, c)
		waitFor(t, "the stream", c.Up)
		aggs, clients, filters = append(aggs, agg), append(clients, c), append(filters, f)
	}
	for _, n := range all {
		if owned[n] != 1 {
			t.Fatalf("node %s owned by %d shards", n, owned[n])
		}
	}
	if late == "" {
		t.Fatal("shard 1 owns no node of the scenario: the test needs one in each")
	}
	if names, _ := filters[1].NodeNames(); len(names) == 0 || names[0] == "" {
		t.Fatalf("shard 1 filter %v", names)
	}
	h.Generate(t0, 5*time.Second)
	// The late node arrives: shard 1's stream restarts with it and
	// resumes from its marks; the Relay replays the late node's flows.
	// The first flows are in and the restart is over before more come, so
	// that none is lost in flight (settle counts them all).
	relay := []*sim.Hubble{h}
	waitFor(t, "the first flows", func() bool { return h.Streams().Flows > 0 && delivered(relay, clients...) })
	before := h.Streams().Started
	mu.Lock()
	late = "\x00"
	mu.Unlock()
	if !filters[1].Refresh() || filters[0].Refresh() {
		t.Fatal("only shard 1's nodes changed")
	}
	waitFor(t, "shard 1's stream to restart", func() bool {
		st := h.Streams()
		return st.Started == before+1 && st.Open == 2
	})
	h.Generate(t0.Add(5*time.Second), 5*time.Second)
	settle(t, 10, relay, clients...)
	for i, a := range aggs {
		if a.Events().Len() == 0 && a.Drops().Len() == 0 {
			t.Errorf("shard %d counted nothing", i)
		}
		if got := testutil.ToFloat64(a.Metrics().Reconnects); got != 0 {
			t.Errorf("shard %d: %v reconnects counted for a planned restart", i, got)
		}
	}
}

// TestShardWhitelist: the node names narrow every filter of the whitelist
// and leave Whitelist itself alone; a shard without nodes follows none.
func TestShardWhitelist(t *testing.T) {
	w := ShardWhitelist(Whitelist(), []string{"c/n1", "c/n2"})
	if len(w) != len(Whitelist()) {
		t.Fatalf("%d filters", len(w))
	}
	for _, f := range w {
		if len(f.GetNodeName()) != 2 || len(f.GetVerdict()) == 0 {
			t.Errorf("filter %v", f)
		}
	}
	for _, f := range Whitelist() {
		if f.GetNodeName() != nil {
			t.Error("Whitelist changed")
		}
	}
	empty := NewNodeShard(Shard{Index: 1, Total: 2, Cluster: "default"}, func() []string { return nil })
	if names, _ := empty.NodeNames(); len(names) != 1 || names[0] != "default/"+noNode {
		t.Errorf("empty shard follows %v", names)
	}
	for _, bad := range []Shard{{Index: 2, Total: 2, Cluster: "c"}, {Index: 0, Total: 0}, {Index: 0, Total: 2, Cluster: "Upper"}, {Index: 0, Total: 2}} {
		if bad.Validate() == nil {
			t.Errorf("%+v valid", bad)
		}
	}
	_ = flowpb.Verdict_DROPPED
}

// TestShardWrongClusterName: a shard whose --hubble.cluster-name is not the
// cluster Relay names its nodes with gets no flow (Hubble's filter matches
// none), and says so once in the log.
func TestShardWrongClusterName(t *testing.T) {
	s := testScenario()
	_, sock := startHubble(t, s, "", 0)
	var all []string
	for _, n := range s.Nodes {
		all = append(all, n.Name)
	}
	var logs testenv.SyncBuffer
	f := NewNodeShard(Shard{Index: 0, Total: 1, Cluster: "default"}, func() []string { return all })
	c := NewClient(Config{Address: "unix://" + sock, Nodes: f, Logger: newTestLogger(&logs),
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, NewAggregator(indexOf(s), "", time.Minute, nil))
	runClient(t, c)
	waitFor(t, "the log line", func() bool { return strings.Contains(logs.String(), "another cluster than --hubble.cluster-name") })
	if n := strings.Count(logs.String(), "another cluster than --hubble.cluster-name"); n != 1 {
		t.Errorf("logged %d times", n)
	}
}
