package fence

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/zonewatch/zonewatch/collector/kube"
)

// TestWatchErrorNotServed: on a cluster whose apiserver does not serve
// Cilium's CRDs (yet), the informers retry for ever; the exporter says so
// once per resource as a warning with what to check, not one client-go
// error line per retry, and a denial still goes through the loud denial
// handling.
func TestWatchErrorNotServed(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	l := &Live{logger: logger}
	denied := kube.NewDenials("fence", logger)
	h := l.watchError(denied, CNPResource)
	notFound := apierrors.NewNotFound(CNPResource.GroupResource(), "")
	for i := 0; i < 5; i++ {
		h(context.Background(), nil, notFound)
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 || !strings.Contains(out, "are Cilium's CRDs installed?") || !strings.Contains(out, "ciliumnetworkpolicies.cilium.io") {
		t.Fatalf("want one warning naming the resource, got %d lines:\n%s", n, out)
	}
	logs.Reset()
	h(context.Background(), nil, apierrors.NewForbidden(CNPResource.GroupResource(), "", nil))
	if out := logs.String(); !strings.Contains(out, "permission denied") || !strings.Contains(out, "starved_source=fence") {
		t.Fatalf("a denial is not the loud denial line:\n%s", out)
	}
	// Another resource gets its own first warning.
	logs.Reset()
	l.watchError(denied, IdentityResource)(context.Background(), nil, apierrors.NewNotFound(IdentityResource.GroupResource(), ""))
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("the identity informer's first not-served error is not said:\n%s", logs.String())
	}
}

// The informers read Kubernetes NetworkPolicies beside Cilium's policies:
// one names the drop it denies, one that cannot be read is counted in
// zonewatch_fence_objects_skipped_total{resource="networkpolicies"} and
// names nothing, and a deleted one is forgotten.
func TestLiveReadsNetworkPolicies(t *testing.T) {
	np := func(name, spec string) *unstructured.Unstructured {
		var o map[string]any
		if err := json.Unmarshal([]byte(`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy",
		  "metadata":{"namespace":"ml-team","name":"`+name+`"},"spec":`+spec+`}`), &o); err != nil {
			t.Fatal(err)
		}
		return &unstructured.Unstructured{Object: o}
	}
	scheme := runtime.NewScheme()
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		CNPResource: "CiliumNetworkPolicyList", CCNPResource: "CiliumClusterwideNetworkPolicyList",
		IdentityResource: "CiliumIdentityList", NetpolResource: "NetworkPolicyList",
	}, np("coordinator-fence", `{"podSelector":{"matchLabels":{"role":"master"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"zone":"b"}}}]}]}`),
		np("broken", `{"podSelector":{"matchExpressions":[{"key":"a","operator":"Near"}]}}`))
	set := NewSet()
	set.PutIdentity(1001, pod("ml-team", "role", "master"))
	set.PutIdentity(1002, pod("ml-team", "zone", "a"))
	m := NewMetrics(nil)
	l, err := NewLive(client, set, 0, m, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if !l.Run(ctx) {
		t.Fatal("not synced")
	}
	if got := set.Name(false, 1001, 1002, ProtoTCP, 29500); got != "ml-team/coordinator-fence" {
		t.Errorf("named %q, want the NetworkPolicy", got)
	}
	if v := testutil.ToFloat64(m.Skipped.WithLabelValues("networkpolicies")); v != 1 {
		t.Errorf("skipped networkpolicies %v, want 1", v)
	}
	if err := client.Resource(NetpolResource).Namespace("ml-team").Delete(ctx, "coordinator-fence", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for set.Name(false, 1001, 1002, ProtoTCP, 29500) != "" {
		if time.Now().After(deadline) {
			t.Fatal("a deleted NetworkPolicy is still named")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
