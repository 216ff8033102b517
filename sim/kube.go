package sim

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeNode renders a simulated node as a Kubernetes object.
func (s *Scenario) KubeNode(n Node) *corev1.Node {
	obj := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name,
			Labels: map[string]string{
				"kubernetes.io/hostname":        n.Name,
				"kubernetes.io/os":              "linux",
				"topology.kubernetes.io/zone":   n.Zone,
				"topology.kubernetes.io/region": s.Region,
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: n.IP.String()},
				{Type: corev1.NodeHostName, Address: n.Name},
			},
		},
	}
	if len(n.GPUs) > 0 {
		obj.Labels["nvidia.com/gpu.present"] = "true"
		q := resource.MustParse(fmt.Sprint(len(n.GPUs)))
		obj.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": q}
		obj.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": q}
	}
	return obj
}

// KubePod renders a simulated pod as a running Kubernetes pod.
func KubePod(p Pod) *corev1.Pod {
	obj := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.Namespace,
			Name:      p.Name,
			Labels:    p.Labels,
		},
		Spec: corev1.PodSpec{
			NodeName:   p.Node,
			Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/train:sim"}},
		},
		Status: corev1.PodStatus{
			Phase:  corev1.PodRunning,
			PodIP:  p.IP.String(),
			PodIPs: []corev1.PodIP{{IP: p.IP.String()}},
		},
	}
	if p.OwnerKind != "" {
		yes := true
		obj.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: ownerAPIVersion(p.OwnerKind), Kind: p.OwnerKind, Name: p.OwnerName,
			UID: "00000000-0000-4000-8000-000000000000", Controller: &yes,
		}}
	}
	if len(p.GPUs) > 0 {
		q := resource.MustParse(fmt.Sprint(len(p.GPUs)))
		obj.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": q}
	}
	return obj
}

func ownerAPIVersion(kind string) string {
	switch kind {
	case "Job":
		return "batch/v1"
	case "ReplicaSet":
		return "apps/v1"
	case "JobSet":
		return "jobset.x-k8s.io/v1alpha2"
	default:
		return "kubeflow.org/v1"
	}
}

// KubeObjects renders every node and pod of the scenario.
func (s *Scenario) KubeObjects() ([]*corev1.Node, []*corev1.Pod) {
	var nodes []*corev1.Node
	for _, n := range s.Nodes {
		nodes = append(nodes, s.KubeNode(n))
	}
	var pods []*corev1.Pod
	for _, p := range s.AllPods() {
		pods = append(pods, KubePod(p))
	}
	return nodes, pods
}
