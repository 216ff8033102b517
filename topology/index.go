package topology

import (
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// UnknownZone is the zone of an endpoint the index cannot place.
const UnknownZone = "unknown"

// Locality values, computed here because PromQL cannot compare two labels.
const (
	LocalitySameZone    = "zone"
	LocalityCrossZone   = "cross_zone"
	LocalityCrossRegion = "cross_region"
	LocalityUnknown     = "unknown"
)

// Job identifies a training job. The index hands out one *Job per job, so
// its strings are shared, never copied per lookup.
type Job struct {
	Namespace string
	Name      string
	Kind      string
}

// Endpoint is what the index knows about one side of a connection.
type Endpoint struct {
	Namespace string // empty for a node or an unknown peer
	Pod       string
	Node      string // empty when unknown
	Zone      string // UnknownZone when unknown
	Region    string // empty when unknown
	Job       *Job   // nil unless the pod belongs to a training job
	Role      string // RoleCoordinator / RoleWorker for job pods
	// Service is set when the address was a Service's cluster IP: the
	// endpoint is then its one ready backend, or, with none or several
	// (Node empty), the Service alone (services.go).
	Service *ServiceName
}

// Known reports whether the index placed the endpoint on a node.
func (e Endpoint) Known() bool { return e.Node != "" }

// Locality compares the places of two endpoints.
func Locality(a, b Endpoint) string {
	if a.Zone == UnknownZone || b.Zone == UnknownZone {
		return LocalityUnknown
	}
	if a.Region != "" && b.Region != "" && a.Region != b.Region {
		return LocalityCrossRegion
	}
	if a.Zone != b.Zone {
		return LocalityCrossZone
	}
	return LocalitySameZone
}

// Node is the part of a Kubernetes node the index keeps.
type Node struct {
	Name      string
	Zone      string // empty when the node has no zone label
	Region    string
	Addresses []netip.Addr
	PodCIDRs  []netip.Prefix
}

// Pod is the part of a job pod the index keeps.
type Pod struct {
	Namespace string
	Name      string
	Node      string // empty until scheduled
	IPs       []netip.Addr
	Finished  bool // phase Succeeded or Failed
	// Terminating: the pod has a deletionTimestamp. The Job controller
	// starts its replacement at once (KEP-3939), so it is not placed.
	Terminating bool
	HostNetwork bool
	Identity    Identity
}

// Scheduled reports whether the pod counts for placement: bound to a node,
// not finished and not terminating.
func (p *Pod) Scheduled() bool { return p.Node != "" && !p.Finished && !p.Terminating }

// lingering reports whether a pod on a node is terminating and not
// finished: its endpoint, and the conntrack entries Cilium deletes with
// it, are still there, for as long as its grace period lets it run.
func (p *Pod) lingering() bool {
	return p.Node != "" && p.Terminating && !p.Finished && !p.HostNetwork
}

type podKey struct{ namespace, name string }
type jobKey struct{ namespace, name string }

type podRec struct {
	Pod
	job *jobRec
	// sources is a bit set of the feeds (informers) holding the pod; a pod
	// is removed when the last one lets go.
	sources uint64
}

type jobRec struct {
	Job
	pods map[podKey]*podRec
	// coordinators counts live pods that coordinate by name or label; while
	// there is one, rank-0 guesses are workers.
	coordinators int
	minPods      int // the largest MinPods of its pods
	// placement is the job's placement as last built (nil: stale). It is
	// dropped under the write lock whenever one of its pods or the zone of
	// a node it runs on changes, and rebuilt lazily under the read lock.
	placement atomic.Pointer[JobPlacement]
	// used: a lookup placed one of its pods since TakeJobUsed last
	// asked (the per-node view only: its remote jobs' feeds stop idle).
	used atomic.Bool
}

// explicitCoordinator reports whether the pod is a live coordinator by name or label.
func (p *Pod) explicitCoordinator() bool {
	return p.Identity.Role == RoleCoordinator && !p.Identity.Guess && !p.Finished && !p.Terminating
}

// role is the pod's role within its job: a rank-0 guess yields to a
// coordinator by name or label.
func (j *jobRec) role(p *podRec) string {
	if p.Identity.Guess && j.coordinators > 0 {
		return RoleWorker
	}
	return p.Identity.Role
}

// training reports whether the job has the pods its rule asks for.
func (j *jobRec) training() bool { return len(j.pods) >= j.minPods }

type nodeRec struct {
	Node
	zone string // Zone, or UnknownZone
}

// Index is the topology: nodes, job pods and the lookups that join flows,
// bytes and GPUs to jobs and zones. Safe for concurrent use; lookups do not
// allocate.
type Index struct {
	mu       sync.RWMutex
	nodes    map[string]*nodeRec
	nodeIPs  map[netip.Addr]*nodeRec
	cidrs    map[netip.Prefix]*nodeRec
	cidrBits []int // distinct prefix lengths in cidrs, longest first
	pods     map[podKey]*podRec
	podIPs   map[netip.Addr]*podRec
	jobs     map[jobKey]*jobRec
	// nodeJobs is the per-node view: for each node, the jobs with
	// scheduled pods there and how many. It makes Placements(node) cost
	// O(this node's jobs and their pods), whatever the cluster size.
	nodeJobs map[string]map[jobKey]int
	// departed logs the job pods that stopped counting for placement
	// (PodsGone).
	departed departures
	// terminating counts, per node, the job pods that are terminating
	// but still running (TerminatingPods); terminatingAll is their sum.
	terminating    map[string]int
	terminatingAll int

	// svc holds the Services' cluster IPs and ready backends (services.go).
	svc services

	generation atomic.Uint64

	// remote is set in the per-node view (SetRemote): addresses that are
	// no pod of a job held are placed through the node's ipcache.
	remote *remoteView
	// nodeReads (SetNodeReads) is told of tunnel endpoints of no node
	// held.
	nodeReads NodeReads
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{
		nodes:    map[string]*nodeRec{},
		nodeIPs:  map[netip.Addr]*nodeRec{},
		cidrs:    map[netip.Prefix]*nodeRec{},
		pods:     map[podKey]*podRec{},
		podIPs:   map[netip.Addr]*podRec{},
		jobs:     map[jobKey]*jobRec{},
		departed: departures{wake: make(chan struct{})},
		nodeJobs: map[string]map[jobKey]int{},

		terminating: map[string]int{},
	}
}

// Generation changes whenever the index changes; consumers use it to skip
// work when nothing moved.
func (x *Index) Generation() uint64 { return x.generation.Load() }

// UpsertNode adds or replaces a node. An update that changes nothing the
// index keeps (a node status heartbeat) is not a change: the generation
// stays.
func (x *Index) UpsertNode(n Node) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.nodes[n.Name]
	if old != nil && old.Zone == n.Zone && old.Region == n.Region &&
		slices.Equal(old.Addresses, n.Addresses) && slices.Equal(old.PodCIDRs, n.PodCIDRs) {
		return
	}
	if old == nil || old.Zone != n.Zone || old.Region != n.Region {
		x.invalidateNodeLocked(n.Name)
	}
	x.deleteNodeLocked(n.Name)
	rec := &nodeRec{Node: n, zone: n.Zone}
	if rec.zone == "" {
		rec.zone = UnknownZone
	}
	x.nodes[n.Name] = rec
	for _, a := range n.Addresses {
		x.nodeIPs[a.Unmap()] = rec
	}
	for _, p := range n.PodCIDRs {
		p = p.Masked()
		x.cidrs[p] = rec
		if !slices.Contains(x.cidrBits, p.Bits()) {
			x.cidrBits = append(x.cidrBits, p.Bits())
			sort.Sort(sort.Reverse(sort.IntSlice(x.cidrBits)))
		}
	}
	x.generation.Add(1)
}

