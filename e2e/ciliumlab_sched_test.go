package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/analyze"
	"github.com/zonewatch/zonewatch/internal/ciliumlab"
	"github.com/zonewatch/zonewatch/internal/schedlab"
)

// The lab's nodes as a scheduler sees them: GPU nodes (allocatable
// nvidia.com/gpu, tainted nvidia.com/gpu=present:NoSchedule as GPU clusters
// taint them) in zones a and c, a bigger CPU-only node in zone b. Zone c's
// GPU node is small (2 GPUs) and bert-slow's master fills it, so zone a is
// the only zone with room for llm-blocked's workers.
var (
	gpuNodeLabels = map[string]string{"nvidia.com/gpu.present": "true"}
	gpuTaints     = []corev1.Taint{schedlab.GPUTaint}
)

// labGPUsOf is the node's GPU count (allocatable nvidia.com/gpu and the
// simulated GPUs).
func labGPUsOf(node string) int64 {
	for _, n := range labNodes {
		if n.Name == node {
			return n.GPUs
		}
	}
	return 0
}

// blockedJobYAML is the seed's blocked job as its user writes it: a
// CPU-only master that tolerates the GPU taint (it may run next to its
// workers: the seed's job has the toleration), two workers of 2 GPUs.
// Nothing in it keeps the pods in one zone.
var blockedJobYAML = fmt.Sprintf(`apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: llm-blocked
  namespace: ml-team
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          tolerations:
          - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
          containers:
          - name: pytorch
            image: registry.invalid/zonewatch-lab:traffic
            ports: [{name: pytorchjob-port, containerPort: %[1]d}]
            resources:
              requests: {cpu: "2", memory: 8Gi}
    Worker:
      replicas: 2
      restartPolicy: OnFailure
      template:
        spec:
          tolerations:
          - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
          containers:
          - name: pytorch
            image: registry.invalid/zonewatch-lab:traffic
            ports: [{name: pytorchjob-port, containerPort: %[1]d}]
            resources:
              requests: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "2"}
              limits: {nvidia.com/gpu: "2"}
`, ciliumlab.RendezvousPort)

// pytorchJob is a PyTorchJob manifest with the shape that makes its pods
// as the Kubeflow training operator does (internal/schedlab).
func pytorchJob(t *testing.T, manifest string) *schedlab.Job {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(manifest), &m); err != nil {
		t.Fatal(err)
	}
	var shape *schedlab.Shape
	for _, s := range schedlab.Shapes() {
		if s.Kind == "PyTorchJob" {
			shape = s
		}
	}
	md := m["metadata"].(map[string]any)
	return &schedlab.Job{Shape: shape, Namespace: md["namespace"].(string), Name: md["name"].(string), Manifest: m}
}

// scheduleJob creates the job's pods unbound, master first, as the
// training operator does, and returns them once the real kube-scheduler
// has bound each to a lab node and the lab has wired it there. Each pod
// gets its node's zone as the label the zone fence selects ("zone"),
// copied at the binding. It fails the test when a pod stays Pending or
// when a pod was not bound by the scheduler.
func scheduleJob(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, j *schedlab.Job) *labJob {
	t.Helper()
	coords, workers, _, err := j.Pods()
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	pods, err := lab.SchedulePods(ctx, append(coords, workers...), map[string]string{"zone": schedlab.LabelZone}, 2*time.Minute)
	if err != nil {
		t.Fatalf("scheduling %s/%s: %v", j.Namespace, j.Name, err)
	}
	t.Logf("%s/%s: %d pods created unbound, bound by kube-scheduler and wired in %s", j.Namespace, j.Name, len(pods), time.Since(began).Round(time.Millisecond))
	for _, p := range pods {
		// The binding is the scheduler's: the pod was created without a
		// node and the scheduler recorded the binding it made.
		if p.ScheduledBy != "default-scheduler" || !strings.HasSuffix(p.Scheduled, " to "+p.Node.Name) {
			t.Errorf("pod %s on %s: Scheduled event by %q: %q, want default-scheduler's", p.Ref(), p.Node.Name, p.ScheduledBy, p.Scheduled)
		}
	}
	return &labJob{ns: j.Namespace, name: j.Name, coordinator: pods[0], workers: pods[1:]}
}

// placement is "pod -> node (zone)" for each of the job's pods.
func (j *labJob) placement() string {
	var out []string
	for _, p := range j.pods() {
		out = append(out, fmt.Sprintf("%s -> %s (%s)", p.Spec.Name, p.Node.Name, p.Node.Zone))
	}
	return strings.Join(out, ", ")
}

// zones are the zones the job's pods run in.
func (j *labJob) zones() []string {
	var out []string
	for _, p := range j.pods() {
		if !containsString(out, p.Node.Zone) {
			out = append(out, p.Node.Zone)
		}
	}
	sort.Strings(out)
	return out
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// analyzeLab dumps the lab's nodes and every pod as `kubectl get nodes -o
// json` and `kubectl get pods -A -o json` would into dir, runs zonewatch's
// analyze on them (the code of `zonewatch-exporter analyze`), and returns
// the job's report and the command a person would type.
func analyzeLab(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, dir, ns, name string) (analyze.Job, string) {
	t.Helper()
	nodeItems, podItems, err := schedlab.ListItems(ctx, lab.Client, "", "")
	if err != nil {
		t.Fatal(err)
	}
	write := func(file string, items []any) string {
		b, err := json.MarshalIndent(map[string]any{"apiVersion": "v1", "kind": "List", "items": items}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	np, pp := write("nodes.json", nodeItems), write("pods.json", podItems)
	rep, err := analyze.Run(analyze.Input{Nodes: np, Pods: pp})
	if err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf("zonewatch-exporter analyze --nodes %s --pods %s", np, pp)
	for _, j := range rep.Jobs {
		if j.Namespace == ns && j.JobName == name {
			return j, cmd
		}
	}
	t.Fatalf("analyze reports no job %s/%s: %+v", ns, name, rep.Jobs)
	return analyze.Job{}, cmd
}

// apiPlacement reads the job's pods from the apiserver (what kubectl get
// pods shows): node by pod, "" for a Pending one.
func apiPlacement(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, ns, name string) map[string]string {
	t.Helper()
	list, err := lab.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "training.kubeflow.org/job-name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p.Spec.NodeName
		}
	}
	return out
}
