package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/topology"
)

// LocalOption changes what the per-node view (NewLocal) watches.
type LocalOption func(*Live)

// PeerNodes makes the per-node view read only the nodes it needs, instead
// of watching every Node of the cluster (whose 5-minute status reports,
// 17 KB each on a GPU node, are most of what an exporter receives:
// docs/performance.md): its own node, the node of every pod it holds, and
// the node behind each tunnel endpoint its ipcache names for an address
// it places, found through that node's host-network pods or, where none
// has the endpoint's address, through the pod that has the address being
// placed. Each is read once with a LIST by name (the verbs the chart
// grants: list and watch), and again every refresh (0: 30 minutes) while
// it is held; nodes of held pods leave the index with their last pod. A
// node's zone and addresses are taken as fixed between reads: Kubernetes'
// well-known labels say a node's topology labels do not change without it
// being recreated.
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
	client  kubeapi.Interface
	index   *topology.Index
	logger  *slog.Logger
	refresh time.Duration

	mu sync.Mutex
	// refs counts the holders of each node: held pods on it (by pod key,
	// podNode), the exporter's own node, tunnel endpoints resolved to it.
	refs    map[string]int
	podNode map[string]string
	// known are the nodes in the index, with when they were read.
	known map[string]time.Time
	// want are nodes to read.
	want map[string]bool
	// byAddr are the tunnel endpoints resolved, with their node: the
	// node is put in the index with them among its addresses, so that
	// they place every address behind them.
	byAddr map[netip.Addr]string
	wake   chan struct{}
	// settled is closed, and replaced, whenever no node is left to read.
	settled chan struct{}

	// addrMu guards endpoints and podAsked only, and is taken last: Miss
	// and Pending run under the index's lock, which read and release
	// take under mu.
	addrMu    sync.Mutex
	endpoints map[netip.Addr]*endpointLookup
	// podAsked: when an address was last looked up through its own pod
	// (asked again only after addrRetry).
	podAsked map[netip.Addr]time.Time
	podSwept time.Time
	lookups  chan addrLookup
	limit    flowcontrol.RateLimiter

	// denied logs a read the ClusterRole refuses as the informers' are
	// (once, at error level, with the rule to add); nil: a warning.
	denied *Denials

	// Reads counts the LISTs of nodes by name, EndpointReads those of
	// host-network pods by a tunnel endpoint, PodReads those of pods by
	// the address being placed; Found, Unresolved, Failed and Dropped
	// the lookups of an address's node by what came of them.
	Reads, EndpointReads, PodReads     atomic.Int64
	Found, Unresolved, Failed, Dropped atomic.Int64
}

// endpointLookup is what is known of the node behind a tunnel endpoint.
type endpointLookup struct {
	// hostAsked is when its host-network pods were last looked up
	// (again only after addrRetry).
	hostAsked time.Time
	// node is the node a lookup found ("" none yet): it is held and
	// read, and no address behind the endpoint is looked up meanwhile.
	node string
	// busy: a lookup of it is queued or running (one at a time).
	busy bool
}

// addrLookup asks for the node behind a tunnel endpoint, for an address
// the ipcache places behind it.
type addrLookup struct{ endpoint, addr netip.Addr }

// Bounds of the lookups of an address's node: each costs the apiserver
// one or two filtered LISTs of pods, so a burst of unknown addresses is queued (one
// lookup per tunnel endpoint at a time, at most lookupQueue waiting: more
// are dropped and asked again by their next miss), their LISTs at most
// lookupQPS a second on average (bursts of lookupBurst).
const (
	addrRetry   = 5 * time.Minute
	lookupQueue = 256
	lookupQPS   = 10
	lookupBurst = 20
)