// DeleteNode removes a node. Its pods stay (their zone becomes unknown)
// until their own deletion arrives.
func (x *Index) DeleteNode(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.invalidateNodeLocked(name)
	x.deleteNodeLocked(name)
	x.generation.Add(1)
}

// invalidateNodeLocked drops the cached placement of every job with a
// scheduled pod on the node (its zone is about to change).
func (x *Index) invalidateNodeLocked(name string) {
	for jk := range x.nodeJobs[name] {
		if j := x.jobs[jk]; j != nil {
			j.placement.Store(nil)
		}
	}
}

func (x *Index) deleteNodeLocked(name string) {
	old := x.nodes[name]
	if old == nil {
		return
	}
	delete(x.nodes, name)
	for _, a := range old.Addresses {
		if x.nodeIPs[a.Unmap()] == old {
			delete(x.nodeIPs, a.Unmap())
		}
	}
	for _, p := range old.PodCIDRs {
		if x.cidrs[p.Masked()] == old {
			delete(x.cidrs, p.Masked())
		}
	}
}

// UpsertPod adds or replaces a job pod seen by feed source (0..63). A pod
// whose labels no longer name a job is removed.
func (x *Index) UpsertPod(source int, p Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := podKey{p.Namespace, p.Name}
	sources := uint64(1) << source
	if old := x.pods[k]; old != nil {
		if samePod(&old.Pod, &p) {
			old.sources |= sources
			return
		}
		sources |= old.sources
		if old.Scheduled() && (p.Identity.Name == "" || !p.Scheduled() || p.Node != old.Node) {
			x.departLocked(old)
		}
		x.removePodLocked(old)
	}
	if p.Identity.Name == "" {
		x.generation.Add(1)
		return
	}
	rec := &podRec{Pod: p, sources: sources}
	x.pods[k] = rec
	if x.remote != nil && p.Node == x.remote.node {
		// A new endpoint here: the ipcache names its identity soon.
		x.remote.kick()
	}
	jk := jobKey{p.Namespace, p.Identity.Name}
	j := x.jobs[jk]
	switch {
	case j == nil:
		j = &jobRec{Job: Job{Namespace: p.Namespace, Name: p.Identity.Name, Kind: p.Identity.Kind}, pods: map[podKey]*podRec{}}
		x.jobs[jk] = j
	case j.Kind != p.Identity.Kind:
		// The kind became known (its owner arrived): a new record, since
		// consumers hold the old *Job without the lock.
		nj := &jobRec{Job: j.Job, pods: j.pods, coordinators: j.coordinators, minPods: j.minPods}
		nj.Kind = p.Identity.Kind
		for _, o := range nj.pods {
			o.job = nj
		}
		j = nj
		x.jobs[jk] = j
	}
	j.placement.Store(nil)
	j.pods[k] = rec
	rec.job = j
	if p.explicitCoordinator() {
		j.coordinators++
	}
	j.minPods = max(j.minPods, p.Identity.MinPods)
	if rec.Scheduled() {
		m := x.nodeJobs[p.Node]
		if m == nil {
			m = map[jobKey]int{}
			x.nodeJobs[p.Node] = m
		}
		m[jk]++
	}
	if !p.Finished && !p.HostNetwork {
		for _, a := range p.IPs {
			x.podIPs[a.Unmap()] = rec
		}
	}
	if p.lingering() {
		x.terminating[p.Node]++
		x.terminatingAll++
	}
	x.generation.Add(1)
}

