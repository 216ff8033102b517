// Package testenv starts the real components tests run against — etcd and
// kube-apiserver from `make tools` — on loopback, in a test's temp folder.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// ToolsBin returns the folder of tools built by `make tools`
// ($ZONEWATCH_TOOLS_BIN, else .tools/bin at the repository root). When a
// tool is missing the test is skipped, or fails when ZONEWATCH_REQUIRE_TOOLS
// or CI is set (make test sets it: a green run must have run everything).
func ToolsBin(t testing.TB, tools ...string) string {
	t.Helper()
	Integration(t)
	dir := os.Getenv("ZONEWATCH_TOOLS_BIN")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), ".tools", "bin")
	}
	for _, tool := range tools {
		if _, err := os.Stat(filepath.Join(dir, tool)); err != nil {
			Unmet(t, fmt.Sprintf("%s not found in %s: run `make tools` (or `make test`, which does)", tool, dir))
		}
	}
	return dir
}

// Required reports whether a test that cannot run must fail instead of
// skipping: ZONEWATCH_REQUIRE_TOOLS or CI is set (make test-integration and
// make e2e set it: a green run must have run everything).
func Required() bool {
	return os.Getenv("ZONEWATCH_REQUIRE_TOOLS") != "" || os.Getenv("CI") != ""
}

// Integration skips the test in the unit tier (go test -short, make
// test-unit): it needs tools, root or real components.
func Integration(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped in -short (make test-unit); make test-integration runs it")
	}
}

// RealData returns the folder sub of the shared real samples
// ($ZONEWATCH_REALDATA, else ../shared/realdata beside the repository). When
// the whole samples folder is absent the test is skipped with a message
// naming it, or fails under ZONEWATCH_REQUIRE_REALDATA; when the samples
// are there but sub is not, it fails (a moved folder must not turn into a
// silent skip).
func RealData(t testing.TB, sub string) string {
	t.Helper()
	root := os.Getenv("ZONEWATCH_REALDATA")
	if root == "" {
		root = filepath.Join(RepoRoot(), "..", "shared", "realdata")
	}
	root = filepath.Clean(root)
	if _, err := os.Stat(root); err != nil {
		msg := fmt.Sprintf("real samples folder %s absent (%v): set ZONEWATCH_REALDATA to test against it", root, err)
		if os.Getenv("ZONEWATCH_REQUIRE_REALDATA") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := filepath.Join(root, sub)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("real samples folder %s is there but %s is not: %v", root, sub, err)
	}
	return dir
}

// Start runs a command for the length of the test, its output in
// dir/name.log, and kills its process group at cleanup.
func Start(t testing.TB, dir, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	return StartEnv(t, dir, name, bin, nil, args...)
}

// StartEnv is Start with env ("KEY=value") added to the test's environment
// for the command alone: a parallel test may not change its own (t.Setenv).
func StartEnv(t testing.TB, dir, name, bin string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("--- %s log (tail) ---\n%s", name, tail(b, 4000))
			}
		}
	})
	return cmd
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// APIServer is a running etcd + kube-apiserver.
type APIServer struct {
	Config *rest.Config
	// Kubeconfig is a kubeconfig file for the exporter binary.
	Kubeconfig string
	URL        string
	// AuditLog is the apiserver's audit log (JSON lines), empty without
	// WithAuditLog; AuditEvents reads it.
	AuditLog string
}

// StartAPIServer starts etcd and kube-apiserver on loopback and waits until
// the server is ready. Authorization is Node,RBAC, as on a real cluster: the
// static admin token (Config, Kubeconfig) is in system:masters and may do
// anything; an exporter runs as the chart's ServiceAccount
// (APIServer.ChartIdentity). Options add an audit log (WithAuditLog).
func StartAPIServer(t testing.TB, opts ...Option) *APIServer {
	t.Helper()
	var o apiOptions
	for _, opt := range opts {
		opt(&o)
	}
	bin := ToolsBin(t, "etcd", "kube-apiserver")
	dir := t.TempDir()

	clientPort, peerPort := FreePort(t), FreePort(t)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	Start(t, dir, "etcd", filepath.Join(bin, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "sa.key")
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(keyFile, pemKey, 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "zonewatch-test-admin-token"
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auditArgs, auditLog := o.auditArgs(t, dir)
	port := FreePort(t)
	Start(t, dir, "kube-apiserver", filepath.Join(bin, "kube-apiserver"), append([]string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port), "--cert-dir", filepath.Join(dir, "certs"),
		"--endpoint-reconciler-type", "none",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", keyFile, "--service-account-signing-key-file", keyFile,
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--authorization-mode", "Node,RBAC",
		"--token-auth-file", tokenFile,
		"--disable-admission-plugins", "ServiceAccount",
		"--enable-priority-and-fairness=false",
	}, append(auditArgs, o.args...)...)...)
	url := "https://127.0.0.1:" + strconv.Itoa(port)
	cfg := &rest.Config{Host: url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 200, Burst: 400}

	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("kube-apiserver not ready after 90s (last error: %v)", err)
		}
		time.Sleep(250 * time.Millisecond)
	}

	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, url, "admin", token, 0o600); err != nil {
		t.Fatal(err)
	}
	return &APIServer{Config: cfg, Kubeconfig: kubeconfig, URL: url, AuditLog: auditLog}
}

// writeKubeconfig writes a kubeconfig for url that logs in with a bearer token.
func writeKubeconfig(path, url, user, token string, mode os.FileMode) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: %q
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: %q}
current-context: test
`, url, user, token, user)
	if err := os.WriteFile(path, []byte(kc), mode); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

// SyncBuffer is a log destination that goroutines of the code under test
// write while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// DocPassage returns the text of a doc file from the line holding marker
// to the next blank line (to the next line starting with end, when end is
// set): the part of a doc a drift test holds to the code. It fails the test
// when the doc no longer holds marker.
func DocPassage(t testing.TB, file, marker, end string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, marker)
	if i < 0 {
		t.Fatalf("%s no longer says %q: update this test to where the doc lists it now", file, marker)
	}
	s = s[i:]
	sep := "\n\n"
	if end != "" {
		sep = "\n" + end
	}
	if j := strings.Index(s, sep); j >= 0 {
		s = s[:j]
	}
	return s
}
