package topology

import (
	"net/netip"
	"testing"
)

// fakeCilium is an ipcache and identity table as a node's agent holds
// them; tests set entries directly.
type fakeCilium struct {
	entries map[netip.Addr]RemoteEntry
	ids     map[uint32]map[string]string // identity -> labels (namespace "ml")
}

func (f *fakeCilium) Lookup(a netip.Addr) (RemoteEntry, bool) {
	e, ok := f.entries[a]
	if !ok {
		return RemoteEntry{Identity: 2}, true // the world prefix, 0.0.0.0/0
	}
	if e.Bits == 0 {
		e.Bits = 32
	}
	return e, ok
}

func (f *fakeCilium) Labels(id uint32) (string, map[string]string, bool) {
	l, ok := f.ids[id]
	return "ml", l, ok
}

// TestRemoteView: in the per-node view, an address that is no pod of a
// held job is placed by its ipcache entry's node (before the pod CIDRs,
// which a lean node view may lack), named by its identity's job; a local
// endpoint (no tunnel endpoint) is on this node; a job named by an
// identity exists while the identity does.
func TestRemoteView(t *testing.T) {
	x := testIndex()
	f := &fakeCilium{
		entries: map[netip.Addr]RemoteEntry{
			ip("10.244.2.9"):  {NodeIP: ip("172.18.1.10"), Identity: 70001},           // a pod of another job on n-b
			ip("10.244.2.10"): {NodeIP: ip("172.18.1.10"), Identity: 70002},           // a pod of no job on n-b
			ip("10.244.1.77"): {NodeIP: netip.IPv4Unspecified(), Identity: 2},         // this node's (n-a) pod of no job
			ip("10.246.0.1"):  {NodeIP: ip("172.18.1.10"), Identity: 70003},           // outside every pod CIDR, on n-b
			ip("10.247.0.1"):  {NodeIP: ip("192.0.2.1"), Identity: 70001},             // an unknown node: not placed by the ipcache
			ip("10.244.2.11"): {NodeIP: ip("172.18.1.10"), Identity: 70004},           // an Indexed Job's pod: minimum pods unknown
			ip("10.244.2.12"): {NodeIP: ip("172.18.1.10"), Identity: 70001, Bits: 24}, // tunnel mode's pod CIDR entry: the node alone
			ip("10.248.0.1"):  {Identity: 6},                                          // another node's address: which one is not said
			ip("10.248.0.2"):  {Identity: 1<<24 | 5},                                  // a CIDR identity
		},
		ids: map[uint32]map[string]string{
			70001: {"training.kubeflow.org/job-name": "gpt", "training.kubeflow.org/operator-name": "pytorchjob-controller"},
			70002: {"app": "web"},
			70003: {"volcano.sh/job-name": "sim"},
			70004: {"batch.kubernetes.io/job-name": "idx"},
		},
	}
	x.SetRemote("n-a", f, f, DefaultRules())
	for _, c := range []struct {
		ip              string
		ok              bool
		node, zone, job string
		pod             string
	}{
		{ip: "10.244.2.5", ok: true, node: "n-b", zone: "z-b", job: "bert", pod: "bert-master-0"}, // held: the index decides
		{ip: "10.244.2.9", ok: true, node: "n-b", zone: "z-b", job: "gpt"},
		{ip: "10.244.2.10", ok: true, node: "n-b", zone: "z-b"},
		{ip: "10.244.1.77", ok: true, node: "n-a", zone: "z-a"},
		{ip: "10.246.0.1", ok: true, node: "n-b", zone: "z-b", job: "sim"},
		{ip: "10.247.0.1", ok: false, zone: UnknownZone},
		{ip: "10.244.2.11", ok: true, node: "n-b", zone: "z-b"},
		{ip: "172.18.1.10", ok: true, node: "n-b", zone: "z-b"},
		{ip: "10.244.2.99", ok: true, node: "n-b", zone: "z-b"}, // the world prefix: the pod CIDR
		{ip: "10.244.2.12", ok: true, node: "n-b", zone: "z-b"},
		{ip: "10.248.0.1", ok: false, zone: UnknownZone},
		{ip: "10.248.0.2", ok: false, zone: UnknownZone},
		{ip: "8.8.8.8", ok: false, zone: UnknownZone},
	} {
		e, ok := x.LookupIP(ip(c.ip))
		job := ""
		if e.Job != nil {
			job = e.Job.Name
			if e.Namespace != "ml" || e.Job.Namespace != "ml" {
				t.Errorf("LookupIP(%s) = %+v: not in ml", c.ip, e)
			}
		}
		if ok != c.ok || e.Node != c.node || e.Zone != c.zone || job != c.job || e.Pod != c.pod {
			t.Errorf("LookupIP(%s) = %+v, %v", c.ip, e, ok)
		}
	}
	a, _ := x.LookupIP(ip("10.244.2.9"))
	b, _ := x.LookupIP(ip("10.247.0.1"))
	if b.Job != nil {
		t.Fatalf("unplaced address named a job: %+v", b)
	}
	if a2, _ := x.LookupIP(ip("10.244.2.9")); a2.Job != a.Job {
		t.Fatal("one job, two *Job")
	}
	if !x.JobExists("ml", "gpt") || x.JobExists("ml", "idx") {
		t.Fatal("JobExists of identity-named jobs")
	}
	delete(f.ids, 70001)
	if x.JobExists("ml", "gpt") {
		t.Fatal("a job whose identities are gone still exists")
	}
	allocs := testing.AllocsPerRun(1000, func() {
		x.LookupIP(ip("10.244.2.10"))
		x.LookupIP(ip("10.246.0.1"))
	})
	if allocs != 0 {
		t.Fatalf("remote lookups allocate: %v allocs per run", allocs)
	}
}

