package analyze

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func res(cpu string, gpus int64) corev1.ResourceList {
	l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourcePods: resource.MustParse("1")}
	if gpus > 0 {
		l["nvidia.com/gpu"] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	return l
}

// TestRoomByZone: what counts toward a zone's room for a job.
func TestRoomByZone(t *testing.T) {
	taint := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	tol := []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	gpuNode := func(zone string, gpus int64, labels map[string]string) nodeInfo {
		a := res("32", gpus)
		a[corev1.ResourcePods] = resource.MustParse("110")
		return nodeInfo{zone: zone, gpu: true, taints: []corev1.Taint{taint}, allocatable: a, ready: true, labels: labels}
	}
	worker := func(node string) podDemand {
		return podDemand{requests: res("4", 4), gpus: 4, tolerations: tol, node: node}
	}
	coordinator := podDemand{requests: res("2", 0)}
	fits := func(rooms []zoneRoom) map[string]bool {
		out := map[string]bool{}
		for _, r := range rooms {
			out[r.zone] = r.fits
		}
		return out
	}
	cases := []struct {
		name   string
		demand []podDemand
		nodes  map[string]nodeInfo
		used   map[string]corev1.ResourceList
		want   map[string]bool
	}{
		{
			name:   "the job's own pods are re-created: their GPUs are free",
			demand: []podDemand{coordinator, worker("a1"), worker("a1")},
			nodes:  map[string]nodeInfo{"a1": gpuNode("a", 8, nil), "b1": gpuNode("b", 4, nil)},
			used:   map[string]corev1.ResourceList{"a1": res("8", 8)},
			want:   map[string]bool{"a": true, "b": false},
		},
		{
			name:   "other pods' requests take room",
			demand: []podDemand{worker(""), worker("")},
			nodes:  map[string]nodeInfo{"a1": gpuNode("a", 8, nil)},
			used:   map[string]corev1.ResourceList{"a1": res("1", 1)},
			want:   map[string]bool{"a": false},
		},
		{
			name:   "a GPU pod that does not tolerate the taint has no node; a pod without GPUs may use a GPU node",
			demand: []podDemand{coordinator, {requests: res("1", 1), gpus: 1}},
			nodes:  map[string]nodeInfo{"a1": gpuNode("a", 8, nil)},
			want:   map[string]bool{"a": false},
		},
		{
			name:   "a node selector keeps pods off nodes it does not match",
			demand: []podDemand{{requests: res("4", 4), gpus: 4, tolerations: tol, nodeSelector: map[string]string{"gpu": "h100"}}},
			nodes:  map[string]nodeInfo{"a1": gpuNode("a", 8, map[string]string{"gpu": "a100"}), "b1": gpuNode("b", 8, map[string]string{"gpu": "h100"})},
			want:   map[string]bool{"a": false, "b": true},
		},
		{
			name:   "a node that is not Ready, or cordoned, takes no pod",
			demand: []podDemand{worker("")},
			nodes: map[string]nodeInfo{
				"a1": func() nodeInfo { n := gpuNode("a", 8, nil); n.ready = false; return n }(),
				"b1": func() nodeInfo { n := gpuNode("b", 8, nil); n.unschedulable = true; return n }(),
				"c1": gpuNode("c", 8, nil),
			},
			want: map[string]bool{"c": true},
		},
		{
			name:   "each pod must fit on one node",
			demand: []podDemand{{requests: res("4", 8), gpus: 8, tolerations: tol}},
			nodes:  map[string]nodeInfo{"a1": gpuNode("a", 4, nil), "a2": gpuNode("a", 4, nil)},
			want:   map[string]bool{"a": false},
		},
	}
	for _, c := range cases {
		if got := fits(roomByZone(c.demand, c.nodes, c.used)); len(got) != len(c.want) || func() bool {
			for z, f := range c.want {
				if got[z] != f {
					return true
				}
			}
			return false
		}() {
			t.Errorf("%s: fits %v, want %v", c.name, got, c.want)
		}
	}
}
