package trainlab

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// LWSGVR is the LeaderWorkerSet API the bed's LWS controller (v0.8.0) serves.
var LWSGVR = schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"}

// StartLWS starts the LeaderWorkerSet controller (sigs.k8s.io/lws,
// cmd/main.go) with its CRD, its LeaderWorkerSet and pod webhooks (the pod
// webhook labels each pod with its group and worker index), internal
// certificate management and leader election off, no gang scheduling
// provider.
func (b *Bed) StartLWS(t testing.TB) *Running {
	t.Helper()
	return b.StartController(t, Controller{
		Tool: "lws",
		Args: func(e Endpoints) []string { return sigsArgs(t, e, "lws.x-k8s.io") },
		Webhooks: []string{"/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
			"/mutate--v1-pod", "/validate--v1-pod"},
		// leaderworkerset_webhook.go generalValidate: the subgroup
		// exclusive-topology annotation needs a subGroupSize.
		Probe: &Probe{GVR: LWSGVR, Message: "cannot have subgroup-exclusive-topology without subGroupSize set", Object: map[string]any{
			"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
			"metadata": map[string]any{"name": "trainlab-probe", "namespace": "default",
				"annotations": map[string]any{"leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology": "topology.kubernetes.io/zone"}},
			"spec": map[string]any{"replicas": 1, "leaderWorkerTemplate": map[string]any{"size": 2,
				"workerTemplate": map[string]any{"spec": map[string]any{
					"containers": []any{map[string]any{"name": "main", "image": "registry.example.com/serve:1"}},
				}}}},
		}},
	})
}
