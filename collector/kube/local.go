package kube

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	corev1 "k8s.io/api/core/v1"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/topology"
)

// sourceView is the index source of the per-node view: one for all its
// informers, since l.held decides when a pod leaves the index.
const sourceView = 0

// jobSel selects pods of one job: a label (a rule's, or the pod label of
// an owner kind) and its value, in the job's namespace. A job may have
// several (jobSelsLocked).
type jobSel struct{ namespace, label, value string }

// jobID names a job as the index does: its namespace and identity name.
type jobID struct{ namespace, name string }

// jobGroup is one job with pods on this node: its local pods, each with
// its own selector and kind, and the selectors whose feeds it holds.
type jobGroup struct {
	local map[string]localPod // by namespace/name
	sels  map[jobSel]bool
}

type localPod struct {
	sel  jobSel
	kind string
}

func (s jobSel) String() string { return s.namespace + "/" + s.label + "=" + s.value }

// jobFeed is the informer of one selector of a job's pods. It runs while
// the node has a pod of a job with that selector and, after the last one
// left, until no pod of the selector is left anywhere: what the index says
// of the job (its existence, with the counters of its flows here) stays
// what the cluster-wide view says.
type jobFeed struct {
	sel    jobSel
	inf    cache.SharedIndexInformer
	synced cache.InformerSynced
	stop   chan struct{}
	local  int // jobs of this node that select pods by it (jobGroup.sels)
	remote int // remote jobs that select pods by it (remoteGroup.sels)
	// lingering: a job of this node used it and left; it runs until the
	// job ends (no pod of its selector left), not only while in demand.
	lingering bool
	// held counts the pods this feed's handler put in the index and has
	// not yet seen go (l.held): the feed stops only at zero, so no
	// deletion it was handed is lost with it.
	held    int
	stopped bool
}

// holding is one holder's last version of a pod the per-node view put in
// the index: the node's pod informer's (by nil) or a job feed's. A pod is
// held by each informer that handed it over until that informer's handler
// sees it go (deleted, or out of its selector): a pod that moves from one
// job to another by its labels stays while either feed holds it.
type holding struct {
	by  *jobFeed
	pod *CachedPod
}

// NewLocal prepares the informers of the per-node view (DaemonSet mode):
// the node's own pods (field selector spec.nodeName, which the apiserver
// serves from its watch cache's index) and all pods of the jobs that have
// a pod there (one label-selected informer per job, started and stopped
// as the node's jobs come and go), besides the node informer. It keeps no
// cluster-wide pod list: the index places every other address through
// the node's Cilium state (topology.Index.SetRemote).
//
// With PeerNodes, it reads only the nodes it needs instead of watching
// every node (nodes.go).
func NewLocal(client kubeapi.Interface, index *topology.Index, rules []topology.Rule, node string, resync time.Duration, logger *slog.Logger, opts ...LocalOption) (*Live, kubeapi.Informers, error) {
	if node == "" {
		return nil, nil, fmt.Errorf("the per-node view needs the node's name")
	}
	l := &Live{index: index, rules: rules, logger: logger, resync: resync, denied: NewDenials("kubernetes", logger),
		client: client, feeds: map[jobSel]*jobFeed{}, localJob: map[string]jobID{}, jobs: map[jobID]*jobGroup{}, held: map[string][]holding{}, strip: PodStripper(rules),
		remote: map[jobSel]*remoteGroup{}, pending: map[*topology.Demand]time.Time{}, wake: make(chan struct{}, 1),
		remoteMax: MaxRemoteJobs, remoteRate: RemoteStartsPerSecond, remoteIdle: RemoteIdle}
	for _, o := range opts {
		o(l)
	}
	// A remote job an identity selects but cannot name (a RayJob's
	// submitter, an Indexed Job) is listed on demand (remote.go).
	index.SetRemoteFeeds(l)
	var factories kubeapi.Informers
	if l.peers == nil {
		nf, err := l.nodeInformer(client)
		if err != nil {
			return nil, nil, err
		}
		factories = append(factories, nf)
	} else {
		l.peers.mu.Lock()
		l.peers.holdLocked(node)
		l.peers.mu.Unlock()
		index.SetNodeReads(l.peers)
	}
	pi := kubeapi.NewInformer(client, kubeapi.Pods, metav1.NamespaceAll, resync, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	})
	if err := l.podInformer(pi); err != nil {
		return nil, nil, err
	}
	l.nodePods = pi.GetIndexer()
	reg, err := pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { l.around("", "add", o, func() { l.localPod(o) }) },
		UpdateFunc: func(_, o any) { l.around("", "update", o, func() { l.localPod(o) }) },
		DeleteFunc: func(o any) { l.around("", "delete", o, func() { l.localPodGone(o) }) },
	})
	if err != nil {
		return nil, nil, fmt.Errorf("pod informer handler: %w", err)
	}
	l.synced = append(l.synced, reg.HasSynced)
	return l, append(factories, pi), nil
}

