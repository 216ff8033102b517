package ciliumlab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestSandboxInPodCgroup: a pod's sockets are made by its sandbox, a
// process in the pod's cgroup under the node's cgroup root (where Cilium's
// socket LB hooks) and in the pod's network namespace; Close stops it by
// pid and removes the cgroups and the namespace, leaving nothing.
func TestSandboxInPodCgroup(t *testing.T) {
	testenv.Integration(t)
	testenv.Root(t, "the sandbox needs root (network namespaces, cgroups)")
	root, err := cgroup2Root()
	if err != nil {
		testenv.Unmet(t, err.Error())
	}
	id := fmt.Sprintf("s%03x", os.Getpid()&0xfff)
	l := &Lab{cfg: Config{Dir: t.TempDir(), Logf: t.Logf}, ID: id, pods: map[string]*Pod{}}
	n := &Node{lab: l, Name: "n1", Dir: l.cfg.Dir, cgroup: filepath.Join(root, "zwl"+id+"-n1")}
	closed := false
	defer func() {
		if !closed {
			l.Close()
		}
	}()
	// Under the lab lock, as a lab: a lab starting meanwhile would take
	// these zwl* names for a dead lab's (sweepStale).
	if err := l.lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{n.cgroup, filepath.Join(n.cgroup, "kubepods")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		l.onUndo("cgroup "+d, func() error { return os.Remove(d) })
	}
	p := &Pod{lab: l, Node: n, UID: "0000-test", NetNS: "zwl" + id + "-pod", Spec: PodSpec{Namespace: "ns", Name: "p"}}
	ctx := context.Background()
	if err := run(ctx, "ip", "netns", "add", p.NetNS); err != nil {
		t.Fatal(err)
	}
	l.onUndo("netns", func() error { return run(context.Background(), "ip", "netns", "del", p.NetNS) })
	if err := run(ctx, "ip", "-n", p.NetNS, "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	if err := l.startSandbox(ctx, p); err != nil {
		t.Fatal(err)
	}
	pid := p.sandbox.proc.Cmd.Process.Pid
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	want := "0::/" + strings.TrimPrefix(filepath.Join(n.cgroup, "kubepods", "pod0000-test"), root+"/")
	if !strings.Contains(string(cg), want+"\n") {
		t.Errorf("sandbox pid %d cgroups:\n%swant %s", pid, cg, want)
	}
	self, _ := os.Readlink("/proc/self/ns/net")
	theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if self == theirs || theirs == "" {
		t.Errorf("sandbox network namespace %q, the test's %q", theirs, self)
	}
	// A listener and a connection made in the pod, used here.
	ln, err := p.sandbox.listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("hello from the pod"))
			c.Close()
		}
	}()
	c, err := p.sandbox.dial(ln.Addr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "hello from the pod" {
		t.Errorf("read %q", got)
	}
	// The namespace's loopback is not the test's: the test's listener is
	// not reachable from the pod.
	if _, err := p.sandbox.dial("127.0.0.1:1", time.Second); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("dial to a closed port in the pod: %v, want connection refused", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if _, err := os.Stat(n.cgroup); !os.IsNotExist(err) {
		t.Errorf("node cgroup left: %v", err)
	}
	if left, _ := Leftovers(id); len(left) > 0 {
		t.Errorf("left %v", left)
	}
	if err := p.sandbox.proc.Cmd.Process.Signal(nil); err == nil {
		t.Errorf("sandbox pid %d still running", pid)
	}
}
