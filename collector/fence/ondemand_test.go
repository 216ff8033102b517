package fence

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// gets counts a client's GETs of single CiliumIdentities, by name.
type gets struct {
	mu sync.Mutex
	n  map[string]int
}

func (g *gets) wrap(rt http.RoundTripper) http.RoundTripper {
	return rtFunc(func(req *http.Request) (*http.Response, error) {
		if name, ok := strings.CutPrefix(req.URL.Path, "/apis/cilium.io/v2/ciliumidentities/"); ok && req.Method == http.MethodGet {
			g.mu.Lock()
			g.n[name]++
			g.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

func (g *gets) of(id uint32) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n[fmt.Sprint(id)]
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// onDemand starts a Live that reads identities by name with cfg, its
// requests counted; sync: wait for the policy informers.
func onDemand(t *testing.T, ctx context.Context, base *rest.Config, cfg IdentityReads, sync bool) (*Set, *Metrics, *gets) {
	t.Helper()
	g := &gets{n: map[string]int{}}
	c := rest.CopyConfig(base)
	c.WrapTransport = g.wrap
	c.QPS, c.Burst = 1000, 1000 // the reader's own limit is under test
	set, m := NewSet(), NewMetrics(nil)
	l, err := NewLive(dynamic.NewForConfigOrDie(c), set, 0, m, slog.New(slog.DiscardHandler), OnDemandIdentities(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if !sync {
		go l.Run(ctx) // the policy informers retry meanwhile
		return set, m, g
	}
	if !l.Run(ctx) {
		t.Fatal("not synced")
	}
	return set, m, g
}

// reads is the number of identity reads done (every result but dropped).
func reads(m *Metrics) float64 {
	var n float64
	for _, r := range []string{ReadFound, ReadNotFound, ReadUnreadable, ReadFailed} {
		n += testutil.ToFloat64(m.IdentityReads.WithLabelValues(r))
	}
	return n
}

func waitReads(t *testing.T, ctx context.Context, m *Metrics, n float64) {
	t.Helper()
	for reads(m) < n {
		if ctx.Err() != nil {
			t.Fatalf("%g identity reads done, want %g", reads(m), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIdentityReadsBounded: the per-node view's identity reads, on the
// real kube-apiserver. The cache holds at most Max identities (the least
// recently used leaves, and is read again when named again); a flood of
// unknown identities beyond the queue is counted dropped, not sent, and
// asked again by its next use; a deleted identity is forgotten once due
// for a refresh; an unreachable apiserver is counted failed and not asked
// again before its backoff, and nothing stops.
func TestIdentityReadsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := testenv.StartAPIServer(t)
	dir := filepath.Join(testenv.ToolsBin(t, "cilium"), "cilium", "crds")
	var files []string
	for _, name := range []string{"ciliumnetworkpolicies", "ciliumclusterwidenetworkpolicies", "ciliumidentities"} {
		files = append(files, filepath.Join(dir, name+".yaml"))
	}
	admin := dynamic.NewForConfigOrDie(api.Config)
	if err := testenv.InstallCRDs(ctx, admin, files...); err != nil {
		t.Fatal(err)
	}
	for id := 1000; id < 1010; id++ {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
			"metadata":        map[string]any{"name": fmt.Sprint(id)},
			"security-labels": map[string]any{"k8s:io.kubernetes.pod.namespace": "ml", "k8s:app": fmt.Sprint("a", id)}}}
		if _, err := admin.Resource(IdentityResource).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	long := IdentityReads{Max: 4, Refresh: time.Hour, NotFound: time.Hour, Failed: time.Hour, QPS: 1000, Burst: 1000, Queue: 64, Timeout: 10 * time.Second}

	t.Run("bound", func(t *testing.T) {
		set, m, g := onDemand(t, ctx, api.Config, long, true)
		// 1000..1009 exist, 1010 and 1011 do not: each named in turn.
		for i, id := range []uint32{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011} {
			set.Labels(id)
			waitReads(t, ctx, m, float64(i+1))
			if n, _ := set.reader.len(); n > long.Max {
				t.Fatalf("%d identities cached, bound %d", n, long.Max)
			}
		}
		if v := testutil.ToFloat64(m.IdentitiesCached); v != float64(long.Max) {
			t.Errorf("zonewatch_fence_identities_cached %g, want %d", v, long.Max)
		}
		if _, ids := set.Len(); ids != 2 {
			t.Errorf("%d identities known, want 2 (1008, 1009: the last four named, two of them absent)", ids)
		}
		if set.HasIdentity(1000) || !set.HasIdentity(1009) {
			t.Errorf("known: 1000 %v (evicted), 1009 %v (recent)", set.HasIdentity(1000), set.HasIdentity(1009))
		}
		if v := testutil.ToFloat64(m.IdentityReads.WithLabelValues(ReadNotFound)); v != 2 {
			t.Errorf("not_found %g, want 2", v)
		}
		// Named again, an evicted identity is read again.
		set.Labels(1000)
		waitReads(t, ctx, m, 13)
		if ns, labels, ok := set.Labels(1000); !ok || ns != "ml" || labels["app"] != "a1000" {
			t.Errorf("1000 read again: %q %v %v", ns, labels, ok)
		}
		if n := g.of(1000); n != 2 {
			t.Errorf("1000 read %d times, want 2", n)
		}
	})

	t.Run("flood", func(t *testing.T) {
		cfg := long
		cfg.Max, cfg.QPS, cfg.Burst, cfg.Queue = 1000, 10, 1, 2
		set, m, g := onDemand(t, ctx, api.Config, cfg, true)
		const n = 30
		for id := uint32(2000); id < 2000+n; id++ {
			set.Labels(id) // none exists
		}
		dropped := testutil.ToFloat64(m.IdentityReads.WithLabelValues(ReadDropped))
		if dropped == 0 {
			t.Fatalf("%d unknown identities at once through a queue of 2: none dropped", n)
		}
		// Asked again by their next use, each is read once in the end.
		for testutil.ToFloat64(m.IdentityReads.WithLabelValues(ReadNotFound)) < n {
			if ctx.Err() != nil {
				t.Fatalf("not_found %g, want %d", testutil.ToFloat64(m.IdentityReads.WithLabelValues(ReadNotFound)), n)
			}
			for id := uint32(2000); id < 2000+n; id++ {
				set.Labels(id)
			}
			time.Sleep(20 * time.Millisecond)
		}
		for id := uint32(2000); id < 2000+n; id++ {
			if c := g.of(id); c != 1 {
				t.Errorf("identity %d read %d times, want once", id, c)
			}
		}
	})

	t.Run("deleted", func(t *testing.T) {
		cfg := long
		cfg.Refresh = 50 * time.Millisecond
		set, m, _ := onDemand(t, ctx, api.Config, cfg, true)
		set.Labels(1005)
		waitReads(t, ctx, m, 1)
		if !set.HasIdentity(1005) {
			t.Fatal("1005 not known after its read")
		}
		if err := admin.Resource(IdentityResource).Delete(ctx, "1005", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for set.HasIdentity(1005) {
			if ctx.Err() != nil {
				t.Fatal("a deleted identity is never forgotten")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if v := testutil.ToFloat64(m.IdentityReads.WithLabelValues(ReadNotFound)); v < 1 {
			t.Errorf("not_found %g after the deletion", v)
		}
	})

	t.Run("denied", func(t *testing.T) {
		// A ServiceAccount no role is bound to: every read is refused.
		sa := api.ServiceAccount(t, "monitoring", "no-rights")
		var logs testenv.SyncBuffer
		g := &gets{n: map[string]int{}}
		c := rest.CopyConfig(sa.Config)
		c.WrapTransport = g.wrap
		set, m := NewSet(), NewMetrics(nil)
		l, err := NewLive(dynamic.NewForConfigOrDie(c), set, 0, m, slog.New(slog.NewTextHandler(&logs, nil)), OnDemandIdentities(long))
		if err != nil {
			t.Fatal(err)
		}
		go l.Run(ctx) // the policy informers are refused too, and retry
		set.Labels(1007)
		set.Labels(1008)
		waitReads(t, ctx, m, 2)
		if v := testutil.ToFloat64(m.IdentityReads.WithLabelValues(ReadFailed)); v != 2 {
			t.Errorf("failed %g, want 2", v)
		}
		if _, _, ok := set.Labels(1007); ok {
			t.Error("a refused identity is known")
		}
		var lines []string
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, `verbs: [\"get\"]`) && strings.Contains(line, "ciliumidentities") {
				lines = append(lines, line)
			}
		}
		if len(lines) != 1 {
			t.Errorf("want one error line naming the get rule to add, got %d:\n%s", len(lines), logs.String())
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		down := rest.CopyConfig(api.Config)
		down.Host = "https://127.0.0.1:1"
		cfg := long
		cfg.Timeout = 2 * time.Second
		set, m, g := onDemand(t, ctx, down, cfg, false)
		set.Labels(1006)
		waitReads(t, ctx, m, 1)
		if v := testutil.ToFloat64(m.IdentityReads.WithLabelValues(ReadFailed)); v != 1 {
			t.Fatalf("failed %g, want 1", v)
		}
		for range 5 {
			if _, _, ok := set.Labels(1006); ok {
				t.Fatal("an identity that could not be read is known")
			}
		}
		if n := g.of(1006); n != 1 {
			t.Errorf("1006 asked %d times within its backoff, want once", n)
		}
	})
}

// TestNameWhileReadPending: a drop naming an identity whose read is under
// way asks nothing more and allocates nothing (a SYN flood of a new peer
// before its read is back), and is not memoized: once the read is back
// (here: recorded as the reader records it) the next drop is named.
func TestNameWhileReadPending(t *testing.T) {
	s := benchSet(t)
	m := NewMetrics(nil)
	cfg := DefaultIdentityReads
	cfg.Queue = 1
	s.setReader(newIdentityReader(nil, s, cfg, m, slog.New(slog.DiscardHandler))) // not run: the read stays queued
	if got := s.Name(false, 1001, 4242, ProtoTCP, 29500); got != "" {
		t.Fatalf("named %q before the peer's identity is read", got)
	}
	if a := testing.AllocsPerRun(100, func() { s.Name(false, 1001, 4242, ProtoTCP, 29500) }); a != 0 {
		t.Errorf("a drop whose read is pending allocates %v times", a)
	}
	if n := len(s.reader.queue); n != 1 {
		t.Errorf("%d reads queued for one identity, want 1", n)
	}
	if v := testutil.ToFloat64(m.IdentityReads.WithLabelValues(ReadDropped)); v != 0 {
		t.Errorf("dropped %g: a pending read was asked again", v)
	}
	// What read() does with a found identity.
	s.reader.mu.Lock()
	e := s.reader.touchLocked(4242)
	e.pending, e.labels, e.until = false, pod("ml-team", "zone", "a"), time.Now().Add(time.Hour)
	s.reader.known++
	s.reader.mu.Unlock()
	s.changed()
	if got := s.Name(false, 1001, 4242, ProtoTCP, 29500); got == "" {
		t.Error("the drop is not named once the identity is read")
	}
}

// BenchmarkNamePendingRead is a drop naming an identity whose read is
// under way.
func BenchmarkNamePendingRead(b *testing.B) {
	s := benchSet(b)
	s.setReader(newIdentityReader(nil, s, DefaultIdentityReads, NewMetrics(nil), slog.New(slog.DiscardHandler)))
	s.Name(false, 1001, 4242, ProtoTCP, 29500)
	b.ReportAllocs()
	for b.Loop() {
		s.Name(false, 1001, 4242, ProtoTCP, 29500)
	}
}
