package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// TestRealJobLabels checks identity against the real job objects in
// ../shared/realdata: each pod template's labels as the controller would
// stamp them are not available, but the MPIJob pod metadata is.
func TestRealMPIJobPods(t *testing.T) {
	path := filepath.Join(testenv.RealData(t, "k8s"), "kueue-issue-8471-mpijob-v2-pods-metadata-only.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]string{}
	for _, doc := range strings.Split(string(data), "\n---") {
		var p corev1.Pod
		if err := yaml.Unmarshal([]byte(doc), &p); err != nil {
			t.Fatal(err)
		}
		if p.Name == "" {
			continue
		}
		pod := PodFrom(topology.DefaultRules(), &p)
		if pod.Identity.Name != "pi" || pod.Identity.Kind != "MPIJob" {
			t.Errorf("%s: identity %+v", p.Name, pod.Identity)
		}
		roles[p.Name] = pod.Identity.Role
	}
	if roles["pi-launcher-tntsp"] != topology.RoleCoordinator || roles["pi-worker-0"] != topology.RoleWorker {
		t.Fatalf("roles: %v", roles)
	}
}
