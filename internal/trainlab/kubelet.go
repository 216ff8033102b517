package trainlab

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Kubelet stands in for the kubelets of the bed's nodes, which are API
// objects only. For every pod bound to a node it does what a kubelet whose
// containers start at once would: the pod becomes Running, with an IP from
// its node's range, its containers running and ready, its conditions
// Ready. A bound pod being deleted is finished as a kubelet finishes it: a
// pod still running gets phase Failed (its containers killed, exit code
// 137), then the kubelet's own delete with grace period 0 (the pod stays
// until the controllers' finalizers are gone). A test ends a pod with Exit.
// Not modelled: probes (a container is ready when it starts), readiness
// gates (Ready is set whatever they say), container restarts, resources.
type Kubelet struct {
	client kubernetes.Interface
	pods   listersv1.PodLister
	queue  workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	ranges map[string]netip.Prefix  // node -> its pod range
	next   map[string]netip.Addr    // node -> the next address to hand out
	given  map[types.UID]netip.Addr // a pod's address, kept across retries
}

// podRanges is where the node ranges come from: node i gets the i-th /24
// (the nodes have no spec.podCIDR: no node-ipam controller runs).
var podRanges = netip.MustParsePrefix("10.128.0.0/9")

func startKubelet(t testing.TB, client kubernetes.Interface) *Kubelet {
	t.Helper()
	k := &Kubelet{
		client: client,
		queue:  workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		ranges: map[string]netip.Prefix{},
		next:   map[string]netip.Addr{},
		given:  map[types.UID]netip.Addr{},
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermNotEqualSelector("spec.nodeName", "").String()
	}))
	inf := f.Core().V1().Pods()
	k.pods = inf.Lister()
	enqueue := func(o any) {
		if key, err := cache.MetaNamespaceKeyFunc(o); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(stop)
		k.queue.ShutDown()
		wg.Wait()
	})
	f.Start(stop)
	f.WaitForCacheSync(stop)
	for range 2 {
		wg.Go(func() {
			for k.work() {
			}
		})
	}
	return k
}

func (k *Kubelet) work() bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.sync(ctx, key); err != nil {
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

// sync brings one bound pod to what its kubelet would make of it.
func (k *Kubelet) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := k.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case pod.DeletionTimestamp != nil:
		return k.finish(ctx, pod)
	case pod.Status.Phase == corev1.PodPending || pod.Status.Phase == "":
		return k.run(ctx, pod)
	}
	return nil
}

// run moves a bound pod to Running.
func (k *Kubelet) run(ctx context.Context, pod *corev1.Pod) error {
	ip, err := k.address(pod.UID, pod.Spec.NodeName)
	if err != nil {
		return err
	}
	p := pod.DeepCopy()
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP, p.Status.PodIPs = ip.String(), []corev1.PodIP{{IP: ip.String()}}
	p.Status.StartTime = &now
	for _, c := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		setCondition(&p.Status, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	p.Status.InitContainerStatuses = nil
	for _, c := range p.Spec.InitContainers {
		st := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: containerID(p, c.Name)}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			st.Ready, st.Started, st.State = true, ptr(true), corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
		} else {
			st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: now, FinishedAt: now, ContainerID: st.ContainerID}}
		}
		p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, st)
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: containerID(p, c.Name),
			Ready: true, Started: ptr(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	_, err = k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// finish ends a bound pod being deleted: phase Failed if it was still
// running, then the delete with grace period 0 that removes it.
func (k *Kubelet) finish(ctx context.Context, pod *corev1.Pod) error {
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		p := pod.DeepCopy()
		terminate(p, corev1.PodFailed, 137, "Error")
		if _, err := k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	zero := int64(0)
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// Exit ends a Running pod's containers with code, as its kubelet reports
// it: phase Succeeded for 0, Failed otherwise. It refuses what a kubelet
// would not do: a pod with restartPolicy Always never ends (its containers
// are restarted), nor does one with OnFailure whose code is not 0.
func (k *Kubelet) Exit(ctx context.Context, namespace, name string, code int32) error {
	for {
		pod, err := k.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pod %s/%s is %s, not Running", namespace, name, pod.Status.Phase)
		}
		switch rp := pod.Spec.RestartPolicy; {
		case rp == corev1.RestartPolicyAlways, rp == corev1.RestartPolicyOnFailure && code != 0:
			return fmt.Errorf("pod %s/%s has restartPolicy %s: its kubelet would restart the container, not end the pod", namespace, name, rp)
		}
		phase, reason := corev1.PodSucceeded, "Completed"
		if code != 0 {
			phase, reason = corev1.PodFailed, "Error"
		}
		terminate(pod, phase, code, reason)
		_, err = k.client.CoreV1().Pods(namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// terminate sets a pod's status to its containers ended with code.
func terminate(p *corev1.Pod, phase corev1.PodPhase, code int32, reason string) {
	now := metav1.Now()
	p.Status.Phase = phase
	for _, c := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
		setCondition(&p.Status, corev1.PodCondition{Type: c, Status: corev1.ConditionFalse, Reason: "PodCompleted", LastTransitionTime: now})
	}
	for i := range p.Status.ContainerStatuses {
		cs := &p.Status.ContainerStatuses[i]
		started := now
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
		cs.Ready, cs.Started = false, ptr(false)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, StartedAt: started, FinishedAt: now, ContainerID: cs.ContainerID}}
	}
}

// address hands out the next address of the node's range to a pod.
func (k *Kubelet) address(uid types.UID, node string) (netip.Addr, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if a, ok := k.given[uid]; ok {
		return a, nil
	}
	r, ok := k.ranges[node]
	if !ok {
		base := podRanges.Addr().As4()
		i := len(k.ranges)
		if i >= 1<<(24-podRanges.Bits()) {
			return netip.Addr{}, fmt.Errorf("no pod range left for node %s", node)
		}
		base[1] += byte(i >> 8)
		base[2] = byte(i)
		r = netip.PrefixFrom(netip.AddrFrom4(base), 24)
		k.ranges[node] = r
		k.next[node] = r.Addr().Next()
	}
	a := k.next[node]
	if !r.Contains(a.Next()) {
		return netip.Addr{}, fmt.Errorf("node %s: its range %s is used up (the stand-in does not reuse addresses)", node, r)
	}
	k.next[node] = a.Next()
	k.given[uid] = a
	return a, nil
}

// NodeRange is the pod range of a node the stand-in has run a pod on.
func (k *Kubelet) NodeRange(node string) (netip.Prefix, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r, ok := k.ranges[node]
	return r, ok
}

func setCondition(st *corev1.PodStatus, c corev1.PodCondition) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == c.Type {
			if st.Conditions[i].Status == c.Status {
				return
			}
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

func containerID(p *corev1.Pod, container string) string {
	return "standin://" + string(p.UID) + "/" + container
}

func ptr[T any](v T) *T { return &v }
