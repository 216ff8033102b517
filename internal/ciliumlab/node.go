package ciliumlab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node is one lab node: a network namespace, a mount namespace held by a
// small process, and the agent in both.
type Node struct {
	lab     *Lab
	Index   int
	Name    string
	Zone    string
	IP      netip.Addr
	PodCIDR netip.Prefix
	// NetNS is the node's network namespace (ip netns name).
	NetNS string
	// Dir holds the node's logs and kubeconfig on the host.
	Dir string
	// AgentMetrics is the agent's Prometheus endpoint (host:port on the bridge).
	AgentMetrics string

	// cgroup is the node's cgroup root on the host (the agent's
	// --cgroup-root inside the node); the pods' cgroups are under it.
	cgroup   string
	holder   *exec.Cmd // keeps the mount namespace
	agent    *Proc
	restarts int
	api      *http.Client
}

// Proc is a process the lab started inside a node.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string
	done chan struct{}
	err  error
}

func (l *Lab) track(p *Proc) {
	l.mu.Lock()
	l.procs = append(l.procs, p)
	l.mu.Unlock()
}

// Exited reports whether the process ended, and its error.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop ends the process group with SIGTERM, then SIGKILL after 10 s.
func (p *Proc) Stop() error {
	if ok, _ := p.Exited(); ok {
		return nil
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return nil
}

// cgroup2Root is where the host mounts the cgroup2 hierarchy (unified or hybrid).
func cgroup2Root() (string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", errors.New("no cgroup2 hierarchy mounted on the host (the agent's --cgroup-root must be one)")
}

// holderScript runs in the node's fresh mount namespace (ip netns exec
// makes one, a slave of the host's, with the node's own sysfs) and keeps it:
// a private /run with the host's /run/netns (pod namespaces) still visible,
// a BPF filesystem on /sys/fs/bpf and the node's cgroup2 sub-hierarchy on
// the agent's default --cgroup-root.
const holderScript = `set -e
D=$1; CG=$2
mkdir -p "$D/keep-netns" "$D/cgroot"
mount --rbind /run/netns "$D/keep-netns"
mount -t tmpfs -o mode=0755 lab-run /run
mkdir -p /run/netns /run/cilium/cgroupv2 /run/lock
mount --rbind "$D/keep-netns" /run/netns
umount -l "$D/keep-netns"
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 none "$D/cgroot"
mount --bind "$D/cgroot/$CG" /run/cilium/cgroupv2
umount "$D/cgroot"
echo ready
exec sleep infinity
`

func (l *Lab) addNode(ctx context.Context, i int, spec NodeSpec) (*Node, error) {
	n := &Node{lab: l, Index: i, Name: spec.Name, Zone: spec.Zone, IP: nodeIP(i), PodCIDR: podCIDR(i),
		NetNS: "zwl" + l.ID + "-" + spec.Name, Dir: filepath.Join(l.cfg.Dir, spec.Name)}
	n.AgentMetrics = net.JoinHostPort(n.IP.String(), "9962")
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return nil, err
	}
	// Network: a namespace, a veth to the bridge named eth0 inside.
	if err := run(ctx, "ip", "netns", "add", n.NetNS); err != nil {
		return nil, err
	}
	l.onUndo("netns "+n.NetNS, func() error { return run(context.Background(), "ip", "netns", "del", n.NetNS) })
	host := fmt.Sprintf("zwl%sh%d", l.ID, i)
	if err := run(ctx, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", n.NetNS); err != nil {
		return nil, err
	}
	// Deleting the namespace deletes the pair; this covers a failure before.
	l.onUndo("veth "+host, func() error {
		if _, err := net.InterfaceByName(host); err != nil {
			return nil
		}
		return run(context.Background(), "ip", "link", "del", host)
	})
	in := func(args ...string) error {
		return run(ctx, "ip", append([]string{"-n", n.NetNS}, args...)...)
	}
	for _, step := range [][]string{
		{"ip", "link", "set", host, "master", l.Bridge},
		{"ip", "link", "set", host, "up"},
	} {
		if err := run(ctx, step[0], step[1:]...); err != nil {
			return nil, err
		}
	}
	for _, step := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", netip.PrefixFrom(n.IP, bridgeNet.Bits()).String(), "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", l.HostIP.String()},
	} {
		if err := in(step...); err != nil {
			return nil, err
		}
	}
	// cgroup2 sub-hierarchy for --cgroup-root.
	root, err := cgroup2Root()
	if err != nil {
		return nil, err
	}
	cg := "zwl" + l.ID + "-" + n.Name
	if err := os.Mkdir(filepath.Join(root, cg), 0o755); err != nil {
		return nil, err
	}
	l.onUndo("cgroup "+cg, func() error { return os.Remove(filepath.Join(root, cg)) })
	n.cgroup = filepath.Join(root, cg)
	// The kubelet's parent of the pods' cgroups (cgroupfs driver).
	kubepods := filepath.Join(n.cgroup, "kubepods")
	if err := os.Mkdir(kubepods, 0o755); err != nil {
		return nil, err
	}
	l.onUndo("cgroup "+kubepods, func() error { return os.Remove(kubepods) })
	// The mount namespace and its holder.
	holder := exec.Command("ip", "netns", "exec", n.NetNS, "sh", "-c", holderScript, "holder", n.Dir, cg)
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		return nil, err
	}
	n.holder = holder
	held := make(chan struct{})
	go func() { _ = holder.Wait(); close(held) }()
	l.track(&Proc{Name: "holder of " + n.Name, Cmd: holder, done: held})
	l.onUndo("mount namespace of "+n.Name, func() error {
		_ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL)
		<-held
		return nil
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		<-held
		return nil, fmt.Errorf("node mount namespace: %v: %s", err, stderr.String())
	}
	if err := l.createNodeObject(ctx, n, spec); err != nil {
		return nil, err
	}
	n.api = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", n.Path("/run/cilium/cilium.sock"))
		}}}
	return n, nil
}

