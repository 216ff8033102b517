package trainlab

import (
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// RayJobGVR and RayClusterGVR are the APIs the bed's KubeRay operator
// (v1.6.0) serves.
var (
	RayJobGVR     = schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayjobs"}
	RayClusterGVR = schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayclusters"}
)

// StartKubeRay starts the KubeRay operator (github.com/ray-project/kuberay,
// ray-operator/main.go) with its CRDs, leader election off, metrics off
// and no webhooks (main.go serves them only with ENABLE_WEBHOOKS=true; they
// validate RayCluster specs and are not needed for the pods).
func (b *Bed) StartKubeRay(t testing.TB) *Running {
	t.Helper()
	return b.StartController(t, Controller{
		Tool: "kuberay-operator",
		Args: func(e Endpoints) []string {
			return []string{"--kubeconfig", e.Kubeconfig, "--enable-leader-election=false",
				"--metrics-addr", "0", "--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(e.HealthPort),
				"--log-stdout-encoder", "console", "--zap-log-level", "2"}
		},
	})
}
