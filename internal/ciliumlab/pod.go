package ciliumlab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodSpec is what a controller would create: labels, owner, node.
type PodSpec struct {
	Namespace, Name, Node string
	Labels                map[string]string
	// Owner is the controlling owner reference (e.g. PyTorchJob, kubeflow.org/v1).
	OwnerAPIVersion, OwnerKind, OwnerName string
	// Ports the container declares (documentation for a reader of the object).
	Ports []int32
	// GPUs the container requests (nvidia.com/gpu, requests and limits).
	GPUs int64
}

// GPUResource is the NVIDIA device plugin's resource.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// Pod is a pod the lab wired: its object, its network namespace and the
// endpoint the agent made for it.
type Pod struct {
	lab         *Lab
	Spec        PodSpec
	Node        *Node
	IP          netip.Addr
	UID         types.UID
	NetNS       string // ip netns name
	containerID string
	deleted     bool
	// sandbox makes the pod's sockets in the pod's cgroup and namespace.
	sandbox *sandbox
	// Scheduled is the scheduler's record of the binding, for a pod the
	// lab left to a scheduler (SchedulePods): the Scheduled event's
	// reporting controller and message ("Successfully assigned ns/pod to
	// node"). Empty for a pod the lab bound itself (AddPod).
	ScheduledBy, Scheduled string
}

// Ref is namespace/name.
func (p *Pod) Ref() string { return p.Spec.Namespace + "/" + p.Spec.Name }

// cniConf is what the kubelet's runtime passes on stdin: the network of
// Cilium's own CNI configuration (05-cilium.conflist).
const cniConf = `{"cniVersion":"0.3.1","name":"cilium","type":"cilium-cni","enable-debug":false}`

// AddPod creates the Pod object bound to its node, a network namespace,
// runs cilium-cni ADD in the node as the kubelet's runtime does, and sets
// the pod's status (Running, the IP the CNI returned) through the status
// subresource.
func (l *Lab) AddPod(ctx context.Context, spec PodSpec) (*Pod, error) {
	n := l.Node(spec.Node)
	if n == nil {
		return nil, fmt.Errorf("no node %q", spec.Node)
	}
	if err := l.EnsureNamespace(ctx, spec.Namespace); err != nil {
		return nil, err
	}
	p := &Pod{lab: l, Spec: spec, Node: n}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: spec.Name, Labels: spec.Labels},
		Spec: corev1.PodSpec{
			NodeName:   spec.Node,
			Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/zonewatch-lab:traffic"}},
		},
	}
	for _, port := range spec.Ports {
		obj.Spec.Containers[0].Ports = append(obj.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: port, Protocol: corev1.ProtocolTCP})
	}
	if spec.GPUs > 0 {
		q := corev1.ResourceList{GPUResource: *resource.NewQuantity(spec.GPUs, resource.DecimalSI)}
		obj.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: q, Limits: q}
	}
	if spec.OwnerKind != "" {
		yes := true
		obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: spec.OwnerAPIVersion, Kind: spec.OwnerKind,
			Name: spec.OwnerName, UID: "00000000-0000-4000-8000-00000000c1ab", Controller: &yes, BlockOwnerDeletion: &yes}}
	}
	created, err := l.Client.CoreV1().Pods(spec.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating pod %s: %w", p.Ref(), err)
	}
	p.UID = created.UID
	l.onUndo("Pod "+p.Ref(), func() error { return p.deleteObject(context.Background()) })
	if err := l.wire(ctx, p, created); err != nil {
		return nil, err
	}
	return p, nil
}

// wire does what the kubelet and its runtime do for a pod bound to the
// node: a network namespace, cilium-cni ADD in the node, and the pod's
// status (Running, the IP the CNI returned) through the status subresource.
func (l *Lab) wire(ctx context.Context, p *Pod, created *corev1.Pod) error {
	spec, n := p.Spec, p.Node
	id := make([]byte, 32)
	_, _ = rand.Read(id)
	p.containerID = hex.EncodeToString(id)
	p.NetNS = fmt.Sprintf("zwl%s-%s-%s", l.ID, spec.Namespace, spec.Name)
	if err := run(ctx, "ip", "netns", "add", p.NetNS); err != nil {
		return err
	}
	l.onUndo("netns "+p.NetNS, func() error {
		if _, err := os.Stat(filepath.Join("/run/netns", p.NetNS)); err != nil {
			return nil
		}
		return run(context.Background(), "ip", "netns", "del", p.NetNS)
	})
	// What a runtime does before CNI: loopback up.
	if err := run(ctx, "ip", "-n", p.NetNS, "link", "set", "lo", "up"); err != nil {
		return err
	}
	began := time.Now()
	out, err := p.cni(ctx, "ADD")
	if err != nil {
		return err
	}
	l.onUndo("CNI DEL "+p.Ref(), func() error {
		if p.deleted {
			return nil
		}
		_, err := p.cni(context.Background(), "DEL")
		return err
	})
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) == 0 {
		return fmt.Errorf("cilium-cni ADD for %s: no IP in %s (%v)", p.Ref(), out, err)
	}
	pfx, err := netip.ParsePrefix(res.IPs[0].Address)
	if err != nil {
		return err
	}
	p.IP = pfx.Addr()
	// The containers start: the pod's processes in its cgroup.
	if err := l.startSandbox(ctx, p); err != nil {
		return err
	}
	l.Logf("pod %s on %s: %s (CNI ADD %s)", p.Ref(), n.Name, p.IP, time.Since(began).Round(time.Millisecond))

	now := metav1.Now()
	image := created.Spec.Containers[0].Image
	created.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    n.IP.String(),
		HostIPs:   []corev1.HostIP{{IP: n.IP.String()}},
		PodIP:     p.IP.String(),
		PodIPs:    []corev1.PodIP{{IP: p.IP.String()}},
		StartTime: &now,
		Conditions: append(created.Status.Conditions, // the scheduler's PodScheduled, if any
			corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now}),
		ContainerStatuses: []corev1.ContainerStatus{{Name: created.Spec.Containers[0].Name, Ready: true, Image: image,
			ContainerID: "containerd://" + p.containerID, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
	}
	if _, err := l.Client.CoreV1().Pods(spec.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting status of %s: %w", p.Ref(), err)
	}
	l.mu.Lock()
	l.pods[p.Ref()] = p
	l.mu.Unlock()
	return nil
}