// Path is a path inside the node's mount namespace as the host reaches it.
// An absolute symbolic link on the way (/var/run -> /run) resolves on the
// host, not in the node: use /run/cilium, not /var/run/cilium.
func (n *Node) Path(p string) string {
	return filepath.Join("/proc", strconv.Itoa(n.holder.Process.Pid), "root", p)
}

// createNodeObject registers the node as the kubelet would: zone and region
// labels, its pod CIDR (IPAM kubernetes), InternalIP, Ready, and, for a
// scheduler, its allocatable resources and taints. The TaintNodesByCondition
// admission plugin taints a new node not-ready; the node lifecycle
// controller (not run here) would lift that taint once the node reports
// Ready, so the lab sets the node's own taints in its place. The agent reads
// none of this but the pod CIDR and the address; it only adds annotations
// and the NetworkUnavailable condition.
func (l *Lab) createNodeObject(ctx context.Context, n *Node, spec NodeSpec) error {
	lbl := map[string]string{
		"kubernetes.io/hostname":        n.Name,
		"kubernetes.io/os":              "linux",
		"topology.kubernetes.io/zone":   n.Zone,
		"topology.kubernetes.io/region": l.cfg.Region,
	}
	for k, v := range spec.Labels {
		lbl[k] = v
	}
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: lbl},
		Spec:       corev1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
	}
	created, err := l.Client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node %s: %w", n.Name, err)
	}
	l.onUndo("Node "+n.Name, func() error {
		return l.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{})
	})
	created.Spec.Taints = spec.Taints
	if created, err = l.Client.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the taints of node %s: %w", n.Name, err)
	}
	created.Status = corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: n.IP.String()},
			{Type: corev1.NodeHostName, Address: n.Name},
		},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}},
	}
	if spec.CPU != "" && spec.Memory != "" {
		cpu, err := resource.ParseQuantity(spec.CPU)
		if err != nil {
			return fmt.Errorf("node %s cpu: %w", n.Name, err)
		}
		mem, err := resource.ParseQuantity(spec.Memory)
		if err != nil {
			return fmt.Errorf("node %s memory: %w", n.Name, err)
		}
		res := corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem, corev1.ResourcePods: resource.MustParse("110")}
		if spec.GPUs > 0 {
			res[GPUResource] = *resource.NewQuantity(spec.GPUs, resource.DecimalSI)
		}
		created.Status.Capacity, created.Status.Allocatable = res, res
	}
	_, err = l.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// Start runs a command inside the node's network and mount namespaces,
