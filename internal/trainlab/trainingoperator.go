package trainlab

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// PyTorchJobGVR and TFJobGVR are the APIs the bed's Kubeflow Training
// Operator (v1.9.3) serves.
var (
	PyTorchJobGVR = schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"}
	TFJobGVR      = schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "tfjobs"}
)

// trainingOperatorCertDir is where training-operator v1.9.3's certificate
// rotator looks for its serving certificate (pkg/cert/cert.go, a constant
// path), and its webhook server's default folder.
const trainingOperatorCertDir = "/tmp/k8s-webhook-server"

// StartTrainingOperator starts the Kubeflow Training Operator
// (github.com/kubeflow/training-operator, cmd/training-operator.v1) with
// its v1 CRDs (their mpijobs is v1: not in a bed with the MPI Operator),
// the PyTorchJob and TFJob controllers only (--enable-scheme), leader
// election off, no webhooks registered. Its certificate rotator cannot be
// turned off: it needs its Secret (created here, in "kubeflow", its
// default namespace), fills it with a CA of its own, and holds the
// controllers back until a serving certificate is in its constant folder
// /tmp/k8s-webhook-server/serving-certs (a kubelet mounts the Secret
// there). So that no test writes in the machine's /tmp, the operator runs
// in a mount namespace of its own (unshare(1), root) where the bed's own
// folder, with a certificate of the bed's CA, is bound over that path (an
// empty mount point is made in /tmp if there is none). Its validating
// webhook configuration is not registered: the rotator, which would
// overwrite its CA, logs that it is missing and goes on.
func (b *Bed) StartTrainingOperator(t testing.TB) *Running {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("training-operator runs in a mount namespace of its own: needs root")
	}
	ctx := context.Background()
	if err := b.EnsureNamespace(ctx, "kubeflow", nil); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "training-operator-webhook-cert", Namespace: "kubeflow"}}
	if _, err := b.Client.CoreV1().Secrets("kubeflow").Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := os.Stat(trainingOperatorCertDir); os.IsNotExist(err) {
		if err := os.MkdirAll(trainingOperatorCertDir, 0o755); err != nil {
			t.Fatal(err)
		}
		// The mount point this test made goes after the controller (the
		// cleanups run last first); only while empty.
		t.Cleanup(func() { os.Remove(trainingOperatorCertDir) })
	}
	return b.StartController(t, Controller{
		Tool: "training-operator",
		Args: func(e Endpoints) []string {
			b.CA.WriteServing(t, filepath.Join(e.Dir, "k8s-webhook-server", "serving-certs"))
			return []string{"--kubeconfig", e.Kubeconfig, "--leader-elect=false",
				"--enable-scheme", "pytorchjob", "--enable-scheme", "tfjob",
				"--webhook-server-port", strconv.Itoa(e.WebhookPort),
				"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(e.HealthPort),
				"--metrics-bind-address", "0", "--zap-log-level", "2"}
		},
		Env: func(e Endpoints) []string {
			return []string{"unshare", "-m", "--propagation", "private", "--",
				"sh", "-c", `mount --bind "$1" ` + trainingOperatorCertDir + ` && shift && exec "$@"`,
				"sh", filepath.Join(e.Dir, "k8s-webhook-server")}
		},
	})
}