// kickingCilium counts the early reads the index asks for.
type kickingCilium struct {
	fakeCilium
	kicks int
}

func (k *kickingCilium) Kick() { k.kicks++ }

// TestNewLocalEndpointKicksTheIPCache: a job pod starting on this node
// asks the ipcache for an early read (its identity is written there
// seconds later; the default interval is 10 s); a pod on another node,
// and an index without an ipcache that can be kicked, ask nothing.
func TestNewLocalEndpointKicksTheIPCache(t *testing.T) {
	x := testIndex()
	k := &kickingCilium{fakeCilium: fakeCilium{entries: map[netip.Addr]RemoteEntry{}}}
	x.SetRemote("n-a", k, k, DefaultRules())
	pod := func(name, node string) Pod {
		return Pod{Namespace: "ml", Name: name, Node: node, IPs: []netip.Addr{ip("10.244.1.99")},
			Identity: Identity{Kind: "PyTorchJob", Name: "gpt", Role: RoleWorker}}
	}
	x.UpsertPod(0, pod("gpt-worker-1", "n-b"))
	if k.kicks != 0 {
		t.Fatalf("%d kicks for a remote pod", k.kicks)
	}
	x.UpsertPod(0, pod("gpt-worker-0", "n-a"))
	if k.kicks != 1 {
		t.Fatalf("%d kicks for a new local pod, want 1", k.kicks)
	}
	x.Kick()
	if k.kicks != 2 {
		t.Fatalf("Index.Kick: %d kicks, want 2", k.kicks)
	}
	plain := testIndex()
	plain.SetRemote("n-a", &fakeCilium{}, nil, DefaultRules())
	plain.UpsertPod(0, pod("gpt-worker-0", "n-a"))
	plain.Kick() // nothing to kick: no panic
	NewIndex().Kick()
}

// labelOwners is an owner table that also finds a RayCluster by its pods'
// ray.io/cluster label (collector/kube's owner informers do).
type labelOwners struct{ ownerMap }

func (o labelOwners) OwnerByLabels(_ string, labels map[string]string) (OwnerRef, bool) {
	ref := OwnerRef{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: labels["ray.io/cluster"]}
	_, ok := o.ownerMap[ref]
	return ref, ok
}

