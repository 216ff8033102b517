package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/topology"
)

// LocalOption changes what the per-node view (NewLocal) watches.
type LocalOption func(*Live)

// PeerNodes makes the per-node view read only the nodes it needs, instead
// of watching every Node of the cluster (whose 5-minute status reports,
// 17 KB each on a GPU node, are most of what an exporter receives:
// docs/performance.md): its own node, the node of every pod it holds, and
// the node behind each tunnel endpoint its ipcache names for an address
// it places (found through that node's host-network pods). Each is read
// once with a LIST by name (the verbs the chart grants: list and watch),
// and again every refresh (0: 30 minutes) while it is held; nodes of held
// pods leave the index with their last pod. A node's zone and addresses
// are taken as fixed between reads: Kubernetes' well-known labels say a
// node's topology labels do not change without it being recreated.
func PeerNodes(refresh time.Duration) LocalOption {
	return func(l *Live) {
		if refresh <= 0 {
			refresh = 30 * time.Minute
		}
		l.peers = newPeerNodes(l.client, l.index, l.logger, refresh)
		l.peers.denied = l.denied
	}
}

// peerNodes is the lean node view: nodes resolved by name and by address,
// never watched.
type peerNodes struct {
	client  kubernetes.Interface
	index   *topology.Index
	logger  *slog.Logger
	refresh time.Duration

	mu sync.Mutex
	// refs counts the holders of each node: held pods on it (by pod key,
	// podNode), the exporter's own node, addresses resolved to it.
	refs    map[string]int
	podNode map[string]string
	// known are the nodes in the index, with when they were read.
	known map[string]time.Time
	// want are nodes to read; addrs tunnel endpoints to resolve, with
	// when they were last asked (an address no host-network pod has is
	// asked again only after addrRetry).
	want   map[string]bool
	byAddr map[netip.Addr]string
	wake   chan struct{}
	// addrMu guards addrs and queue only: addr runs under the index's
	// lock, which read and release take under mu.
	addrMu sync.Mutex
	addrs  map[netip.Addr]time.Time
	queue  []netip.Addr
	// settled is closed, and replaced, whenever no node is left to read.
	settled chan struct{}

	// denied logs a read the ClusterRole refuses as the informers' are
	// (once, at error level, with the rule to add); nil: a warning.
	denied *Denials

	// Reads counts the LISTs by name, AddrReads those by address,
	// Unresolved the addresses no host-network pod had.
	Reads, AddrReads, Unresolved atomic.Int64
}

const addrRetry = 5 * time.Minute

func newPeerNodes(client kubernetes.Interface, index *topology.Index, logger *slog.Logger, refresh time.Duration) *peerNodes {
	return &peerNodes{client: client, index: index, logger: logger, refresh: refresh,
		refs: map[string]int{}, podNode: map[string]string{}, known: map[string]time.Time{}, want: map[string]bool{},
		addrs: map[netip.Addr]time.Time{}, byAddr: map[netip.Addr]string{}, wake: make(chan struct{}, 1), settled: make(chan struct{})}
}

// pod records the node of a held pod (key namespace/name; node "" when
// the pod left the index or is not scheduled).
func (p *peerNodes) pod(key, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.podNode[key]
	if old == node {
		return
	}
	if node == "" {
		delete(p.podNode, key)
	} else {
		p.podNode[key] = node
		p.holdLocked(node)
	}
	if old != "" {
		p.releaseLocked(old)
	}
}

func (p *peerNodes) holdLocked(node string) {
	p.refs[node]++
	if p.refs[node] == 1 {
		if _, ok := p.known[node]; !ok {
			p.want[node] = true
			p.signal()
		}
	}
}

func (p *peerNodes) releaseLocked(node string) {
	p.refs[node]--
	if p.refs[node] > 0 {
		return
	}
	delete(p.refs, node)
	delete(p.want, node)
	if _, ok := p.known[node]; ok {
		delete(p.known, node)
		p.index.DeleteNode(node)
	}
}

// addr asks for the node behind a tunnel endpoint the index does not know
// (topology.Index.SetNodeMiss): never blocks, asks once per addrRetry.
func (p *peerNodes) addr(a netip.Addr) {
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	if t, ok := p.addrs[a]; ok && time.Since(t) < addrRetry {
		return
	}
	p.addrs[a] = time.Now()
	p.queue = append(p.queue, a)
	p.signal()
}

