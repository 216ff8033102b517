package topology

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// RemoteEntry is what the node's Cilium ipcache says of an address
// (collector/ipcache's Entry): the node it lives on when that is another
// node (the tunnel endpoint, set in tunnel and native routing alike; the
// zero Addr for this node's endpoints, node addresses and world
// prefixes), its security identity, and the prefix length of the entry
// that matched (the address's own: 32 or 128).
type RemoteEntry struct {
	NodeIP   netip.Addr
	Identity uint32
	Flags    uint8
	Bits     uint8
}

// Reserved security identities the per-node view reads (Cilium's
// pkg/identity: world 2, 9 and 10; remote-node 6; kube-apiserver 7; the
// node-local scope of CIDR identities, 1<<24).
const (
	identityWorld      = 2
	identityRemoteNode = 6
	identityAPIServer  = 7
	identityWorldIPv4  = 9
	identityWorldIPv6  = 10
	identityLocalScope = 1 << 24
)

// localEndpoint reports whether an entry without a tunnel endpoint is an
// endpoint of this node: the address's own entry with an endpoint's
// identity (a pod's, the health or init endpoint's), not a node address
// (remote-node names no node) or a world or CIDR prefix.
func localEndpoint(a netip.Addr, e RemoteEntry) bool {
	if int(e.Bits) != a.BitLen() {
		return false
	}
	switch e.Identity {
	case 0, identityWorld, identityWorldIPv4, identityWorldIPv6, identityRemoteNode, identityAPIServer:
		return false
	}
	return e.Identity&0xFF000000 != identityLocalScope
}

// IPCache looks addresses up in the node's Cilium ipcache
// (collector/ipcache reads the BPF map).
type IPCache interface {
	Lookup(netip.Addr) (RemoteEntry, bool)
}

// Identities names a security identity: the namespace and pod labels
// Cilium derived it from (false for a reserved or unknown identity).
type Identities interface {
	Labels(id uint32) (namespace string, labels map[string]string, ok bool)
}

// LabelOwners resolves, for a pod known only by its labels (a security
// identity's: no owner reference), the owner object its labels name
// (ray.io/cluster=X: the RayCluster X) and that object's controllers, so
// that a remote pod's job is named as its own node names it (a RayJob's
// cluster after the RayJob, a JobSet after its TrainJob).
type LabelOwners interface {
	Owners
	OwnerByLabels(namespace string, labels map[string]string) (OwnerRef, bool)
}

// RemoteFeeds lists, on demand, the pods of a remote job that an identity
// selects but cannot name whole (collector/kube's per-node view): a rule
// with a minimum of pods (a RayJob's submitter, an Indexed Job) counts
// the job's pods, and Cilium's label filter drops the completion index.
// Want is called from lookups, under the index's lock: it must not block
// nor call into the index.
type RemoteFeeds interface {
	Want(d *Demand)
}

// Demand is a remote job an identity selects: the pods' selector (a
// rule's name label and its value, in the identity's namespace) and the
// job's name and kind as far as the identity tells them. The index keeps
// one per selector for its life; the lookups that meet it mark it used.
type Demand struct {
	Namespace, Label, Value string
	Name, Kind              string

	used   atomic.Bool // looked up since the feeder last took it
	wanted atomic.Bool // handed to RemoteFeeds.Want, not yet let go (Done)
}

// TakeUsed reports whether a lookup met the demand since the last call.
func (d *Demand) TakeUsed() bool { return d.used.Swap(false) }

// Done lets the demand go: its feed stopped or never started; the next
// lookup that meets it asks again.
func (d *Demand) Done() { d.wanted.Store(false) }

// touch marks the demand used and, unless it is wanted already, hands it
// to the feeder. It does not allocate.
func (d *Demand) touch(f RemoteFeeds) {
	if !d.used.Load() {
		d.used.Store(true)
	}
	if f != nil && !d.wanted.Load() && d.wanted.CompareAndSwap(false, true) {
		f.Want(d)
	}
}

// remoteView places, in the per-node view, the addresses that are no pod
// of a job the index holds: their node from the ipcache, their job (if
// any) from their identity's labels through the rules.
type remoteView struct {
	node  string // the exporter's own node: where unspecified NodeIPs are
	ipc   IPCache
	ids   Identities
	rules []Rule
	// owners (nil for none) names identities' jobs after their top owner.
	owners LabelOwners
	// feeds (nil for none) lists the pods of the jobs that identities
	// select but cannot name (SetRemoteFeeds).
	feeds RemoteFeeds

	mu sync.Mutex
	// jobs are the jobs named by identities, one *Job per job for as long
	// as the index lives (consumers compare them by pointer), with the
	// identities that named them (JobExists).
	jobs map[jobKey]*remoteJob
	byID map[uint32]*remoteJob
	// noJobs are the identities that name no job, with the demand of
	// the job they select (nil for none).
	noJobs  map[uint32]*Demand
	demands map[jobSelector]*Demand
}

