package ciliumlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A pod's processes run as a kubelet runs a container's: in a cgroup of
// their own under the node's cgroup root (the agent's --cgroup-root, where
// Cilium attaches its socket load balancer: cgroup/connect4, sendmsg4,
// recvmsg4, getpeername4) and in the pod's network namespace. Without it
// Cilium's socket LB never sees the pod's connections: a ClusterIP is not
// translated at connect and the datapath sees the VIP (docs/hubble.md, "On
// real Cilium agents").
//
// The lab's traffic is made by the test process, so each pod gets one
// sandbox process, started by clone3 straight into the pod's cgroup
// (CLONE_INTO_CGROUP) and entering the pod's network namespace: it opens
// the pod's sockets (listen, connect) and hands each to the test process
// over a unix socket (SCM_RIGHTS). A socket belongs to the cgroup and the
// network namespace of the process that created it, for its whole life,
// whoever reads and writes it later. The sandbox is the same binary as the
// test (os.Executable), which serves when it finds sandboxEnv set; it ends
// when the test process closes its end of the control socket.

// sandboxEnv marks the sandbox process (the control socket is fd 3).
const sandboxEnv = "ZONEWATCH_CILIUMLAB_SANDBOX"

func init() {
	if os.Getenv(sandboxEnv) == "" {
		return
	}
	os.Exit(serveSandbox(3))
}

// serveSandbox answers requests on the control socket until it closes.
// A request is "listen ADDR" or "dial ADDR TIMEOUT_NS"; the reply is "ok"
// with the socket's descriptor, or "err KIND TEXT" (KIND "timeout" or
// "other").
func serveSandbox(fd int) int {
	buf := make([]byte, 512)
	for {
		n, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0)
		if err != nil || n == 0 {
			return 0
		}
		f := strings.Fields(string(buf[:n]))
		var sock interface {
			File() (*os.File, error)
			Close() error
		}
		var oerr error
		switch {
		case len(f) == 2 && f[0] == "listen":
			var ln net.Listener
			ln, oerr = net.Listen("tcp4", f[1])
			if oerr == nil {
				sock = ln.(*net.TCPListener)
			}
		case len(f) == 3 && f[0] == "dial":
			ns, _ := strconv.ParseInt(f[2], 10, 64)
			var c net.Conn
			c, oerr = net.DialTimeout("tcp4", f[1], time.Duration(ns))
			if oerr == nil {
				sock = c.(*net.TCPConn)
			}
		default:
			oerr = fmt.Errorf("bad request %q", buf[:n])
		}
		if oerr != nil {
			kind := "other"
			var ne net.Error
			if errors.As(oerr, &ne) && ne.Timeout() {
				kind = "timeout"
			}
			if err := unix.Sendmsg(fd, []byte("err "+kind+" "+errText(oerr)), nil, nil, 0); err != nil {
				return 1
			}
			continue
		}
		file, err := sock.File()
		if err == nil {
			err = unix.Sendmsg(fd, []byte("ok"), unix.UnixRights(int(file.Fd())), nil, 0)
			file.Close()
		} else {
			err = unix.Sendmsg(fd, []byte("err other "+err.Error()), nil, nil, 0)
		}
		// The test process holds the socket now; the sandbox's copies go.
		sock.Close()
		if err != nil {
			return 1
		}
	}
}

// sandbox is a pod's socket-making process.
type sandbox struct {
	pod    *Pod
	cgroup string // the pod's cgroup, a directory under the node's
	proc   *Proc
	mu     sync.Mutex // one request at a time on ctl
	ctl    int        // the test process's end of the control socket
	closed bool
}

// sandboxErr is a failure the sandbox reported.
type sandboxErr struct {
	text    string
	timeout bool
}

func (e *sandboxErr) Error() string   { return e.text }
func (e *sandboxErr) Timeout() bool   { return e.timeout }
func (e *sandboxErr) Temporary() bool { return false }