// DeletePod lets go of a pod for one feed source; the pod leaves the index
// when no source holds it.
func (x *Index) DeletePod(source int, namespace, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	rec := x.pods[podKey{namespace, name}]
	if rec == nil {
		return
	}
	rec.sources &^= uint64(1) << source
	if rec.sources == 0 {
		if rec.Scheduled() {
			x.departLocked(rec)
		}
		x.removePodLocked(rec)
	}
	x.generation.Add(1)
}

func (x *Index) removePodLocked(rec *podRec) {
	k := podKey{rec.Namespace, rec.Name}
	delete(x.pods, k)
	if rec.lingering() {
		if x.terminating[rec.Node]--; x.terminating[rec.Node] <= 0 {
			delete(x.terminating, rec.Node)
		}
		x.terminatingAll--
	}
	for _, a := range rec.IPs {
		if x.podIPs[a.Unmap()] == rec {
			delete(x.podIPs, a.Unmap())
		}
	}
	if j := rec.job; j != nil {
		j.placement.Store(nil)
		if rec.Scheduled() {
			jk := jobKey{j.Namespace, j.Name}
			if m := x.nodeJobs[rec.Node]; m != nil {
				if m[jk]--; m[jk] <= 0 {
					delete(m, jk)
				}
				if len(m) == 0 {
					delete(x.nodeJobs, rec.Node)
				}
			}
		}
		delete(j.pods, k)
		if rec.explicitCoordinator() {
			j.coordinators--
		}
		if len(j.pods) == 0 {
			delete(x.jobs, jobKey{j.Namespace, j.Name})
		}
	}
}

