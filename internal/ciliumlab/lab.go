// Package ciliumlab runs real Cilium agents (cilium-agent, cilium-cni and
// hubble-relay built by `make tools` from the v1.20.2 module) as Kubernetes
// nodes on one machine, without Docker or a kubelet.
//
// A node is a network namespace with its own mount namespace: its own /run
// (the agent hard-codes /var/run/cilium), its own BPF filesystem on
// /sys/fs/bpf, a cgroup2 sub-hierarchy and a node IP on a veth to a bridge
// the lab creates. Inside a node the agent's and the exporter's default
// paths (/var/run/cilium/hubble.sock, /sys/fs/bpf/tc/globals) are the real
// ones. A pod is a network namespace wired by cilium-cni ADD and removed by
// DEL, as the kubelet calls it; its Pod object carries the IP the CNI
// returned; its sockets are made by a process of its own in a cgroup under
// the node's cgroup root (sandbox.go), as a container's are. A pod is bound by the lab (AddPod) or created unbound and
// placed by a scheduler running against the apiserver (SchedulePods: the
// lab wires it on the node of its Binding, as a kubelet would; RunPods
// does the same for the pods a controller makes); nodes
// carry allocatable resources and taints for it. Nodes talk over VXLAN or,
// with Config.Routing native, directly over the bridge; Config.ServiceLB
// picks what translates ClusterIPs (socket or tc LB of kube-proxy
// replacement, or the real kube-proxy in iptables mode).
//
// Everything the lab makes (processes, namespaces, links, mounts, cgroups,
// Kubernetes objects it does not leave to the apiserver's own cleanup) is
// recorded when made and undone by Close in reverse order, by name or id,
// even after a failed start. docs/hubble.md ("On real Cilium agents")
// says what the lab's test proves; it needs root, iproute2, util-linux and
// a kernel with tcx and VXLAN.
package ciliumlab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// NodeSpec is one node of the lab.
type NodeSpec struct {
	Name string
	Zone string
	// What a scheduler needs of the node, set as the kubelet and the
	// device plugin set them: allocatable (and capacity) CPU, memory and
	// nvidia.com/gpu, and the node's taints. Empty CPU and Memory leave
	// the node without allocatable resources (only pods bound by the lab
	// itself, AddPod, run there).
	CPU, Memory string
	GPUs        int64
	Labels      map[string]string
	Taints      []corev1.Taint
}

// Config is what Start needs.
type Config struct {
	// Cilium is the folder `make tools` builds (.tools/bin/cilium):
	// cilium-agent, cilium-cni, hubble-relay, lib/bpf, llvm/ and crds/.
	Cilium string
	// Dir is a folder the lab owns (node state, logs); the caller removes it.
	Dir string
	// API is an admin config of the kube-apiserver; APIURL its address on
	// the host's loopback, which the lab forwards to from the bridge.
	API *rest.Config
	// Region labels every node (topology.kubernetes.io/region).
	Region string
	Nodes  []NodeSpec
	// Relay makes every agent serve Hubble's peer service and gRPC on
	// :4244 (plain text), which hubble-relay needs.
	Relay bool
	// HubbleTLS makes every agent serve Hubble's gRPC on :4244 with TLS
	// and mutual authentication, as Cilium's chart does by default
	// (hubble.tls.enabled): the lab issues the certificates
	// (Lab.HubbleTLS). Not with Relay.
	HubbleTLS bool
	// HubbleSocketDir is the folder of the agents' Hubble socket
	// (Cilium's hubble.socketPath; DefaultHubbleSocketDir when empty): a
	// folder of its own keeps the agent's API socket out of a pod that
	// mounts it.
	HubbleSocketDir string
	// Routing is the agents' routing mode (RoutingTunnel when empty).
	Routing Routing
	// ServiceLB is what translates ClusterIPs (ServiceLBNone when empty;
	// ServiceLBKubeProxy starts kube-proxy on every node).
	ServiceLB ServiceLB
	// KubeProxy is the kube-proxy binary for ServiceLBKubeProxy (default:
	// kube-proxy beside the Cilium folder, .tools/bin/kube-proxy).
	KubeProxy string
	// Logf receives the lab's progress lines; nil discards them.
	Logf func(format string, args ...any)
	// ID names everything the lab makes (zwl<ID>...): up to 4 letters or
	// digits; empty picks a random one.
	ID string
}

// Lab is a running set of nodes.
type Lab struct {
	cfg    Config
	ID     string
	Bridge string
	// HostIP is the bridge's address: the host as the nodes see it.
	HostIP netip.Addr
	// APIAddr is the forwarder to the apiserver on the bridge.
	APIAddr string
	Nodes   []*Node
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// StartTime is how long Start took, from nothing to every agent ready
	// and knowing every node.
	StartTime time.Duration
	// Version is the Cilium version of the agents ("1.18.11"), from the
	// Cilium folder's build stamp; empty when it has none.
	Version string

	mu       sync.Mutex
	undo     []undoStep
	procs    []*Proc
	pods     map[string]*Pod
	lockFile *os.File
	tls      *HubbleTLSFiles
	// slowestSettle is the slowest SettledIdentity seen.
	slowestSettle struct {
		pod  string
		took time.Duration
	}
}