// TestRemoteViewNamesTopOwner: a remote Ray head's identity names the
// RayJob that controls its RayCluster once owners are known, as the
// head's own node names it; an owner that arrives later renames it after
// ForgetIdentities.
func TestRemoteViewNamesTopOwner(t *testing.T) {
	x := testIndex()
	f := &fakeCilium{
		entries: map[netip.Addr]RemoteEntry{ip("10.244.2.9"): {NodeIP: ip("172.18.1.10"), Identity: 70001}},
		ids:     map[uint32]map[string]string{70001: {"ray.io/cluster": "tune-x7k2p", "ray.io/node-type": "head"}},
	}
	x.SetRemote("n-a", f, f, DefaultRules())
	owners := labelOwners{ownerMap{}}
	x.SetRemoteOwners(owners)
	job := func() Job {
		e, _ := x.LookupIP(ip("10.244.2.9"))
		if e.Job == nil {
			return Job{}
		}
		return *e.Job
	}
	if j := job(); j != (Job{Namespace: "ml", Name: "tune-x7k2p", Kind: "RayCluster"}) {
		t.Errorf("before its owner: %+v, want the RayCluster", j)
	}
	owners.ownerMap[OwnerRef{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "tune-x7k2p"}] = OwnerRef{APIVersion: "ray.io/v1", Kind: "RayJob", Name: "tune"}
	if j := job(); j.Kind != "RayCluster" {
		t.Errorf("cached until forgotten: %+v", j)
	}
	x.ForgetIdentities()
	if j := job(); j != (Job{Namespace: "ml", Name: "tune", Kind: "RayJob"}) {
		t.Errorf("after its owner: %+v, want the RayJob", j)
	}
	if !x.JobExists("ml", "tune") {
		t.Error("the RayJob named by an identity does not exist")
	}
}

// wants records the demands handed to the feeder.
type wants struct{ got []*Demand }

func (w *wants) Want(d *Demand) { w.got = append(w.got, d) }

// TestRemoteViewAsksForJobsItCannotName: an identity that selects a job it
// cannot name (an Indexed Job's pod: no completion index; a RayJob's
// submitter: a minimum of pods) names none and hands the job's selector
// to the feeder once, with the job's name and kind as far as the identity
// tells; every lookup marks it used; once let go (Done) the next lookup
// asks again; an identity that names its job, or no job, asks nothing.
// Lookups stay free of allocations.
func TestRemoteViewAsksForJobsItCannotName(t *testing.T) {
	x := testIndex()
	f := &fakeCilium{
		entries: map[netip.Addr]RemoteEntry{
			ip("10.244.2.11"): {NodeIP: ip("172.18.1.10"), Identity: 70004},
			ip("10.244.2.12"): {NodeIP: ip("172.18.1.10"), Identity: 70005}, // another pod of the same Job
			ip("10.244.2.13"): {NodeIP: ip("172.18.1.10"), Identity: 70006},
			ip("10.244.2.9"):  {NodeIP: ip("172.18.1.10"), Identity: 70001},
			ip("10.244.2.10"): {NodeIP: ip("172.18.1.10"), Identity: 70002},
		},
		ids: map[uint32]map[string]string{
			70001: {"training.kubeflow.org/job-name": "gpt"},
			70002: {"app": "web"},
			70004: {"batch.kubernetes.io/job-name": "idx", "job-name": "idx"},
			70005: {"batch.kubernetes.io/job-name": "idx", "job-name": "idx", "team": "a"},
			70006: {"ray.io/originated-from-cr-name": "tune", "ray.io/originated-from-crd": "RayJob", "batch.kubernetes.io/job-name": "tune"},
		},
	}
	x.SetRemote("n-a", f, f, DefaultRules())
	w := &wants{}
	x.SetRemoteFeeds(w)
	for range 3 {
		for _, a := range []string{"10.244.2.11", "10.244.2.12", "10.244.2.13", "10.244.2.9", "10.244.2.10"} {
			e, _ := x.LookupIP(ip(a))
			if named := e.Job != nil; named != (a == "10.244.2.9") {
				t.Errorf("LookupIP(%s) = %+v", a, e)
			}
		}
	}
	if len(w.got) != 2 {
		t.Fatalf("%d demands, want 2 (one per job): %+v", len(w.got), w.got)
	}
	idx, tune := w.got[0], w.got[1]
	fields := func(d *Demand) [5]string { return [5]string{d.Namespace, d.Label, d.Value, d.Name, d.Kind} }
	if got := fields(idx); got != [5]string{"ml", "batch.kubernetes.io/job-name", "idx", "idx", "Job"} {
		t.Errorf("Indexed Job's demand %q", got)
	}
	if got := fields(tune); got != [5]string{"ml", "ray.io/originated-from-cr-name", "tune", "tune", "RayJob"} {
		t.Errorf("RayJob submitter's demand %q", got)
	}
	if !idx.TakeUsed() || idx.TakeUsed() {
		t.Error("TakeUsed: a lookup's use taken once")
	}
	x.LookupIP(ip("10.244.2.11"))
	if !idx.TakeUsed() || len(w.got) != 2 {
		t.Errorf("a lookup of a wanted demand: used, not asked again (%d demands)", len(w.got))
	}
	idx.Done()
	x.LookupIP(ip("10.244.2.12"))
	if len(w.got) != 3 || w.got[2] != idx {
		t.Errorf("after Done a lookup asks again: %d demands", len(w.got))
	}
	x.ForgetIdentities()
	x.LookupIP(ip("10.244.2.11"))
	if len(w.got) != 3 {
		t.Errorf("identities forgotten: the same demand, not asked again while wanted (%d demands)", len(w.got))
	}
	allocs := testing.AllocsPerRun(1000, func() {
		x.LookupIP(ip("10.244.2.11"))
		x.LookupIP(ip("10.244.2.13"))
	})
	if allocs != 0 {
		t.Fatalf("lookups of demanded jobs allocate: %v allocs per run", allocs)
	}
}