// TerminatingPods returns how many job pods on node (on every node when
// node is empty) are terminating and not finished yet: pods whose
// endpoints may go at any moment of a grace period of any length.
func (x *Index) TerminatingPods(node string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if node == "" {
		return x.terminatingAll
	}
	return x.terminating[node]
}

// samePod reports whether an update changes nothing the index keeps.
func samePod(a, b *Pod) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.Node == b.Node &&
		a.Finished == b.Finished && a.Terminating == b.Terminating && a.HostNetwork == b.HostNetwork &&
		a.Identity == b.Identity && slices.Equal(a.IPs, b.IPs)
}

// LookupIP places an IP: a job pod, else a node address, else (in the
// per-node view, SetRemote) the ipcache's node and the identity's job,
// else a pod CIDR (a non-job peer on that node), else a Service's cluster
// IP (its one backend, or the Service alone), else unknown (false).
func (x *Index) LookupIP(a netip.Addr) (Endpoint, bool) {
	a = a.Unmap()
	x.mu.RLock()
	defer x.mu.RUnlock()
	if e, ok := x.lookupAddrLocked(a); ok {
		return e, true
	}
	return x.lookupServiceLocked(a)
}

// lookupAddrLocked places a pod, node or pod-CIDR address.
func (x *Index) lookupAddrLocked(a netip.Addr) (Endpoint, bool) {
	if rec := x.podIPs[a]; rec != nil {
		return x.podEndpointLocked(rec), true
	}
	if n := x.nodeIPs[a]; n != nil {
		return Endpoint{Node: n.Name, Zone: n.zone, Region: n.Region}, true
	}
	if x.remote != nil {
		if e, ok := x.remoteLocked(a); ok {
			return e, true
		}
	}
	for _, bits := range x.cidrBits {
		if bits > a.BitLen() {
			continue
		}
		p, err := a.Prefix(bits)
		if err != nil {
			continue
		}
		if n := x.cidrs[p]; n != nil {
			return Endpoint{Node: n.Name, Zone: n.zone, Region: n.Region}, true
		}
	}
	return Endpoint{Zone: UnknownZone}, false
}

// LookupPod places a job pod by name (the fallback when a flow's IP is not
// in the index, e.g. a pod whose IP the informer has not seen yet).
func (x *Index) LookupPod(namespace, name string) (Endpoint, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	rec := x.pods[podKey{namespace, name}]
	if rec == nil {
		return Endpoint{Zone: UnknownZone}, false
	}
	return x.podEndpointLocked(rec), true
}

// NodeZone returns a node's zone (UnknownZone if it has none) and region.
func (x *Index) NodeZone(name string) (zone, region string, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := x.nodes[name]
	if n == nil {
		return UnknownZone, "", false
	}
	return n.zone, n.Region, true
}

func (x *Index) podEndpointLocked(rec *podRec) Endpoint {
	e := Endpoint{Namespace: rec.Namespace, Pod: rec.Name, Node: rec.Node, Zone: UnknownZone}
	if j := rec.job; j != nil && j.training() {
		e.Job, e.Role = &j.Job, j.role(rec)
	}
	if j := rec.job; j != nil && x.remote != nil && !j.used.Load() {
		j.used.Store(true)
	}
	if n := x.nodes[rec.Node]; n != nil {
		e.Zone, e.Region = n.zone, n.Region
	}
	return e
}

// TakeJobUsed reports whether a lookup placed a pod of the job since the
// last call (per-node view only; false otherwise).
func (x *Index) TakeJobUsed(namespace, name string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	j := x.jobs[jobKey{namespace, name}]
	return j != nil && j.used.Swap(false)
}

