package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/topology"
)

// Live feeds the index from a kube-apiserver: one node informer and, per
// job rule, one pod informer selecting pods that carry the rule's name
// label, so only job pods (not all 100k pods) are listed and watched.
// With WithOwners, metadata-only informers on the owner kinds
// (OwnerResources) resolve each pod's top owner.
type Live struct {
	index    *topology.Index
	rules    []topology.Rule
	logger   *slog.Logger
	resync   time.Duration
	synced   []cache.InformerSynced
	isSynced atomic.Bool

	pods []cache.SharedIndexInformer // by feed source
	meta metadata.Interface
	disc Discovery
	// mu orders a pod's upserts from its own informer and from owner
	// changes, so a pod deleted meanwhile is never put back.
	mu     sync.Mutex
	owners *ownerStore
	// denied makes a missing RBAC rule loud (Denials).
	denied *Denials

	// The per-node view (NewLocal), under mu: the job feeds by selector,
	// the job of each of the node's job pods (by namespace/name), the
	// node's jobs with their selectors, and the holders of each pod it put
	// in the index (by namespace/name).
	client   kubeapi.Interface
	strip    func(any) (any, error)
	feeds    map[jobSel]*jobFeed
	localJob map[string]jobID
	jobs     map[jobID]*jobGroup
	held     map[string][]holding
	nodePods cache.Indexer // the node's pod informer's
	stopped  bool          // Run's context is done: no new feed
	// The remote jobs listed on demand (remote.go), under mu: by the
	// selector of the identity that asked, the demands waiting for a
	// feed (with when a lookup last met them), and this second's starts.
	remote     map[jobSel]*remoteGroup
	pending    map[*topology.Demand]time.Time
	second     time.Time
	starts     int
	remoteMax  int
	remoteRate int
	remoteIdle time.Duration
	remoteStat RemoteStats
	// wants are the demands handed over by lookups (Want), under wantMu:
	// Want runs under the index's lock and must not wait for mu.
	wantMu sync.Mutex
	wants  []*topology.Demand
	wake   chan struct{}
	// peers is the lean node view (PeerNodes); nil: the node informer.
	peers *peerNodes
	// hook wraps every handler and job-feed list/watch call of the
	// per-node view; set by tests only (export_test.go), before Run.
	hook func(ev handlerEvent, call func())
}

// WithOwners makes Run resolve top owners (TrainJob over JobSet, RayJob
// over RayCluster) through metadata-only informers; kinds the server does
// not serve, or the exporter may not list, are skipped with a log line.
func (l *Live) WithOwners(meta metadata.Interface, disc Discovery) {
	l.meta, l.disc = meta, disc
}

// NewLive prepares informers; Run starts them.
func NewLive(client kubeapi.Interface, index *topology.Index, rules []topology.Rule, resync time.Duration, logger *slog.Logger) (*Live, kubeapi.Informers, error) {
	l := &Live{index: index, rules: rules, logger: logger, resync: resync, denied: NewDenials("kubernetes", logger)}
	var factories kubeapi.Informers

	nf, err := l.nodeInformer(client)
	if err != nil {
		return nil, nil, err
	}
	factories = append(factories, nf)

	strip := PodStripper(rules)
	for i, label := range topology.NameLabels(rules) {
		source := i
		pi := kubeapi.NewInformer(client, kubeapi.Pods, metav1.NamespaceAll, resync, func(o *metav1.ListOptions) { o.LabelSelector = label })
		if err := pi.SetTransform(strip); err != nil {
			return nil, nil, fmt.Errorf("pod informer transform: %w", err)
		}
		if err := l.denied.Watch(pi, schema.GroupResource{Resource: "pods"}); err != nil {
			return nil, nil, fmt.Errorf("pod informer error handler: %w", err)
		}
		if err := pi.AddIndexers(cache.Indexers{controllerIndex: podByController}); err != nil {
			return nil, nil, fmt.Errorf("pod informer index: %w", err)
		}
		reg, err := pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { l.pod(source, o) },
			UpdateFunc: func(_, o any) { l.pod(source, o) },
			DeleteFunc: func(o any) {
				if p, ok := tombstone(o).(*CachedPod); ok {
					l.mu.Lock()
					index.DeletePod(source, p.Namespace, p.Name)
					l.mu.Unlock()
				}
			},
		})
		if err != nil {
			return nil, nil, fmt.Errorf("pod informer handler: %w", err)
		}
		l.pods = append(l.pods, pi)
		l.synced = append(l.synced, reg.HasSynced)
		factories = append(factories, pi)
	}
	return l, factories, nil
}