// podInformer gives a pod informer the transform, the denial handler and
// the controller index every pod informer has.
func (l *Live) podInformer(pi cache.SharedIndexInformer) error {
	if err := pi.SetTransform(l.strip); err != nil {
		return fmt.Errorf("pod informer transform: %w", err)
	}
	if err := l.denied.Watch(pi, schema.GroupResource{Resource: "pods"}); err != nil {
		return fmt.Errorf("pod informer error handler: %w", err)
	}
	if err := pi.AddIndexers(cache.Indexers{controllerIndex: podByController}); err != nil {
		return fmt.Errorf("pod informer index: %w", err)
	}
	return nil
}

// selOf is the selector of the job a kept pod belongs to; false for a pod
// of no job. Identity reads the owners: a RayJob's submitter (KubeRay
// v1.6.0) is of a job only through its Job's owner.
func (l *Live) selOf(p *CachedPod) (jobSel, bool) {
	if p.Pod(l.rules, l.ownersLocked()).Identity.Name == "" {
		return jobSel{}, false
	}
	for _, r := range l.rules {
		for i := 0; i+1 < len(p.labels); i += 2 {
			if p.labels[i] == r.NameLabel && p.labels[i+1] != "" {
				return jobSel{p.Namespace, r.NameLabel, p.labels[i+1]}, true
			}
		}
	}
	return jobSel{}, false
}

func (l *Live) localPod(o any) {
	p, ok := o.(*CachedPod)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.localPodLocked(p)
}

func (l *Live) localPodLocked(p *CachedPod) {
	key := p.Namespace + "/" + p.Name
	sel, isJob := l.selOf(p)
	if !isJob && !l.holdsLocked(nil, key) {
		return // a pod of no job, as before: nothing for the index
	}
	// Held until deleted, also once it names no job (the index drops it
	// by this version: a feed's older one must not bring it back).
	l.putLocked(nil, p)
	l.placeLocalLocked(key, p, sel, isJob)
}

// placeLocalLocked makes a local pod count for the job its identity names
// (its top owner's, with owners), leaving the job it counted for before.
func (l *Live) placeLocalLocked(key string, p *CachedPod, sel jobSel, isJob bool) {
	var id jobID
	var kind string
	if isJob {
		ident := p.Pod(l.rules, l.ownersLocked()).Identity
		id, kind = jobID{p.Namespace, ident.Name}, ident.Kind
	}
	prev, had := l.localJob[key]
	if had && (!isJob || prev != id) {
		delete(l.localJob, key)
		l.leaveLocked(prev, key)
	}
	if isJob {
		l.localJob[key] = id
		g := l.jobs[id]
		if g == nil {
			g = &jobGroup{local: map[string]localPod{}, sels: map[jobSel]bool{}}
			l.jobs[id] = g
		}
		g.local[key] = localPod{sel, kind}
		l.regroupLocked(id, g)
	}
}

func (l *Live) localPodGone(o any) {
	p, ok := tombstone(o).(*CachedPod)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropLocked(nil, p.Namespace, p.Name)
	key := p.Namespace + "/" + p.Name
	if id, had := l.localJob[key]; had {
		delete(l.localJob, key)
		l.leaveLocked(id, key)
	}
}

func (l *Live) ownersLocked() topology.Owners {
	if l.owners == nil {
		return nil
	}
	return l.owners
}

