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

// StripNode keeps only what NodeFrom reads, so the informer cache of 5,000
// nodes stays small. It is an informer transform.
func StripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // tombstones pass through
	}
	labels := map[string]string{}
	for _, k := range []string{LabelZone, LabelZoneLegacy, LabelRegion, LabelRegionLegacy} {
		if v, ok := n.Labels[k]; ok {
			labels[k] = v
		}
	}
	out := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels, ResourceVersion: n.ResourceVersion, UID: n.UID},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			out.Status.Addresses = append(out.Status.Addresses, a)
		}
	}
	return out, nil
}

// PodStripper returns an informer transform that keeps only what identity
// and placement read: the labels the job rules read (and the annotation of
// such a key where the label is absent, e.g. an old pod's completion
// index), the controller owner reference, spec.hostname where a
// coordinator-hostname label needs it, deletionTimestamp, node, IPs, phase
// and hostNetwork.
func PodStripper(rules []topology.Rule) func(any) (any, error) {
	keep := map[string]bool{}
	for _, k := range topology.Keys(rules) {
		keep[k] = true
	}
	var hostLabels []string
	for _, r := range rules {
		if r.CoordinatorHostLabel != "" {
			hostLabels = append(hostLabels, r.CoordinatorHostLabel)
		}
	}
	return func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		labels := make(map[string]string, 4)
		for k, v := range p.Labels {
			if keep[k] {
				labels[k] = v
			}
		}
		var annotations map[string]string
		for k, v := range p.Annotations {
			if _, isLabel := p.Labels[k]; keep[k] && !isLabel {
				if annotations == nil {
					annotations = make(map[string]string, 1)
				}
				annotations[k] = v
			}
		}
		var owners []metav1.OwnerReference
		if o := metav1.GetControllerOfNoCopy(p); o != nil {
			owners = []metav1.OwnerReference{{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, Controller: o.Controller}}
		}
		spec := corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork}
		for _, l := range hostLabels {
			if _, ok := p.Labels[l]; ok {
				spec.Hostname = p.Spec.Hostname
			}
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: p.Namespace, Name: p.Name, Labels: labels, Annotations: annotations, OwnerReferences: owners,
				ResourceVersion: p.ResourceVersion, UID: p.UID, DeletionTimestamp: p.DeletionTimestamp,
			},
			Spec:   spec,
			Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
		}, nil
	}
}
