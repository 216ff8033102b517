package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/collector/ipcache"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/topology"
)

func init() { register("ipcache", &ipcachePart{}) }

// ipcachePart chooses the DaemonSet's pod view: with "node", the exporter
// watches its node's pods and its jobs' pods only and places every other
// address through the node's Cilium ipcache (docs/topology.md). The
// Kubernetes feed starts the reader (startIPCache): the index must place
// through it before the informers fill it, so start has nothing left to do.
type ipcachePart struct {
	view     *string
	nodeView *string
	refresh  *time.Duration
	bpffs    *string
	interval *time.Duration
}

func (p *ipcachePart) flags(cmd *kingpin.CmdClause) {
	p.view = flagOf(cmd, "kube.pod-view", "Which job pods a DaemonSet exporter (--node-name set) watches: node (its node's pods and all pods of the jobs running there; other addresses are placed through the node's Cilium ipcache) or cluster (every job pod of the cluster, as Relay mode does).").Default("node").Enum("node", "cluster")
	p.nodeView = flagOf(cmd, "kube.node-view", "Which nodes a DaemonSet exporter in the per-node view (--kube.pod-view=node) reads: peers (its own node, the nodes of the pods it holds, and the node behind each tunnel endpoint its ipcache names, found through that node's host-network pods, else through the pod with the address being placed; each read by name, never watched) or cluster (a watch of every node: every node's status report, about 17 KB on a GPU node every 5 minutes, reaches every exporter; docs/performance.md).").Default("peers").Enum("peers", "cluster")
	p.refresh = flagOf(cmd, "kube.node-refresh", "How often a node the peers node view holds is read again (--kube.node-view=peers).").Default("30m").Duration()
	p.bpffs = flagOf(cmd, "ipcache.bpffs-path", "Folder of the BPF filesystem where Cilium pins its ipcache map (cilium_ipcache_v2, cilium_ipcache before 1.18).").Default("/sys/fs/bpf/tc/globals").String()
	p.interval = flagOf(cmd, "ipcache.refresh-interval", "How often to read the ipcache map (--kube.pod-view=node).").Default("10s").Duration()
}

func (p *ipcachePart) input(in *inputs) {
	if *p.view == "node" {
		in.ipcache = ipcache.BPFSource{Dir: *p.bpffs, Load: in.loadPin}
		if *p.nodeView == "peers" {
			in.localOptions = append(in.localOptions, kube.PeerNodes(*p.refresh))
		}
	}
	in.ipcacheInterval = *p.interval
}

func (p *ipcachePart) start(context.Context, *wiring, *inputs) error { return nil }

// startIPCache starts the reader of the node's ipcache
// (zonewatch_source_up{source="ipcache"}) and returns it as the index's
// IPCache, and the reader (readiness waits for its first read).
func startIPCache(ctx context.Context, w *wiring, in *inputs) (topology.IPCache, *ipcache.Reader, error) {
	r, err := ipcache.New(in.ipcache, ipcache.Config{Logger: w.logger.With("component", "ipcache"), Self: w.self})
	if err != nil {
		return nil, nil, fmt.Errorf("ipcache reader: %w", err)
	}
	w.exporter.AddSource("ipcache", r)
	go r.Run(ctx, in.ipcacheInterval)
	return ipcacheView{r}, r, nil
}

// ipcacheView gives the index the reader's entries.
type ipcacheView struct{ r *ipcache.Reader }

// Kick asks for an early read (the index asks: a new endpoint here, an
// address of a flow it could not give a job).
func (v ipcacheView) Kick() { v.r.Kick() }

func (v ipcacheView) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	e, ok := v.r.Lookup(a)
	return topology.RemoteEntry{NodeIP: e.NodeIP, Identity: e.Identity, Flags: e.Flags, Bits: e.Bits}, ok
}