// leaveLocked takes a local pod out of its job; the job's feeds are
// released with its last local pod.
func (l *Live) leaveLocked(id jobID, key string) {
	g := l.jobs[id]
	if g == nil {
		return
	}
	delete(g.local, key)
	if len(g.local) == 0 {
		delete(l.jobs, id)
		for s := range g.sels {
			l.releaseLocked(s, false)
		}
		return
	}
	l.regroupLocked(id, g)
}

// regroupLocked runs a feed for every selector of the job (jobSelsLocked)
// and releases those it no longer has: new feeds start before old ones are
// released, so a feed the job keeps is never restarted.
func (l *Live) regroupLocked(id jobID, g *jobGroup) {
	base := make(map[jobSel]string, len(g.local))
	for _, lp := range g.local {
		base[lp.sel] = lp.kind
	}
	l.resel(g.sels, l.jobSelsLocked(id, base), false)
}

// resel acquires the feeds of want that sels lacks and releases those of
// sels that want lacks, for a job of this node or (remote) a remote job.
func (l *Live) resel(sels, want map[jobSel]bool, remote bool) {
	for s := range want {
		if !sels[s] {
			sels[s] = true
			l.acquireLocked(s, remote)
		}
	}
	for s := range sels {
		if !want[s] {
			delete(sels, s)
			l.releaseLocked(s, remote)
		}
	}
}

// jobSelsLocked is every label selector under which a pod of the job may
// be found, so that the node holds all of the job's pods however they are
// labelled: base, each with the job's kind there (the rule label of each
// local pod, or the selector of a remote job's identity); the job's name under the
// other rules of its kind (a RayJob's submitter, ray.io/originated-from-cr-name,
// beside its cluster's ray.io/cluster); and, with owners, the pod label of
// each owner object below the job's top owner (the RayJob's RayCluster).
// Every node with a pod of the job derives the same set once its owners
// have synced.
func (l *Live) jobSelsLocked(id jobID, base map[jobSel]string) map[jobSel]bool {
	want := map[jobSel]bool{}
	kinds := map[string]bool{}
	for sel, kind := range base {
		want[sel] = true
		kinds[kind] = true
	}
	for _, r := range l.rules {
		if kinds[r.Kind] && r.GroupLabel == "" && !r.KindFromOwner {
			want[jobSel{id.namespace, r.NameLabel, id.name}] = true
		}
	}
	if l.owners != nil {
		for kind := range kinds {
			for _, b := range l.owners.podLabelsBelow(id.namespace, kind, id.name) {
				want[jobSel{id.namespace, b.label, b.value}] = true
			}
		}
	}
	return want
}

// placeBelowLocked places the node's pods whose controller is one of the
// owner objects (objectKey) that the node's pod informer holds but no job
// took yet: an owner that came after its pod may make it a job's (a
// RayJob's submitter Job).
func (l *Live) placeBelowLocked(keys []string) {
	if l.nodePods == nil {
		return
	}
	for _, k := range keys {
		objs, _ := l.nodePods.ByIndex(controllerIndex, k)
		for _, o := range objs {
			if p, ok := o.(*CachedPod); ok && !l.holdsLocked(nil, p.Namespace+"/"+p.Name) {
				l.localPodLocked(p)
			}
		}
	}
}

// regroupAllLocked places every local pod again after an owner changed:
// its job's name may have changed, and the selectors of every job.
func (l *Live) regroupAllLocked() {
	for key := range l.localJob {
		for _, h := range l.held[key] {
			if h.by == nil {
				sel, isJob := l.selOf(h.pod)
				l.placeLocalLocked(key, h.pod, sel, isJob)
			}
		}
	}
	for id, g := range l.jobs {
		l.regroupLocked(id, g)
	}
	for _, g := range l.remote {
		l.regroupRemoteLocked(g)
	}
}

// acquireLocked counts a job (of this node, or remote) using the feed of
// sel, starting the feed.
func (l *Live) acquireLocked(sel jobSel, remote bool) {
	if f := l.feeds[sel]; f != nil {
		if remote {
			f.remote++
		} else {
			f.local++
		}
		return
	}
	if l.stopped {
		return // Run's context is done
	}
	f, err := l.startFeedLocked(sel)
	if err != nil {
		l.logger.Error("starting a job's pod informer", "job", sel.String(), "err", err)
		return
	}
	if remote {
		f.remote = 1
	} else {
		f.local = 1
	}
	l.feeds[sel] = f
}

