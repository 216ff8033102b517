package ciliumlab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sweepStale removes what a lab that died without its undo left on the
// machine: its test binary was killed, or panicked in another test while
// the lab was up (a panic ends the process; other tests' cleanups never
// run). It runs under the lab lock, which a live lab holds from before it
// makes anything until after it removed everything, so every zwl*
// namespace, link and cgroup is a dead lab's. Left there, its bridge holds
// the lab's fixed host address (10.213.0.1) and the new lab's agents
// cannot reach the apiserver ("i/o timeout"). The dead lab's processes
// in those namespaces and cgroups are killed first, by pid; its processes
// outside them (a test's etcd and kube-apiserver) are not the lab's to
// name and stay.
func (l *Lab) sweepStale(ctx context.Context) error {
	left, err := Leftovers("")
	if err != nil || len(left) == 0 {
		return err
	}
	l.cfg.Logf("a dead lab's leftovers (no lab holds %s): removing %s", lockPath, strings.Join(left, ", "))
	var errs []error
	// Processes first: in each namespace and cgroup, by pid.
	for _, item := range left {
		kind, name, _ := strings.Cut(item, " ")
		var pids []int
		switch kind {
		case "netns":
			out, err := output(ctx, nil, "ip", "netns", "pids", name)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", item, err))
				continue
			}
			pids = parsePids(string(out))
		case "cgroup":
			b, err := os.ReadFile(filepath.Join(name, "cgroup.procs"))
			if err == nil {
				pids = parsePids(string(b))
			}
			// Its children's processes too (the pods' cgroups below the node's).
			_ = filepath.WalkDir(name, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() && p != name {
					if b, err := os.ReadFile(filepath.Join(p, "cgroup.procs")); err == nil {
						pids = append(pids, parsePids(string(b))...)
					}
				}
				return nil
			})
		}
		for _, pid := range pids {
			if pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// Then what held them, once the kernel reaped the processes.
	deadline := time.Now().Add(10 * time.Second)
	for _, item := range left {
		kind, name, _ := strings.Cut(item, " ")
		switch kind {
		case "netns":
			if err := run(ctx, "ip", "netns", "del", name); err != nil {
				errs = append(errs, err)
			}
		case "link":
			// A veth goes with its peer's namespace: gone already is fine.
			if err := run(ctx, "ip", "link", "del", name); err != nil && linkExists(name) {
				errs = append(errs, err)
			}
		case "cgroup":
			if err := removeCgroupTree(name, deadline); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if still, err := Leftovers(""); err != nil || len(still) > 0 {
		errs = append(errs, fmt.Errorf("still there after the sweep: %v (%v)", still, err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing a dead lab's leftovers: %w", errors.Join(errs...))
	}
	return nil
}

func parsePids(s string) []int {
	var out []int
	for _, f := range strings.Fields(s) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

// removeCgroupTree removes a cgroup and its children, deepest first,
// retrying until deadline while killed processes are still being reaped.
func removeCgroupTree(root string, deadline time.Time) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		for {
			err := os.Remove(dirs[i])
			if err == nil || os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cgroup %s: %w", dirs[i], err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}
