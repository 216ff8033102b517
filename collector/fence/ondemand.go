package fence

import (
	"container/list"
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/zonewatch/zonewatch/collector/kube"
)

// IdentityReads bounds the on-demand CiliumIdentity reads of the per-node
// view (OnDemandIdentities): no informer lists every identity of the
// cluster; an identity is read by name (GET ciliumidentities/<id>) when a
// drop or a lookup names one not known here.
type IdentityReads struct {
	// Max is how many identities, known or known absent, are kept; the
	// least recently used one goes first.
	Max int
	// Refresh is the age after which a known identity is read again on
	// its next use (served meanwhile): a deleted one is then forgotten.
	Refresh time.Duration
	// NotFound is how long an identity the apiserver does not have is
	// not asked for again; Failed the same after any other failure.
	NotFound, Failed time.Duration
	// QPS and Burst limit the reads, so that a flood of unknown
	// identities cannot hammer the apiserver; Queue bounds the reads
	// waiting (beyond it an identity is asked again by its next use).
	QPS   float32
	Burst int
	Queue int
	// Timeout bounds one read.
	Timeout time.Duration
}

// DefaultIdentityReads are the exporter's bounds: 8,192 identities (a
// node's peers; about 1 KB each), known ones checked every 10 minutes,
// 20 reads a second at most.
var DefaultIdentityReads = IdentityReads{Max: 8192, Refresh: 10 * time.Minute, NotFound: time.Minute, Failed: 10 * time.Second,
	QPS: 20, Burst: 40, Queue: 256, Timeout: 5 * time.Second}

// Results of an identity read (zonewatch_fence_identity_reads_total).
const (
	ReadFound      = "found"      // read and parsed
	ReadNotFound   = "not_found"  // 404: kept as absent for NotFound
	ReadUnreadable = "unreadable" // read, does not parse: kept as absent
	ReadFailed     = "failed"     // any other error: asked again after Failed
	ReadDropped    = "dropped"    // the queue was full: asked again by the next use
)

// ReadResults are the values of the result label.
var ReadResults = []string{ReadFound, ReadNotFound, ReadUnreadable, ReadFailed, ReadDropped}

// identityReader holds the identities read on demand: a bounded LRU of
// entries, each known (labels), absent (404 or unreadable) or failed, and
// the queue of reads. Its lock is taken under the Set's (lookups come
// from the Set with its lock held); it never calls the Set while holding
// it.
type identityReader struct {
	client dynamic.Interface
	set    *Set
	cfg    IdentityReads
	m      *Metrics
	logger *slog.Logger
	denied atomic.Bool // a denial was logged at error level
	limit  flowcontrol.RateLimiter
	now    func() time.Time

	mu      sync.Mutex
	entries map[uint32]*list.Element // of *idEntry
	lru     *list.List               // front: most recently used
	known   int
	queue   chan uint32
}

type idEntry struct {
	id      uint32
	labels  Labels // nil: absent or failed
	until   time.Time
	pending bool // a read is queued or running
}

func newIdentityReader(client dynamic.Interface, set *Set, cfg IdentityReads, m *Metrics, logger *slog.Logger) *identityReader {
	return &identityReader{client: client, set: set, cfg: cfg, m: m, logger: logger,
		limit: flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst),
		now:   time.Now, entries: map[uint32]*list.Element{}, lru: list.New(), queue: make(chan uint32, cfg.Queue)}
}

// cluster reports whether id is a cluster-scope identity, the only ones
// that are CiliumIdentity objects: reserved ones are below 256, the
// node-local scopes (CIDR, FQDN, ingress) have a high byte.
func cluster(id uint32) bool { return id >= 256 && id&0xFF000000 == 0 }

