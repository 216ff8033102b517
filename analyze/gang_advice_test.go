package analyze

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestGangAdvice: --podgroups picks the advice; auto follows what the
// dump shows; the gang advice is a PodGroup of every pod of the job kept
// in one zone, and the templates join it in the way the controller
// carries (a PyTorchJob's templates drop spec.schedulingGroup: the label).
func TestGangAdvice(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("testdata/blocked/pods.json")
	if err != nil {
		t.Fatal(err)
	}
	withPodGroup := func(name string, topology bool) string {
		var list map[string]any
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatal(err)
		}
		pg := PodGroupManifest("ml-team", "other", 2)
		if !topology {
			delete(pg["spec"].(map[string]any), "schedulingConstraints")
		}
		list["items"] = append(list["items"].([]any), pg)
		out, err := json.Marshal(list)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fix := func(pods string, mode PodGroups) string {
		rep, err := Run(Input{Nodes: "testdata/nodes.json", Pods: pods, PodGroups: mode})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range rep.Jobs {
			if j.JobName == "llm-train" {
				return j.SuggestedFix
			}
		}
		t.Fatalf("no llm-train in %+v", rep.Jobs)
		return ""
	}
	plain := "testdata/blocked/pods.json"
	gangDump, basicDump := withPodGroup("gang.json", true), withPodGroup("basic.json", false)
	for _, c := range []struct {
		pods string
		mode PodGroups
		gang bool
	}{
		{plain, PodGroupsAuto, false}, {plain, PodGroupsOn, true}, {gangDump, PodGroupsAuto, true},
		{gangDump, PodGroupsOff, false}, {basicDump, PodGroupsAuto, false}, {plain, "", false},
	} {
		f := fix(c.pods, c.mode)
		if got := strings.Contains(f, "kind: PodGroup"); got != c.gang {
			t.Errorf("%s with --podgroups=%s: gang advice %v, want %v:\n%s", filepath.Base(c.pods), c.mode, got, c.gang, f)
		}
		if c.gang == strings.Contains(f, KueueTopologyAnnotation) {
			t.Errorf("%s with --podgroups=%s: Kueue in the gang advice or no Kueue without it:\n%s", filepath.Base(c.pods), c.mode, f)
		}
	}
	docs := strings.Split(fix(plain, PodGroupsOn), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("the gang advice is %d documents, want 2", len(docs))
	}
	var pg struct {
		APIVersion, Kind string
		Metadata         struct{ Name, Namespace string }
		Spec             struct {
			SchedulingPolicy struct {
				Gang struct{ MinCount int } `json:"gang"`
			} `json:"schedulingPolicy"`
			SchedulingConstraints struct {
				Topology []struct{ Key string } `json:"topology"`
			} `json:"schedulingConstraints"`
		}
	}
	if err := yaml.Unmarshal([]byte(docs[0]), &pg); err != nil {
		t.Fatal(err)
	}
	if pg.APIVersion != "scheduling.k8s.io/v1beta1" || pg.Kind != "PodGroup" || pg.Metadata.Name != "llm-train-gang" || pg.Metadata.Namespace != "ml-team" ||
		pg.Spec.SchedulingPolicy.Gang.MinCount != 3 || len(pg.Spec.SchedulingConstraints.Topology) != 1 || pg.Spec.SchedulingConstraints.Topology[0].Key != "topology.kubernetes.io/zone" {
		t.Errorf("the PodGroup: %+v\n%s", pg, docs[0])
	}
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(docs[1]), &patch); err != nil {
		t.Fatal(err)
	}
	specs := patch["spec"].(map[string]any)["pytorchReplicaSpecs"].(map[string]any)
	for _, key := range []string{"Master", "Worker"} {
		tm, _ := specs[key].(map[string]any)["template"].(map[string]any)
		lbl, _ := tm["metadata"].(map[string]any)["labels"].(map[string]any)
		if lbl[PodGroupLabel] != "llm-train-gang" {
			t.Errorf("template %s: labels %v, want %s: llm-train-gang", key, lbl, PodGroupLabel)
		}
		if spec, _ := tm["spec"].(map[string]any); spec["schedulingGroup"] != nil {
			t.Errorf("template %s: spec.schedulingGroup, which a PyTorchJob drops", key)
		}
	}
	if master := specs["Master"].(map[string]any)["template"].(map[string]any); master["spec"] == nil {
		t.Errorf("the CPU-only master has no tolerations of the GPU taint: %v", master)
	}
}