func newPeerNodes(client kubeapi.Interface, index *topology.Index, logger *slog.Logger, refresh time.Duration) *peerNodes {
	return &peerNodes{client: client, index: index, logger: logger, refresh: refresh,
		refs: map[string]int{}, podNode: map[string]string{}, known: map[string]time.Time{}, want: map[string]bool{},
		byAddr: map[netip.Addr]string{}, wake: make(chan struct{}, 1), settled: make(chan struct{}),
		endpoints: map[netip.Addr]*endpointLookup{}, podAsked: map[netip.Addr]time.Time{},
		lookups: make(chan addrLookup, lookupQueue), limit: flowcontrol.NewTokenBucketRateLimiter(lookupQPS, lookupBurst)}
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

// Miss asks for the node behind a tunnel endpoint the index does not
// hold, for an address behind it (topology.NodeReads): its host-network
// pods are looked up once per addrRetry; where none has the endpoint's
// address, the address's own pod, once per address per addrRetry, until
// one names the node. It never blocks.
func (p *peerNodes) Miss(endpoint, a netip.Addr) {
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	e := p.endpoints[endpoint]
	if e == nil {
		e = &endpointLookup{}
		p.endpoints[endpoint] = e
	}
	if e.busy {
		return
	}
	now := time.Now()
	if now.Sub(e.hostAsked) < addrRetry {
		// Its host-network pods were looked up lately: they named its
		// node (read soon), or none has its address and the address's
		// own pod may.
		if e.node != "" || a == endpoint {
			return
		}
		if t, ok := p.podAsked[a]; ok && now.Sub(t) < addrRetry {
			return
		}
	}
	select {
	case p.lookups <- addrLookup{endpoint, a}:
		e.busy = true
	default:
		p.Dropped.Add(1)
	}
}

// Pending reports whether the node behind a tunnel endpoint is being
// looked up, or was found and is not in the index yet (topology.NodeReads).
func (p *peerNodes) Pending(endpoint netip.Addr) bool {
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	e := p.endpoints[endpoint]
	return e != nil && (e.busy || e.node != "")
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
	list, err := kubeapi.ListNodes(ctx, p.client, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
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
		// later read, a refresh away; the tunnel endpoints resolved to
		// it wait no more.
		delete(p.known, name)
		p.index.DeleteNode(name)
		p.addrMu.Lock()
		for _, e := range p.endpoints {
			if e.node == name {
				e.node = ""
			}
		}
		p.addrMu.Unlock()
		return nil
	}
	p.known[name] = time.Now()
	n := NodeFrom(&list.Items[0])
	// A tunnel endpoint found to be this node's is one of its addresses
	// (usually its InternalIP already): every address behind it is
	// placed by it, without another lookup.
	for ep, node := range p.byAddr {
		if node == name && !slices.Contains(n.Addresses, ep) {
			n.Addresses = append(n.Addresses, ep)
		}
	}
	p.index.UpsertNode(n)
	return nil
}

// runLookups serves the lookups of an address's node, one at a time and
// at most lookupQPS a second, until ctx ends.
func (p *peerNodes) runLookups(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case l := <-p.lookups:
			p.lookup(ctx, l)
		}
	}
}

// lookup finds the node behind a tunnel endpoint: from a host-network pod
// with the endpoint's address (every node running Cilium runs its agent
// so, and its pod's address is usually the tunnel endpoint) when those
// were not looked up lately, else, or when none has it, from the pod
// with the address being placed (a node may run no host-network pod with
// its tunnel endpoint's address). The node found is held, and read.
func (p *peerNodes) lookup(ctx context.Context, l addrLookup) {
	now := time.Now()
	p.addrMu.Lock()
	e := p.endpoints[l.endpoint]
	host := now.Sub(e.hostAsked) >= addrRetry
	if host {
		e.hostAsked = now
	}
	p.addrMu.Unlock()
	node, result := "", &p.Unresolved
	defer func() {
		p.addrMu.Lock()
		e.busy = false
		if node != "" {
			e.node = node
		}
		p.addrMu.Unlock()
		if node != "" {
			p.resolve(l.endpoint, node)
		}
		result.Add(1)
	}()
	if host {
		sel := fields.AndSelectors(fields.OneTermEqualSelector("status.podIP", l.endpoint.String()), fields.OneTermEqualSelector("spec.hostNetwork", "true"))
		var err error
		if node, err = p.listPodNode(ctx, &p.EndpointReads, sel); err != nil {
			p.addrMu.Lock()
			e.hostAsked = time.Time{} // ask again at the next miss
			p.addrMu.Unlock()
			result = &p.Failed
			return
		}
		if node != "" {
			result = &p.Found
			return
		}
	}
	if l.addr == l.endpoint || !p.askPod(l.addr, now) {
		return
	}
	// A pod that finished keeps its address in its status, which a new
	// pod may have now.
	sel := fields.AndSelectors(fields.OneTermEqualSelector("status.podIP", l.addr.String()),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)), fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)))
	var err error
	node, err = p.listPodNode(ctx, &p.PodReads, sel)
	switch {
	case err != nil:
		p.addrMu.Lock()
		delete(p.podAsked, l.addr)
		p.addrMu.Unlock()
		result = &p.Failed
	case node != "":
		result = &p.Found
	default:
		p.logger.Debug("no pod has the address, nor a host-network pod its tunnel endpoint's: its node stays unknown", "address", l.addr, "tunnel_endpoint", l.endpoint)
	}
}

