package hubblepeer

import (
	"testing"

	"github.com/zonewatch/zonewatch/collector/hubble"
)

// TestCiliumShardsNodeNameFilter: Relay replicas sharded by node name
// (--shard/--total-shards) ask each agent for their nodes with the
// node_name filter; Cilium v1.20.2's own filter (pkg/hubble/filters
// nodename.go and patterns.go: a name without a cluster is "default/name")
// gives each node's flows to exactly one of the two shards, all of them,
// and none to the other; a shard that names another cluster gets nothing.
func TestCiliumShardsNodeNameFilter(t *testing.T) {
	a, b := startNode(t, nodeA), startNode(t, nodeB)
	nodes := func() []string { return []string{nodeA, nodeB} }
	shardOf := func(n *node, i int, cluster string) *client {
		s := hubble.Shard{Index: i, Total: 2, Cluster: cluster}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		return follow(t, n, hubble.Config{Nodes: hubble.NewNodeShard(s, nodes)})
	}
	owner := func(name string) int {
		if (hubble.Shard{Index: 0, Total: 2}).Owns(name) {
			return 0
		}
		return 1
	}
	ca := []*client{shardOf(a, 0, "default"), shardOf(a, 1, "default")}
	cb := []*client{shardOf(b, 0, "default"), shardOf(b, 1, "default")}
	other := shardOf(a, owner(nodeA), "another-cluster")
	live(t, a, ca[owner(nodeA)])
	live(t, b, cb[owner(nodeB)])

	traffic(a, b)
	wantA := totals{forwarded: forwardedA}
	wantB := totals{policyDrops: deniedPackets, dropped: deniedPackets, forwarded: forwardedB}
	settle(t, "the owning shards' counts", func() bool {
		sa, sb := ca[owner(nodeA)].totals(t), cb[owner(nodeB)].totals(t)
		return sa.forwarded >= wantA.forwarded && sb.forwarded >= wantB.forwarded && sb.policyDrops >= wantB.policyDrops
	})
	for _, x := range []struct {
		name string
		cs   []*client
		own  int
		want totals
	}{{nodeA, ca, owner(nodeA), wantA}, {nodeB, cb, owner(nodeB), wantB}} {
		got := x.cs[x.own].totals(t)
		got.processed = 0
		if got != x.want {
			t.Errorf("%s: its shard %d counted %v, want %v", x.name, x.own, got, x.want)
		}
		if p := x.cs[1-x.own].processed(); p != 0 {
			t.Errorf("%s: shard %d, which does not own it, processed %v flows", x.name, 1-x.own, p)
		}
	}
	if p := other.processed(); p != 0 {
		t.Errorf("a shard naming another cluster processed %v flows", p)
	}
}
