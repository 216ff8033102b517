package kube_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/zonewatch/zonewatch/analyze"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// syncBuffer is a log sink the informers' goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type cluster struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	// kapi is the exporter's client of the same apiserver.
	kapi kubeapi.Interface
	dyn  dynamic.Interface
	meta metadata.Interface
}

func startCluster(t *testing.T) *cluster {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	c := &cluster{t: t, ctx: ctx, client: kubernetes.NewForConfigOrDie(api.Config), kapi: kubeapi.NewForConfigOrDie(api.Config),
		dyn: dynamic.NewForConfigOrDie(api.Config), meta: metadata.NewForConfigOrDie(api.Config)}
	for i, zone := range []string{"zone-a", "zone-b"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n-%c", 'a'+i), Labels: map[string]string{kube.LabelZone: zone}}}
		if _, err := c.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// live starts the informers, owner informers included.
func (c *cluster) live(index *topology.Index, log *syncBuffer) {
	logger := slog.New(slog.NewTextHandler(log, nil))
	l, factories, err := kube.NewLive(c.kapi, index, topology.DefaultRules(), 0, logger)
	if err != nil {
		c.t.Fatal(err)
	}
	l.WithOwners(c.meta, c.kapi)
	if err := l.Run(c.ctx, factories); err != nil {
		c.t.Fatal(err)
	}
}

// pod creates a pod bound to node, Running with ip.
func (c *cluster) pod(p *corev1.Pod, node, ip string) {
	c.t.Helper()
	p.Namespace = "ml"
	p.Spec.NodeName = node
	p.Spec.Containers = []corev1.Container{{Name: "c", Image: "busybox"}}
	created, err := c.client.CoreV1().Pods("ml").Create(c.ctx, p, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create pod %s: %v", p.Name, err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if _, err := c.client.CoreV1().Pods("ml").UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("pod %s status: %v", p.Name, err)
	}
}

// waitPlacement polls the index until check passes.
func waitPlacement(t *testing.T, index *topology.Index, what string, check func([]topology.JobPlacement) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		jp := index.Placements("")
		if check(jp) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: placements %+v", what, jp)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func coordinators(jp topology.JobPlacement) int {
	n := 0
	for _, p := range jp.Pods {
		if p.Role == topology.RoleCoordinator {
			n++
		}
	}
	return n
}

// jobsetPodObject is a JobSet child pod (labels and annotations per
// sigs.k8s.io/jobset v0.12.0 pkg/controllers/jobset_controller.go
// labelAndAnnotateObject; completion index and hostname per
// k8s.io/kubernetes v1.37.2 pkg/controller/job/job_controller.go).
func jobsetPodObject(name, js, rjob string, podIdx int, owner *metav1.OwnerReference) *corev1.Pod {
	job := js + "-" + rjob + "-0"
	idx := fmt.Sprint(podIdx)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"jobset.sigs.k8s.io/jobset-name": js, "jobset.sigs.k8s.io/replicatedjob-name": rjob,
			"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-name": job, topology.LabelCompletionIndex: idx},
		Annotations: map[string]string{topology.LabelCompletionIndex: idx, "jobset.sigs.k8s.io/jobset-name": js}},
		Spec: corev1.PodSpec{Hostname: job + "-" + idx}}
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return p
}

