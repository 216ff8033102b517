package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// Option configures StartAPIServer.
type Option func(*apiOptions)

type apiOptions struct {
	audit bool
	args  []string
}

// WithArgs adds kube-apiserver flags (feature gates, runtime config,
// admission plugins) after the test environment's own.
func WithArgs(args ...string) Option {
	return func(o *apiOptions) { o.args = append(o.args, args...) }
}

// WithAuditLog makes the apiserver write an audit log (every request at
// level Metadata: who, verb, resource, response code, and the authorizer's
// decision and reason) to APIServer.AuditLog, for tests that compare what a
// client asked for with what its role grants (AuditEvents).
func WithAuditLog() Option { return func(o *apiOptions) { o.audit = true } }

// auditPolicy logs each request once, when its response is complete (a
// watch: when it starts, ResponseStarted, and when it ends).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
`

func (o apiOptions) auditArgs(t testing.TB, dir string) ([]string, string) {
	if !o.audit {
		return nil, ""
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "audit.log")
	return []string{"--audit-policy-file", policy, "--audit-log-path", log,
		"--audit-log-mode", "blocking", "--audit-log-maxbackup", "0"}, log
}

// AuditEvent is one request from the apiserver's audit log.
type AuditEvent struct {
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
		APIVersion  string `json:"apiVersion"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Annotations map[string]string `json:"annotations"`
}

// Code is the response's HTTP status (0 when not known).
func (e AuditEvent) Code() int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

// Decision is the authorizer's: "allow" or "forbid".
func (e AuditEvent) Decision() string { return e.Annotations["authorization.k8s.io/decision"] }

// AuditEvents reads the audit log of an apiserver started WithAuditLog:
// the events of user (every user when empty).
func (a *APIServer) AuditEvents(t testing.TB, user string) []AuditEvent {
	t.Helper()
	if a.AuditLog == "" {
		t.Fatal("AuditEvents: the apiserver was started without WithAuditLog")
	}
	b, err := os.ReadFile(a.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	var out []AuditEvent
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit log %s: %v", a.AuditLog, err)
		}
		if user == "" || e.User.Username == user {
			out = append(out, e)
		}
	}
	return out
}

// Identity is a client of the test apiserver that is not the admin.
type Identity struct {
	// User is the name the apiserver authenticates, e.g.
	// system:serviceaccount:monitoring:zonewatch.
	User   string
	Config *rest.Config
	// Kubeconfig is a kubeconfig file any UID can read (for a process run
	// with the chart's securityContext, StartAs).
	Kubeconfig string
}

