package sim

import (
	"slices"
	"testing"
)

func TestPodResourcesOfDefault(t *testing.T) {
	s := Default()
	for _, n := range s.Nodes {
		pods, alloc := PodResourcesOf(s, n.Name)
		var own []string
		for _, g := range n.GPUs {
			own = append(own, g.UUID)
		}
		if len(own) == 0 && len(alloc) != 0 || len(own) > 0 && !slices.Equal(alloc[0].GetDeviceIds(), own) {
			t.Errorf("%s: allocatable %v, want %v", n.Name, alloc, own)
		}
		for _, p := range pods {
			for _, c := range p.GetContainers() {
				for _, d := range c.GetDevices() {
					if d.GetResourceName() != GPUResource {
						t.Errorf("%s/%s: resource %s", p.GetNamespace(), p.GetName(), d.GetResourceName())
					}
					for _, id := range d.GetDeviceIds() {
						if !slices.Contains(own, id) {
							t.Errorf("%s/%s on %s holds %s, not a GPU of that node", p.GetNamespace(), p.GetName(), n.Name, id)
						}
					}
				}
			}
		}
	}
	all, _ := PodResourcesOf(s, "")
	if len(all) != len(s.AllPods()) {
		t.Errorf("all nodes: %d pods, want %d", len(all), len(s.AllPods()))
	}
}
