package ciliumlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestSweepStaleLeftovers: what a dead lab left (a namespace with a process
// in it, a link, a node cgroup with a pod cgroup and a process in it) is
// gone after a new lab's sweep under the lock, its processes killed; a
// lab that left nothing is not swept.
func TestSweepStaleLeftovers(t *testing.T) {
	testenv.Integration(t)
	testenv.Root(t, "the sweep needs root (network namespaces, links, cgroups)")
	root, err := cgroup2Root()
	if err != nil {
		testenv.Unmet(t, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := &Lab{cfg: Config{Logf: t.Logf}, pods: map[string]*Pod{}}
	if err := l.lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if left, err := Leftovers(""); err != nil || len(left) > 0 {
		t.Fatalf("leftovers before the test: %v (%v): not the test's to remove", left, err)
	}
	if err := l.sweepStale(ctx); err != nil {
		t.Fatalf("nothing to sweep: %v", err)
	}

	id := fmt.Sprintf("d%03x", os.Getpid()&0xfff)
	ns, link := "zwl"+id+"-gpu-a1", "zwl"+id+"h0"
	cg := filepath.Join(root, "zwl"+id+"-gpu-a1")
	// Whatever the test fails on, nothing stays.
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", ns).Run()
		_ = exec.Command("ip", "link", "del", link).Run()
		_ = removeCgroupTree(cg, time.Now().Add(5*time.Second))
	})
	// The host end of a veth whose other end is in the namespace, as a
	// lab's node has it.
	for _, c := range [][]string{{"ip", "netns", "add", ns}, {"ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", c, err, out)
		}
	}
	if err := os.MkdirAll(filepath.Join(cg, "kubepods"), 0o755); err != nil {
		t.Fatal(err)
	}
	inNS := exec.Command("ip", "netns", "exec", ns, "sleep", "600")
	inCgroup := exec.Command("sleep", "600")
	var waits []chan error
	for _, c := range []*exec.Cmd{inNS, inCgroup} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func(c *exec.Cmd) { done <- c.Wait() }(c)
		waits = append(waits, done)
		t.Cleanup(func() { _ = c.Process.Kill() })
	}
	if err := os.WriteFile(filepath.Join(cg, "kubepods", "cgroup.procs"), []byte(strconv.Itoa(inCgroup.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	// ip netns exec has become sleep in the namespace once its netns is
	// the namespace's.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		if len(parsePids(string(out))) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process in %s", ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
	left, err := Leftovers("")
	if err != nil || len(left) != 3 {
		t.Fatalf("made 3 leftovers, Leftovers says %v (%v)", left, err)
	}

	if err := l.sweepStale(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := Leftovers(""); err != nil || len(left) > 0 {
		t.Errorf("after the sweep: %v (%v)", left, err)
	}
	for i, done := range waits {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("process %d of the dead lab still runs", i)
		}
	}
}