// ServiceAccount creates namespace/name (and the namespace) if missing and
// returns it as a client, with a real token from the TokenRequest API: the
// apiserver authenticates it as system:serviceaccount:<ns>:<name> in the
// groups system:serviceaccounts and system:serviceaccounts:<ns>, exactly as
// in a pod. It may do what RBAC bindings grant it, nothing more.
func (a *APIServer) ServiceAccount(t testing.TB, namespace, name string) *Identity {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := a.admin(t)
	ensure(t, "namespace "+namespace, func() error {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
		return err
	})
	ensure(t, "service account "+namespace+"/"+name, func() error {
		_, err := admin.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}, metav1.CreateOptions{})
		return err
	})
	day := int64(24 * 3600)
	tr, err := admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &day}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for service account %s/%s: %v", namespace, name, err)
	}
	user := "system:serviceaccount:" + namespace + ":" + name
	dir, err := os.MkdirTemp("", "zonewatch-sa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// 0644: the exporter may run as nobody (Relay mode); a test token only.
	if err := writeKubeconfig(kubeconfig, a.URL, user, tr.Status.Token, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(a.Config)
	cfg.BearerToken = tr.Status.Token
	return &Identity{User: user, Config: cfg, Kubeconfig: kubeconfig}
}

func (a *APIServer) admin(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(a.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ensure runs create, treating "already exists" as done.
func ensure(t testing.TB, what string, create func() error) {
	t.Helper()
	if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating %s: %v", what, err)
	}
}

// ChartRBAC is the exporter's ServiceAccount, ClusterRole and
// ClusterRoleBinding as the chart renders them (deploy/manifests, the
// committed output of deploy/render.sh: not a copy).
type ChartRBAC struct {
	ServiceAccount corev1.ServiceAccount
	ClusterRole    rbacv1.ClusterRole
	Binding        rbacv1.ClusterRoleBinding
}

// ManifestsDir is deploy/manifests in this repository.
func ManifestsDir() string {
	return filepath.Join(RepoRoot(), "deploy", "manifests")
}

// LoadChartRBAC reads the chart's RBAC objects from deploy/manifests.
func LoadChartRBAC(t testing.TB) *ChartRBAC {
	t.Helper()
	var r ChartRBAC
	var found []string
	for _, f := range []string{"serviceaccount.yaml", "clusterrole.yaml"} {
		for _, doc := range manifestDocs(t, filepath.Join(ManifestsDir(), f)) {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var into any
			switch meta.Kind {
			case "ServiceAccount":
				into = &r.ServiceAccount
			case "ClusterRole":
				into = &r.ClusterRole
			case "ClusterRoleBinding":
				into = &r.Binding
			default:
				continue
			}
			if err := yaml.UnmarshalStrict(doc, into); err != nil {
				t.Fatalf("%s: %s: %v", f, meta.Kind, err)
			}
			found = append(found, meta.Kind)
		}
	}
	if len(found) != 3 {
		t.Fatalf("deploy/manifests: want a ServiceAccount, a ClusterRole and a ClusterRoleBinding, found %v (run deploy/render.sh)", found)
	}
	return &r
}

// manifestDocs splits a multi-document YAML file.
func manifestDocs(t testing.TB, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, doc := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			out = append(out, doc)
		}
	}
	return out
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// ChartIdentity applies the chart's RBAC (LoadChartRBAC, after edit when
// not nil, e.g. to remove a rule) and returns its ServiceAccount as a
// client: what an exporter pod of the chart is on a real cluster. It waits
// until the authorizer grants the role's first rule, so the caller never
// races RBAC's cache. It can be called again with another edit: the role
// is updated in place.
//
// For other harnesses (internal/ciliumlab, the scheduling lab): start the
// apiserver with StartAPIServer, then
//
//	id := api.ChartIdentity(t, nil)
//	testenv.StartAs(t, dir, "exporter", testenv.ChartSecurityContext(t), bin, "--kubeconfig="+id.Kubeconfig, ...)
//
// runs the real exporter with the chart's privileges on both sides: its
// ClusterRole and its container securityContext.
func (a *APIServer) ChartIdentity(t testing.TB, edit func(*ChartRBAC)) *Identity {
	t.Helper()
	r := LoadChartRBAC(t)
	if edit != nil {
		edit(r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := a.admin(t)
	sa := r.ServiceAccount
	id := a.ServiceAccount(t, sa.Namespace, sa.Name)
	role := r.ClusterRole.DeepCopy()
	if err := upsert(ctx, func() error {
		_, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
		return err
	}, func() error {
		cur, err := admin.RbacV1().ClusterRoles().Get(ctx, role.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		role.ResourceVersion = cur.ResourceVersion
		_, err = admin.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("applying ClusterRole %s: %v", role.Name, err)
	}
	binding := r.Binding.DeepCopy()
	if err := upsert(ctx, func() error {
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
		return err
	}, func() error { return nil }); err != nil {
		t.Fatalf("applying ClusterRoleBinding %s: %v", binding.Name, err)
	}
	a.waitGranted(ctx, t, admin, id.User, sa.Namespace, role)
	return id
}

func upsert(ctx context.Context, create, update func() error) error {
	err := create()
	if apierrors.IsAlreadyExists(err) {
		return update()
	}
	return err
}

// waitGranted waits until RBAC's cache grants user the first verb of each
// rule of role.
func (a *APIServer) waitGranted(ctx context.Context, t testing.TB, admin kubernetes.Interface, user, namespace string, role *rbacv1.ClusterRole) {
	t.Helper()
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
	for _, rule := range role.Rules {
		if len(rule.APIGroups) == 0 || len(rule.Resources) == 0 || len(rule.Verbs) == 0 {
			continue
		}
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: rule.APIGroups[0], Resource: rule.Resources[0], Verb: rule.Verbs[0]},
		}}
		for {
			res, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err == nil && res.Status.Allowed {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("RBAC never granted %s %s/%s to %s (last: %v)", rule.Verbs[0], rule.APIGroups[0], rule.Resources[0], user, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
