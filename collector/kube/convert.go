package kube

import (
	"github.com/zonewatch/zonewatch/topology"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node labels that place a node.
const (
	LabelZone         = "topology.kubernetes.io/zone"
	LabelZoneLegacy   = "failure-domain.beta.kubernetes.io/zone"
	LabelRegion       = "topology.kubernetes.io/region"
	LabelRegionLegacy = "failure-domain.beta.kubernetes.io/region"
)

func firstLabel(labels map[string]string, keys ...string) string {
	for _, k := range keys {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return ""
}

// NodeFrom converts a Kubernetes node. Addresses that do not parse are skipped.
func NodeFrom(n *corev1.Node) topology.Node {
	out := topology.Node{
		Name:   n.Name,
		Zone:   firstLabel(n.Labels, LabelZone, LabelZoneLegacy),
		Region: firstLabel(n.Labels, LabelRegion, LabelRegionLegacy),
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out.Addresses = append(out.Addresses, ip.Unmap())
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p.Masked())
		}
	}
	return out
}

// PodFrom converts a Kubernetes pod, identifying its job with rules. A pod
// of no job has an empty Identity.Name.
func PodFrom(rules []topology.Rule, p *corev1.Pod) topology.Pod {
	return PodWithOwners(rules, nil, p)
}

// PodWithOwners is PodFrom resolving the pod's top owner through owners
// (nil: the pod's own controller reference only).
func PodWithOwners(rules []topology.Rule, owners topology.Owners, p *corev1.Pod) topology.Pod {
	id, _ := topology.Identify(rules, PodMeta(p), owners)
	out := topology.Pod{
		Namespace:   p.Namespace,
		Name:        p.Name,
		Node:        p.Spec.NodeName,
		Finished:    p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
		Terminating: p.DeletionTimestamp != nil,
		HostNetwork: p.Spec.HostNetwork,
		Identity:    id,
	}
	ips := p.Status.PodIPs
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out.IPs = append(out.IPs, a.Unmap())
		}
	}
	return out
}

// PodMeta is what identity reads of a pod.
func PodMeta(p *corev1.Pod) topology.PodMeta {
	m := topology.PodMeta{Namespace: p.Namespace, Labels: p.Labels, Annotations: p.Annotations, Hostname: p.Spec.Hostname}
	if o := metav1.GetControllerOfNoCopy(p); o != nil {
		m.Owner = &topology.OwnerRef{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name}
	}
	return m
}

// StripNode is the node informer's transform: it keeps what NodeFrom
// reads, as a CachedNode, so the cache of 5,000 nodes stays small. Kept
// nodes and tombstones pass through.
func StripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &CachedNode{Node: NodeFrom(n), ResourceVersion: n.ResourceVersion}, nil
}

// PodStripper returns the pod informers' transform: a CachedPod keeping
// only what identity and placement read — the labels the job rules read
// (and the annotation of such a key where the label is absent, e.g. an old
// pod's completion index), the controller owner reference, spec.hostname
// where a coordinator-hostname label needs it, deletionTimestamp, node,
// IPs, phase and hostNetwork. Kept pods and tombstones pass through.
func PodStripper(rules []topology.Rule) func(any) (any, error) {
	k := newPodKeeper(rules)
	return func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		return k.cache(p), nil
	}
}
