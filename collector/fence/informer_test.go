package fence

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

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
