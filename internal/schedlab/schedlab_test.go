package schedlab

import (
	"context"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/topology"
)

func TestMerge(t *testing.T) {
	dst := map[string]any{"spec": map[string]any{
		"replicatedJobs": []any{map[string]any{"name": "a", "replicas": 1}, map[string]any{"name": "b"}},
		"tolerations":    []any{map[string]any{"key": "x"}},
	}}
	Merge(dst, map[string]any{"spec": map[string]any{
		"replicatedJobs": []any{map[string]any{"name": "b", "template": map[string]any{"k": "v"}}},
		"tolerations":    []any{map[string]any{"key": "x"}, map[string]any{"key": "y"}},
	}})
	want := map[string]any{"spec": map[string]any{
		"replicatedJobs": []any{map[string]any{"name": "a", "replicas": 1}, map[string]any{"name": "b", "template": map[string]any{"k": "v"}}},
		"tolerations":    []any{map[string]any{"key": "x"}, map[string]any{"key": "y"}},
	}}
	if !reflect.DeepEqual(dst, want) {
		t.Errorf("merged %v, want %v", dst, want)
	}
}

// owners resolves the intermediate objects a shape returns, as the
// exporter's owner informers do.
type owners map[string]topology.OwnerRef

// ownersOf maps each intermediate object a shape returns to its owner; a
// top owner (a JobSet) has none and is left out.
func ownersOf(objs []map[string]any) owners {
	own := owners{}
	for _, o := range objs {
		m := o["metadata"].(map[string]any)
		if m["ownerReferences"] == nil {
			continue
		}
		ref := m["ownerReferences"].([]any)[0].(metav1.OwnerReference)
		own[o["kind"].(string)+"/"+m["name"].(string)] = topology.OwnerRef{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name}
	}
	return own
}

func (o owners) ControllerOf(_ string, ref topology.OwnerRef) (topology.OwnerRef, bool) {
	r, ok := o[ref.Kind+"/"+ref.Name]
	return r, ok
}

// TestShapesIdentity: the pods each shape makes are the job topology
// identifies (kind, name, role), so the scheduling test's jobs are the
// ones zonewatch sees.
func TestShapesIdentity(t *testing.T) {
	sz := Size{Workers: 3, WorkerGPUs: 1, WorkerCPU: "1", WorkerMem: "1Gi", CoordCPU: "1", CoordMem: "1Gi"}
	for _, s := range Shapes() {
		j := s.New("ns", "train", sz)
		coords, workers, objs, err := j.Pods()
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		own := ownersOf(objs)
		name := "train"
		if s.Kind == "LeaderWorkerSet" {
			name = "train-0"
		}
		if len(coords) != 1 || len(workers) != 2+map[bool]int{true: 0, false: 1}[s.AllGPU] {
			t.Errorf("%s: %d coordinators, %d workers", s.Name, len(coords), len(workers))
		}
		for _, p := range append(coords, workers...) {
			id, ok := topology.Identify(topology.DefaultRules(), kube.PodMeta(p), own)
			if id.Guess && !s.AllGPU {
				// A rank-0 guess yields to the coordinator by name or label.
				id.Role = topology.RoleWorker
			}
			role := topology.RoleWorker
			if p == coords[0] {
				role = topology.RoleCoordinator
			}
			if !ok || id.Kind != s.Kind || id.Name != name || id.Role != role {
				t.Errorf("%s: pod %s is %+v (%v), want %s %s %s", s.Name, p.Name, id, ok, s.Kind, name, role)
			}
		}
		for _, tm := range j.Templates() {
			if tm.T == nil || tm.T["spec"] == nil {
				t.Errorf("%s: template %s is empty", s.Name, tm.Path)
			}
		}
	}
}

// TestStepShapesIdentity: every pod of each step of a shape that comes in
// steps is the job topology identifies, and every pod is in one step.
func TestStepShapesIdentity(t *testing.T) {
	sz := Size{Workers: 3, WorkerGPUs: 1, WorkerCPU: "1", WorkerMem: "1Gi", CoordCPU: "1", CoordMem: "1Gi"}
	for _, s := range StepShapes() {
		j := s.New("ns", "train", sz)
		coords, workers, objs, err := j.Pods()
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		own := ownersOf(objs)
		steps, err := s.Steps(j)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		n := 0
		for i, st := range steps {
			if len(st.Pods) == 0 {
				t.Errorf("%s: step %d has no pod", s.Name, i)
			}
			n += len(st.Pods)
			for _, p := range st.Pods {
				id, ok := topology.Identify(topology.DefaultRules(), kube.PodMeta(p), own)
				if !ok || id.Kind != s.Kind || id.Name != "train" {
					t.Errorf("%s: pod %s is %+v (%v), want %s train", s.Name, p.Name, id, ok, s.Kind)
				}
			}
		}
		if n != len(coords)+len(workers) {
			t.Errorf("%s: %d pods in the steps, %d in the job", s.Name, n, len(coords)+len(workers))
		}
	}
}

// TestLab: the real scheduler binds a GPU pod to the tainted GPU node it
// tolerates, and leaves one it cannot place Pending, found unschedulable.
func TestLab(t *testing.T) {
	lab := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := lab.AddNodes(ctx,
		Node{Name: "gpu", Zone: "z1", CPU: "8", Memory: "32Gi", GPUs: 2, Taints: []corev1.Taint{GPUTaint}},
		Node{Name: "cpu", Zone: "z2", CPU: "8", Memory: "32Gi"}); err != nil {
		t.Fatal(err)
	}
	if err := lab.EnsureNamespace(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, gpus int64, tolerate bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "t"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "x", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}}}}}}
		if tolerate {
			p.Spec.Tolerations = []corev1.Toleration{{Key: string(GPUResource), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		}
		return p
	}
	for _, p := range []*corev1.Pod{pod("fits", 2, true), pod("untolerated", 1, false)} {
		if _, err := lab.Client.CoreV1().Pods("t").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := lab.Settle(ctx, "t", 2, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Placement{"fits": "gpu", "untolerated": ""}); !reflect.DeepEqual(got, want) {
		t.Errorf("placement %v, want %v", got, want)
	}
	if err := lab.DeletePods(ctx, "t"); err != nil {
		t.Fatal(err)
	}
}
