package schedlab

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Size is a job's shape in resources: one coordinator (CPU-only, where the
// controller has one) and workers with GPUs.
type Size struct {
	Workers              int
	WorkerGPUs           int64
	WorkerCPU, WorkerMem string
	CoordCPU, CoordMem   string
}

// Job is a training job as its user writes it (Manifest, in the
// controller's own kind; for a TrainJob, Runtime is the JobSet template of
// its ClusterTrainingRuntime) and the shape that makes its pods.
type Job struct {
	Shape           *Shape
	Namespace, Name string
	Manifest        map[string]any
	Runtime         map[string]any
}

// Template is a pod template of a manifest (the map holding its metadata
// and spec, to edit in place) and whether its pods request GPUs.
type Template struct {
	Path string
	T    map[string]any
	GPU  bool
}

// Shape makes a controller's jobs and their pods, as the controller does:
// names, labels, annotations, owner references, the template's spec. The
// citations are in identity_test.go of topology, whose rules read them.
type Shape struct {
	Name string // e.g. "MPIJob v2beta1"
	Kind string
	// AllGPU: every pod has GPUs; the coordinator is rank 0.
	AllGPU    bool
	manifest  func(name string, sz Size) map[string]any
	pods      func(j *Job) (coordinators, workers []*corev1.Pod, owners []map[string]any, err error)
	templates func(j *Job) []Template
	// runtime makes a TrainJob's runtime template (torchRuntime if nil).
	runtime func(sz Size) map[string]any
}

// New makes a job of the shape.
func (s *Shape) New(namespace, name string, sz Size) *Job {
	j := &Job{Shape: s, Namespace: namespace, Name: name, Manifest: s.manifest(name, sz)}
	if s.Kind == "TrainJob" {
		j.Runtime = torchRuntime(sz)
		if s.runtime != nil {
			j.Runtime = s.runtime(sz)
		}
	}
	return j
}

// Pods returns the pods the controller creates for the job now:
// coordinators (rank 0 where every pod has GPUs) and workers, and the
// intermediate objects it creates (for a dump: owner references resolve
// through them).
func (j *Job) Pods() (coordinators, workers []*corev1.Pod, owners []map[string]any, err error) {
	return j.Shape.pods(j)
}

// Templates returns the manifest's pod templates.
func (j *Job) Templates() []Template { return j.Shape.templates(j) }

// Shapes are the controller shapes topology identifies.
func Shapes() []*Shape {
	return []*Shape{
		kubeflow("PyTorchJob", "PyTorchJob", "kubeflow.org/v1", "pytorchReplicaSpecs", "Master", "pytorchjob-controller"),
		kubeflow("TFJob", "TFJob", "kubeflow.org/v1", "tfReplicaSpecs", "Chief", "tfjob-controller"),
		kubeflow("MPIJob v1", "MPIJob", "kubeflow.org/v1", "mpiReplicaSpecs", "Launcher", "mpijob-controller"),
		mpiV2(), trainJob(), jobSet(), lws(), volcano(), rayJob(), indexedJob(),
	}
}

// --- helpers ---

func container(name, cpu, mem string, gpus int64) map[string]any {
	res := map[string]any{"cpu": cpu, "memory": mem}
	lim := map[string]any{}
	if gpus > 0 {
		res["nvidia.com/gpu"] = strconv.FormatInt(gpus, 10)
		lim["nvidia.com/gpu"] = strconv.FormatInt(gpus, 10)
	}
	c := map[string]any{"name": name, "image": "registry.example.com/train:1.0", "resources": map[string]any{"requests": res}}
	if len(lim) > 0 {
		c["resources"].(map[string]any)["limits"] = lim
	}
	return c
}

// podTemplate: GPU pods tolerate the GPU taint, as GPU pods do (written by
// their users, or added by the ExtendedResourceToleration plugin).
func podTemplate(name string, gpu bool, sz Size, restart string) map[string]any {
	spec := map[string]any{"restartPolicy": restart}
	if gpu {
		spec["containers"] = []any{container(name, sz.WorkerCPU, sz.WorkerMem, sz.WorkerGPUs)}
		spec["tolerations"] = []any{map[string]any{"key": string(GPUResource), "operator": "Exists", "effect": "NoSchedule"}}
	} else {
		spec["containers"] = []any{container(name, sz.CoordCPU, sz.CoordMem, 0)}
	}
	return map[string]any{"spec": spec}
}