// lookup gives an identity's labels when known, and asks for a read when
// it is not, or when it is due again. It never blocks.
func (r *identityReader) lookup(id uint32) (Labels, bool) {
	if !cluster(id) {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.touchLocked(id)
	if !e.pending && !r.now().Before(e.until) {
		r.askLocked(e)
	}
	return e.labels, e.labels != nil
}

// inFlight reports whether a read of id is queued or running.
func (r *identityReader) inFlight(id uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	el := r.entries[id]
	return el != nil && el.Value.(*idEntry).pending
}

// has reports whether an identity is known, without asking for an
// unknown one; a known one due again is read again (a deleted identity
// then leaves: the remote job it named ends).
func (r *identityReader) has(id uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	el := r.entries[id]
	if el == nil {
		return false
	}
	e := el.Value.(*idEntry)
	if e.labels != nil && !e.pending && !r.now().Before(e.until) {
		r.askLocked(e)
	}
	return e.labels != nil
}

// touchLocked returns id's entry, made most recently used, creating it
// (and evicting the least recently used beyond Max) if needed.
func (r *identityReader) touchLocked(id uint32) *idEntry {
	if el := r.entries[id]; el != nil {
		r.lru.MoveToFront(el)
		return el.Value.(*idEntry)
	}
	e := &idEntry{id: id}
	r.entries[id] = r.lru.PushFront(e)
	for r.lru.Len() > r.cfg.Max {
		old := r.lru.Remove(r.lru.Back()).(*idEntry)
		delete(r.entries, old.id)
		if old.labels != nil {
			r.known--
		}
	}
	r.m.IdentitiesCached.Set(float64(r.lru.Len()))
	return e
}

// askLocked queues a read of e's identity, or counts it dropped.
func (r *identityReader) askLocked(e *idEntry) {
	select {
	case r.queue <- e.id:
		e.pending = true
	default:
		r.m.IdentityReads.WithLabelValues(ReadDropped).Inc()
	}
}

// len returns the number of entries and of known identities.
func (r *identityReader) len() (entries, known int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lru.Len(), r.known
}

// run reads the queued identities with workers until ctx ends.
func (r *identityReader) run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-r.queue:
					if err := r.limit.Wait(ctx); err != nil {
						return
					}
					r.read(ctx, id)
				}
			}
		})
	}
	wg.Wait()
}

// read GETs one identity and records what came of it.
func (r *identityReader) read(ctx context.Context, id uint32) {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	u, err := r.client.Resource(IdentityResource).Get(rctx, strconv.FormatUint(uint64(id), 10), metav1.GetOptions{})
	cancel()
	var labels Labels
	result, wait := ReadFound, r.cfg.Refresh
	switch {
	case apierrors.IsNotFound(err):
		result, wait = ReadNotFound, r.cfg.NotFound
	case err != nil:
		if ctx.Err() != nil {
			return
		}
		result, wait = ReadFailed, r.cfg.Failed
		level := slog.LevelDebug
		if apierrors.IsForbidden(err) && r.denied.CompareAndSwap(false, true) {
			level = slog.LevelError
		}
		if apierrors.IsForbidden(err) {
			r.logger.Log(ctx, level, "permission denied: add the rule to zonewatch's ClusterRole (Helm chart: templates/clusterrole.yaml); remote jobs and default-deny drops are named again once granted",
				"starved_source", "fence", "verb", "get", "resource", kube.ResourceName(IdentityResource.GroupResource()),
				"rule", `{apiGroups: ["cilium.io"], resources: ["ciliumidentities"], verbs: ["get"]}`, "err", err)
		} else {
			r.logger.Debug("identity read failed: asked again later", "identity", id, "err", err)
		}
	default:
		var got uint32
		got, labels, err = IdentityFrom(u.Object)
		if err == nil && got != id {
			err = strconv.ErrRange
		}
		if err != nil {
			labels, result, wait = nil, ReadUnreadable, r.cfg.NotFound
			r.m.Skipped.WithLabelValues(IdentityResource.Resource).Inc()
			r.logger.Warn("identity object skipped: names no fence and no job", "identity", id, "err", err)
		}
	}
	r.m.IdentityReads.WithLabelValues(result).Inc()
	r.mu.Lock()
	e := r.touchLocked(id)
	was := e.labels != nil
	e.pending, e.until = false, r.now().Add(wait)
	if result != ReadFailed || labels != nil {
		e.labels = labels // a failed re-read keeps what was known
	}
	if e.labels != nil && !was {
		r.known++
	} else if e.labels == nil && was {
		r.known--
	}
	changed := was != (e.labels != nil)
	r.mu.Unlock()
	if changed {
		r.set.changed()
	}
}
