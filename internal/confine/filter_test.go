package confine

import (
	"encoding/binary"
	"runtime"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestProgram runs the filter in x/net/bpf's classic BPF machine on the
// seccomp_data of the syscalls that matter: the allowed bpf() commands
// pass, every other bpf() command gets EPERM, other syscalls pass, and a
// syscall through another ABI gets EPERM whatever it is. The machine loads
// words big-endian where the kernel loads them in the host's order, so the
// test writes each 32-bit word big-endian at the offset the kernel reads.
func TestProgram(t *testing.T) {
	arch, ok := nativeArch[runtime.GOARCH]
	if !ok {
		t.Skipf("no seccomp filter for %s", runtime.GOARCH)
	}
	prog, err := Program(ReadCommands)
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]bpf.RawInstruction, len(prog))
	for i, f := range prog {
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatalf("the filter has instructions x/net/bpf does not know: %v", insns)
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	const (
		allow = unix.SECCOMP_RET_ALLOW
		eperm = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	)
	run := func(arch, nr uint32, arg0 uint64) uint32 {
		data := make([]byte, 64) // struct seccomp_data: nr, arch, ip, args[6]
		binary.BigEndian.PutUint32(data[offNr:], nr)
		binary.BigEndian.PutUint32(data[offArch:], arch)
		binary.BigEndian.PutUint32(data[offArg0:], uint32(arg0))
		binary.BigEndian.PutUint32(data[offArg0+4:], uint32(arg0>>32))
		ret, err := vm.Run(data)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(ret)
	}
	allowed := map[uint32]bool{}
	for _, c := range ReadCommands {
		allowed[c] = true
	}
	// Every bpf() command the kernel knows today (0 .. BPF_TOKEN_CREATE)
	// and a few past it.
	for cmd := uint32(0); cmd < 48; cmd++ {
		want := uint32(eperm)
		if allowed[cmd] {
			want = allow
		}
		if got := run(arch, unix.SYS_BPF, uint64(cmd)); got != want {
			t.Errorf("bpf(%d): %#x, want %#x", cmd, got, want)
		}
	}
	// The kernel reads the command as an int: high bits set on an allowed
	// one change nothing, and on a refused one refuse it still.
	if got := run(arch, unix.SYS_BPF, 1<<32|unix.BPF_MAP_LOOKUP_ELEM); got != allow {
		t.Errorf("bpf(1<<32 | BPF_MAP_LOOKUP_ELEM): %#x, want allow", got)
	}
	if got := run(arch, unix.SYS_BPF, 1<<32|unix.BPF_MAP_UPDATE_ELEM); got != eperm {
		t.Errorf("bpf(1<<32 | BPF_MAP_UPDATE_ELEM): %#x, want EPERM", got)
	}
	for _, nr := range []uint32{unix.SYS_READ, unix.SYS_MMAP, unix.SYS_FUTEX, unix.SYS_SECCOMP} {
		if got := run(arch, nr, unix.BPF_MAP_UPDATE_ELEM); got != allow {
			t.Errorf("syscall %d: %#x, want allow", nr, got)
		}
	}
	if got := run(arch, x32SyscallBit|unix.SYS_BPF, unix.BPF_MAP_LOOKUP_ELEM); got != eperm {
		t.Errorf("an x32 syscall: %#x, want EPERM", got)
	}
	for _, other := range []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_ARM, unix.AUDIT_ARCH_X86_64 ^ unix.AUDIT_ARCH_AARCH64 ^ arch} {
		if got := run(other, unix.SYS_READ, 0); got != eperm {
			t.Errorf("a syscall of arch %#x: %#x, want EPERM", other, got)
		}
	}
}
