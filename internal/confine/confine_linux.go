// Package confine keeps a process that reads Cilium's pinned BPF maps from
// changing them, whatever its code is made to do.
//
// Root with CAP_BPF (what opening Cilium's 0600 pins takes) may open a pin
// for writing even through a read-only bind mount of the BPF filesystem
// (the mount is checked when a path is written, not when a pin is opened),
// and then update or delete entries of the node's policy, conntrack and
// ipcache maps. A seccomp filter sees bpf()'s command but not the file
// flags in its attribute: it can refuse every command that writes, not a
// BPF_OBJ_GET that asks for write access. So the work is split in two
// processes:
//
//   - the parent (Supervise) starts the same command again as its child
//     and then only opens pins for it, always read-only (BPF_F_RDONLY),
//     checks each is a map and hands the child the file descriptor over a
//     socket pair; its own filter allows bpf() to open pins and read their
//     info, nothing else. It reads nothing from the network.
//   - the child (Child) installs, before it reads any input, a filter that
//     allows bpf() only to read an open map (ReadCommands): no BPF_OBJ_GET,
//     so the only map descriptors it can hold are the parent's read-only
//     ones, and no update, delete, map create, program load or pin.
//
// Both filters apply to every thread (SECCOMP_FILTER_FLAG_TSYNC) and to
// every syscall made through another ABI (refused). Other syscalls are not
// filtered here: the container runtime's profile (RuntimeDefault) does that.
package confine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// EnvFD names the child's end of the socket pair in its environment; set
// only by Supervise.
const EnvFD = "ZONEWATCH_CONFINED_FD"

// maxMsg bounds a request (a path) and a reply.
const maxMsg = unix.PathMax + 64

// Opener opens pinned maps through the parent, read-only. It is safe for
// concurrent use.
type Opener struct {
	mu sync.Mutex
	fd int
}

// Child confines this process when it is the child Supervise started: it
// installs the read-only filter and returns the Opener that reaches the
// parent. It returns nil, nil in any other process.
func Child() (*Opener, error) {
	v, ok := os.LookupEnv(EnvFD)
	if !ok {
		return nil, nil
	}
	_ = os.Unsetenv(EnvFD)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q is no file descriptor", EnvFD, v)
	}
	if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_SEQPACKET {
		return nil, fmt.Errorf("%s=%d is not the parent's socket (type %d): %v", EnvFD, fd, typ, err)
	}
	unix.CloseOnExec(fd)
	if err := install(ReadCommands); err != nil {
		return nil, err
	}
	return &Opener{fd: fd}, nil
}

// LoadPinnedMap asks the parent for the map pinned at path, opened
// read-only. An error wraps the parent's errno: a pin that does not exist
// is fs.ErrNotExist, a refusal fs.ErrPermission.
func (o *Opener) LoadPinnedMap(path string) (*ebpf.Map, error) {
	// The parent shares the working folder but takes absolute paths only.
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := unix.Sendmsg(o.fd, []byte(path), nil, nil, 0); err != nil {
		return nil, fmt.Errorf("asking the parent to open %s: %w", path, err)
	}
	buf := make([]byte, maxMsg)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(o.fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("the parent's answer for %s: %w", path, err)
	}
	if n < 4 {
		return nil, fmt.Errorf("the parent's answer for %s: %w", path, errParentGone)
	}
	fds, err := rights(oob[:oobn])
	if err != nil {
		return nil, fmt.Errorf("the parent's answer for %s: %w", path, err)
	}
	if errno := binary.LittleEndian.Uint32(buf[:4]); errno != 0 {
		closeAll(fds)
		return nil, fmt.Errorf("%s: %w", buf[4:n], syscall.Errno(errno))
	}
	if len(fds) != 1 {
		closeAll(fds)
		return nil, fmt.Errorf("the parent's answer for %s carries %d descriptors", path, len(fds))
	}
	m, err := ebpf.NewMapFromFD(fds[0])
	if err != nil {
		return nil, fmt.Errorf("map %s from the parent: %w", path, err)
	}
	return m, nil
}

var errParentGone = errors.New("the parent closed the socket")

func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			closeAll(fds)
			return nil, err
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// Supervise runs this program again (the same executable, arguments and
// environment) as a confined child, opens pins for it read-only until it
// exits, and returns its exit code (128 + the signal when a signal ended
// it). SIGTERM, SIGINT and SIGHUP are passed on to the child; the child is
// killed if this process dies (Pdeathsig).
func Supervise() (int, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 1, fmt.Errorf("socket pair for the confined child: %w", err)
	}
	parent, child := pair[0], os.NewFile(uintptr(pair[1]), "confined-child")
	defer unix.Close(parent)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), EnvFD+"=3")
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Pdeathsig follows the thread that started the child: keep this
	// goroutine on it until the child is gone.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	child.Close()
	if err != nil {
		return 1, fmt.Errorf("starting the confined child: %w", err)
	}
	// After the start: a filter is inherited, and this one would take the
	// child's reads away.
	if err := install(OpenCommands); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return 1, err
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	go serve(parent)
	err = cmd.Wait()
	close(done)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 1, fmt.Errorf("waiting for the confined child: %w", err)
	}
	return 0, nil
}

// serve answers the child's requests until it closes its end: each is a
// path, opened read-only; the answer is an errno (0 with the descriptor)
// and a message.
func serve(fd int) {
	buf := make([]byte, maxMsg)
	for {
		n, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0)
		if err != nil || n == 0 {
			return
		}
		m, err := openReadOnly(string(buf[:n]))
		if err != nil {
			reply := binary.LittleEndian.AppendUint32(nil, uint32(errnoOf(err)))
			reply = append(reply, err.Error()...)
			if len(reply) > maxMsg {
				reply = reply[:maxMsg]
			}
			if unix.Sendmsg(fd, reply, nil, nil, 0) != nil {
				return
			}
			continue
		}
		err = unix.Sendmsg(fd, make([]byte, 4), unix.UnixRights(m.FD()), nil, 0)
		m.Close()
		if err != nil {
			return
		}
	}
}

// openReadOnly opens the pin at path with BPF_F_RDONLY and keeps it only
// when it is a map: a program or link descriptor is not handed out.
func openReadOnly(path string) (*ebpf.Map, error) {
	if len(path) == 0 || path[0] != '/' {
		return nil, fmt.Errorf("pin path %q is not absolute: %w", path, unix.EINVAL)
	}
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("opening pinned map %s read-only: %w", path, err)
	}
	return m, nil
}

// errnoOf is err's errno, EINVAL when it carries none (a pin that is not
// a map).
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) && errno != 0 {
		return errno
	}
	return unix.EINVAL
}