func (p *peerNodes) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run reads the nodes asked for until ctx ends.
func (p *peerNodes) run(ctx context.Context) {
	tick := time.NewTicker(min(p.refresh, time.Minute))
	defer tick.Stop()
	backoff := time.Second
	for {
		failed := false
		for _, a := range p.takeAddrs() {
			if err := p.resolveAddr(ctx, a); err != nil {
				failed = true
			}
		}
		for _, name := range p.due() {
			if err := p.read(ctx, name); err != nil {
				failed = true
			}
		}
		// Release the waiters now, not at the next wake or tick (a
		// minute away, when the waiter's own wake-up was taken by this
		// round).
		p.settle()
		var retry <-chan time.Time
		if failed {
			retry = time.After(backoff)
			backoff = min(2*backoff, 30*time.Second)
		} else {
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-tick.C:
		case <-retry:
		}
	}
}

func (p *peerNodes) takeAddrs() []netip.Addr {
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	q := p.queue
	p.queue = nil
	return q
}

// due are the nodes to read: asked for, or held and read longer than
// refresh ago. When none is asked for, waiters are released.
func (p *peerNodes) due() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for n := range p.want {
		out = append(out, n)
	}
	for n, t := range p.known {
		if time.Since(t) >= p.refresh && !p.want[n] {
			out = append(out, n)
		}
	}
	p.settleLocked()
	return out
}

func (p *peerNodes) settle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settleLocked()
}

// settleLocked releases the waiters when no node is left to read.
func (p *peerNodes) settleLocked() {
	if len(p.want) == 0 {
		close(p.settled)
		p.settled = make(chan struct{})
	}
}

// read lists one node by name and puts it in the index while it is held.
func (p *peerNodes) read(ctx context.Context, name string) error {
	p.Reads.Add(1)
	list, err := p.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		if p.denied == nil || !p.denied.Note(schema.GroupResource{Resource: "nodes"}, err) {
			p.logger.Warn("reading a node", "node", name, "err", err)
		}
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.want, name)
	if p.refs[name] == 0 {
		return nil // released meanwhile
	}
	if len(list.Items) == 0 {
		// Gone (or not yet created): its pods' zone is unknown until a
		// later read, a refresh away.
		delete(p.known, name)
		p.index.DeleteNode(name)
		return nil
	}
	p.known[name] = time.Now()
	n := NodeFrom(&list.Items[0])
	p.index.UpsertNode(n)
	return nil
}

// resolveAddr finds the node of a tunnel endpoint from a host-network pod
// with that address (every node running Cilium runs its agent so) and
// holds that node.
func (p *peerNodes) resolveAddr(ctx context.Context, a netip.Addr) error {
	p.AddrReads.Add(1)
	sel := fields.AndSelectors(fields.OneTermEqualSelector("status.podIP", a.String()), fields.OneTermEqualSelector("spec.hostNetwork", "true"))
	list, err := p.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel.String(), Limit: 1})
	if err != nil {
		p.addrMu.Lock()
		delete(p.addrs, a) // ask again at the next miss
		p.addrMu.Unlock()
		p.logger.Warn("finding the node of an address", "address", a, "err", err)
		return err
	}
	var node string
	for _, pod := range list.Items {
		if pod.Spec.NodeName != "" {
			node = pod.Spec.NodeName
			break
		}
	}
	if node == "" {
		p.Unresolved.Add(1)
		p.logger.Debug("no host-network pod has the address: its node stays unknown", "address", a)
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byAddr[a] != node {
		if old := p.byAddr[a]; old != "" {
			p.releaseLocked(old)
		}
		p.byAddr[a] = node
		p.holdLocked(node)
	}
	return nil
}

// wait returns once every node asked for so far has been read (or ctx
// ends).
func (p *peerNodes) wait(ctx context.Context) error {
	for {
		p.mu.Lock()
		done, ch := len(p.want) == 0, p.settled
		p.mu.Unlock()
		if done {
			return nil
		}
		p.signal()
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the nodes of the node's pods: %w", ctx.Err())
		case <-ch:
		}
	}
}

// PeerNodeReads reports the lean node view's reads: by name, by address,
// and addresses no host-network pod had; zeros without PeerNodes.
func (l *Live) PeerNodeReads() (byName, byAddr, unresolved int64) {
	if l.peers == nil {
		return 0, 0, 0
	}
	return l.peers.Reads.Load(), l.peers.AddrReads.Load(), l.peers.Unresolved.Load()
}