// nodeInformer prepares the node informer: stripped nodes into the index.
func (l *Live) nodeInformer(client kubeapi.Interface) (cache.SharedIndexInformer, error) {
	ni := kubeapi.NewInformer(client, kubeapi.Nodes, "", l.resync, nil)
	if err := ni.SetTransform(StripNode); err != nil {
		return nil, fmt.Errorf("node informer transform: %w", err)
	}
	if err := l.denied.Watch(ni, schema.GroupResource{Resource: "nodes"}); err != nil {
		return nil, fmt.Errorf("node informer error handler: %w", err)
	}
	nodes, err := ni.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { l.node(o) },
		UpdateFunc: func(_, o any) { l.node(o) },
		DeleteFunc: func(o any) {
			if n, ok := tombstone(o).(*CachedNode); ok {
				l.index.DeleteNode(n.Name)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("node informer handler: %w", err)
	}
	// The handler's sync, not the informer's: the index holds every node
	// and pod of the first list only once the handlers have run.
	l.synced = append(l.synced, nodes.HasSynced)
	return ni, nil
}

// Run starts the informers and waits for their first sync (or ctx). The
// owner informers sync first, so that pods are named after their top
// owner from the start.
func (l *Live) Run(ctx context.Context, factories kubeapi.Informers) error {
	if l.meta != nil && l.disc != nil {
		owners, synced := startOwners(ctx, l.meta, l.disc, l.resync, l.logger, l.denied, l.ownerChanged)
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return fmt.Errorf("waiting for owner informers to sync: %w", ctx.Err())
		}
		l.mu.Lock()
		l.owners = owners
		l.mu.Unlock()
		// The per-node view names remote pods' jobs from their identities:
		// after their top owner too (a no-op for the cluster-wide view).
		l.index.SetRemoteOwners(owners)
		l.synced = append(l.synced, synced...)
		l.logger.Info("owner informers synced", "kinds", len(owners.stores))
	}
	go func() {
		<-ctx.Done()
		l.mu.Lock()
		defer l.mu.Unlock()
		l.stopped = true
		for _, f := range l.feeds {
			l.stopFeedLocked(f)
		}
	}()
	if l.remote != nil {
		go l.runRemote(ctx)
	}
	if l.peers != nil {
		go l.peers.run(ctx)
		go l.peers.runLookups(ctx)
	}
	factories.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), l.synced...) {
		return fmt.Errorf("waiting for node and pod informers to sync: %w", ctx.Err())
	}
	if err := l.waitFeeds(ctx); err != nil {
		return err
	}
	if l.peers != nil {
		if err := l.peers.wait(ctx); err != nil {
			return err
		}
	}
	l.isSynced.Store(true)
	n, p, j := l.index.Counts()
	l.logger.Info("kubernetes informers synced", "nodes", n, "job_pods", p, "jobs", j)
	return nil
}

// Up reports whether the informers have synced (zonewatch_source_up{source="kubernetes"}).
func (l *Live) Up() bool {
	if !l.isSynced.Load() {
		return false
	}
	for _, s := range l.synced {
		if !s() {
			return false
		}
	}
	return true
}

func (l *Live) node(o any) {
	n, ok := o.(*CachedNode)
	if !ok {
		return // informers only hand out what their transform made
	}
	l.index.UpsertNode(n.Node)
}

func (l *Live) pod(source int, o any) {
	p, ok := o.(*CachedPod)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.upsert(source, p)
}

func (l *Live) upsert(source int, p *CachedPod) {
	var owners topology.Owners
	if l.owners != nil {
		owners = l.owners
	}
	l.index.UpsertPod(source, p.Pod(l.rules, owners))
	if l.peers != nil { // the per-node view's lean node view: hold its node
		l.peers.pod(p.Namespace+"/"+p.Name, p.node)
	}
}

// ownerChanged identifies again the job pods below an owner object (key:
// objectKey) that came, went or changed its controller: the pods it
// controls and those of the owner objects below it (a JobSet's Jobs).
func (l *Live) ownerChanged(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owners == nil {
		return // the owner informers' first sync: no pod is identified yet
	}
	keys := l.owners.keysBelow(key)
	if l.held != nil { // the per-node view: what its handlers hold
		l.index.ForgetIdentities()
		below := make(map[string]bool, len(keys))
		for _, k := range keys {
			below[k] = true
		}
		l.reidentifyLocked(below)
		// A job's name and the owner objects below it may have changed:
		// so may the selectors of the node's jobs.
		l.regroupAllLocked()
		l.placeBelowLocked(keys)
		return
	}
	for _, k := range keys {
		for source, inf := range l.pods {
			objs, _ := inf.GetIndexer().ByIndex(controllerIndex, k)
			for _, o := range objs {
				if p, ok := o.(*CachedPod); ok {
					l.upsert(source, p)
				}
			}
		}
	}
}

func tombstone(o any) any {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return o
}