// cni runs cilium-cni in the node with the kubelet runtime's environment.
func (p *Pod) cni(ctx context.Context, command string) ([]byte, error) {
	n := p.Node
	args := fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s",
		p.Spec.Namespace, p.Spec.Name, p.containerID, p.UID)
	argv := []string{"-t", strconv.Itoa(n.holder.Process.Pid), "-m", "-n", "--", "env",
		"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + p.containerID,
		"CNI_NETNS=/run/netns/" + p.NetNS, "CNI_IFNAME=eth0",
		"CNI_PATH=" + p.lab.cfg.Cilium, "CNI_ARGS=" + args,
		filepath.Join(p.lab.cfg.Cilium, "cilium-cni")}
	// ADD may compile the node's first bpf_lxc; DEL only asks the agent.
	limit := 2 * time.Minute
	if command == "DEL" {
		limit = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	out, err := output(ctx, bytes.NewReader([]byte(cniConf)), "nsenter", argv...)
	if err != nil {
		return nil, fmt.Errorf("cilium-cni %s for %s on %s: %w", command, p.Ref(), n.Name, err)
	}
	return out, nil
}

// ContainerStop is how long the lab's kubelet takes to stop a pod's
// containers between the deletion request and the sandbox's teardown.
const ContainerStop = time.Second

// Delete removes the pod in the kubelet's order: the deletion request
// (the pod turns terminating), the containers stop, the sandbox goes
// (CNI DEL, then the namespace), then the kubelet's final delete of the
// object.
func (p *Pod) Delete(ctx context.Context) error {
	if p.deleted {
		return nil
	}
	grace := int64(30)
	err := p.lab.Client.CoreV1().Pods(p.Spec.Namespace).Delete(ctx, p.Spec.Name,
		metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting pod %s: %w", p.Ref(), err)
	}
	time.Sleep(ContainerStop)
	if err := p.sandbox.stop(); err != nil {
		return err
	}
	if err := p.sandbox.removeCgroup(); err != nil {
		return err
	}
	if _, err := p.cni(ctx, "DEL"); err != nil {
		return err
	}
	p.deleted = true
	if err := run(ctx, "ip", "netns", "del", p.NetNS); err != nil {
		return err
	}
	p.lab.mu.Lock()
	delete(p.lab.pods, p.Ref())
	p.lab.mu.Unlock()
	return p.deleteObject(ctx)
}

func (p *Pod) deleteObject(ctx context.Context) error {
	zero := int64(0)
	pc := p.lab.Client.CoreV1().Pods(p.Spec.Namespace)
	err := pc.Delete(ctx, p.Spec.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for {
		got, err := pc.Get(ctx, p.Spec.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && got.UID != p.UID) {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("pod %s not gone: %w", p.Ref(), ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// agentEndpoint is what the lab reads of an endpoint's status in the
// agent's REST API (GET /v1/endpoint).
type agentEndpoint struct {
	State    string `json:"state"`
	Identity struct {
		ID     int64    `json:"id"`
		Labels []string `json:"labels"`
	} `json:"identity"`
	Networking struct {
		Addressing []struct {
			IPV4 string `json:"ipv4"`
		} `json:"addressing"`
	} `json:"networking"`
}

// endpoint returns the status of the agent's endpoint with the pod's IP,
// or nil and why there is none (yet).
func (p *Pod) endpoint(ctx context.Context) (*agentEndpoint, string) {
	var eps []struct {
		Status agentEndpoint `json:"status"`
	}
	if err := p.Node.getJSON(ctx, "/v1/endpoint", &eps); err != nil {
		return nil, err.Error()
	}
	for i := range eps {
		for _, a := range eps[i].Status.Networking.Addressing {
			if a.IPV4 == p.IP.String() {
				return &eps[i].Status, ""
			}
		}
	}
	return nil, "no endpoint with " + p.IP.String()
}

// Listen opens a TCP listener on the pod's IP, made by the pod's own
// process (its cgroup and network namespace).
func (p *Pod) Listen(port int) (net.Listener, error) {
	return p.sandbox.listen(net.JoinHostPort(p.IP.String(), strconv.Itoa(port)))
}

// Dial connects from the pod to addr within timeout: the pod's own
// process connects, so Cilium's socket LB (cgroup/connect4) sees it as it
// sees a container's connect.
func (p *Pod) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	return p.sandbox.dial(addr, timeout)
}

// DisableIPv6 turns IPv6 off in the pod (what a cluster with Cilium's IPv6
// off often does); by default pods keep it, as a runtime leaves them.
func (p *Pod) DisableIPv6(ctx context.Context) error {
	return run(ctx, "ip", "netns", "exec", p.NetNS, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
}
