package analyze

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// TestVolcanoFix: Kueue does not manage Volcano Jobs, so a split Volcano
// Job never gets Kueue's advice: with room in a zone, the pin there with
// minAvailable of every pod (Volcano's gang starts them all or none);
// with no zone of room, Volcano's gang kept in one zone by its
// networkTopology, and no pin.
func TestVolcanoFix(t *testing.T) {
	taint := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	tol := []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	gpuNode := func(zone string, gpus int64) nodeInfo {
		a := res("32", gpus)
		a[corev1.ResourcePods] = resource.MustParse("110")
		return nodeInfo{zone: zone, gpu: true, taints: []corev1.Taint{taint}, allocatable: a, ready: true}
	}
	j := &Job{Namespace: "ml", JobName: "lm", JobKind: "VolcanoJob"}
	pods := func() *jobPods {
		w := podDemand{replicaType: "mpiworker", requests: res("4", 4), gpus: 4, tolerations: tol}
		return &jobPods{replicas: map[string]bool{"mpimaster": true, "mpiworker": false},
			demand: []podDemand{{replicaType: "mpimaster", requests: res("2", 0)}, w, w}}
	}
	for _, c := range []struct {
		name         string
		nodes        map[string]nodeInfo
		want, unwant []string
	}{
		{"room in zone a", map[string]nodeInfo{"a1": gpuNode("a", 8), "b1": gpuNode("b", 4)},
			[]string{"# a has room for the whole job now", "minAvailable: 3", "- name: mpimaster", "- name: mpiworker", "nodeAffinity:", "- a\n", "key: nvidia.com/gpu"},
			[]string{"kueue.x-k8s.io", "- b\n"}},
		{"no zone of room", map[string]nodeInfo{"a1": gpuNode("a", 4), "b1": gpuNode("b", 4)},
			[]string{"# No zone can hold every pod of VolcanoJob ml/lm", "Kueue does not manage Volcano Jobs", "minAvailable: 3", "networkTopology:", "highestTierAllowed: 1", "UNTESTED"},
			[]string{"kueue.x-k8s.io", "nodeAffinity:"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, podGroups := range []bool{false, true} {
				fix := suggestedFix(j, pods(), c.nodes, nil, podGroups)
				if testing.Verbose() && !podGroups {
					t.Logf("the fix:\n%s", fix)
				}
				var v map[string]any
				if err := yaml.Unmarshal([]byte(fix), &v); err != nil || v["spec"] == nil {
					t.Fatalf("podGroups %v: the fix is not a YAML fragment (%v):\n%s", podGroups, err, fix)
				}
				for _, s := range c.want {
					if !strings.Contains(fix, s) {
						t.Errorf("podGroups %v: the fix lacks %q:\n%s", podGroups, s, fix)
					}
				}
				for _, s := range c.unwant {
					if strings.Contains(fix, s) {
						t.Errorf("podGroups %v: the fix has %q:\n%s", podGroups, s, fix)
					}
				}
			}
		})
	}
}
