package hubble

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/zonewatch/zonewatch/collector/fence"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// identityRequests records the requests of a client for CiliumIdentities
// ("GET /apis/cilium.io/v2/ciliumidentities/41000", "LIST ...").
type identityRequests struct {
	mu   sync.Mutex
	seen []string
}

func (r *identityRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if strings.Contains(req.URL.Path, "/ciliumidentities") {
			verb := req.Method
			if req.URL.Query().Get("watch") == "true" {
				verb = "WATCH"
			} else if verb == http.MethodGet && strings.HasSuffix(req.URL.Path, "/ciliumidentities") {
				verb = "LIST"
			}
			r.mu.Lock()
			r.seen = append(r.seen, verb+" "+req.URL.Path)
			r.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

func (r *identityRequests) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.seen {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ciliumAPIServer starts a real kube-apiserver serving Cilium's policy
// and identity CRDs (Cilium's own files), and returns its config.
func ciliumAPIServer(t *testing.T, ctx context.Context) *rest.Config {
	t.Helper()
	api := testenv.StartAPIServer(t)
	dir := filepath.Join(testenv.ToolsBin(t, "cilium"), "cilium", "crds")
	var files []string
	for _, name := range []string{"ciliumnetworkpolicies", "ciliumclusterwidenetworkpolicies", "ciliumidentities"} {
		files = append(files, filepath.Join(dir, name+".yaml"))
	}
	if err := testenv.InstallCRDs(ctx, dynamic.NewForConfigOrDie(api.Config), files...); err != nil {
		t.Fatal(err)
	}
	return api.Config
}

func ciliumIdentity(id string, labels map[string]string) *unstructured.Unstructured {
	meta, sec := map[string]any{}, map[string]any{}
	for k, v := range labels {
		meta[k] = v
		sec["k8s:"+k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
		"metadata": map[string]any{"name": id, "labels": meta}, "security-labels": sec}}
}

// TestRemoteDropNamedOnDemand: in the per-node view the fence lists no
// CiliumIdentity (no list, no watch); a default-deny drop on this node
// whose far end is a pod of a job with no pod here names both the policy
// and the job once the two identities have been read by name, on the real
// kube-apiserver. An identity the apiserver does not have (404) is read
// once, counted not_found and kept as absent: further drops naming it ask
// nothing and count as no_job.
func TestRemoteDropNamedOnDemand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := ciliumAPIServer(t, ctx)
	admin := dynamic.NewForConfigOrDie(base)
	for id, labels := range map[string]map[string]string{
		"41000": {"io.kubernetes.pod.namespace": "ml-team", "io.cilium.k8s.policy.cluster": "default",
			"training.kubeflow.org/job-name": "llm-blocked", "training.kubeflow.org/replica-type": "worker"},
		"42000": {"io.kubernetes.pod.namespace": "data", "io.cilium.k8s.policy.cluster": "default", "app": "dataset"},
	} {
		if _, err := admin.Resource(fence.IdentityResource).Create(ctx, ciliumIdentity(id, labels), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "data"}}}
	if _, err := admin.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cnp := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
		"metadata": map[string]any{"namespace": "data", "name": "dataset-fence"},
		"spec": map[string]any{"endpointSelector": map[string]any{"matchLabels": map[string]any{"app": "dataset"}},
			"ingress": []any{map[string]any{"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{"app": "loader"}}}}}}}}
	if _, err := admin.Resource(fence.CNPResource).Namespace("data").Create(ctx, cnp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var reqs identityRequests
	cfg := rest.CopyConfig(base)
	cfg.WrapTransport = reqs.wrap
	set := fence.NewSet()
	m := fence.NewMetrics(nil)
	live, err := fence.NewLive(dynamic.NewForConfigOrDie(cfg), set, 0, m, slog.New(slog.DiscardHandler), fence.OnDemandIdentities(fence.DefaultIdentityReads))
	if err != nil {
		t.Fatal(err)
	}
	if !live.Run(ctx) {
		t.Fatal("fence informers not synced")
	}
	if _, ids := set.Len(); ids != 0 {
		t.Fatalf("%d identities held before any drop, want 0", ids)
	}

	s := testScenario()
	x := nodesOnly(s) // gpu-b1 holds no pod of llm-blocked
	worker, gone := addr("10.244.2.3"), addr("10.244.2.7")
	x.SetRemote("gpu-b1", ipcacheOf{
		worker:                  {NodeIP: addr("172.18.0.11"), Identity: 41000, Bits: 32},
		addr("10.244.4.9"):      {Identity: 42000, Bits: 32}, // the dataset server, here
		gone:                    {NodeIP: addr("172.18.0.11"), Identity: 43000, Bits: 32},
		netip.IPv4Unspecified(): {Identity: 2},
	}, set, topology.DefaultRules())
	agg := NewAggregator(x, "gpu-b1", time.Minute, nil)
	agg.SetFences(set)
	sec := 0
	drop := func(src netip.Addr, id uint32) {
		sec++
		agg.Observe(&flowpb.Flow{Time: timestamppb.New(t0.Add(time.Duration(sec) * time.Second)), NodeName: "prod/gpu-b1",
			Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, EventType: &flowpb.CiliumEventType{Type: eventDrop},
			TrafficDirection: flowpb.TrafficDirection_INGRESS,
			IP:               &flowpb.IP{Source: src.String(), Destination: "10.244.4.9"},
			L4:               &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: 8080}}},
			Source:           &flowpb.Endpoint{Identity: id},
			Destination:      &flowpb.Endpoint{ID: 9, Identity: 42000, Namespace: "data", PodName: "dataset-0"}})
	}
	want := DropKey{Namespace: "ml-team", Job: "llm-blocked", Direction: DirectionIngress, SrcZone: zoneA, DstZone: zoneB,
		Locality: topology.LocalityCrossZone, Peer: PeerCluster, Reason: ReasonPolicyDenied,
		PolicyName: "data/dataset-fence", PolicySource: PolicySourceSelected}
	// The first drops come before the reads: they name no job yet.
	for agg.Drops().Value(want) == 0 {
		if ctx.Err() != nil {
			var all []DropKey
			agg.Drops().Each(func(k DropKey, _ float64) { all = append(all, k) })
			t.Fatalf("the remote job's drop is never named with its policy: %+v; identity requests %v", all, reqs.seen)
		}
		drop(worker, 41000)
		time.Sleep(20 * time.Millisecond)
	}
	named := agg.Drops().Value(want)
	for range 3 {
		drop(worker, 41000)
	}
	if got := agg.Drops().Value(want); got != named+3 {
		t.Errorf("after the reads %g drops named, want %g", got, named+3)
	}

	// An identity the apiserver does not have: read once, kept as absent.
	before := uncounted(agg, uncountedNoJob)
	drop(gone, 43000)
	for testutil.ToFloat64(m.IdentityReads.WithLabelValues(fence.ReadNotFound)) == 0 {
		if ctx.Err() != nil {
			t.Fatalf("the unknown identity's 404 is never counted; identity requests %v", reqs.seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 5 {
		drop(gone, 43000)
	}
	if n := reqs.count("GET /apis/cilium.io/v2/ciliumidentities/43000"); n != 1 {
		t.Errorf("identity 43000 read %d times, want once (a 404 is kept as absent)", n)
	}
	if got := uncounted(agg, uncountedNoJob) - before; got != 6 {
		t.Errorf("no_job %g for the unknown identity's drops, want 6", got)
	}
	if v := testutil.ToFloat64(m.IdentityReads.WithLabelValues(fence.ReadFound)); v != 2 {
		t.Errorf("identity reads found %g, want 2 (41000 and 42000, once each)", v)
	}
	if n := reqs.count("LIST ") + reqs.count("WATCH "); n != 0 {
		t.Errorf("the per-node view listed or watched CiliumIdentities: %v", reqs.seen)
	}
	if !x.JobExists("ml-team", "llm-blocked") {
		t.Error("the remote job named by its identity does not exist for the counters")
	}
}