type undoStep struct {
	what string
	fn   func() error
}

// Addresses: the bridge is 10.213.0.1/24, node i (from 0) 10.213.0.(11+i),
// its pod CIDR 10.214.(1+i).0/24. One lab runs at a time on a machine (a
// lock file serialises them), so the fixed ranges cannot collide.
var (
	bridgeNet = netip.MustParsePrefix("10.213.0.1/24")
)

func nodeIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 213, 0, byte(11 + i)}) }
func podCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 214, byte(1 + i), 0}), 24)
}

// lockPath serialises labs on one machine (fixed address ranges, host BPF).
const lockPath = "/run/lock/zonewatch-ciliumlab.lock"

// Start brings up the bridge, the nodes and their agents, and returns once
// every agent reports Ok and knows every node. On error everything made so
// far is already undone.
func Start(ctx context.Context, cfg Config) (l *Lab, err error) {
	began := time.Now()
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	for _, b := range []string{"cilium-agent", "cilium-cni", "lib/bpf", "llvm/clang", "llvm/llc", "crds"} {
		if _, err := os.Stat(filepath.Join(cfg.Cilium, b)); err != nil {
			return nil, fmt.Errorf("cilium tools: %w (make tools builds them)", err)
		}
	}
	for _, b := range []string{"ip", "nsenter", "mount"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("the lab needs %s (iproute2, util-linux): %w", b, err)
		}
	}
	id := cfg.ID
	if id == "" {
		idb := make([]byte, 2)
		_, _ = rand.Read(idb)
		id = hex.EncodeToString(idb)
	}
	if len(id) > 4 {
		return nil, fmt.Errorf("lab id %q: at most 4 characters (interface names)", id)
	}
	if _, err := cfg.routingArgs(); err != nil {
		return nil, err
	}
	if _, err := cfg.serviceArgs(); err != nil {
		return nil, err
	}
	if cfg.Relay && cfg.HubbleTLS {
		return nil, fmt.Errorf("the lab's Relay follows the agents without TLS: Config.Relay and Config.HubbleTLS exclude each other")
	}
	if d := cfg.HubbleSocketDir; d != "" && (!filepath.IsAbs(d) || !strings.HasPrefix(filepath.Clean(d), "/var/run/cilium")) {
		return nil, fmt.Errorf("HubbleSocketDir %q: a folder under /var/run/cilium (the node's own)", d)
	}
	if cfg.ServiceLB == ServiceLBKubeProxy {
		if _, err := os.Stat(cfg.kubeProxyBin()); err != nil {
			return nil, fmt.Errorf("kube-proxy: %w (make tools builds it)", err)
		}
		if _, err := exec.LookPath("iptables-restore"); err != nil {
			return nil, fmt.Errorf("kube-proxy's iptables mode needs iptables (make tools installs it): %w", err)
		}
	}
	l = &Lab{cfg: cfg, ID: id, pods: map[string]*Pod{}, Version: agentVersion(cfg.Cilium)}
	l.Bridge = "zwl" + l.ID
	l.HostIP = bridgeNet.Addr()
	defer func() {
		if err != nil {
			if cerr := l.Close(); cerr != nil {
				err = fmt.Errorf("%w (and cleaning up: %v)", err, cerr)
			}
			l = nil
		}
	}()
	if err := l.lock(ctx); err != nil {
		return l, err
	}
	if err := l.sweepStale(ctx); err != nil {
		return l, err
	}
	// Cilium's CRDs use the schema format idn-hostname, which the
	// apiserver answers with a warning on each create: not ours to act on.
	api := rest.CopyConfig(cfg.API)
	api.WarningHandler = rest.NoWarnings{}
	if l.Client, err = kubernetes.NewForConfig(api); err != nil {
		return l, err
	}
	if l.Dynamic, err = dynamic.NewForConfig(api); err != nil {
		return l, err
	}
	if err := l.startBridge(ctx); err != nil {
		return l, err
	}
	if err := l.forwardAPI(); err != nil {
		return l, err
	}
	if err := l.installCRDs(ctx); err != nil {
		return l, err
	}
	if cfg.HubbleTLS {
		if l.tls, err = issueHubbleTLS(filepath.Join(cfg.Dir, "hubble-tls"), cfg.Nodes); err != nil {
			return l, err
		}
	}
	for i, spec := range cfg.Nodes {
		n, err := l.addNode(ctx, i, spec)
		if err != nil {
			return l, fmt.Errorf("node %s: %w", spec.Name, err)
		}
		l.Nodes = append(l.Nodes, n)
	}
	// The agents start together (BPF compiles once per node, in parallel).
	errs := make([]error, len(l.Nodes))
	var wg sync.WaitGroup
	for i, n := range l.Nodes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = n.startAgent(ctx) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return l, err
	}
	for _, n := range l.Nodes {
		if err := n.waitNodes(ctx, len(l.Nodes)); err != nil {
			return l, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if cfg.ServiceLB == ServiceLBKubeProxy {
		for _, n := range l.Nodes {
			if err := n.startKubeProxy(ctx, cfg.kubeProxyBin()); err != nil {
				return l, fmt.Errorf("node %s: %w", n.Name, err)
			}
		}
	}
	l.StartTime = time.Since(began)
	cfg.Logf("lab %s: %d nodes ready in %s", l.ID, len(l.Nodes), l.StartTime.Round(time.Millisecond))
	return l, nil
}

// Node returns the node of that name, or nil.
func (l *Lab) Node(name string) *Node {
	for _, n := range l.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Routing is the agents' routing mode.
func (l *Lab) Routing() Routing {
	if l.cfg.Routing == "" {
		return RoutingTunnel
	}
	return l.cfg.Routing
}

// Dir is the lab's folder.
func (l *Lab) Dir() string { return l.cfg.Dir }

// Logf writes a progress line.
func (l *Lab) Logf(format string, args ...any) { l.cfg.Logf(format, args...) }

// onUndo records how to undo something just made.
func (l *Lab) onUndo(what string, fn func() error) {
	l.mu.Lock()
	l.undo = append(l.undo, undoStep{what, fn})
	l.mu.Unlock()
}

// Close undoes everything the lab made, last first, and returns every
// failure. It can be called more than once.
func (l *Lab) Close() error {
	if pod, took := l.SlowestSettle(); pod != "" {
		l.Logf("slowest identity settle of the lab: %s, %s", pod, took.Round(time.Millisecond))
	}
	l.mu.Lock()
	steps := l.undo
	l.undo = nil
	l.mu.Unlock()
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		if err := steps[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("undo %s: %w", steps[i].what, err))
		}
	}
	return errors.Join(errs...)
}

