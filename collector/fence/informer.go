package fence

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
)

// The resources the informers watch: Cilium's (cilium.io/v2) and
// Kubernetes NetworkPolicies, which Cilium enforces too.
var (
	CNPResource      = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}
	CCNPResource     = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumclusterwidenetworkpolicies"}
	IdentityResource = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumidentities"}
	NetpolResource   = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}
	// ReadResources are what the fence's informers list and watch (the
	// chart's ClusterRole grants exactly these; deploy's tests check it);
	// with OnDemandIdentities, identities are read by name (get) instead.
	ReadResources = []schema.GroupVersionResource{CNPResource, CCNPResource, IdentityResource, NetpolResource}
	// GetResources are what the fence reads by name too: the per-node
	// view's identities (OnDemandIdentities); the ClusterRole grants get
	// on these alone.
	GetResources = []schema.GroupVersionResource{IdentityResource}
)

// cached is what an informer keeps of one object: its parsed policy or
// identity labels, never the object.
type cached struct {
	Namespace, Name, ResourceVersion string
	policy                           *Policy
	ref                              Ref // a policy's, parsed or not
	id                               uint32
	labels                           Labels
}

// GetObjectMeta gives the informer what it keys and orders by.
func (c *cached) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, ResourceVersion: c.ResourceVersion}
}

// Metrics count the objects the informers could not read.
type Metrics struct {
	Skipped *prometheus.CounterVec
	// IdentityReads counts the per-node view's on-demand identity reads
	// by result; IdentitiesCached is how many it holds (known or absent).
	IdentityReads    *prometheus.CounterVec
	IdentitiesCached prometheus.Gauge
}

// NewMetrics registers the fence metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_fence_objects_skipped_total",
			Help: "CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy, CiliumIdentity and NetworkPolicy objects zonewatch could not read (resource=ciliumnetworkpolicies|ciliumclusterwidenetworkpolicies|ciliumidentities|networkpolicies); they name no fence."},
			[]string{"resource"}),
		IdentityReads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_fence_identity_reads_total",
			Help: "CiliumIdentity reads by name of the per-node view (DaemonSet, --kube.pod-view=node), by result: found, not_found (kept as absent for a minute), unreadable (kept as absent), failed (asked again after 10 s), dropped (the read queue was full: asked again by the next use). The cluster-wide view lists every identity instead."},
			[]string{"result"}),
		IdentitiesCached: prometheus.NewGauge(prometheus.GaugeOpts{Name: "zonewatch_fence_identities_cached",
			Help: "CiliumIdentities the per-node view holds from its reads by name, known or known absent (at most 8192, least recently used first out); 0 in the cluster-wide view."}),
	}
	for _, r := range ReadResources {
		m.Skipped.WithLabelValues(r.Resource)
	}
	for _, r := range ReadResults {
		m.IdentityReads.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Skipped, m.IdentityReads, m.IdentitiesCached)
	}
	return m
}

// Live feeds a Set from four small informers: CiliumNetworkPolicies and
// Kubernetes NetworkPolicies of every namespace,
// CiliumClusterwideNetworkPolicies and CiliumIdentities, each kept as its parsed form (a policy's selectors, an identity's
// labels). With OnDemandIdentities the identities are read by name
// instead, as drops and lookups name them.
type Live struct {
	set    *Set
	client dynamic.Interface
	resync time.Duration
	infs   kubeapi.Informers
	synced []cache.InformerSynced
	m      *Metrics
	logger *slog.Logger
	reader *identityReader
}

// Option changes what Live reads.
type Option func(*options)

type options struct{ onDemand *IdentityReads }

// OnDemandIdentities runs no CiliumIdentity informer: an identity is read
// by name (GET ciliumidentities/<id>) when a drop or a lookup of the Set
// names one it does not know, within cfg's bounds. The per-node view's:
// its cost is its node's peers', not the cluster's.
func OnDemandIdentities(cfg IdentityReads) Option {
	return func(o *options) { o.onDemand = &cfg }
}

// readWorkers read identities at once (a slow apiserver's latency does not
// stall the others).
const readWorkers = 4

// NewLive prepares the informers; Run starts them.
func NewLive(client dynamic.Interface, set *Set, resync time.Duration, m *Metrics, logger *slog.Logger, opts ...Option) (*Live, error) {
	if m == nil {
		m = NewMetrics(nil)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	l := &Live{set: set, client: client, resync: resync, m: m, logger: logger}
	if o.onDemand != nil {
		l.reader = newIdentityReader(client, set, *o.onDemand, m, logger)
		set.setReader(l.reader)
	}
	denied := kube.NewDenials("fence", logger)
	for _, gvr := range ReadResources {
		if gvr == IdentityResource && l.reader != nil {
			continue
		}
		inf := l.informer(gvr)
		l.infs = append(l.infs, inf)
		if err := inf.SetTransform(l.transform(gvr)); err != nil {
			return nil, fmt.Errorf("%s informer transform: %w", gvr.Resource, err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(l.watchError(denied, gvr)); err != nil {
			return nil, fmt.Errorf("%s informer error handler: %w", gvr.Resource, err)
		}
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    l.upsert,
			UpdateFunc: func(_, o any) { l.upsert(o) },
			DeleteFunc: l.delete,
		})
		if err != nil {
			return nil, fmt.Errorf("%s informer handler: %w", gvr.Resource, err)
		}
		l.synced = append(l.synced, reg.HasSynced)
	}
	return l, nil
}

// informer lists and watches gvr in every namespace, as client-go's
// dynamic informer does (not its factory: that one brings every built-in
// group's informers into the binary, docs/performance.md).
func (l *Live) informer(gvr schema.GroupVersionResource) cache.SharedIndexInformer {
	r := l.client.Resource(gvr)
	return kubeapi.InformerFor(l.client, &unstructured.Unstructured{}, l.resync,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return r.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return r.Watch(ctx, o) })
}