// releaseLocked lets a job go of the feed of sel. A feed that a job of
// this node used runs on until no pod of its selector is left (its job
// ended); one only remote jobs used stops with their demand, and what it
// put in the index leaves it (remote.go).
func (l *Live) releaseLocked(sel jobSel, remote bool) {
	f := l.feeds[sel]
	if f == nil {
		return
	}
	if remote {
		f.remote--
	} else if f.local--; f.local == 0 {
		f.lingering = true
	}
	if remote && f.remote == 0 && f.local == 0 && !f.lingering {
		l.stopFeedLocked(f)
		return
	}
	l.stopIdleLocked(f)
}

// stopIdleLocked stops a job's feed once the node has no pod of the job,
// the feed has synced, its handler has seen every pod it put in the index
// go, and its store holds no pod its handler is still to be handed (the
// job has no pod left anywhere). The handler's own count decides that
// stopping loses nothing: client-go removes an object from the store
// before the handler sees the deletion (with InOrderInformersBatchProcess,
// a whole batch before any handler runs), and a stopped feed's queued
// handlers never run; the store only keeps a feed running longer.
func (l *Live) stopIdleLocked(f *jobFeed) {
	if f.stopped || f.local > 0 || f.remote > 0 || f.held > 0 || !f.synced() || len(f.inf.GetStore().ListKeys()) > 0 {
		return
	}
	l.stopFeedLocked(f)
}

// stopFeedLocked stops a feed. What it still holds (only at Run's end:
// an idle feed holds nothing) leaves the index with it, so no deletion
// that arrives after the stop, or never, can leave a pod there.
func (l *Live) stopFeedLocked(f *jobFeed) {
	f.stopped = true
	close(f.stop)
	if l.feeds[f.sel] == f {
		delete(l.feeds, f.sel)
	}
	for _, hs := range l.held {
		if f.held == 0 {
			break
		}
		for _, h := range hs {
			if h.by == f {
				l.dropLocked(f, h.pod.Namespace, h.pod.Name)
				break
			}
		}
	}
}

// holdsLocked reports whether by (nil: the node's pod informer) holds the
// pod.
func (l *Live) holdsLocked(by *jobFeed, key string) bool {
	return slices.ContainsFunc(l.held[key], func(h holding) bool { return h.by == by })
}

// putLocked records by's version of a pod and puts it in the index,
// unless another holder handed over a newer one (each informer delivers
// in its own order).
func (l *Live) putLocked(by *jobFeed, p *CachedPod) {
	key := p.Namespace + "/" + p.Name
	hs := l.held[key]
	mine, newest := -1, true
	for i, h := range hs {
		if h.by == by {
			mine = i
		} else if newer(h.pod, p) {
			newest = false
		}
	}
	if mine < 0 {
		l.held[key] = append(hs, holding{by, p})
		if by != nil {
			by.held++
		}
	} else {
		hs[mine].pod = p
	}
	if newest {
		l.upsert(sourceView, p)
	}
}

// dropLocked lets go of by's hold on a pod: the pod leaves the index with
// its last holder; while another holds it, it stays as that holder's
// newest version has it.
func (l *Live) dropLocked(by *jobFeed, namespace, name string) {
	key := namespace + "/" + name
	hs := l.held[key]
	i := slices.IndexFunc(hs, func(h holding) bool { return h.by == by })
	if i < 0 {
		return
	}
	hs = slices.Delete(hs, i, i+1)
	if by != nil {
		by.held--
	}
	if len(hs) == 0 {
		delete(l.held, key)
		l.index.DeletePod(sourceView, namespace, name)
		if l.peers != nil {
			l.peers.pod(key, "")
		}
		return
	}
	l.held[key] = hs
	l.upsert(sourceView, newestOf(hs))
}

// newestOf is the latest version of a pod among its holders'.
func newestOf(hs []holding) *CachedPod {
	n := hs[0].pod
	for _, h := range hs[1:] {
		if newer(h.pod, n) {
			n = h.pod
		}
	}
	return n
}

// newer reports whether a is a later version of the pod than b (their
// resource versions compared as the apiserver's; false when either is not
// a comparable one).
func newer(a, b *CachedPod) bool {
	c, err := resourceversion.CompareResourceVersion(a.ResourceVersion, b.ResourceVersion)
	return err == nil && c > 0
}

