package ciliumlab

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// SchedulePods creates the pods unbound (spec.nodeName empty), as a
// training controller creates them, and leaves their placement to a
// scheduler running against the lab's apiserver (internal/schedlab's
// kube-scheduler). Like a kubelet, the lab watches the pods; when one is
// bound to a lab node it copies that node's labels named in nodeLabels
// (pod label key -> node label key) onto the pod, as a mutating webhook
// on pods/binding does, before the sandbox exists, so that Cilium's
// identity of the pod has them; then it wires the pod on that node
// (cilium-cni ADD, status Running) as AddPod does, waits until the pod's
// identity has those labels on every node (Pod.SettledIdentity: so keys
// must be ones Cilium keeps in identities), and records the scheduler's Scheduled event
// (Pod.ScheduledBy, Pod.Scheduled).
//
// It returns the pods in the order given once every one runs. When some
// stay unbound past timeout it returns the ones wired and an error naming
// each pod left Pending with the scheduler's reason (PodScheduled).
func (l *Lab) SchedulePods(ctx context.Context, pods []*corev1.Pod, nodeLabels map[string]string, timeout time.Duration) ([]*Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := make([]*Pod, len(pods))
	byUID := map[types.UID]int{}
	var from string
	for i, obj := range pods {
		if obj.Spec.NodeName != "" {
			return nil, fmt.Errorf("pod %s/%s is bound to %s already: SchedulePods leaves the node to the scheduler", obj.Namespace, obj.Name, obj.Spec.NodeName)
		}
		if err := l.EnsureNamespace(ctx, obj.Namespace); err != nil {
			return nil, err
		}
		created, err := l.Client.CoreV1().Pods(obj.Namespace).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating pod %s/%s: %w", obj.Namespace, obj.Name, err)
		}
		p := &Pod{lab: l, UID: created.UID, Spec: specOf(created)}
		l.onUndo("Pod "+p.Ref(), func() error { return p.deleteObject(context.Background()) })
		out[i] = p
		byUID[created.UID] = i
		if from == "" {
			from = created.ResourceVersion
		}
	}
	// One watch over every namespace from the first creation: the
	// bindings that happen before it opens are among its events.
	left := len(pods)
	last := map[types.UID]*corev1.Pod{}
	err := l.watchPods(ctx, "", metav1.ListOptions{ResourceVersion: from}, func(_ watch.EventType, pod *corev1.Pod) (bool, error) {
		i, mine := byUID[pod.UID]
		if !mine {
			return false, nil
		}
		last[pod.UID] = pod
		p := out[i]
		if pod.Spec.NodeName == "" || p.Node != nil {
			return false, nil
		}
		if err := l.runBound(ctx, p, pod, nodeLabels); err != nil {
			return true, err
		}
		left--
		return left == 0, nil
	})
	if err != nil && err == ctx.Err() {
		return out, l.pendingError(out, last, ctx.Err())
	}
	return out, err
}