// its output in the node's folder as name.log, and stops it on Close.
func (n *Node) Start(name string, env []string, bin string, args ...string) (*Proc, error) {
	p, err := n.start(name, env, bin, args...)
	if err == nil {
		n.lab.onUndo(fmt.Sprintf("%s on %s (pid %d)", name, n.Name, p.Cmd.Process.Pid), p.Stop)
	}
	return p, err
}

// start is Start without the undo step (the agent has one for all its restarts).
func (n *Node) start(name string, env []string, bin string, args ...string) (*Proc, error) {
	dir := n.Dir
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	argv := []string{"-t", strconv.Itoa(n.holder.Process.Pid), "-m", "-n", "--", "env"}
	argv = append(argv, env...)
	argv = append(argv, bin)
	argv = append(argv, args...)
	cmd := exec.Command("nsenter", argv...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s on %s: %w", name, n.Name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); logf.Close(); close(p.done) }()
	n.lab.track(p)
	return p, nil
}

// agentArgs are the agent's flags: the notes' working set
// (../shared/CILIUM-LAB-NOTES.md) plus the Helm chart's defaults where they
// change what zonewatch sees (monitor aggregation medium, 5 s, all flags).
func (n *Node) agentArgs(kubeconfig string) []string {
	args := []string{
		"--k8s-kubeconfig-path=" + kubeconfig,
		"--lib-dir=" + filepath.Join(n.lab.cfg.Cilium, "lib"),
		"--devices=eth0",
		"--ipam=kubernetes", "--k8s-require-ipv4-pod-cidr=true",
		"--enable-ipv4=true", "--enable-ipv6=false",
		"--enable-l7-proxy=false",
		"--enable-health-checking=false", "--enable-endpoint-health-checking=false",
		"--enable-ipv4-masquerade=false",
		"--identity-allocation-mode=crd",
		"--cluster-name=default", "--cluster-id=0",
		"--enable-hubble=true", "--hubble-socket-path=" + n.lab.HubbleSocket(),
		"--bpf-conntrack-accounting=true",
		// The chart's defaults (bpf.monitorAggregation and friends).
		"--monitor-aggregation=medium", "--monitor-aggregation-interval=5s", "--monitor-aggregation-flags=all",
		// The agent's own counters (drops by reason and direction) are the
		// lab's ground truth.
		"--prometheus-serve-addr=" + n.AgentMetrics,
	}
	// The routing mode and the Service path (checked by Start).
	routing, _ := n.lab.cfg.routingArgs()
	services, _ := n.lab.cfg.serviceArgs()
	args = append(args, routing...)
	args = append(args, services...)
	switch {
	case n.lab.cfg.Relay:
		args = append(args, "--hubble-listen-address=:"+HubblePort, "--hubble-disable-tls=true")
	case n.lab.tls != nil:
		cert, key := n.lab.tls.serverFiles(n.Name)
		// v1.20.2 defaults hubble-disable-tls to true (pkg/hubble/cell
		// certloader.go; its chart writes false with hubble.tls.enabled):
		// without the flag the agent serves plain text beside the files.
		args = append(args, "--hubble-listen-address=:"+HubblePort, "--hubble-disable-tls=false", "--hubble-tls-cert-file="+cert,
			"--hubble-tls-key-file="+key, "--hubble-tls-client-ca-files="+n.lab.tls.CA)
	default:
		args = append(args, "--hubble-listen-address=")
	}
	return args
}

func (n *Node) startAgent(ctx context.Context) error {
	// Cilium v1.20.2 creates the folder of its API socket, not that of
	// --hubble-socket-path (daemon_main.go creates path.Dir(SocketPath);
	// serveroption.WithUnixSocketListener only listens): a folder of its
	// own must exist before the agent starts.
	if err := os.MkdirAll(n.Path(hostRun(filepath.Dir(n.lab.HubbleSocket()))), 0o755); err != nil {
		return err
	}
	return n.runAgent(ctx, "cilium-agent")
}

// HubbleSocket is the node's Hubble socket as the host reaches it.
func (n *Node) HubbleSocket() string { return n.Path(hostRun(n.lab.HubbleSocket())) }

// hostRun spells a /var/run path as /run, as Path needs it (/var/run is a
// symbolic link to /run, resolved on the host).
func hostRun(p string) string {
	if rest, ok := strings.CutPrefix(p, "/var/run/"); ok {
		return "/run/" + rest
	}
	return p
}

func (n *Node) runAgent(ctx context.Context, name string) error {
	kc, err := n.lab.Kubeconfig(n.Name+"-agent", n.lab.cfg.API.BearerToken)
	if err != nil {
		return err
	}
	env := []string{
		"PATH=" + filepath.Join(n.lab.cfg.Cilium, "llvm") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"K8S_NODE_NAME=" + n.Name,
	}
	began := time.Now()
	p, err := n.start(name, env, filepath.Join(n.lab.cfg.Cilium, "cilium-agent"), n.agentArgs(kc)...)
	if err != nil {
		return err
	}
	if n.agent == nil {
		// One undo step for the agent however often it restarts, in the
		// place of its first start: the pods' CNI DEL before it need it.
		n.lab.onUndo("cilium-agent on "+n.Name, func() error { return n.agent.Stop() })
	}
	n.agent = p
	if err := n.waitHealthy(ctx, p); err != nil {
		return err
	}
	n.lab.Logf("node %s (%s, %s): agent ready in %s", n.Name, n.Zone, n.IP, time.Since(began).Round(time.Millisecond))
	return nil
}

// Agent is the node's cilium-agent process.
func (n *Node) Agent() *Proc { return n.agent }

// RestartAgent stops the agent and starts it again with the same flags
// (its pinned maps and endpoints stay; its log goes to a new file).
func (n *Node) RestartAgent(ctx context.Context) error {
	if err := n.agent.Stop(); err != nil {
		return err
	}
	n.restarts++
	return n.runAgent(ctx, fmt.Sprintf("cilium-agent-%d", n.restarts))
}

// waitHealthy polls the agent's /v1/healthz until the daemon and its
// Kubernetes connection are Ok, or the agent exits.
func (n *Node) waitHealthy(ctx context.Context, p *Proc) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last string
	for {
		if ok, err := p.Exited(); ok {
			return fmt.Errorf("cilium-agent on %s exited (%v); log tail:\n%s", n.Name, err, tailFile(p.Log, 3000))
		}
		var st struct {
			Cilium     struct{ State, Msg string } `json:"cilium"`
			Kubernetes struct{ State, Msg string } `json:"kubernetes"`
		}
		if err := n.getJSON(ctx, "/v1/healthz", &st); err != nil {
			last = err.Error()
		} else if st.Cilium.State == "Ok" && st.Kubernetes.State == "Ok" {
			return nil
		} else {
			last = fmt.Sprintf("cilium %s %s; kubernetes %s %s", st.Cilium.State, st.Cilium.Msg, st.Kubernetes.State, st.Kubernetes.Msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cilium-agent on %s not healthy: %s; log tail:\n%s", n.Name, last, tailFile(p.Log, 3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitNodes waits until the agent knows count nodes (itself included): the
// tunnel to each is programmed from them.
func (n *Node) waitNodes(ctx context.Context, count int) error {
	return n.poll(ctx, time.Minute, "knows every node", func() (bool, string) {
		var st struct {
			Nodes []struct {
				Name string `json:"name"`
			} `json:"nodes-added"`
		}
		if err := n.getJSON(ctx, "/v1/cluster/nodes", &st); err != nil {
			return false, err.Error()
		}
		return len(st.Nodes) >= count, fmt.Sprintf("%d nodes: %v", len(st.Nodes), st.Nodes)
	})
}

// poll calls cond every 200 ms until it holds or timeout passes.
func (n *Node) poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, detail := cond()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent on %s %s: not within %s; last: %s", n.Name, what, timeout, detail)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// getJSON reads one of the agent's REST API resources over its socket.
func (n *Node) getJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := n.api.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return json.Unmarshal(b, v)
}

func tailFile(path string, max int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// AgentRSS is the agent's resident set in bytes (/proc/PID/status VmRSS).
func (n *Node) AgentRSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.agent.Cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS")
}