// reidentifyLocked puts every held pod whose controller is one of the
// owner objects (objectKey) in the index again: its top owner changed.
func (l *Live) reidentifyLocked(owners map[string]bool) {
	for _, hs := range l.held {
		if p := newestOf(hs); p.ownerKey != "" && owners[p.ownerKey] {
			l.upsert(sourceView, p)
		}
	}
}

func (l *Live) startFeedLocked(sel jobSel) (*jobFeed, error) {
	selector := labels.SelectorFromSet(labels.Set{sel.label: sel.value}).String()
	inf := kubeapi.InformerFor(l.client, &corev1.Pod{}, l.resync,
		func(ctx context.Context, o metav1.ListOptions) (obj runtime.Object, err error) {
			o.LabelSelector = selector
			l.around(sel.String(), "list", nil, func() { obj, err = l.client.List(ctx, kubeapi.Pods, sel.namespace, o) })
			return obj, err
		},
		func(ctx context.Context, o metav1.ListOptions) (w watch.Interface, err error) {
			o.LabelSelector = selector
			l.around(sel.String(), "watch", nil, func() { w, err = l.client.Watch(ctx, kubeapi.Pods, sel.namespace, o) })
			return w, err
		})
	if err := l.podInformer(inf); err != nil {
		return nil, err
	}
	f := &jobFeed{sel: sel, inf: inf, stop: make(chan struct{})}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { l.around(sel.String(), "add", o, func() { l.feedPod(f, o) }) },
		UpdateFunc: func(_, o any) { l.around(sel.String(), "update", o, func() { l.feedPod(f, o) }) },
		DeleteFunc: func(o any) { l.around(sel.String(), "delete", o, func() { l.feedPodGone(f, o) }) },
	})
	if err != nil {
		return nil, fmt.Errorf("job pod informer handler: %w", err)
	}
	f.synced = reg.HasSynced
	go inf.Run(f.stop)
	go func() {
		// A feed whose node's pods all left before it synced is idle
		// once it has: nothing else would stop it.
		select {
		case <-reg.HasSyncedChecker().Done():
			l.mu.Lock()
			l.stopIdleLocked(f)
			l.mu.Unlock()
		case <-f.stop:
		}
	}()
	return f, nil
}

func (l *Live) feedPod(f *jobFeed, o any) {
	p, ok := o.(*CachedPod)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.stopped {
		return
	}
	l.putLocked(f, p)
}

func (l *Live) feedPodGone(f *jobFeed, o any) {
	p, ok := tombstone(o).(*CachedPod)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.stopped {
		return
	}
	l.dropLocked(f, p.Namespace, p.Name)
	l.stopIdleLocked(f)
}

// waitFeeds waits until every job feed started so far has synced (the
// node's pods have: their handlers started the feeds).
func (l *Live) waitFeeds(ctx context.Context) error {
	for {
		l.mu.Lock()
		var pending []cache.InformerSynced
		for _, f := range l.feeds {
			if !f.synced() {
				pending = append(pending, f.synced)
			}
		}
		l.mu.Unlock()
		if len(pending) == 0 {
			return nil
		}
		if !cache.WaitForCacheSync(ctx.Done(), pending...) {
			return fmt.Errorf("waiting for the node's job pod informers to sync: %w", ctx.Err())
		}
	}
}

// Feeds reports how many job pod informers the per-node view runs.
func (l *Live) Feeds() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.feeds)
}

// handlerEvent is one call of the per-node view into its informers: a
// handler of the node's pod informer (Feed "") or of a job feed (Feed: the
// job's selector), or a job feed's list or watch call (no pod).
type handlerEvent struct{ Feed, Op, Namespace, Name string }

// around runs one handler or list/watch call, through the test hook when
// one is set (export_test.go: the ghost tests hold and order handlers to
// open the windows between a store change and its handler).
func (l *Live) around(feed, op string, o any, call func()) {
	if l.hook == nil {
		call()
		return
	}
	ev := handlerEvent{Feed: feed, Op: op}
	if p, ok := tombstone(o).(*CachedPod); ok {
		ev.Namespace, ev.Name = p.Namespace, p.Name
	}
	l.hook(ev, call)
}
