package trainlab

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// JobSetGVR is the JobSet API the bed's JobSet controller (v0.11.1) serves.
var JobSetGVR = schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}

// StartJobSet starts the JobSet controller (sigs.k8s.io/jobset, main.go)
// with its CRD, its JobSet and pod webhooks (the pod webhooks order the
// pods of exclusive-placement JobSets and their leader; they answer for
// every pod), internal certificate management and leader election off.
func (b *Bed) StartJobSet(t testing.TB) *Running {
	t.Helper()
	return b.StartController(t, Controller{
		Tool: "jobset",
		Args: func(e Endpoints) []string { return sigsArgs(t, e, "jobset.x-k8s.io") },
		Webhooks: []string{"/mutate-jobset-x-k8s-io-v1alpha2-jobset", "/validate-jobset-x-k8s-io-v1alpha2-jobset",
			"/mutate--v1-pod", "/validate--v1-pod"},
		// jobset_webhook.go ValidateCreate: the first replicated job may
		// not depend on another.
		Probe: &Probe{GVR: JobSetGVR, Message: "DependsOn can't be set for the first ReplicatedJob", Object: map[string]any{
			"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
			"metadata": map[string]any{"name": "trainlab-probe", "namespace": "default"},
			"spec": map[string]any{"replicatedJobs": []any{map[string]any{
				"name": "a", "replicas": 1,
				"dependsOn": []any{map[string]any{"name": "b", "status": "Complete"}},
				"template": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
					"restartPolicy": "Never",
					"containers":    []any{map[string]any{"name": "main", "image": "registry.example.com/train:1"}},
				}}}},
			}}},
		}},
	})
}
