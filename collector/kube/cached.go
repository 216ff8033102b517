package kube

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/zonewatch/zonewatch/topology"
)

// CachedPod is what a pod informer keeps of a job pod (the result of its
// transform, PodStripper): the labels the job rules read, the controller
// reference, and what placement reads, parsed once. It is read-only once
// made: the index shares its strings and IP slice.
type CachedPod struct {
	Namespace, Name, ResourceVersion string
	// labels and annotations are kept key/value pairs; the keys are the
	// rules' own strings, shared by every pod.
	labels, annotations []string
	owner               topology.OwnerRef
	ownerKey            string // objectKey of the controller; empty for none
	hostname, node      string
	ips                 []netip.Addr
	finished            bool
	terminating         bool
	hostNetwork         bool
}

// GetObjectMeta gives the informer what it keys and orders by (namespace,
// name, resource version).
func (p *CachedPod) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, ResourceVersion: p.ResourceVersion}
}

func pairs(kv []string) map[string]string {
	if kv == nil {
		return nil
	}
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// Meta is what identity reads of the pod.
func (p *CachedPod) Meta() topology.PodMeta {
	m := topology.PodMeta{Namespace: p.Namespace, Labels: pairs(p.labels), Annotations: pairs(p.annotations), Hostname: p.hostname}
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	if p.ownerKey != "" {
		o := p.owner
		m.Owner = &o
	}
	return m
}

// Pod converts the kept pod for the index, resolving its top owner through
// owners (nil: its own controller reference only).
func (p *CachedPod) Pod(rules []topology.Rule, owners topology.Owners) topology.Pod {
	id, _ := topology.Identify(rules, p.Meta(), owners)
	return topology.Pod{
		Namespace: p.Namespace, Name: p.Name, Node: p.node, IPs: p.ips,
		Finished: p.finished, Terminating: p.terminating, HostNetwork: p.hostNetwork,
		Identity: id,
	}
}

// podKeeper makes CachedPods for one set of rules.
type podKeeper struct {
	keep       map[string]string // kept key -> the same string, shared
	hostLabels []string
}

func newPodKeeper(rules []topology.Rule) *podKeeper {
	k := &podKeeper{keep: map[string]string{}}
	for _, key := range topology.Keys(rules) {
		k.keep[key] = key
	}
	for _, r := range rules {
		if r.CoordinatorHostLabel != "" {
			k.hostLabels = append(k.hostLabels, r.CoordinatorHostLabel)
		}
	}
	return k
}

func (k *podKeeper) cache(p *corev1.Pod) *CachedPod {
	out := &CachedPod{
		Namespace: p.Namespace, Name: p.Name, ResourceVersion: p.ResourceVersion,
		node:        p.Spec.NodeName,
		finished:    p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
		terminating: p.DeletionTimestamp != nil,
		hostNetwork: p.Spec.HostNetwork,
	}
	for key, v := range p.Labels {
		if shared, ok := k.keep[key]; ok {
			out.labels = append(out.labels, shared, v)
		}
	}
	for key, v := range p.Annotations {
		if shared, ok := k.keep[key]; ok {
			if _, isLabel := p.Labels[key]; !isLabel {
				out.annotations = append(out.annotations, shared, v)
			}
		}
	}
	if o := metav1.GetControllerOfNoCopy(p); o != nil {
		if gv, err := schema.ParseGroupVersion(o.APIVersion); err == nil {
			out.owner = topology.OwnerRef{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name}
			out.ownerKey = objectKey(p.Namespace, gv.Group, o.Kind, o.Name)
		}
	}
	for _, l := range k.hostLabels {
		if _, ok := p.Labels[l]; ok {
			out.hostname = p.Spec.Hostname
		}
	}
	ips := p.Status.PodIPs
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out.ips = append(out.ips, a.Unmap())
		}
	}
	return out
}

// podByController indexes kept pods by their controller (controllerIndex).
func podByController(obj any) ([]string, error) {
	if p, ok := obj.(*CachedPod); ok {
		if p.ownerKey == "" {
			return nil, nil
		}
		return []string{p.ownerKey}, nil
	}
	return byController(obj)
}

// CachedNode is what the node informer keeps of a node: the index's own
// Node and the resource version.
type CachedNode struct {
	topology.Node
	ResourceVersion string
}

// GetObjectMeta gives the informer what it keys and orders by.
func (n *CachedNode) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion}
}