type jobSelector struct{ namespace, label, value string }

type remoteJob struct {
	job Job
	ids map[uint32]bool
}

// Kick asks the node's ipcache for an early refresh, when it can be asked
// (collector/ipcache's Reader can): an address it does not place yet, a
// new endpoint on this node. It never blocks.
func (x *Index) Kick() {
	x.mu.RLock()
	r := x.remote
	x.mu.RUnlock()
	if r != nil {
		r.kick()
	}
}

func (r *remoteView) kick() {
	if k, ok := r.ipc.(interface{ Kick() }); ok {
		k.Kick()
	}
}

// SetRemote makes the index a per-node view (DaemonSet mode): it holds
// the pods of node's jobs, and places every other address through the
// node's ipcache (its node and zone by the node's address) and, with ids,
// names a remote pod's job from its identity. Call it before the index is
// used.
func (x *Index) SetRemote(node string, ipc IPCache, ids Identities, rules []Rule) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.remote = &remoteView{node: node, ipc: ipc, ids: ids, rules: rules,
		jobs: map[jobKey]*remoteJob{}, byID: map[uint32]*remoteJob{}, noJobs: map[uint32]*Demand{}, demands: map[jobSelector]*Demand{}}
}

// SetRemoteFeeds makes the per-node view ask f for the pods of a remote
// job that an identity selects but cannot name (a rule's minimum of pods,
// an Indexed Job's completion index): once f has put them in the index,
// the job is what the cluster-wide view says. Call it before flows are
// classified; a no-op without SetRemote.
func (x *Index) SetRemoteFeeds(f RemoteFeeds) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.remote == nil {
		return
	}
	x.remote.mu.Lock()
	defer x.remote.mu.Unlock()
	x.remote.feeds = f
}

// NodeReads finds, on demand, the nodes a per-node view that reads only
// the nodes it needs does not hold (collector/kube PeerNodes). The index
// calls it under its lock: it must not block nor call into the index.
type NodeReads interface {
	// Miss asks for the node behind endpoint, the tunnel endpoint the
	// ipcache names for addr, which no node held has.
	Miss(endpoint, addr netip.Addr)
	// Pending reports whether the node behind endpoint is being looked
	// up or read: an address behind it is placed once that is done.
	Pending(endpoint netip.Addr) bool
}

// SetNodeReads makes the index ask r for the node behind a tunnel
// endpoint the ipcache names and the index does not hold. Call it before
// the index is used.
func (x *Index) SetNodeReads(r NodeReads) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.nodeReads = r
}

// PlacementPending reports whether placing a waits on a read of its
// node: the ipcache names a tunnel endpoint for it that no node held has,
// and the node behind it is being looked up or read (SetNodeReads). A
// flow to such an address is worth holding for a moment: counted now, it
// would count to an unknown zone.
func (x *Index) PlacementPending(a netip.Addr) bool {
	a = a.Unmap()
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.remote == nil || x.nodeReads == nil {
		return false
	}
	ent, ok := x.remote.ipc.Lookup(a)
	if !ok {
		return false
	}
	ep, ok := nodeEndpoint(a, ent)
	return ok && x.nodeIPs[ep] == nil && x.nodeReads.Pending(ep)
}

// nodeEndpoint is the address through which the node behind a's ipcache
// entry is found: the tunnel endpoint the entry names or, for an address
// the entry says is a remote node's own (identity remote-node or
// kube-apiserver, no tunnel endpoint: Cilium v1.20.2's node manager gives
// a node's InternalIP one only with the host firewall or node encryption,
// pkg/node/manager/manager.go nodeAddressHasTunnelIP), the address itself
// (its node's host-network pods have it).
func nodeEndpoint(a netip.Addr, ent RemoteEntry) (netip.Addr, bool) {
	if ent.NodeIP.IsValid() && !ent.NodeIP.IsUnspecified() {
		return ent.NodeIP.Unmap(), true
	}
	if int(ent.Bits) == a.BitLen() && (ent.Identity == identityRemoteNode || ent.Identity == identityAPIServer) {
		return a, true
	}
	return netip.Addr{}, false
}

// SetRemoteOwners makes the per-node view name a remote pod's job after
// its top owner (the kube feed's owner informers), as the pods' own nodes
// do. Call it before flows are classified; a no-op without SetRemote.
func (x *Index) SetRemoteOwners(o LabelOwners) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.remote == nil {
		return
	}
	x.remote.mu.Lock()
	defer x.remote.mu.Unlock()
	x.remote.owners = o
	x.remote.forgetLocked()
}