// nodeReads records the lean node view's misses and says which endpoints
// are being read.
type nodeReads struct {
	misses  [][2]netip.Addr
	pending map[netip.Addr]bool
}

func (r *nodeReads) Miss(endpoint, addr netip.Addr) {
	r.misses = append(r.misses, [2]netip.Addr{endpoint, addr})
	r.pending[endpoint] = true
}

func (r *nodeReads) Pending(endpoint netip.Addr) bool { return r.pending[endpoint] }

// TestRemoteNodeAddressRead: in the lean node view, a remote node's own
// address (identity remote-node or kube-apiserver, no tunnel endpoint, as
// Cilium v1.20.2's node manager writes a node's InternalIP without the host
// firewall or node encryption: pkg/node/manager/manager.go
// nodeAddressHasTunnelIP) of a node not held asks for the
// node behind that address itself, waits while it is read, and is placed
// once the node is held with it; a world address or a CIDR identity asks
// for nothing. Before, such an address stayed unknown until a pod of that
// node was held (TestPerNodeViewMatchesClusterWide, seed
// 1796594563442962710).
func TestRemoteNodeAddressRead(t *testing.T) {
	x := testIndex()
	f := &fakeCilium{entries: map[netip.Addr]RemoteEntry{
		ip("172.18.9.10"): {Identity: identityRemoteNode},
		ip("172.18.9.11"): {Identity: identityAPIServer},
		ip("10.248.0.2"):  {Identity: 1<<24 | 5}, // a CIDR identity
	}}
	x.SetRemote("n-a", f, f, DefaultRules())
	reads := &nodeReads{pending: map[netip.Addr]bool{}}
	x.SetNodeReads(reads)
	for _, a := range []string{"172.18.9.10", "172.18.9.11", "10.248.0.2", "10.249.0.1"} {
		if e, ok := x.LookupIP(ip(a)); ok {
			t.Errorf("%s placed before its node is read: %+v", a, e)
		}
	}
	want := [][2]netip.Addr{{ip("172.18.9.10"), ip("172.18.9.10")}, {ip("172.18.9.11"), ip("172.18.9.11")}}
	if len(reads.misses) != len(want) || reads.misses[0] != want[0] || reads.misses[1] != want[1] {
		t.Fatalf("misses %v, want %v (the node addresses themselves, nothing for world or CIDR identities)", reads.misses, want)
	}
	if !x.PlacementPending(ip("172.18.9.10")) || x.PlacementPending(ip("10.248.0.2")) {
		t.Errorf("pending: node address %v, CIDR identity %v; want true, false", x.PlacementPending(ip("172.18.9.10")), x.PlacementPending(ip("10.248.0.2")))
	}
	x.UpsertNode(Node{Name: "n-z", Zone: "z-z", Addresses: []netip.Addr{ip("172.18.9.10")}})
	if e, ok := x.LookupIP(ip("172.18.9.10")); !ok || e.Node != "n-z" || e.Zone != "z-z" {
		t.Errorf("the node address once its node is held: %+v %v, want n-z in z-z", e, ok)
	}
	if x.PlacementPending(ip("172.18.9.10")) {
		t.Errorf("still pending once its node is held")
	}
}
