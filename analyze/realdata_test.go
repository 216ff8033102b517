package analyze

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// realFiles are the files of ../shared/realdata (written by real Cilium,
// kubectl, dcgm-exporter and the job operators' own examples; see its
// SOURCES.md) that match pattern, "folder/glob". The test skips, naming the
// folder, only when the samples are absent.
func realFiles(t *testing.T, pattern string) []string {
	t.Helper()
	sub, glob, _ := strings.Cut(pattern, "/")
	dir := testenv.RealData(t, sub)
	files, _ := filepath.Glob(filepath.Join(dir, glob))
	if len(files) == 0 {
		t.Fatalf("no file in %s matches %s", dir, glob)
	}
	return files
}

func TestRealHubbleFlows(t *testing.T) {
	for _, f := range realFiles(t, "hubble/*") {
		t.Run(filepath.Base(f), func(t *testing.T) {
			rep, err := Run(Input{Nodes: td("nodes.json"), Pods: td("blocked", "pods.json"), Flows: []string{f}})
			if err != nil {
				t.Fatal(err)
			}
			if rep.FlowsRead == 0 || rep.BadLines != 0 {
				t.Errorf("flows_read %d bad_lines %d", rep.FlowsRead, rep.BadLines)
			}
		})
	}
}

func TestRealDCGMExporterPages(t *testing.T) {
	for _, f := range realFiles(t, "dcgm/*") {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if _, err := Run(Input{Nodes: td("nodes.json"), Pods: td("blocked", "pods.json"), GPU: f}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRealPods reads pods written by a real mpi-operator (metadata only:
// not scheduled, so no job to report).
func TestRealPods(t *testing.T) {
	for _, f := range realFiles(t, "k8s/*.yaml") {
		t.Run(filepath.Base(f), func(t *testing.T) {
			rep, err := Run(Input{Nodes: td("nodes.json"), Pods: f})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Jobs) != 0 {
				t.Errorf("unscheduled pods made jobs: %+v", rep.Jobs)
			}
		})
	}
}

// TestRealJobManifests checks the suggested fix against the operators'
// own example manifests: pods are made the way each operator labels them,
// split across two zones, and put in one List with the manifest (as
// `kubectl get pods,<kind> -o yaml` prints them); the fix must name only
// replica specs or replicated jobs the manifest has.
func TestRealJobManifests(t *testing.T) {
	files := realFiles(t, "k8s/*/*.yaml")
	tested := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		kind, _ := m["kind"].(string)
		meta, _ := m["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		spec, _ := m["spec"].(map[string]any)
		if kind == "ClusterTrainingRuntime" { // a JobSet template for TrainJobs
			spec = dig(spec, "template", "spec")
			kind = "JobSet"
		}
		replicas, field := manifestReplicas(kind, spec)
		if len(replicas) == 0 {
			continue // PodGroup, Workload: no pods of their own
		}
		tested++
		t.Run(filepath.Base(f), func(t *testing.T) {
			pods := fakePods(kind, name, replicas)
			list, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": append([]any{m}, pods...)})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "pods.yaml")
			if err := os.WriteFile(path, list, 0o644); err != nil {
				t.Fatal(err)
			}
			rep, err := Run(Input{Nodes: td("nodes.json"), Pods: path})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Jobs) != 1 || rep.Jobs[0].Verdict != VerdictSplit || rep.Jobs[0].JobKind != kind {
				t.Fatalf("jobs %+v, want one split %s", rep.Jobs, kind)
			}
			fix := rep.Jobs[0].SuggestedFix
			var patch map[string]any
			if err := yaml.Unmarshal([]byte(fix), &patch); err != nil {
				t.Fatalf("fix is not YAML: %v\n%s", err, fix)
			}
			got, _ := manifestReplicas(kind, dig(patch, "spec"))
			if len(got) == 0 {
				t.Fatalf("fix has no %s:\n%s", field, fix)
			}
			for _, r := range got {
				if !slices.Contains(replicas, r) {
					t.Errorf("fix names %s %q; the manifest has %v:\n%s", field, r, replicas, fix)
				}
			}
		})
	}
	if tested == 0 {
		t.Skip("no job manifests in the real data")
	}
}

func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m, _ = m[k].(map[string]any)
	}
	return m
}

// manifestReplicas lists a job spec's replica spec keys or replicated
// job names.
func manifestReplicas(kind string, spec map[string]any) (names []string, field string) {
	if kind == "JobSet" {
		list, _ := spec["replicatedJobs"].([]any)
		for _, rj := range list {
			if n, _ := rj.(map[string]any)["name"].(string); n != "" {
				names = append(names, n)
			}
		}
		return names, "replicatedJobs"
	}
	field = replicaSpecs[kind]
	for k := range dig(spec, field) {
		names = append(names, k)
	}
	slices.Sort(names)
	return names, field
}

// fakePods labels pods the way each operator does: two per replica, the
// first replica's first pod in us-east-1b, every other pod in us-east-1a.
func fakePods(kind, job string, replicas []string) []any {
	var pods []any
	for ri, r := range replicas {
		for i := range 2 {
			node, ip := "gpu-a1", fmt.Sprintf("10.244.1.%d", 100+10*ri+i)
			if ri == 0 && i == 0 {
				node, ip = "cpu-b1", "10.244.5.100"
			}
			var labels map[string]string
			owner := map[string]any{"apiVersion": "kubeflow.org/v1", "kind": kind, "name": job, "uid": "1", "controller": true}
			if kind == "JobSet" {
				labels = map[string]string{"jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": r,
					"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": fmt.Sprint(i)}
				owner["apiVersion"], owner["kind"], owner["name"] = "batch/v1", "Job", job+"-"+r+"-0"
			} else {
				labels = map[string]string{"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": strings.ToLower(r),
					"training.kubeflow.org/replica-index": fmt.Sprint(i)}
				if r == "Master" {
					labels["training.kubeflow.org/job-role"] = "master"
				}
			}
			pods = append(pods, map[string]any{"apiVersion": "v1", "kind": "Pod",
				"metadata": map[string]any{"name": fmt.Sprintf("%s-%s-%d", job, strings.ToLower(r), i), "namespace": "default",
					"labels": labels, "ownerReferences": []any{owner}},
				"spec":   map[string]any{"nodeName": node, "containers": []any{map[string]any{"name": "c", "image": "busybox"}}},
				"status": map[string]any{"phase": "Running", "podIP": ip}})
		}
	}
	return pods
}