func (l *Lab) lock(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return fmt.Errorf("locking %s: %w", lockPath, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return fmt.Errorf("another Cilium lab holds %s: %w", lockPath, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	l.lockFile = f
	l.onUndo("lock "+lockPath, func() error { return f.Close() })
	return nil
}

// run runs a command to completion and returns its combined output in the error.
func run(ctx context.Context, name string, args ...string) error {
	_, err := output(ctx, nil, name, args...)
	return err
}

func output(ctx context.Context, stdin io.Reader, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = stdin
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return []byte(out.String()), fmt.Errorf("%s %s: %w: %s%s", name, strings.Join(args, " "), err, stderr.String(), out.String())
	}
	return []byte(out.String()), nil
}

// startBridge creates the bridge the nodes' veths plug into.
func (l *Lab) startBridge(ctx context.Context) error {
	if err := run(ctx, "ip", "link", "add", l.Bridge, "type", "bridge"); err != nil {
		return err
	}
	l.onUndo("bridge "+l.Bridge, func() error { return run(context.Background(), "ip", "link", "del", l.Bridge) })
	if err := run(ctx, "ip", "addr", "add", bridgeNet.String(), "dev", l.Bridge); err != nil {
		return err
	}
	return run(ctx, "ip", "link", "set", l.Bridge, "up")
}

// forwardAPI listens on the bridge and forwards to the apiserver on
// loopback, which the nodes cannot reach.
func (l *Lab) forwardAPI() error {
	host := strings.TrimPrefix(l.cfg.API.Host, "https://")
	ln, err := net.Listen("tcp", net.JoinHostPort(l.HostIP.String(), "0"))
	if err != nil {
		return err
	}
	l.APIAddr = ln.Addr().String()
	var conns sync.WaitGroup
	done := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(done)
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				up, err := net.Dial("tcp", host)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	l.onUndo("apiserver forwarder "+l.APIAddr, func() error {
		err := ln.Close()
		<-done
		return err
	})
	return nil
}

// Kubeconfig returns a kubeconfig file with the given bearer token that
// works from inside a node (the apiserver through the bridge).
func (l *Lab) Kubeconfig(name, token string) (string, error) {
	path := filepath.Join(l.cfg.Dir, name+".kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "https://%s", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: %q}
contexts:
- name: lab
  context: {cluster: lab, user: u}
current-context: lab
`, l.APIAddr, token)
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

// Leftovers lists what a lab with this id left on the machine: network
// namespaces, links and cgroups named after it. Empty after Close.
func Leftovers(id string) ([]string, error) {
	prefix := "zwl" + id
	var out []string
	ns, err := os.ReadDir("/run/netns")
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range ns {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, "netns "+e.Name())
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, prefix) {
			out = append(out, "link "+i.Name)
		}
	}
	if root, err := cgroup2Root(); err == nil {
		cgs, err := os.ReadDir(root)
		if err != nil {
			return nil, err
		}
		for _, e := range cgs {
			if strings.HasPrefix(e.Name(), prefix) {
				out = append(out, "cgroup "+filepath.Join(root, e.Name()))
			}
		}
	}
	return out, nil
}

// Processes lists the lab's processes that have not ended (the nodes'
// namespace holders and everything started in them), by pid.
func (l *Lab) Processes() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int
	for _, p := range l.procs {
		if ok, _ := p.Exited(); !ok {
			out = append(out, p.Cmd.Process.Pid)
		}
	}
	return out
}