// startSandbox makes the pod's cgroup under the node's cgroup root
// (kubepods/pod<UID>, as the kubelet's cgroupfs driver names it) and
// starts the pod's sandbox in it and in the pod's network namespace. Close
// (or Delete) stops the process by its pid and removes the cgroup.
func (l *Lab) startSandbox(ctx context.Context, p *Pod) error {
	n := p.Node
	cg := filepath.Join(n.cgroup, "kubepods", "pod"+string(p.UID))
	if err := os.Mkdir(cg, 0o755); err != nil {
		return fmt.Errorf("cgroup of pod %s: %w", p.Ref(), err)
	}
	s := &sandbox{pod: p, cgroup: cg, ctl: -1}
	l.onUndo("cgroup "+cg, s.removeCgroup)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	child := os.NewFile(uintptr(fds[1]), "sandbox-ctl")
	defer child.Close()
	s.ctl = fds[0]
	cgfd, err := unix.Open(cg, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(s.ctl)
		return err
	}
	defer unix.Close(cgfd)
	logPath := filepath.Join(n.Dir, "pod-"+p.Spec.Namespace+"-"+p.Spec.Name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		unix.Close(s.ctl)
		return err
	}
	cmd := exec.Command("nsenter", "--net="+filepath.Join("/run/netns", p.NetNS), "--", exe)
	cmd.Env = []string{sandboxEnv + "=1", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, UseCgroupFD: true, CgroupFD: cgfd}
	if err := cmd.Start(); err != nil {
		logf.Close()
		unix.Close(s.ctl)
		return fmt.Errorf("starting the sandbox of %s in %s: %w", p.Ref(), cg, err)
	}
	s.proc = &Proc{Name: "sandbox of " + p.Ref(), Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() { s.proc.err = cmd.Wait(); logf.Close(); close(s.proc.done) }()
	l.track(s.proc)
	l.onUndo(fmt.Sprintf("sandbox of %s (pid %d)", p.Ref(), cmd.Process.Pid), s.stop)
	p.sandbox = s
	// Ready when it answers: a listen on an unused loopback port.
	if _, err := s.listen("127.0.0.1:0"); err != nil {
		return fmt.Errorf("the sandbox of %s does not answer: %w; log: %s", p.Ref(), err, tailFile(logPath, 1000))
	}
	_ = ctx
	return nil
}

// request sends one request and returns the socket it made.
func (s *sandbox) request(req string) (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("pod %s is stopped", s.pod.Ref())
	}
	if err := unix.Sendmsg(s.ctl, []byte(req), nil, nil, 0); err != nil {
		return nil, fmt.Errorf("sandbox of %s: %w", s.pod.Ref(), err)
	}
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(s.ctl, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil || n == 0 {
		return nil, fmt.Errorf("sandbox of %s gone (%v): %s", s.pod.Ref(), err, tailFile(s.proc.Log, 500))
	}
	reply := string(buf[:n])
	if rest, ok := strings.CutPrefix(reply, "err "); ok {
		kind, text, _ := strings.Cut(rest, " ")
		return nil, &sandboxErr{text: text, timeout: kind == "timeout"}
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("sandbox of %s: no socket in its reply %q (%v)", s.pod.Ref(), reply, err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("sandbox of %s: %v", s.pod.Ref(), err)
	}
	return os.NewFile(uintptr(fds[0]), "pod-socket"), nil
}

func (s *sandbox) listen(addr string) (net.Listener, error) {
	f, err := s.request("listen " + addr)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return net.FileListener(f)
}

func (s *sandbox) dial(addr string, timeout time.Duration) (net.Conn, error) {
	f, err := s.request(fmt.Sprintf("dial %s %d", addr, timeout.Nanoseconds()))
	if err != nil {
		var se *sandboxErr
		if errors.As(err, &se) {
			// The sandbox's text is errText's "op: error"; keep the shape.
			op, text, ok := strings.Cut(se.text, ": ")
			if !ok {
				op, text = "dial", se.text
			}
			return nil, &net.OpError{Op: op, Net: "tcp4", Err: &sandboxErr{text: text, timeout: se.timeout}}
		}
		return nil, err
	}
	defer f.Close()
	return net.FileConn(f)
}

// stop ends the sandbox (the pod's containers stop): its control socket
// closes, it exits; SIGKILL by pid after 5 s.
func (s *sandbox) stop() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		unix.Close(s.ctl)
	}
	s.mu.Unlock()
	if s.proc == nil {
		return nil
	}
	select {
	case <-s.proc.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(s.proc.Cmd.Process.Pid, syscall.SIGKILL)
		<-s.proc.done
	}
	return nil
}

// removeCgroup removes the pod's cgroup. Only the lab's own processes are
// ever in it (the sandbox, by pid); any left are killed by pid first.
func (s *sandbox) removeCgroup() error {
	if _, err := os.Stat(s.cgroup); os.IsNotExist(err) {
		return nil
	}
	for range 50 {
		err := os.Remove(s.cgroup)
		if err == nil || os.IsNotExist(err) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		b, _ := os.ReadFile(filepath.Join(s.cgroup, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("cgroup %s still busy", s.cgroup)
}
