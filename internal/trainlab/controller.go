package trainlab

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// Endpoints are what the bed picked for one controller: its command line
// is built from them.
type Endpoints struct {
	// Kubeconfig reaches the test apiserver as an admin.
	Kubeconfig string
	// Dir is the controller's own folder (its configuration file, its log).
	Dir string
	// WebhookPort is where the controller serves its webhooks, on
	// 127.0.0.1, with CertDir's tls.crt and tls.key (signed by the bed's CA).
	WebhookPort int
	CertDir     string
	// HealthPort is for its health probes (/readyz), on 127.0.0.1.
	HealthPort int
}

// Probe is an object that the controller's validating webhook denies,
// created with a server-side dry run until the denial comes back (with
// Message in it): then the apiserver calls the controller's webhooks.
type Probe struct {
	GVR     schema.GroupVersionResource
	Object  map[string]any
	Message string
}

// Controller is a training controller as the bed starts it.
type Controller struct {
	// Tool is the binary in .tools/bin; NAME.d/crds holds its CRDs and
	// NAME.d/webhook.yaml its webhook configurations.
	Tool string
	// Args is its command line.
	Args func(e Endpoints) []string
	// Webhooks are the paths of the webhook configuration to register
	// (each webhook whose service path is one of them), pointed at
	// 127.0.0.1:WebhookPort with the bed's CA; the others are left out.
	// None: the controller runs without webhooks and Probe is not used.
	Webhooks []string
	Probe    *Probe
	// Env, when set, goes before the controller's path on env(1)'s command
	// line: NAME=VALUE words for its environment (e.g. TMPDIR, where a
	// controller-runtime webhook server whose cert folder is not
	// configurable reads its certificates), then, if needed, a command
	// that execs the rest (e.g. unshare).
	Env func(e Endpoints) []string
	// Ready, when set, replaces the wait for /readyz on HealthPort (a
	// controller that serves no health probe on a port of the bed's
	// choosing): it returns once the controller runs.
	Ready func(ctx context.Context, b *Bed) error
}

// Running is a controller the bed started.
type Running struct {
	Endpoints
	// Log is its output.
	Log string
}

// StartController installs the controller's CRDs, starts it, waits for
// its health probe, registers its webhooks and waits until the apiserver
// calls them (Probe). It stops at the test's cleanup.
func (b *Bed) StartController(t testing.TB, c Controller) *Running {
	t.Helper()
	bin := testenv.ToolsBin(t, c.Tool, c.Tool+".d")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	crds, err := filepath.Glob(filepath.Join(bin, c.Tool+".d", "crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in %s.d/crds (%v)", c.Tool, err)
	}
	if err := testenv.InstallCRDs(ctx, b.Dyn, crds...); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e := Endpoints{Kubeconfig: b.API.Kubeconfig, Dir: dir, WebhookPort: testenv.FreePort(t),
		CertDir: filepath.Join(dir, "webhook-certs"), HealthPort: testenv.FreePort(t)}
	b.CA.WriteServing(t, e.CertDir)
	args := c.Args(e)
	if c.Env != nil {
		// env(1) execs the controller: the process the bed stops is it.
		testenv.Start(t, dir, c.Tool, "/usr/bin/env", append(append(c.Env(e), filepath.Join(bin, c.Tool)), args...)...)
	} else {
		testenv.Start(t, dir, c.Tool, filepath.Join(bin, c.Tool), args...)
	}
	r := &Running{Endpoints: e, Log: filepath.Join(dir, c.Tool+".log")}
	fail := func(err error) {
		t.Helper()
		log, _ := os.ReadFile(r.Log)
		if len(log) > 6000 {
			log = log[len(log)-6000:]
		}
		t.Fatalf("%s: %v\n--- %s log (tail) ---\n%s", c.Tool, err, c.Tool, log)
	}
	ready := func(ctx context.Context, _ *Bed) error {
		return waitHTTP(ctx, "http://127.0.0.1:"+strconv.Itoa(e.HealthPort)+"/readyz")
	}
	if c.Ready != nil {
		ready = c.Ready
	}
	if err := ready(ctx, b); err != nil {
		fail(err)
	}
	if len(c.Webhooks) == 0 {
		return r
	}
	if err := b.registerWebhooks(ctx, c.Tool, filepath.Join(bin, c.Tool+".d", "webhook.yaml"), e.WebhookPort, c.Webhooks); err != nil {
		fail(err)
	}
	if c.Probe == nil {
		fail(errors.New("webhooks registered without a probe: nothing tells when the apiserver calls them"))
	}
	if err := b.probe(ctx, *c.Probe); err != nil {
		fail(err)
	}
	return r
}