// watchError handles a failed list or watch of gvr: an RBAC denial goes
// through the loud denial handling; a resource the apiserver does not
// serve (Cilium's CRDs not installed yet, or not Cilium) is said once per
// resource at warning level, then only at debug, while the informer keeps
// retrying with its backoff (client-go's handler logs it on every retry);
// anything else is client-go's.
func (l *Live) watchError(denied *kube.Denials, gvr schema.GroupVersionResource) cache.WatchErrorHandlerWithContext {
	var said atomic.Bool
	return func(ctx context.Context, r *cache.Reflector, err error) {
		switch {
		case denied.Note(gvr.GroupResource(), err):
		case apierrors.IsNotFound(err):
			level := slog.LevelDebug
			if said.CompareAndSwap(false, true) {
				level = slog.LevelWarn
			}
			l.logger.Log(ctx, level, "cilium resource not served (are Cilium's CRDs installed?): retrying; default-deny drops name no policy until it is",
				"resource", gvr.Resource+"."+gvr.Group, "version", gvr.Version)
		default:
			cache.DefaultWatchErrorHandler(ctx, r, err)
		}
	}
}

// Run starts the informers (and the identity reads) and returns once they
// have synced or ctx ends.
func (l *Live) Run(ctx context.Context) bool {
	if l.reader != nil {
		go l.reader.run(ctx, readWorkers)
	}
	l.infs.Start(ctx.Done())
	return cache.WaitForCacheSync(ctx.Done(), l.synced...)
}

// Synced reports whether every informer's first list has been handled.
func (l *Live) Synced() bool {
	for _, s := range l.synced {
		if !s() {
			return false
		}
	}
	return true
}

func (l *Live) transform(gvr schema.GroupVersionResource) cache.TransformFunc {
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil // a tombstone or an object already kept
		}
		c := &cached{Namespace: u.GetNamespace(), Name: u.GetName(), ResourceVersion: u.GetResourceVersion()}
		var err error
		switch gvr {
		case IdentityResource:
			c.id, c.labels, err = IdentityFrom(u.Object)
		case NetpolResource:
			c.policy, err = NetworkPolicyFrom(u.Object)
			c.ref = Ref{Namespace: c.Namespace, Name: c.Name, Kind: KindNetworkPolicy}
		default:
			c.policy, err = PolicyFrom(u.Object, gvr == CCNPResource)
			c.ref = Ref{Namespace: c.Namespace, Name: c.Name}
		}
		if err != nil {
			l.m.Skipped.WithLabelValues(gvr.Resource).Inc()
			l.logger.Warn("policy object skipped: names no fence", "resource", gvr.Resource, "namespace", c.Namespace, "name", c.Name, "err", err)
		}
		return c, nil
	}
}

// PolicyFrom parses a policy object as decoded JSON.
func PolicyFrom(obj map[string]any, clusterwide bool) (*Policy, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var o Object
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, err
	}
	if clusterwide {
		o.Kind = "CiliumClusterwideNetworkPolicy"
	}
	return o.Parse()
}

// NetworkPolicyFrom parses a Kubernetes NetworkPolicy as decoded JSON.
func NetworkPolicyFrom(obj map[string]any) (*Policy, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return ParseNetworkPolicy(b)
}

// IdentityFrom reads a CiliumIdentity: its name is the numeric identity,
// security-labels its labels ("k8s:app" -> value).
func IdentityFrom(obj map[string]any) (uint32, Labels, error) {
	md, _ := obj["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	id, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		return 0, nil, fmt.Errorf("identity name %q: not a number", name)
	}
	raw, ok := obj["security-labels"].(map[string]any)
	if !ok {
		return 0, nil, fmt.Errorf("identity %d: no security-labels", id)
	}
	m := make(map[string]string, len(raw))
	for k, v := range raw {
		s, ok := v.(string)
		if !ok {
			return 0, nil, fmt.Errorf("identity %d: label %q is not a string", id, k)
		}
		m[k] = s
	}
	return uint32(id), ParseLabels(m), nil
}

func (l *Live) upsert(o any) {
	c, ok := o.(*cached)
	if !ok {
		return
	}
	switch {
	case c.policy != nil:
		l.set.Put(c.policy)
	case c.ref.Name != "":
		l.set.Delete(c.ref) // an update that cannot be read: the old one is gone
	case c.labels != nil:
		l.set.PutIdentity(c.id, c.labels)
	}
}

func (l *Live) delete(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	c, ok := o.(*cached)
	if !ok {
		return
	}
	switch {
	case c.ref.Name != "":
		l.set.Delete(c.ref)
	case c.labels != nil:
		l.set.DeleteIdentity(c.id)
	}
}