func meta(kind, apiVersion, name string) map[string]any {
	return map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{"name": name}}
}

func uid(parts ...string) types.UID {
	s := "uid"
	for _, p := range parts {
		s += "-" + p
	}
	return types.UID(s)
}

func ownerRef(apiVersion, kind, name string) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid(kind, name), Controller: &t, BlockOwnerDeletion: &t}
}

// ownerObject is an intermediate object as a dump holds it.
func ownerObject(apiVersion, kind, namespace, name string, owner metav1.OwnerReference) map[string]any {
	return map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{
		"name": name, "namespace": namespace, "uid": string(uid(kind, name)), "ownerReferences": []any{owner}}}
}

// newPod makes a pod of a template map as a controller does: the
// template's labels, annotations and spec, plus its own.
func newPod(j *Job, name string, tmpl map[string]any, labels, annotations map[string]string, owner metav1.OwnerReference) (*corev1.Pod, error) {
	b, err := json.Marshal(tmpl)
	if err != nil {
		return nil, err
	}
	var pt corev1.PodTemplateSpec
	if err := json.Unmarshal(b, &pt); err != nil {
		return nil, fmt.Errorf("%s: pod template: %w", j.Shape.Name, err)
	}
	p := &corev1.Pod{ObjectMeta: pt.ObjectMeta, Spec: pt.Spec}
	p.Name, p.Namespace = name, j.Namespace
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	for k, v := range labels {
		p.Labels[k] = v
	}
	if len(annotations) > 0 && p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	for k, v := range annotations {
		p.Annotations[k] = v
	}
	p.OwnerReferences = []metav1.OwnerReference{owner}
	return p, nil
}

func gpuTemplate(t map[string]any) bool {
	spec, _ := t["spec"].(map[string]any)
	cs, _ := spec["containers"].([]any)
	for _, c := range cs {
		res, _ := c.(map[string]any)["resources"].(map[string]any)
		for _, k := range []string{"limits", "requests"} {
			if l, ok := res[k].(map[string]any); ok && l["nvidia.com/gpu"] != nil {
				return true
			}
		}
	}
	return false
}

// Dig walks maps by keys; nil when a key is missing.
func Dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

func list(m map[string]any, key string) []map[string]any {
	var out []map[string]any
	items, _ := m[key].([]any)
	for _, it := range items {
		if mm, ok := it.(map[string]any); ok {
			out = append(out, mm)
		}
	}
	return out
}

func intOf(v any, def int) int {
	switch n := v.(type) {
	case int:
		return n
	case int64:
		return int(n)
	case float64:
		return int(n)
	}
	return def
}

// Merge lays patch over dst, as a person adds a fragment to a manifest:
// maps merge key by key, lists of named items (name, groupName) merge item
// by item, other lists get the patch's items they lack. dst is changed.
func Merge(dst, patch map[string]any) {
	for k, pv := range patch {
		switch p := pv.(type) {
		case map[string]any:
			d, ok := dst[k].(map[string]any)
			if !ok {
				d = map[string]any{}
				dst[k] = d
			}
			Merge(d, p)
		case []any:
			d, _ := dst[k].([]any)
			dst[k] = mergeList(d, p)
		default:
			dst[k] = pv
		}
	}
}

func itemKey(v any) string {
	m, ok := v.(map[string]any)
	if !ok {
		return ""
	}
	for _, k := range []string{"name", "groupName"} {
		if s, ok := m[k].(string); ok {
			return k + "=" + s
		}
	}
	return ""
}

func mergeList(dst, patch []any) []any {
	for _, pv := range patch {
		key, done := itemKey(pv), false
		for i, dv := range dst {
			if key != "" && itemKey(dv) == key {
				Merge(dst[i].(map[string]any), pv.(map[string]any))
				done = true
				break
			}
			if reflect.DeepEqual(dv, pv) {
				done = true
				break
			}
		}
		if !done {
			dst = append(dst, pv)
		}
	}
	return dst
}

// deepCopy copies a manifest (maps, lists and scalars of JSON).
func deepCopy(m map[string]any) map[string]any {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // maps of JSON values always marshal
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// Copy returns a job with a copy of the manifest (and runtime), to fix.
func (j *Job) Copy() *Job {
	c := *j
	c.Manifest = deepCopy(j.Manifest)
	if j.Runtime != nil {
		c.Runtime = deepCopy(j.Runtime)
	}
	return &c
}