var webhookGVRs = map[string]schema.GroupVersionResource{
	"MutatingWebhookConfiguration":   {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"},
	"ValidatingWebhookConfiguration": {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"},
}

// registerWebhooks creates the webhook configurations of the file, named
// after the tool (upstream's names, "mutating-webhook-configuration", are
// the same for every kubebuilder project), keeping the webhooks served at
// paths, each pointed at the loopback server by URL with the bed's CA.
// Mutating configurations come first, as in the file, so that the probe of
// a validating webhook finds them in place.
func (b *Bed) registerWebhooks(ctx context.Context, tool, path string, port int, paths []string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	found := map[string]bool{}
	for {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		kind, _ := m["kind"].(string)
		gvr, ok := webhookGVRs[kind]
		if !ok {
			continue
		}
		var keep []any
		hooks, _ := m["webhooks"].([]any)
		for _, h := range hooks {
			hook, _ := h.(map[string]any)
			cc, _ := hook["clientConfig"].(map[string]any)
			svc, _ := cc["service"].(map[string]any)
			p, _ := svc["path"].(string)
			if !slices.Contains(paths, p) {
				continue
			}
			found[p] = true
			hook["clientConfig"] = map[string]any{"url": "https://127.0.0.1:" + strconv.Itoa(port) + p, "caBundle": base64.StdEncoding.EncodeToString(b.CA.PEM)}
			keep = append(keep, hook)
		}
		if len(keep) == 0 {
			continue
		}
		m["webhooks"] = keep
		m["metadata"] = map[string]any{"name": tool + "-" + strings.ToLower(strings.TrimSuffix(kind, "WebhookConfiguration"))}
		if _, err := b.Dyn.Resource(gvr).Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("registering %s of %s: %w", kind, tool, err)
		}
	}
	for _, p := range paths {
		if !found[p] {
			return fmt.Errorf("%s has no webhook at %s", path, p)
		}
	}
	return nil
}

// probe dry-runs the probe object until the apiserver answers with the
// webhook's denial.
func (b *Bed) probe(ctx context.Context, p Probe) error {
	u, err := Unstructured(p.Object)
	if err != nil {
		return err
	}
	var last error
	for {
		_, err := b.Dyn.Resource(p.GVR).Namespace(u.GetNamespace()).Create(ctx, u.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err != nil && strings.Contains(err.Error(), "denied the request") && strings.Contains(err.Error(), p.Message):
			return nil
		case err == nil:
			last = errors.New("probe object accepted: the webhook is not called yet")
		default:
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("webhook probe (%s %s): %w (last: %v)", u.GetKind(), u.GetName(), ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Unstructured makes an object from a map written in Go (ints, nested
// maps and slices) through JSON, as the dynamic client wants it (int64,
// float64).
func Unstructured(obj map[string]any) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(b); err != nil {
		return nil, err
	}
	return u, nil
}

// writeConfig writes a controller's configuration file into its folder
// and returns the path.
func writeConfig(t testing.TB, e Endpoints, name, cfg string) string {
	t.Helper()
	path := filepath.Join(e.Dir, name)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sigsArgs is the command line of the kubernetes-sigs controllers (JobSet,
// LeaderWorkerSet): one Configuration of the same fields in their own API
// group (config.<group>/v1alpha1): webhooks on the bed's port with its
// certificates, health on loopback, leader election and internal
// certificate management off.
func sigsArgs(t testing.TB, e Endpoints, group string) []string {
	cfg := fmt.Sprintf(`apiVersion: config.%s/v1alpha1
kind: Configuration
webhook: {host: 127.0.0.1, port: %d, certDir: %q}
health: {healthProbeBindAddress: "127.0.0.1:%d"}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
`, group, e.WebhookPort, e.CertDir, e.HealthPort)
	path := writeConfig(t, e, group+"-config.yaml", cfg)
	return []string{"--config", path, "--kubeconfig", e.Kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", "0", "--zap-log-level", "2"}
}
