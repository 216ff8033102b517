package confine

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ReadCommands are the bpf() commands the readers use once a map is open
// (cilium/ebpf's Map.BatchLookup, Map.Iterate and Map.Info, and the
// map-info read that ebpf.NewMapFromFD does). Nothing else passes the
// child's filter: no BPF_OBJ_GET (the parent opens every pin, read-only),
// no update, delete, map create, program load or pin.
var ReadCommands = []uint32{
	unix.BPF_MAP_LOOKUP_ELEM,
	unix.BPF_MAP_GET_NEXT_KEY,
	unix.BPF_OBJ_GET_INFO_BY_FD,
	unix.BPF_MAP_LOOKUP_BATCH,
}

// OpenCommands is what the parent's own filter lets through: it only
// opens pins (and reads their type and sizes to check they are maps).
var OpenCommands = []uint32{
	unix.BPF_OBJ_GET,
	unix.BPF_OBJ_GET_INFO_BY_FD,
}

// nativeArch is the audit architecture of the syscalls this binary makes;
// a syscall made through another ABI (int 0x80 on amd64) carries another
// and is refused whatever it is.
var nativeArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}

// x32SyscallBit marks amd64's x32 ABI syscalls, which share
// AUDIT_ARCH_X86_64 and would otherwise slip past the number check.
const x32SyscallBit = 0x40000000

// seccomp_data offsets (include/uapi/linux/seccomp.h): nr, arch, and the
// low 32 bits of args[0] on a little-endian machine (the kernel reads
// bpf()'s cmd as an int, so the high bits do not matter).
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16
)

// Program returns the seccomp filter that lets bpf() through for the
// given commands only (EPERM for any other) and leaves every other
// syscall alone.
func Program(allowed []uint32) ([]unix.SockFilter, error) {
	arch, ok := nativeArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("no seccomp filter for %s", runtime.GOARCH)
	}
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jgeK = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		retK = unix.BPF_RET | unix.BPF_K
	)
	allow := unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ALLOW}
	deny := unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)&unix.SECCOMP_RET_DATA}
	// The jumps count instructions from the next one; the program is laid
	// out as: checks, then the allowed commands, then deny, then allow.
	n := len(allowed)
	prog := []unix.SockFilter{
		{Code: ldW, K: offArch},
		{Code: jeqK, K: arch, Jt: 1}, // native: skip the deny below
		deny,
		{Code: ldW, K: offNr},
		{Code: jgeK, K: x32SyscallBit, Jt: uint8(n + 2)}, // x32: to deny
		{Code: jeqK, K: unix.SYS_BPF, Jf: uint8(n + 2)},  // not bpf(): to allow
		{Code: ldW, K: offArg0},
	}
	for i, cmd := range allowed {
		prog = append(prog, unix.SockFilter{Code: jeqK, K: cmd, Jt: uint8(n - i)}) // to allow
	}
	return append(prog, deny, allow), nil
}

// install applies the filter to every thread of the process
// (SECCOMP_FILTER_FLAG_TSYNC: the Go runtime runs goroutines on threads it
// has already started), after setting no_new_privs, which an unprivileged
// process needs to install a filter and the kernel passes to every thread
// with TSYNC. A filter cannot be removed: it holds until the process ends.
func install(allowed []uint32) error {
	prog, err := Program(allowed)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("installing the seccomp filter: thread %d could not take it", r)
	}
	return nil
}