// TestTerminatingPodAgainstKubeAPIServer: point 6 on a real apiserver. A
// pod held by a finalizer and deleted keeps running with a
// deletionTimestamp while its replacement (same completion index, other
// zone) starts: one coordinator, no split. Also: absent CRDs are skipped
// with one log line each, and the exporter still syncs.
func TestTerminatingPodAgainstKubeAPIServer(t *testing.T) {
	testenv.ToolsBin(t, "etcd", "kube-apiserver")
	c := startCluster(t)
	const hold = "zonewatch.test/hold"
	old := jobsetPodObject("pt-workers-0-0-old", "pt", "workers", 0, nil)
	old.Finalizers = []string{hold}
	c.pod(old, "n-b", "10.0.2.1")
	c.pod(jobsetPodObject("pt-workers-0-1-aaaaa", "pt", "workers", 1, nil), "n-a", "10.0.1.2")

	index := topology.NewIndex()
	var log syncBuffer
	c.live(index, &log)
	waitPlacement(t, index, "split before the deletion", func(jp []topology.JobPlacement) bool {
		return len(jp) == 1 && jp[0].Split()
	})

	if err := c.client.CoreV1().Pods("ml").Delete(c.ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.pod(jobsetPodObject("pt-workers-0-0-new", "pt", "workers", 0, nil), "n-a", "10.0.1.1")
	got, err := c.client.CoreV1().Pods("ml").Get(c.ctx, old.Name, metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp == nil {
		t.Fatalf("the old pod should be terminating: %v %+v", err, got.ObjectMeta)
	}
	waitPlacement(t, index, "terminating pod next to its replacement", func(jp []topology.JobPlacement) bool {
		return len(jp) == 1 && !jp[0].Split() && len(jp[0].Pods) == 2 && coordinators(jp[0]) == 1
	})
	// The leaving pod's IP still names the job (its last packets).
	if e, ok := index.LookupIP(mustAddr("10.0.2.1")); !ok || e.Job == nil {
		t.Errorf("terminating pod's IP: %+v %v", e, ok)
	}

	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := c.client.CoreV1().Pods("ml").Patch(c.ctx, old.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, res := range []string{"jobset.x-k8s.io/v1alpha2, Resource=jobsets", "ray.io/v1, Resource=rayclusters"} {
		if n := strings.Count(log.String(), `resource="`+res+`"`); n != 1 {
			t.Errorf("absent %s logged %d times:\n%s", res, n, log.String())
		}
	}
	if strings.Contains(log.String(), `resource="batch/v1, Resource=jobs"`) {
		t.Errorf("batch Jobs skipped:\n%s", log.String())
	}
}

// crd installs a minimal structural CRD with upstream's group, version,
// kind and plural (the files are cited at the call).
func (c *cluster) crd(group, version, kind, plural string) {
	c.t.Helper()
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": plural + "." + group},
		"spec": map[string]any{
			"group": group, "scope": "Namespaced",
			"names": map[string]any{"kind": kind, "plural": plural, "singular": strings.ToLower(kind), "listKind": kind + "List"},
			"versions": []any{map[string]any{"name": version, "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	if _, err := c.dyn.Resource(gvr).Create(c.ctx, obj, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("CRD %s: %v", plural, err)
	}
	// Established, and served through discovery.
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := c.client.Discovery().ServerResourcesForGroupVersion(group + "/" + version)
		if err == nil {
			for _, r := range list.APIResources {
				if r.Name == plural {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("CRD %s not served: %v", plural, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// object creates a custom or batch object owned by owner; it returns an
// owner reference to it.
func (c *cluster) object(apiVersion, kind, plural, name string, labels map[string]string, spec map[string]any, owner *metav1.OwnerReference) *metav1.OwnerReference {
	c.t.Helper()
	gv, _ := schema.ParseGroupVersion(apiVersion)
	meta := map[string]any{"name": name, "namespace": "ml"}
	if labels != nil {
		l := map[string]any{}
		for k, v := range labels {
			l[k] = v
		}
		meta["labels"] = l
	}
	if owner != nil {
		meta["ownerReferences"] = []any{map[string]any{"apiVersion": owner.APIVersion, "kind": owner.Kind, "name": owner.Name,
			"uid": string(owner.UID), "controller": true, "blockOwnerDeletion": true}}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta}}
	if spec != nil {
		obj.Object["spec"] = spec
	}
	created, err := c.dyn.Resource(gv.WithResource(plural)).Namespace("ml").Create(c.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create %s %s: %v", kind, name, err)
	}
	yes := true
	return &metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: created.GetUID(), Controller: &yes}
}

// TestOwnerChainAgainstKubeAPIServer: point 9 on a real apiserver with
// the CRDs installed. Job -> JobSet -> TrainJob gives job_kind TrainJob;
// a RayCluster created after its pods, owned by a RayJob, renames them to
// the RayJob, which its submitter pod joins (point 8).
func TestOwnerChainAgainstKubeAPIServer(t *testing.T) {
	testenv.ToolsBin(t, "etcd", "kube-apiserver")
	c := startCluster(t)
	// Group, version, kind, plural as in: kubeflow/trainer v2.3.0
	// manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml; sigs.k8s.io/jobset
	// v0.12.0 config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml;
	// ray-project/kuberay v1.7.0 ray-operator/config/crd/bases/ray.io_rayclusters.yaml
	// and ray.io_rayjobs.yaml.
	c.crd("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
	c.crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
	c.crd("ray.io", "v1", "RayCluster", "rayclusters")
	c.crd("ray.io", "v1", "RayJob", "rayjobs")

	// Trainer v2.3.0 pkg/runtime/framework/plugins/jobset/jobset.go: the
	// JobSet has the TrainJob's name and is controlled by it; JobSet
	// v0.12.0 names its Jobs "<js>-<rjob>-<idx>" and labels them.
	tj := c.object("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs", "llm", nil, map[string]any{"runtimeRef": map[string]any{"name": "torch-distributed"}}, nil)
	js := c.object("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", "llm", nil, map[string]any{}, tj)
	job := c.object("batch/v1", "Job", "jobs", "llm-node-0", map[string]string{"jobset.sigs.k8s.io/jobset-name": "llm"}, map[string]any{
		"completionMode": "Indexed", "completions": int64(2), "parallelism": int64(2), "manualSelector": false,
		"template": map[string]any{"spec": map[string]any{"restartPolicy": "Never", "containers": []any{map[string]any{"name": "node", "image": "busybox"}}}},
	}, js)
	c.pod(jobsetPodObject("llm-node-0-0-abcde", "llm", "node", 0, job), "n-a", "10.0.1.1")
	c.pod(jobsetPodObject("llm-node-0-1-fghij", "llm", "node", 1, job), "n-a", "10.0.1.2")

	// KubeRay v1.7.0 ray-operator/controllers/ray/common/pod.go labelPod;
	// rayjob_controller.go getSubmitterTemplate / createNewK8sJob.
	ray := func(name, nodeType string) *corev1.Pod {
		yes := true
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:          map[string]string{"ray.io/cluster": "tune-x7k2p", "ray.io/node-type": nodeType, "ray.io/group": "g"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "tune-x7k2p", UID: "00000000-0000-0000-0000-000000000001", Controller: &yes}}}}
	}
	c.pod(ray("tune-x7k2p-head-abcde", "head"), "n-b", "10.0.2.1")
	c.pod(ray("tune-x7k2p-g-worker-fghij", "worker"), "n-b", "10.0.2.2")
	submitter := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tune-klmno", Labels: map[string]string{
		"ray.io/originated-from-cr-name": "tune", "ray.io/originated-from-crd": "RayJob", "batch.kubernetes.io/job-name": "tune"}}}
	c.pod(submitter, "n-b", "10.0.2.3")

	index := topology.NewIndex()
	var log syncBuffer
	c.live(index, &log)
	waitPlacement(t, index, "TrainJob", func(jp []topology.JobPlacement) bool {
		for _, j := range jp {
			if j.Job == (topology.Job{Namespace: "ml", Name: "llm", Kind: "TrainJob"}) && len(j.Pods) == 2 && coordinators(j) == 1 {
				return true
			}
		}
		return false
	})
	waitPlacement(t, index, "RayCluster before its owner exists", func(jp []topology.JobPlacement) bool {
		for _, j := range jp {
			if j.Job.Kind == "RayCluster" && j.Job.Name == "tune-x7k2p" {
				return true
			}
		}
		return false
	})

	rj := c.object("ray.io/v1", "RayJob", "rayjobs", "tune", nil, map[string]any{}, nil)
	c.object("ray.io/v1", "RayCluster", "rayclusters", "tune-x7k2p", map[string]string{"ray.io/originated-from-crd": "RayJob"}, map[string]any{}, rj)
	waitPlacement(t, index, "RayJob with its submitter", func(jp []topology.JobPlacement) bool {
		for _, j := range jp {
			if j.Job.Kind == "RayCluster" {
				return false
			}
			if j.Job == (topology.Job{Namespace: "ml", Name: "tune", Kind: "RayJob"}) && len(j.Pods) == 3 && coordinators(j) == 1 {
				return true
			}
		}
		return false
	})
	// Owners created after their pods were identified: the Job's arrival
	// re-identifies the pods it controls, the JobSet's those of its Jobs.
	late := func(name, uid string) *metav1.OwnerReference {
		yes := true
		return &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: name, UID: types.UID(uid), Controller: &yes}
	}
	c.pod(jobsetPodObject("late-node-0-0-abcde", "late", "node", 0, late("late-node-0", "00000000-0000-0000-0000-000000000002")), "n-a", "10.0.1.3")
	c.pod(jobsetPodObject("late-node-0-1-fghij", "late", "node", 1, late("late-node-0", "00000000-0000-0000-0000-000000000002")), "n-a", "10.0.1.4")
	waitPlacement(t, index, "JobSet before its owners exist", func(jp []topology.JobPlacement) bool {
		for _, j := range jp {
			if j.Job == (topology.Job{Namespace: "ml", Name: "late", Kind: "JobSet"}) && len(j.Pods) == 2 {
				return true
			}
		}
		return false
	})
	ltj := c.object("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs", "late", nil, map[string]any{}, nil)
	c.object("batch/v1", "Job", "jobs", "late-node-0", map[string]string{"jobset.sigs.k8s.io/jobset-name": "late"}, map[string]any{
		"completionMode": "Indexed", "completions": int64(2), "parallelism": int64(2),
		"template": map[string]any{"spec": map[string]any{"restartPolicy": "Never", "containers": []any{map[string]any{"name": "node", "image": "busybox"}}}},
	}, &metav1.OwnerReference{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "late", UID: "00000000-0000-0000-0000-000000000003"})
	c.object("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", "late", nil, map[string]any{}, ltj)
	waitPlacement(t, index, "TrainJob after its owners arrived", func(jp []topology.JobPlacement) bool {
		for _, j := range jp {
			if j.Job == (topology.Job{Namespace: "ml", Name: "late", Kind: "TrainJob"}) && len(j.Pods) == 2 {
				return true
			}
		}
		return false
	})
	if strings.Contains(log.String(), "not resolving owners") {
		t.Errorf("an owner kind was skipped with its CRD installed:\n%s", log.String())
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestAnalyzeAgreesAgainstKubeAPIServer: the identity dump analyze reads
// (analyze/testdata/identity/pods.json, every controller's shape) is
// created in a real apiserver with its owner objects; the exporter's
// informers must then place every job as analyze does.
func TestAnalyzeAgreesAgainstKubeAPIServer(t *testing.T) {
	testenv.ToolsBin(t, "etcd", "kube-apiserver")
	c := startCluster(t)
	c.crd("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
	c.crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
	c.crd("ray.io", "v1", "RayCluster", "rayclusters")
	c.crd("ray.io", "v1", "RayJob", "rayjobs")
	nodes := filepath.Join("..", "..", "analyze", "testdata", "nodes.json")
	dump := filepath.Join("..", "..", "analyze", "testdata", "identity", "pods.json")
	rep, err := analyze.Run(analyze.Input{Nodes: nodes, Pods: dump})
	if err != nil {
		t.Fatal(err)
	}

	var nodeList, list struct {
		Items []json.RawMessage `json:"items"`
	}
	for file, into := range map[string]any{nodes: &nodeList, dump: &list} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatal(err)
		}
	}
	for _, raw := range nodeList.Items {
		var n corev1.Node
		_ = json.Unmarshal(raw, &n)
		n.ResourceVersion, n.UID = "", ""
		created, err := c.client.CoreV1().Nodes().Create(c.ctx, &n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = n.Status
		if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"serve", "etl", "ray"} {
		if _, err := c.client.CoreV1().Namespaces().Create(c.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	plural := map[string]string{"TrainJob": "trainjobs", "JobSet": "jobsets", "Job": "jobs", "RayJob": "rayjobs", "RayCluster": "rayclusters"}
	for _, raw := range list.Items {
		var u unstructured.Unstructured
		if err := json.Unmarshal(raw, &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetUID("")
		if u.GetKind() == "Pod" {
			var p corev1.Pod
			_ = json.Unmarshal(raw, &p)
			p.UID = ""
			deleting := p.DeletionTimestamp != nil
			p.DeletionTimestamp, p.DeletionGracePeriodSeconds = nil, nil
			if deleting {
				p.Finalizers = []string{"zonewatch.test/hold"}
			}
			status := p.Status
			created, err := c.client.CoreV1().Pods(p.Namespace).Create(c.ctx, &p, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("pod %s: %v", p.Name, err)
			}
			created.Status = status
			if _, err := c.client.CoreV1().Pods(p.Namespace).UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if deleting {
				if err := c.client.CoreV1().Pods(p.Namespace).Delete(c.ctx, p.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		if u.GetKind() == "Job" { // the dump keeps metadata only
			u.Object["spec"] = map[string]any{"template": map[string]any{"spec": map[string]any{
				"restartPolicy": "Never", "containers": []any{map[string]any{"name": "c", "image": "busybox"}}}}}
		}
		gv, _ := schema.ParseGroupVersion(u.GetAPIVersion())
		if _, err := c.dyn.Resource(gv.WithResource(plural[u.GetKind()])).Namespace(u.GetNamespace()).Create(c.ctx, &u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}

	index := topology.NewIndex()
	var log syncBuffer
	c.live(index, &log)
	want := map[string]string{}
	for _, j := range rep.Jobs {
		want[j.Namespace+"/"+j.JobName] = fmt.Sprintf("%s %v", j.JobKind, j.Zones)
	}
	var got map[string]string
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = map[string]string{}
		for _, jp := range index.Placements("") {
			zones := map[string]analyze.RoleCount{}
			for _, p := range jp.Pods {
				rc := zones[p.Zone]
				if p.Role == topology.RoleCoordinator {
					rc.Coordinator++
				} else {
					rc.Worker++
				}
				zones[p.Zone] = rc
			}
			got[jp.Job.Namespace+"/"+jp.Job.Name] = fmt.Sprintf("%s %v", jp.Job.Kind, zones)
		}
		if reflect.DeepEqual(got, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("exporter and analyze disagree:\nexporter %v\nanalyze  %v", got, want)
	}
	if len(want) != 10 {
		t.Fatalf("analyze reported %d jobs, want the 10 of the dump", len(want))
	}
}
