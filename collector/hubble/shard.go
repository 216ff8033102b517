package hubble

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/proto"
)

// Shard is one of Total Relay replicas (kube-state-metrics' --shard and
// --total-shards): it follows the flows observed on the nodes whose name
// hashes (FNV-1a, 32 bits) to Index modulo Total, through Hubble's
// server-side node_name filter, so that N replicas see every flow exactly
// once between them.
type Shard struct {
	Index, Total int
	// Cluster is the Cilium cluster name (cluster-name, "default" unless
	// set): Hubble names nodes "cluster/node", and a pattern naming the
	// cluster is a literal (1.5 µs a flow for 2,500 nodes on the agents),
	// where one without ("node") starts with a wildcard (1.2 ms a flow).
	Cluster string
}

// Sharded reports whether more than one replica shares the nodes.
func (s Shard) Sharded() bool { return s.Total > 1 }

// Validate checks Index and Total.
func (s Shard) Validate() error {
	if s.Total < 1 || s.Index < 0 || s.Index >= s.Total {
		return fmt.Errorf("shard %d of %d: want 0 <= shard < total-shards", s.Index, s.Total)
	}
	if s.Sharded() && !validPattern(s.Cluster) {
		return fmt.Errorf("cluster name %q is not a Hubble node-name pattern element ([-._0-9a-z])", s.Cluster)
	}
	return nil
}

// Owns reports whether the node's flows are this shard's.
func (s Shard) Owns(node string) bool {
	if s.Total <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(node))
	return int(h.Sum32()%uint32(s.Total)) == s.Index
}

// noNode is a node-name pattern no node has (a DNS name does not start with
// '-'): the filter of a shard that owns no node yet.
const noNode = "-"

// validPattern reports whether s can stand in a Hubble node-name pattern as
// a literal (pkg/hubble/filters/patterns.go appendFQDNPatternRegexp:
// -, ., _, 0-9, a-z; '*' is a wildcard).
func validPattern(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '.' || r == '_' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z') {
			return false
		}
	}
	return true
}

// NodeFilter restricts a client's stream to some nodes.
type NodeFilter interface {
	// NodeNames returns the node_name patterns to follow and a channel
	// that is closed when they change: the stream then restarts.
	NodeNames() ([]string, <-chan struct{})
}

// NodeShard is the NodeFilter of a Shard over the cluster's nodes (from
// the topology index), refreshed by Run.
type NodeShard struct {
	shard Shard
	nodes func() []string

	mu      sync.Mutex
	names   []string
	changed chan struct{}
}

// NewNodeShard returns the filter of shard over nodes().
func NewNodeShard(shard Shard, nodes func() []string) *NodeShard {
	n := &NodeShard{shard: shard, nodes: nodes, changed: make(chan struct{})}
	n.names = n.compute()
	return n
}

func (n *NodeShard) compute() []string {
	var out []string
	for _, name := range n.nodes() {
		if n.shard.Owns(name) && validPattern(name) {
			out = append(out, n.shard.Cluster+"/"+name)
		}
	}
	if len(out) == 0 {
		return []string{n.shard.Cluster + "/" + noNode}
	}
	slices.Sort(out)
	return out
}

// NodeNames implements NodeFilter.
func (n *NodeShard) NodeNames() ([]string, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.names, n.changed
}

// Refresh recomputes the shard's nodes and reports whether they changed.
func (n *NodeShard) Refresh() bool {
	names := n.compute()
	n.mu.Lock()
	defer n.mu.Unlock()
	if slices.Equal(names, n.names) {
		return false
	}
	n.names = names
	close(n.changed)
	n.changed = make(chan struct{})
	return true
}

// Run refreshes every interval until ctx ends, so that a stream restarts
// at most once an interval when nodes come and go.
func (n *NodeShard) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.Refresh()
		}
	}
}

// ShardWhitelist narrows each filter of a whitelist to the nodes (filter
// fields are ANDed, filters ORed).
func ShardWhitelist(base []*flowpb.FlowFilter, nodes []string) []*flowpb.FlowFilter {
	out := make([]*flowpb.FlowFilter, len(base))
	for i, f := range base {
		c := proto.Clone(f).(*flowpb.FlowFilter)
		c.NodeName = nodes
		out[i] = c
	}
	return out
}

// NewNodeReplay is how far before the newest flow a stream whose nodes
// changed resumes: a node that joined the shard has flows from before it
// was seen (informer delay and the refresh interval), which no replica has
// counted; the others' are skipped by their node marks.
const NewNodeReplay = 30 * time.Second

// sinceWithNewNodes moves a resume point back to NewNodeReplay before the
// newest flow seen.
func (c *Client) sinceWithNewNodes(since time.Time) time.Time {
	var hi int64
	for _, m := range c.marks {
		hi = max(hi, m.max)
	}
	if hi == 0 {
		return since
	}
	if t := time.Unix(0, hi).Add(-NewNodeReplay); t.Before(since) {
		return t
	}
	return since
}

// checkShardCluster logs once when Relay names a node of another cluster
// than the shard's filter does (--hubble.cluster-name): the filter would
// match none of its flows, and the shard count nothing.
func (c *Client) checkShardCluster(names []string) {
	ns, ok := c.cfg.Nodes.(*NodeShard)
	if !ok || c.clusterWarned.Load() {
		return
	}
	for _, n := range names {
		if i := strings.IndexByte(n, '/'); i >= 0 && n[:i] != ns.shard.Cluster {
			if c.clusterWarned.CompareAndSwap(false, true) {
				c.logger.Error("hubble names nodes in another cluster than --hubble.cluster-name: this shard's node_name filter matches none of their flows",
					"node", n, "cluster_name", ns.shard.Cluster)
			}
			return
		}
	}
}