// askPod records that a's own pod is looked up now; false when it was
// lately. It forgets, at most every addrRetry, the addresses asked longer
// ago.
func (p *peerNodes) askPod(a netip.Addr, now time.Time) bool {
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	if t, ok := p.podAsked[a]; ok && now.Sub(t) < addrRetry {
		return false
	}
	if now.Sub(p.podSwept) >= addrRetry {
		p.podSwept = now
		for b, t := range p.podAsked {
			if now.Sub(t) >= addrRetry {
				delete(p.podAsked, b)
			}
		}
	}
	p.podAsked[a] = now
	return true
}

// listPodNode lists, after the rate limit, at most one pod of any namespace
// matching sel and returns its node ("" for none), counting the LIST in
// reads.
func (p *peerNodes) listPodNode(ctx context.Context, reads *atomic.Int64, sel fields.Selector) (string, error) {
	if err := p.limit.Wait(ctx); err != nil {
		return "", err
	}
	reads.Add(1)
	list, err := kubeapi.ListPods(ctx, p.client, metav1.NamespaceAll, metav1.ListOptions{FieldSelector: sel.String(), Limit: 1})
	if err != nil {
		if p.denied == nil || !p.denied.Note(schema.GroupResource{Resource: "pods"}, err) {
			p.logger.Warn("finding the node of an address", "selector", sel.String(), "err", err)
		}
		return "", err
	}
	for _, pod := range list.Items {
		if pod.Spec.NodeName != "" {
			return pod.Spec.NodeName, nil
		}
	}
	return "", nil
}

// resolve holds the node found behind a tunnel endpoint, and reads it
// again when it is in the index already without the endpoint among its
// addresses.
func (p *peerNodes) resolve(endpoint netip.Addr, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.byAddr[endpoint]
	if old == node {
		return
	}
	p.byAddr[endpoint] = node
	p.holdLocked(node)
	if old != "" {
		p.releaseLocked(old)
	}
	if _, ok := p.known[node]; ok {
		p.want[node] = true
		p.signal()
	}
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

// PeerNodeStats are the lean node view's reads (LISTs) and lookups.
type PeerNodeStats struct {
	// ByName are the LISTs of a node by name; ByEndpoint those of
	// host-network pods by a tunnel endpoint's address; ByPodAddress
	// those of pods by the address being placed.
	ByName, ByEndpoint, ByPodAddress int64
	// The lookups of an address's node, by what came of them: Found a
	// node, Unresolved (no host-network pod had the tunnel endpoint's
	// address and no pod the address), Failed (a LIST failed: asked again
	// at the next miss), Dropped (lookupQueue waiting: asked again at the
	// next miss).
	Found, Unresolved, Failed, Dropped int64
}

// ReadsPeerNodes reports whether the view reads only the nodes it needs
// (PeerNodes).
func (l *Live) ReadsPeerNodes() bool { return l.peers != nil }

// PeerNodeReads reports the lean node view's reads and lookups; zeros
// without PeerNodes.
func (l *Live) PeerNodeReads() PeerNodeStats {
	if l.peers == nil {
		return PeerNodeStats{}
	}
	p := l.peers
	return PeerNodeStats{ByName: p.Reads.Load(), ByEndpoint: p.EndpointReads.Load(), ByPodAddress: p.PodReads.Load(),
		Found: p.Found.Load(), Unresolved: p.Unresolved.Load(), Failed: p.Failed.Load(), Dropped: p.Dropped.Load()}
}
