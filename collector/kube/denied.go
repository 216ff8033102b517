package kube

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// Denials makes an informer's RBAC denial loud: the first 403 of each
// resource is logged at error, once, with the verb, the resource, the user
// and the ClusterRole rule to add (the informer keeps retrying and syncs by
// itself once the rule is there; until then its source is not synced, so
// zonewatch_source_up is 0 for it). Every other watch error goes to
// client-go's default handler.
type Denials struct {
	source string
	logger *slog.Logger

	mu     sync.Mutex
	denied map[schema.GroupResource]bool
}

// NewDenials returns the denial logger of one source (its
// zonewatch_source_up label).
func NewDenials(source string, logger *slog.Logger) *Denials {
	return &Denials{source: source, logger: logger, denied: map[schema.GroupResource]bool{}}
}

// Watch sets d as inf's watch error handler for resource gr.
func (d *Denials) Watch(inf cache.SharedIndexInformer, gr schema.GroupResource) error {
	return inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if !d.Note(gr, err) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
		}
	})
}

// Note logs err once per resource when it is a denial, and reports
// whether it was one.
func (d *Denials) Note(gr schema.GroupResource, err error) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	d.mu.Lock()
	first := !d.denied[gr]
	d.denied[gr] = true
	d.mu.Unlock()
	level := slog.LevelDebug
	if first {
		level = slog.LevelError
	}
	user, verb := deniedRequest(err)
	d.logger.Log(context.Background(), level, "permission denied: add the rule to zonewatch's ClusterRole (Helm chart: templates/clusterrole.yaml); "+d.source+" recovers by itself once granted",
		"starved_source", d.source, "verb", verb, "resource", ResourceName(gr), "user", user, "rule", Rule(gr))
	return true
}

// forbiddenMessage is how the apiserver words an RBAC denial
// (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters
// forbiddenMessage): `User "u" cannot list resource "pods" in API group ""
// at the cluster scope`.
var forbiddenMessage = regexp.MustCompile(`User "([^"]*)" cannot (\S+) resource`)

// deniedRequest returns the user and verb of a denial ("" and "list/watch"
// when the message has another form).
func deniedRequest(err error) (user, verb string) {
	if m := forbiddenMessage.FindStringSubmatch(err.Error()); m != nil {
		return m[1], m[2]
	}
	return "", "list/watch"
}

// ResourceName is gr as RBAC and kubectl write it: pods, jobsets.jobset.x-k8s.io.
func ResourceName(gr schema.GroupResource) string {
	return gr.String()
}

// Rule is the ClusterRole rule an informer of gr needs, in the chart
// template's own notation: list and watch (an informer never gets).
func Rule(gr schema.GroupResource) string {
	return fmt.Sprintf(`{apiGroups: [%q], resources: [%q], verbs: ["list", "watch"]}`, gr.Group, gr.Resource)
}
