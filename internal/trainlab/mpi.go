package trainlab

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// MPIJobGVR is the MPIJob API the bed's MPI Operator (v0.8.0) serves.
var MPIJobGVR = schema.GroupVersionResource{Group: "kubeflow.org", Version: "v2beta1", Resource: "mpijobs"}

// mpiLockNamespace is where the MPI Operator takes its leader lease.
const mpiLockNamespace = "mpi-operator"

// StartMPIOperator starts the MPI Operator (github.com/kubeflow/mpi-operator,
// cmd/mpi-operator) with its v2beta1 MPIJob CRD. It has no webhooks. Two
// things it does not let the bed choose (cmd/mpi-operator/app/server.go):
// leader election is always on (a Lease in mpiLockNamespace, which the
// bed creates; the operator runs its controller once it leads, which is
// what the bed waits for), and its health check listens on :8080, a
// fixed port (it exits if that port is taken). Its MPIJob CRD collides
// with training-operator's v1 mpijobs: a bed runs one of the two.
func (b *Bed) StartMPIOperator(t testing.TB) *Running {
	t.Helper()
	return b.StartController(t, Controller{
		Tool: "mpi-operator",
		Args: func(e Endpoints) []string {
			return []string{"--kubeConfig", e.Kubeconfig, "--lock-namespace", mpiLockNamespace,
				"--threadiness", "2", "--monitoring-port", "0", "-v", "2"}
		},
		Ready: func(ctx context.Context, b *Bed) error {
			if err := b.EnsureNamespace(ctx, mpiLockNamespace, nil); err != nil {
				return err
			}
			var last error
			for {
				l, err := b.Client.CoordinationV1().Leases(mpiLockNamespace).Get(ctx, "mpi-operator", metav1.GetOptions{})
				switch {
				case err != nil:
					last = err
				case l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "":
					return nil
				default:
					last = fmt.Errorf("lease %s/mpi-operator has no holder", mpiLockNamespace)
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("mpi-operator does not lead: %w (last: %v)", ctx.Err(), last)
				case <-time.After(250 * time.Millisecond):
				}
			}
		},
	})
}
