// Package schedlab runs the real kube-scheduler (built by hack/tools.sh)
// against the test kube-apiserver of internal/testenv, with nodes that are
// API objects only (no kubelet: the lab sets their status), so that tests
// and `make demo` see where the real scheduler puts pods. Pods are created
// as their controllers create them (shapes.go); no controller runs here.
// internal/trainlab runs the real controllers and holds the JobSet,
// LeaderWorkerSet and Indexed Job shapes to the pods they make.
package schedlab

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// Label keys the lab sets on nodes.
const (
	LabelZone     = "topology.kubernetes.io/zone"
	LabelRegion   = "topology.kubernetes.io/region"
	LabelHostname = "kubernetes.io/hostname"
	// LabelCell groups the nodes of one independent cell: tests run many
	// cells side by side in one cluster; their pods select their cell.
	LabelCell = "schedlab.zonewatch.io/cell"
	// GPUResource is the NVIDIA device plugin's resource.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
)

// Lab is a test apiserver with the real scheduler bound to it.
type Lab struct {
	API    *testenv.APIServer
	Client kubernetes.Interface
	pods   listersv1.PodLister
}

// Start starts etcd, kube-apiserver and kube-scheduler (no leader
// election, the default profile) and waits until the scheduler is healthy.
// Everything stops at the test's cleanup.
func Start(t testing.TB) *Lab {
	t.Helper()
	testenv.ToolsBin(t, "etcd", "kube-apiserver", "kube-scheduler")
	return Attach(t, testenv.StartAPIServer(t))
}

// Attach starts kube-scheduler against an apiserver already running (a
// lab's, e.g. `make demo`'s), so that its pods are bound by the real
// scheduler.
func Attach(t testing.TB, api *testenv.APIServer) *Lab {
	t.Helper()
	return attach(t, api)
}

func attach(t testing.TB, api *testenv.APIServer, args ...string) *Lab {
	t.Helper()
	bin := testenv.ToolsBin(t, "kube-scheduler")
	dir := t.TempDir()
	port := testenv.FreePort(t)
	testenv.Start(t, dir, "kube-scheduler", filepath.Join(bin, "kube-scheduler"), append([]string{
		"--kubeconfig", api.Kubeconfig,
		"--authentication-kubeconfig", api.Kubeconfig, "--authorization-kubeconfig", api.Kubeconfig,
		"--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
		"-v", "1"}, args...)...)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-scheduler not healthy after 60s (last: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	pods := f.Core().V1().Pods()
	lister := pods.Lister()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	f.Start(stop)
	f.WaitForCacheSync(stop)
	return &Lab{API: api, Client: cs, pods: lister}
}

// Node is a node of the lab: no kubelet, its status set by the lab.
type Node struct {
	Name, Zone, Region string
	CPU, Memory        string // allocatable, e.g. "32", "256Gi"
	GPUs               int64
	Labels             map[string]string
	Taints             []corev1.Taint
}

// GPUTaint is how GPU clusters taint GPU nodes (GKE, the GPU Operator's
// guides): pods without the toleration stay off them.
var GPUTaint = corev1.Taint{Key: string(GPUResource), Value: "present", Effect: corev1.TaintEffectNoSchedule}

// AddNodes creates the nodes Ready with their allocatable resources. The
// TaintNodesByCondition admission plugin taints a new node not-ready (the
// node lifecycle controller, not run here, would lift it): the lab sets
// the node's own taints afterwards.
func (l *Lab) AddNodes(ctx context.Context, nodes ...Node) error {
	for _, n := range nodes {
		lbl := map[string]string{LabelHostname: n.Name, LabelZone: n.Zone, "kubernetes.io/os": "linux"}
		if n.Region != "" {
			lbl[LabelRegion] = n.Region
		}
		if n.GPUs > 0 {
			lbl["nvidia.com/gpu.present"] = "true"
		}
		for k, v := range n.Labels {
			lbl[k] = v
		}
		node, err := l.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: lbl}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", n.Name, err)
		}
		node.Spec.Taints = n.Taints
		if node, err = l.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting the taints of node %s: %w", n.Name, err)
		}
		res := corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(n.CPU),
			corev1.ResourceMemory: resource.MustParse(n.Memory),
			corev1.ResourcePods:   resource.MustParse("110"),
		}
		if n.GPUs > 0 {
			res[GPUResource] = *resource.NewQuantity(n.GPUs, resource.DecimalSI)
		}
		now := metav1.Now()
		node.Status = corev1.NodeStatus{
			Capacity: res, Allocatable: res,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: now, LastTransitionTime: now}},
		}
		if _, err := l.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting the status of node %s: %w", n.Name, err)
		}
	}
	return nil
}

// EnsureNamespace creates a namespace with labels (or adds the labels).
func (l *Lab) EnsureNamespace(ctx context.Context, name string, lbl map[string]string) error {
	_, err := l.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// Placement is where each pod of a namespace is: its node, or "" while
// Pending.
type Placement map[string]string

// Pending counts the pods without a node.
func (p Placement) Pending() int {
	n := 0
	for _, node := range p {
		if node == "" {
			n++
		}
	}
	return n
}

// Settle waits until the namespace has want pods and each is bound, or
// the unbound ones have been found unschedulable by the scheduler and no
// pod was bound for quiet (the scheduler retries unschedulable pods on
// cluster events after a backoff of 1s to 10s, so quiet is a few
// seconds), or until ctx ends. It returns the placement it saw last.
func (l *Lab) Settle(ctx context.Context, namespace string, want int, quiet time.Duration) (Placement, error) {
	return l.settle(ctx, namespace, want, func(n, bound, unschedulable int, still time.Duration) bool {
		return bound == n || (bound+unschedulable == n && still >= quiet)
	})
}

// settle polls the namespace's pods until it has want of them and done
// says so, given how many are bound, how many the scheduler marked
// unschedulable and how long no pod was bound (counted from when the
// namespace last had fewer than want pods), or until ctx ends. It returns
// the placement it saw last.
func (l *Lab) settle(ctx context.Context, namespace string, want int, done func(n, bound, unschedulable int, still time.Duration) bool) (Placement, error) {
	last, changed := -1, time.Now()
	for {
		list, err := l.pods.Pods(namespace).List(labels.Everything())
		if err != nil {
			return nil, err
		}
		p := Placement{}
		bound, unschedulable := 0, 0
		for _, pod := range list {
			p[pod.Name] = pod.Spec.NodeName
			if pod.Spec.NodeName != "" {
				bound++
				continue
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					unschedulable++
				}
			}
		}
		if bound != last || len(list) < want {
			last, changed = bound, time.Now()
		}
		if len(list) >= want && done(len(list), bound, unschedulable, time.Since(changed)) {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return p, fmt.Errorf("namespace %s: %d of %d pods bound, %d unschedulable: %w", namespace, bound, want, unschedulable, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Pods returns the pods of a namespace from the lab's cache.
func (l *Lab) Pods(namespace string) ([]*corev1.Pod, error) {
	return l.pods.Pods(namespace).List(labels.Everything())
}

// DeletePods deletes every pod of a namespace at once (no kubelet waits
// for them) and waits until the cache has none.
func (l *Lab) DeletePods(ctx context.Context, namespace string) error {
	zero := int64(0)
	if err := l.Client.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("deleting the pods of %s: %w", namespace, err)
	}
	for {
		list, err := l.pods.Pods(namespace).List(labels.Everything())
		if err != nil {
			return err
		}
		if len(list) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s: %d pods left: %w", namespace, len(list), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
