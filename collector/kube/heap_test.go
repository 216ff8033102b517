package kube

import (
	"fmt"
	"github.com/zonewatch/zonewatch/topology"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func heapNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// fullPod is a job pod as the apiserver sends it, before the transform.
func fullPod(j, k, node int) *corev1.Pod {
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: fmt.Sprintf("team-%d", j%50), Name: fmt.Sprintf("job-%d-worker-%d", j, k),
			UID: "0c8a1f3e-5d1b-4c1e-9a4f-7b8c9d0e1f2a", ResourceVersion: "123456789",
			Labels: map[string]string{
				"training.kubeflow.org/job-name": fmt.Sprintf("job-%d", j), "training.kubeflow.org/replica-type": "worker",
				"training.kubeflow.org/replica-index": fmt.Sprint(k), "training.kubeflow.org/operator-name": "pytorchjob-controller",
				"app.kubernetes.io/part-of": "training", "team": "ml",
			},
			Annotations: map[string]string{
				"kubectl.kubernetes.io/last-applied-configuration": string(make([]byte, 1500)),
				"prometheus.io/scrape":                             "true",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob", Name: fmt.Sprintf("job-%d", j), UID: "x", Controller: &yes}},
		},
		Spec: corev1.PodSpec{
			NodeName: fmt.Sprintf("node-%05d", node),
			Containers: []corev1.Container{{
				Name: "pytorch", Image: "nvcr.io/nvidia/pytorch:24.05-py3",
				Command:   []string{"torchrun", "--nnodes=4", "--nproc-per-node=8", "train.py"},
				Env:       []corev1.EnvVar{{Name: "MASTER_ADDR", Value: "job-master-0"}, {Name: "MASTER_PORT", Value: "23456"}, {Name: "NCCL_DEBUG", Value: "INFO"}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}},
			}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.1.2.3", PodIPs: []corev1.PodIP{{IP: "10.1.2.3"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}

// TestHeapAtScale reports (with -v) the heap held for 5,000 nodes and
// 20,000 job pods: the informer caches (CachedPod, CachedNode, the pod
// store indexed by controller as the informers index it), and the index.
// Measured, not asserted; docs/performance.md has the figures.
func TestHeapAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("heap measurement")
	}
	const nodes, jobs, perJob = 5000, 2000, 10
	strip := PodStripper(topology.DefaultRules())
	base := heapNow()
	podStore := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{controllerIndex: podByController})
	nodeStore := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for i := 0; i < nodes; i++ {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i), Labels: map[string]string{
				LabelZone: fmt.Sprintf("zone-%d", i%4), LabelRegion: "r1", "kubernetes.io/hostname": "h", "node.kubernetes.io/instance-type": "p5.48xlarge"}},
			Spec:   corev1.NodeSpec{PodCIDR: "10.0.0.0/24", PodCIDRs: []string{"10.0.0.0/24"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.16.0.1"}, {Type: corev1.NodeHostName, Address: "h"}}},
		}
		s, _ := StripNode(n)
		_ = nodeStore.Add(s)
	}
	for j := 0; j < jobs; j++ {
		for k := 0; k < perJob; k++ {
			s, _ := strip(fullPod(j, k, (j*perJob+k)%nodes))
			_ = podStore.Add(s)
		}
	}
	caches := heapNow()
	x := topology.NewIndex()
	for _, o := range nodeStore.List() {
		x.UpsertNode(o.(*CachedNode).Node)
	}
	for _, o := range podStore.List() {
		x.UpsertPod(0, o.(*CachedPod).Pod(topology.DefaultRules(), nil))
	}
	index := heapNow()
	t.Logf("informer caches (stripped): %.1f MiB for %d nodes + %d pods; index: %.1f MiB; total %.1f MiB",
		float64(caches-base)/(1<<20), len(nodeStore.List()), len(podStore.List()),
		float64(index-caches)/(1<<20), float64(index-base)/(1<<20))
	runtime.KeepAlive(x)
	runtime.KeepAlive(podStore)
	runtime.KeepAlive(nodeStore)
}
