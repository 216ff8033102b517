package trainlab

import (
	"fmt"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TrainJobGVR and ClusterTrainingRuntimeGVR are the APIs the bed's Kubeflow
// Trainer (v2.2.0) serves.
var (
	TrainJobGVR               = schema.GroupVersionResource{Group: "trainer.kubeflow.org", Version: "v1alpha1", Resource: "trainjobs"}
	ClusterTrainingRuntimeGVR = schema.GroupVersionResource{Group: "trainer.kubeflow.org", Version: "v1alpha1", Resource: "clustertrainingruntimes"}
)

// StartTrainer starts Kubeflow Trainer's controller manager
// (github.com/kubeflow/trainer/v2, cmd/trainer-controller-manager) with its
// CRDs and its TrainJob and runtime webhooks, certificate management and
// leader election off. A TrainJob runs as a JobSet: start JobSet first.
// Its configuration has no certificate folder: its webhook server reads
// the default, $TMPDIR/k8s-webhook-server/serving-certs, so the bed points
// TMPDIR at the controller's folder and writes the certificates there.
func (b *Bed) StartTrainer(t testing.TB) *Running {
	t.Helper()
	return b.StartController(t, Controller{
		Tool: "trainer-controller-manager",
		Args: func(e Endpoints) []string {
			b.CA.WriteServing(t, filepath.Join(e.Dir, "tmp", "k8s-webhook-server", "serving-certs"))
			cfg := fmt.Sprintf(`apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
webhook: {host: 127.0.0.1, port: %d}
health: {healthProbeBindAddress: "127.0.0.1:%d"}
metrics: {bindAddress: "0"}
leaderElection: {leaderElect: false}
certManagement: {enable: false}
`, e.WebhookPort, e.HealthPort)
			path := writeConfig(t, e, "trainer-config.yaml", cfg)
			return []string{"--config", path, "--kubeconfig", e.Kubeconfig, "--zap-log-level", "2"}
		},
		Env: func(e Endpoints) []string { return []string{"TMPDIR=" + filepath.Join(e.Dir, "tmp")} },
		Webhooks: []string{"/mutate-trainer-kubeflow-org-v1alpha1-trainjob", "/validate-trainer-kubeflow-org-v1alpha1-trainjob",
			"/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime", "/validate-trainer-kubeflow-org-v1alpha1-trainingruntime"},
		// trainjob_webhook.go ValidateCreate: a runtime kind it does not know.
		Probe: &Probe{GVR: TrainJobGVR, Message: "unsupported runtime", Object: map[string]any{
			"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
			"metadata": map[string]any{"name": "trainlab-probe", "namespace": "default"},
			"spec":     map[string]any{"runtimeRef": map[string]any{"name": "trainlab-probe", "kind": "TrainlabNoSuchRuntime"}},
		}},
	})
}
