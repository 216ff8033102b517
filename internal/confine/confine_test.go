package confine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// helperEnv makes a start of this test binary the process under test:
// Supervise in it, and then Child in the child Supervise starts.
const helperEnv = "ZONEWATCH_CONFINE_TEST_PIN"

// TestConfinedChild runs Supervise and Child as the exporter does, as root
// with every capability, against a hash map pinned in a real BPF
// filesystem: the child reads the map through the parent, and every way
// it has to change it or make a program is refused.
func TestConfinedChild(t *testing.T) {
	if pin := os.Getenv(helperEnv); pin != "" {
		os.Exit(helper(pin))
	}
	testenv.Integration(t)
	testenv.Root(t, "pinning a BPF map needs root")
	dir := t.TempDir()
	if err := syscall.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		testenv.Unmet(t, fmt.Sprintf("mounting a bpffs: %v", err))
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Put(uint32(1), uint32(7)); err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(dir, "m")
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestConfinedChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+pin)
	out, err := cmd.CombinedOutput()
	t.Logf("confined child:\n%s", out)
	if err != nil {
		t.Fatalf("the supervised child: %v", err)
	}
	for _, want := range []string{"read 1=7", "update: operation not permitted", "delete: operation not permitted",
		"open for writing: operation not permitted", "map create: operation not permitted",
		"program load: operation not permitted", "pin: operation not permitted", "absent pin: not exist"} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("the child's output lacks %q", want)
		}
	}
	var v uint32
	if err := m.Lookup(uint32(1), &v); err != nil || v != 7 {
		t.Errorf("key 1 after the child: %d, %v; want 7", v, err)
	}
	if err := m.Lookup(uint32(2), &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("key 2 after the child: %d, %v; want no entry", v, err)
	}
}

// helper is the process under test: the parent until it starts its
// child, then (in the child) the attempts, one line each.
func helper(pin string) int {
	op, err := Child()
	if err != nil {
		fmt.Println("child:", err)
		return 1
	}
	if op == nil {
		code, err := Supervise()
		if err != nil {
			fmt.Println("supervise:", err)
		}
		return code
	}
	m, err := op.LoadPinnedMap(pin)
	if err != nil {
		fmt.Println("open through the parent:", err)
		return 1
	}
	var v uint32
	if err := m.Lookup(uint32(1), &v); err != nil {
		fmt.Println("read:", err)
		return 1
	}
	fmt.Printf("read 1=%d\n", v)
	report := func(what string, err error) {
		if err == nil {
			fmt.Println(what + ": succeeded")
			return
		}
		if errors.Is(err, syscall.EPERM) {
			fmt.Println(what + ": operation not permitted")
			return
		}
		fmt.Printf("%s: %v\n", what, err)
	}
	report("update", m.Put(uint32(1), uint32(8)))
	report("delete", m.Delete(uint32(1)))
	rw, err := ebpf.LoadPinnedMap(pin, nil)
	if err == nil {
		rw.Close()
	}
	report("open for writing", err)
	nm, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err == nil {
		nm.Close()
	}
	report("map create", err)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "MIT",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 0, asm.DWord), asm.Return()}})
	if err == nil {
		prog.Close()
	}
	report("program load", err)
	report("pin", m.Pin(filepath.Join(filepath.Dir(pin), "evil")))
	if _, err := op.LoadPinnedMap(filepath.Join(filepath.Dir(pin), "absent")); errors.Is(err, fs.ErrNotExist) {
		fmt.Println("absent pin: not exist")
	} else {
		fmt.Println("absent pin:", err)
	}
	return 0
}