// watchPods watches the pods of namespace ("" for all) from
// opts.ResourceVersion, re-opening the watch where it ends, and calls each
// with every event but bookmarks until each says done or returns an
// error, or ctx ends (its error is returned).
func (l *Lab) watchPods(ctx context.Context, namespace string, opts metav1.ListOptions, each func(watch.EventType, *corev1.Pod) (done bool, err error)) error {
	opts.AllowWatchBookmarks = true
	for {
		w, err := l.Client.CoreV1().Pods(namespace).Watch(ctx, opts)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("watching pods: %w", err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				w.Stop()
				return fmt.Errorf("watching pods: %v", apierrors.FromObject(ev.Object))
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			opts.ResourceVersion = pod.ResourceVersion
			if ev.Type == watch.Bookmark {
				continue
			}
			if done, err := each(ev.Type, pod); done || err != nil {
				w.Stop()
				return err
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// specOf is the PodSpec of a pod object made by someone else.
func specOf(obj *corev1.Pod) PodSpec {
	s := PodSpec{Namespace: obj.Namespace, Name: obj.Name, Node: obj.Spec.NodeName, Labels: obj.Labels}
	if ref := metav1.GetControllerOf(obj); ref != nil {
		s.OwnerAPIVersion, s.OwnerKind, s.OwnerName = ref.APIVersion, ref.Kind, ref.Name
	}
	for _, c := range obj.Spec.Containers {
		for _, port := range c.Ports {
			s.Ports = append(s.Ports, port.ContainerPort)
		}
		q := c.Resources.Limits[GPUResource]
		if r, ok := c.Resources.Requests[GPUResource]; ok {
			q = r
		}
		s.GPUs += q.Value()
	}
	return s
}

// runBound does a kubelet's part for a pod just bound to one of the lab's
// nodes.
func (l *Lab) runBound(ctx context.Context, p *Pod, pod *corev1.Pod, nodeLabels map[string]string) error {
	n := l.Node(pod.Spec.NodeName)
	if n == nil {
		return fmt.Errorf("pod %s bound to %q, which is no node of the lab", p.Ref(), pod.Spec.NodeName)
	}
	p.Node, p.Spec.Node = n, n.Name
	if len(nodeLabels) > 0 {
		node, err := l.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		add := map[string]string{}
		for podKey, nodeKey := range nodeLabels {
			add[podKey] = node.Labels[nodeKey]
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": add}})
		if pod, err = l.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("labelling pod %s with its node's labels: %w", p.Ref(), err)
		}
		p.Spec.Labels = pod.Labels
	}
	by, msg, err := l.scheduledEvent(ctx, pod)
	if err != nil {
		return err
	}
	p.ScheduledBy, p.Scheduled = by, msg
	l.Logf("pod %s bound to %s by %s: %s", p.Ref(), n.Name, by, msg)
	if err := l.wire(ctx, p, pod); err != nil {
		return err
	}
	// The agent's pod watch may hand the endpoint the bound pod before the
	// labels above (two updates): the endpoint then starts with an identity
	// without them and changes it seconds later (seen: 8 to 31 s; a worker
	// whose identity lacked "zone" denied by the zone fence's NotIn). The
	// pod runs once its identity has them on every node, as a webhook's
	// label would be.
	keys := make([]string, 0, len(nodeLabels))
	for podKey := range nodeLabels {
		keys = append(keys, podKey)
	}
	sort.Strings(keys)
	_, err = p.SettledIdentity(ctx, keys...)
	return err
}

// scheduledEvent waits for the Scheduled event of the pod (the scheduler
// records it after the binding, asynchronously) and returns its reporting
// controller and message.
func (l *Lab) scheduledEvent(ctx context.Context, pod *corev1.Pod) (by, msg string, err error) {
	sel := fields.Set{"involvedObject.uid": string(pod.UID), "reason": "Scheduled"}.AsSelector().String()
	for {
		evs, err := l.Client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil {
			for _, ev := range evs.Items {
				by := ev.ReportingController
				if by == "" {
					by = ev.Source.Component
				}
				return by, ev.Message, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", "", fmt.Errorf("no Scheduled event for pod %s/%s bound to %s (%v): %w", pod.Namespace, pod.Name, pod.Spec.NodeName, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// pendingError names the pods left unbound and the scheduler's reason.
func (l *Lab) pendingError(pods []*Pod, last map[types.UID]*corev1.Pod, cause error) error {
	var why []string
	for _, p := range pods {
		if p == nil || p.Node != nil {
			continue
		}
		reason := "not seen by the scheduler"
		if obj := last[p.UID]; obj != nil {
			for _, c := range obj.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					reason = c.Reason + ": " + c.Message
				}
			}
		}
		why = append(why, p.Ref()+" Pending ("+reason+")")
	}
	sort.Strings(why)
	return fmt.Errorf("%s: %w", strings.Join(why, "; "), cause)
}

// RunPods does a kubelet's part for pods that a controller creates (a
// training operator running against the lab's apiserver, `make demo`):
// it waits until namespace has want pods matching selector (a label
// selector, "" for all) bound to the lab's nodes by the scheduler and
// wires each as SchedulePods does (its node's labels named in
// nodeLabels copied onto it first). It returns them in the order they
// were created. Deleting them stays with the caller (Pod.Delete, as a
// kubelet ends a pod the controller or the garbage collector deleted).
func (l *Lab) RunPods(ctx context.Context, namespace, selector string, want int, nodeLabels map[string]string, timeout time.Duration) ([]*Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type seen struct {
		pod     *Pod
		created time.Time
	}
	byUID := map[types.UID]*seen{}
	last := map[types.UID]*corev1.Pod{}
	wired := 0
	handle := func(pod *corev1.Pod) error {
		last[pod.UID] = pod
		s := byUID[pod.UID]
		if s == nil {
			if pod.DeletionTimestamp != nil {
				return nil
			}
			p := &Pod{lab: l, UID: pod.UID, Spec: specOf(pod)}
			l.onUndo("Pod "+p.Ref(), func() error { return p.deleteObject(context.Background()) })
			s = &seen{pod: p, created: pod.CreationTimestamp.Time}
			byUID[pod.UID] = s
		}
		if pod.Spec.NodeName == "" || s.pod.Node != nil {
			return nil
		}
		if err := l.runBound(ctx, s.pod, pod, nodeLabels); err != nil {
			return err
		}
		wired++
		return nil
	}
	result := func() []*Pod {
		var out []*seen
		for _, s := range byUID {
			if s.pod.Node != nil {
				out = append(out, s)
			}
		}
		sort.Slice(out, func(i, j int) bool {
			if !out[i].created.Equal(out[j].created) {
				return out[i].created.Before(out[j].created)
			}
			return out[i].pod.Spec.Name < out[j].pod.Spec.Name
		})
		pods := make([]*Pod, len(out))
		for i, s := range out {
			pods[i] = s.pod
		}
		return pods
	}
	pending := func(cause error) error {
		var left []*Pod
		for _, s := range byUID {
			left = append(left, s.pod)
		}
		if len(left) < want {
			return fmt.Errorf("namespace %s: %d of %d pods created (%s): %w", namespace, len(left), want, selector, cause)
		}
		return l.pendingError(left, last, cause)
	}
	list, err := l.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("listing pods of %s: %w", namespace, err)
	}
	for i := range list.Items {
		if err := handle(&list.Items[i]); err != nil {
			return result(), err
		}
	}
	if wired >= want {
		return result(), nil
	}
	err = l.watchPods(ctx, namespace, metav1.ListOptions{LabelSelector: selector, ResourceVersion: list.ResourceVersion}, func(ev watch.EventType, pod *corev1.Pod) (bool, error) {
		if ev == watch.Deleted {
			return false, nil
		}
		if err := handle(pod); err != nil {
			return true, err
		}
		return wired >= want, nil
	})
	if err != nil && err == ctx.Err() {
		return result(), pending(ctx.Err())
	}
	return result(), err
}
