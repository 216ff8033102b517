package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Setpriv is Debian's util-linux setpriv, which StartAs runs the real
// binary under.
const Setpriv = "/usr/bin/setpriv"

// SecurityContext is the process identity a container runtime (runc, as
// containerd's CRI plugin drives it) gives a container from its pod's
// securityContext: user, group, supplementary groups, and the capability
// bounding set "drop ALL, add what is listed". Inheritable and ambient sets
// are empty (runc since CVE-2022-24769): a container running as root holds
// exactly the added capabilities; one running as any other UID holds none.
// allowPrivilegeEscalation: false is no_new_privs.
type SecurityContext struct {
	UID, GID int
	// Groups are the supplementalGroups.
	Groups []int
	// Caps are the added capabilities as the chart writes them (BPF,
	// SYS_ADMIN).
	Caps       []string
	NoNewPrivs bool
}

// SecurityContextOf reads the effective securityContext of container name
// in spec (the container's fields win over the pod's).
func SecurityContextOf(spec *corev1.PodSpec, name string) (SecurityContext, error) {
	var c *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			c = &spec.Containers[i]
		}
	}
	if c == nil {
		return SecurityContext{}, fmt.Errorf("no container %q", name)
	}
	var sc SecurityContext
	uid, gid := (*int64)(nil), (*int64)(nil)
	if p := spec.SecurityContext; p != nil {
		uid, gid = p.RunAsUser, p.RunAsGroup
		for _, g := range p.SupplementalGroups {
			sc.Groups = append(sc.Groups, int(g))
		}
	}
	cs := c.SecurityContext
	if cs == nil || cs.Capabilities == nil || !dropsAll(cs.Capabilities.Drop) {
		return SecurityContext{}, fmt.Errorf("container %q does not drop ALL capabilities", name)
	}
	if cs.RunAsUser != nil {
		uid = cs.RunAsUser
	}
	if cs.RunAsGroup != nil {
		gid = cs.RunAsGroup
	}
	if uid == nil || gid == nil {
		return SecurityContext{}, fmt.Errorf("container %q: runAsUser and runAsGroup must be set (the image's user is not known here)", name)
	}
	sc.UID, sc.GID = int(*uid), int(*gid)
	for _, c := range cs.Capabilities.Add {
		sc.Caps = append(sc.Caps, string(c))
	}
	sc.NoNewPrivs = cs.AllowPrivilegeEscalation != nil && !*cs.AllowPrivilegeEscalation
	return sc, nil
}

func dropsAll(caps []corev1.Capability) bool {
	for _, c := range caps {
		if strings.EqualFold(string(c), "ALL") {
			return true
		}
	}
	return false
}

// ChartSecurityContext is the exporter container's securityContext in the
// committed DaemonSet (deploy/manifests/daemonset.yaml, the chart's default
// values): root holding only CAP_BPF, no_new_privs.
func ChartSecurityContext(t testing.TB) SecurityContext {
	t.Helper()
	for _, doc := range manifestDocs(t, filepath.Join(ManifestsDir(), "daemonset.yaml")) {
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal(doc, &ds); err != nil {
			t.Fatalf("deploy/manifests/daemonset.yaml: %v", err)
		}
		if ds.Kind != "DaemonSet" {
			continue
		}
		sc, err := SecurityContextOf(&ds.Spec.Template.Spec, "exporter")
		if err != nil {
			t.Fatalf("deploy/manifests/daemonset.yaml: %v", err)
		}
		return sc
	}
	t.Fatal("deploy/manifests/daemonset.yaml: no DaemonSet")
	return SecurityContext{}
}

// Without returns a copy that lacks capability c (the test of a dropped
// capability).
func (s SecurityContext) Without(c string) SecurityContext {
	out := s
	out.Caps = nil
	for _, have := range s.Caps {
		if !strings.EqualFold(have, c) {
			out.Caps = append(out.Caps, have)
		}
	}
	return out
}

// Args is the setpriv command line that runs bin with this identity.
func (s SecurityContext) Args(bin string, args ...string) []string {
	groups := "--clear-groups"
	if len(s.Groups) > 0 {
		g := make([]string, len(s.Groups))
		for i, v := range s.Groups {
			g[i] = strconv.Itoa(v)
		}
		groups = "--groups=" + strings.Join(g, ",")
	}
	bounding := "-all"
	for _, c := range s.Caps {
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(strings.ToUpper(c), "CAP_"))
	}
	out := []string{Setpriv, "--reuid=" + strconv.Itoa(s.UID), "--regid=" + strconv.Itoa(s.GID), groups,
		"--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=" + bounding}
	if s.NoNewPrivs {
		out = append(out, "--no-new-privs")
	}
	return append(append(out, "--", bin), args...)
}