// JobExists reports whether the job still has pods in the index.
func (x *Index) JobExists(namespace, name string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	jk := jobKey{namespace, name}
	return x.jobs[jk] != nil || x.remoteJobExistsLocked(jk)
}

// PodPlacement is one scheduled job pod.
type PodPlacement struct {
	Pod         string
	Role        string
	ReplicaType string
	Node        string
	Zone        string
}

// JobPlacement is where a job's scheduled pods run.
type JobPlacement struct {
	Job   Job
	Zones []string // distinct known zones of scheduled pods, sorted
	Pods  []PodPlacement
	// MultiZone is the LabelMultiZone value of its scheduled pods (the
	// greatest where they differ), "" when none has one.
	MultiZone string
	// Version is the index generation the placement was built at: two
	// placements of a job with the same Version are the same.
	Version uint64
}

// Split reports whether the job's scheduled pods span more than one zone.
func (j *JobPlacement) Split() bool { return len(j.Zones) > 1 }

// Placements returns every job with at least one scheduled pod on node
// (every job with a scheduled pod when node is empty), sorted by namespace
// and name. Pods lists all the job's scheduled pods cluster-wide. For one
// node it costs O(the jobs on that node and their pods): the per-node view
// is kept up to date by the upserts. Each job's placement is built once per
// change and shared: callers must not modify the slices; Version tells two
// builds apart.
func (x *Index) Placements(node string) []JobPlacement {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []JobPlacement
	add := func(j *jobRec) {
		if !j.training() {
			return
		}
		if jp := x.placementLocked(j); jp != nil {
			out = append(out, *jp)
		}
	}
	if node == "" {
		out = make([]JobPlacement, 0, len(x.jobs))
		for _, j := range x.jobs {
			add(j)
		}
	} else {
		for jk := range x.nodeJobs[node] {
			if j := x.jobs[jk]; j != nil {
				add(j)
			}
		}
	}
	slices.SortFunc(out, func(a, b JobPlacement) int {
		if a.Job.Namespace != b.Job.Namespace {
			return strings.Compare(a.Job.Namespace, b.Job.Namespace)
		}
		return strings.Compare(a.Job.Name, b.Job.Name)
	})
	return out
}

// placementLocked returns the job's cached placement, building it when
// stale; nil when the job has no scheduled pod. Concurrent readers may
// build it twice, with the same result.
func (x *Index) placementLocked(j *jobRec) *JobPlacement {
	if jp := j.placement.Load(); jp != nil {
		if len(jp.Pods) == 0 {
			return nil
		}
		return jp
	}
	jp := &JobPlacement{Job: j.Job, Version: x.generation.Load()}
	for _, p := range j.pods {
		if !p.Scheduled() {
			continue
		}
		zone := UnknownZone
		if n := x.nodes[p.Node]; n != nil {
			zone = n.zone
		}
		jp.Pods = append(jp.Pods, PodPlacement{Pod: p.Name, Role: j.role(p), ReplicaType: p.Identity.ReplicaType, Node: p.Node, Zone: zone})
		jp.MultiZone = max(jp.MultiZone, p.Identity.MultiZone)
		if zone != UnknownZone && !slices.Contains(jp.Zones, zone) {
			jp.Zones = append(jp.Zones, zone)
		}
	}
	sort.Strings(jp.Zones)
	slices.SortFunc(jp.Pods, func(a, b PodPlacement) int { return strings.Compare(a.Pod, b.Pod) })
	j.placement.Store(jp)
	if len(jp.Pods) == 0 {
		return nil
	}
	return jp
}

// NodeNames returns the names of the nodes held, sorted.
func (x *Index) NodeNames() []string {
	x.mu.RLock()
	names := make([]string, 0, len(x.nodes))
	for n := range x.nodes {
		names = append(names, n)
	}
	x.mu.RUnlock()
	slices.Sort(names)
	return names
}

// Counts returns the number of nodes, job pods and jobs held.
func (x *Index) Counts() (nodes, pods, jobs int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.nodes), len(x.pods), len(x.jobs)
}