// ForgetIdentities drops what the per-node view concluded from
// identities: an owner object came, went or changed its controller, so an
// identity may name another job now. The jobs stay (consumers hold them).
func (x *Index) ForgetIdentities() {
	x.mu.RLock()
	r := x.remote
	x.mu.RUnlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgetLocked()
}

func (r *remoteView) forgetLocked() {
	clear(r.byID)
	clear(r.noJobs)
	for _, rj := range r.jobs {
		clear(rj.ids)
	}
}

// remoteLocked places a through the ipcache; false when it has no entry
// or names a node the index does not know.
func (x *Index) remoteLocked(a netip.Addr) (Endpoint, bool) {
	r := x.remote
	ent, ok := r.ipc.Lookup(a)
	if !ok {
		return Endpoint{}, false
	}
	var n *nodeRec
	if ep, ok := nodeEndpoint(a, ent); ok {
		n = x.nodeIPs[ep]
		if n == nil && x.nodeReads != nil {
			x.nodeReads.Miss(ep, a)
		}
	} else if localEndpoint(a, ent) {
		n = x.nodes[r.node]
	}
	if n == nil {
		return Endpoint{}, false
	}
	e := Endpoint{Node: n.Name, Zone: n.zone, Region: n.Region}
	// Only an endpoint's own entry names its identity's job (a pod CIDR
	// entry of tunnel mode names the node alone).
	if int(ent.Bits) != a.BitLen() {
		return e, true
	}
	if j := x.identityJobLocked(ent.Identity); j != nil {
		e.Namespace, e.Job = j.Namespace, j // its role is not known here
	}
	return e, true
}

// identityJobLocked names the job of an identity: the index's own job
// when it holds it, else one kept for it here. Identities are cached: a
// security identity's labels never change (what owners make of them may:
// ForgetIdentities).
func (x *Index) identityJobLocked(id uint32) *Job {
	r := x.remote
	if r.ids == nil || id == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rj := r.byID[id]
	if rj == nil {
		if d, no := r.noJobs[id]; no {
			if d != nil {
				d.touch(r.feeds)
			}
			return nil
		}
		ns, labels, ok := r.ids.Labels(id)
		if !ok {
			return nil
		}
		meta := PodMeta{Namespace: ns, Labels: labels}
		var owners Owners
		if r.owners != nil {
			owners = r.owners
			if o, ok := r.owners.OwnerByLabels(ns, labels); ok {
				meta.Owner = &o
			}
		}
		ident, ok := Identify(r.rules, meta, owners)
		if !ok || ident.MinPods > 1 {
			// A rule with a minimum counts the job's pods, which an
			// identity does not tell, nor an Indexed Job's completion
			// index: the job's own pods do (RemoteFeeds).
			d := r.demandLocked(ns, labels, ident, ok)
			r.noJobs[id] = d
			if d != nil {
				d.touch(r.feeds)
			}
			return nil
		}
		jk := jobKey{ns, ident.Name}
		rj = r.jobs[jk]
		if rj == nil {
			rj = &remoteJob{job: Job{Namespace: ns, Name: ident.Name, Kind: ident.Kind}, ids: map[uint32]bool{}}
			r.jobs[jk] = rj
		}
		rj.ids[id] = true
		r.byID[id] = rj
	}
	if j := x.jobs[jobKey{rj.job.Namespace, rj.job.Name}]; j != nil {
		return &j.Job
	}
	return &rj.job
}

// demandLocked is the demand of the job an identity's labels select
// under the first rule whose name label they carry (the rule Identify
// reads); nil for labels of no rule.
func (r *remoteView) demandLocked(ns string, labels map[string]string, ident Identity, named bool) *Demand {
	for i := range r.rules {
		rule := &r.rules[i]
		v := labels[rule.NameLabel]
		if v == "" {
			continue
		}
		sel := jobSelector{ns, rule.NameLabel, v}
		d := r.demands[sel]
		if d == nil {
			d = &Demand{Namespace: ns, Label: rule.NameLabel, Value: v, Name: v, Kind: rule.Kind}
			if named {
				d.Name, d.Kind = ident.Name, ident.Kind
			}
			r.demands[sel] = d
		}
		return d
	}
	return nil
}

// remoteJobExistsLocked reports whether a job named by identities still
// has one that the cluster knows.
func (x *Index) remoteJobExistsLocked(jk jobKey) bool {
	r := x.remote
	if r == nil || r.ids == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rj := r.jobs[jk]
	if rj == nil {
		return false
	}
	known := func(id uint32) bool { _, _, ok := r.ids.Labels(id); return ok }
	if h, ok := r.ids.(interface{ HasIdentity(uint32) bool }); ok {
		known = h.HasIdentity // without building the labels
	}
	for id := range rj.ids {
		if known(id) {
			return true
		}
	}
	return false
}