// String says who the process runs as, for test messages.
func (s SecurityContext) String() string {
	return fmt.Sprintf("uid %d gid %d groups %v caps %v no_new_privs %v", s.UID, s.GID, s.Groups, s.Caps, s.NoNewPrivs)
}

// CanStartAs skips (or fails under ZONEWATCH_REQUIRE_TOOLS) a test that
// cannot switch identities: it must run as root, with setpriv.
func CanStartAs(t testing.TB) {
	t.Helper()
	msg := ""
	if os.Geteuid() != 0 {
		msg = "running a process with the chart's securityContext needs root (setpriv switches user and capabilities)"
	} else if _, err := os.Stat(Setpriv); err != nil {
		msg = Setpriv + " not found (Debian util-linux)"
	}
	if msg != "" {
		Unmet(t, msg)
	}
}

// Root skips (or fails under ZONEWATCH_REQUIRE_TOOLS) a test that does not
// run as root; msg says what needs it.
func Root(t testing.TB, msg string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unmet(t, msg)
	}
}

// Unmet skips the test for want of what msg names, or fails it when a
// green run must have run everything (Required).
func Unmet(t testing.TB, msg string) {
	t.Helper()
	if Required() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// StartAs is Start for a process with the container identity sc: bin runs
// under setpriv, as the chart's pod would run it. Files it must read that
// the test wrote (a kubeconfig, a socket) must be reachable by sc.UID
// (Identity.Kubeconfig is; see Reachable).
//
// For other harnesses (internal/ciliumlab): StartAs(t, dir, "exporter",
// ChartSecurityContext(t), bin, args...) runs the exporter as the chart's
// DaemonSet does (root holding CAP_BPF only, no_new_privs).
func StartAs(t testing.TB, dir, name string, sc SecurityContext, bin string, args ...string) *exec.Cmd {
	t.Helper()
	CanStartAs(t)
	a := sc.Args(bin, args...)
	return Start(t, dir, name, a[0], a[1:]...)
}

// Reachable lets any UID reach path (a socket, a kubeconfig) the test
// made under its temp folder: each folder above it gets o+x (search, not
// list). Whether that UID may then open path is path's own mode and owner,
// as on a host.
func Reachable(t testing.TB, path string) {
	t.Helper()
	for d := filepath.Dir(path); d != "/" && d != "."; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// CiliumGroup is the gid of the host's group "cilium", which Cilium gives
// its Hubble and API sockets (mode 0660), and whether that group exists.
func CiliumGroup() (int, bool) {
	g, err := user.LookupGroup("cilium")
	if err != nil {
		return 0, false
	}
	gid, err := strconv.Atoi(g.Gid)
	return gid, err == nil
}

// CiliumSocket gives a unix socket the owner and mode Cilium gives its
// Hubble socket (pkg/api/socket.go SetDefaultPermissions, called by
// pkg/hubble/server/serveroption; importing it would pull go-openapi into
// go.mod): root, mode 0660 (api.SocketFileMode), group cilium when that
// group exists on the host, else left as created (root's).
func CiliumSocket(t testing.TB, path string) {
	t.Helper()
	if gid, ok := CiliumGroup(); ok {
		if err := os.Chown(path, 0, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o660); err != nil {
		t.Fatal(err)
	}
}

// childEnv names, in a child RunTestAs started, the test it runs; childArg
// prefixes the values the parent hands it.
const (
	childEnv = "ZONEWATCH_TESTENV_AS"
	childArg = "ZONEWATCH_TESTENV_AS_"
)

// AsChild reports whether this test process is the child RunTestAs
// started for t, and returns the values the parent handed it. A test that
// reads a real host resource in-process calls it first: the child does
// the reading, with the identity the parent chose.
func AsChild(t testing.TB) (map[string]string, bool) {
	if os.Getenv(childEnv) != t.Name() {
		return nil, false
	}
	vals := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, childArg) {
			vals[strings.TrimPrefix(k, childArg)] = v
		}
	}
	return vals, true
}

// RunTestAs runs t's own test function again in a child of this test
// binary, with the container identity sc (setpriv), handing it vals
// (AsChild); it returns the child's output, and an error when the child
// failed. The parent sets up what needs more privilege than the container
// has (a bpffs mount, a socket) and the child reads it as the pod would.
func RunTestAs(t testing.TB, sc SecurityContext, vals map[string]string) (string, error) {
	t.Helper()
	CanStartAs(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := sc.Args(self, "-test.run", "^"+strings.ReplaceAll(regexpQuote(t.Name()), "/", "$/^")+"$", "-test.v", "-test.count=1")
	cmd := exec.Command(a[0], a[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name())
	for k, v := range vals {
		cmd.Env = append(cmd.Env, childArg+k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func regexpQuote(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}
