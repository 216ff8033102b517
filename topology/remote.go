package topology

import (
	"net/netip"
	"sync"
)

// RemoteEntry is what the node's Cilium ipcache says of an address: the
// node it lives on (the tunnel endpoint, set in tunnel and native routing
// alike; unspecified for this node's own endpoints) and its security
// identity.
type RemoteEntry struct {
	NodeIP   netip.Addr
	Identity uint32
	Flags    uint8
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

// remoteView places, in the per-node view, the addresses that are no pod
// of a job the index holds: their node from the ipcache, their job (if
// any) from their identity's labels through the rules.
type remoteView struct {
	node  string // the exporter's own node: where unspecified NodeIPs are
	ipc   IPCache
	ids   Identities
	rules []Rule

	mu sync.Mutex
	// jobs are the jobs named by identities, one *Job per job for as long
	// as the index lives (consumers compare them by pointer), with the
	// identities that named them (JobExists).
	jobs   map[jobKey]*remoteJob
	byID   map[uint32]*remoteJob
	noJobs map[uint32]bool
}

type remoteJob struct {
	job Job
	ids map[uint32]bool
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
		jobs: map[jobKey]*remoteJob{}, byID: map[uint32]*remoteJob{}, noJobs: map[uint32]bool{}}
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
	if ent.NodeIP.IsValid() && !ent.NodeIP.IsUnspecified() {
		n = x.nodeIPs[ent.NodeIP.Unmap()]
	} else {
		n = x.nodes[r.node]
	}
	if n == nil {
		return Endpoint{}, false
	}
	e := Endpoint{Node: n.Name, Zone: n.zone, Region: n.Region}
	if j := x.identityJobLocked(ent.Identity); j != nil {
		e.Namespace, e.Job = j.Namespace, j // its role is not known here
	}
	return e, true
}

// identityJobLocked names the job of an identity: the index's own job
// when it holds it, else one kept for it here. Identities are cached: a
// security identity's labels never change.
func (x *Index) identityJobLocked(id uint32) *Job {
	r := x.remote
	if r.ids == nil || id == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rj := r.byID[id]
	if rj == nil {
		if r.noJobs[id] {
			return nil
		}
		ns, labels, ok := r.ids.Labels(id)
		if !ok {
			return nil
		}
		ident, ok := Identify(r.rules, PodMeta{Namespace: ns, Labels: labels}, nil)
		if !ok || ident.MinPods > 1 {
			// A rule with a minimum counts the job's pods, which an
			// identity does not tell.
			r.noJobs[id] = true
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
	for id := range rj.ids {
		if _, _, ok := r.ids.Labels(id); ok {
			return true
		}
	}
	return false
}
