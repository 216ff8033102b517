package analyze

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden reports in testdata")

func td(parts ...string) string { return filepath.Join(append([]string{"testdata"}, parts...)...) }

// wantJob is what a case checks of one job; nil maps and slices are not
// checked.
type wantJob struct {
	name             string // namespace/name
	kind             string
	verdict          string
	zones            map[string]RoleCount
	coordinatorZones []string
	drops, events    ByLocality
	policies         []string
	gpu              *float64
	fix              []string // substrings of suggested_fix
	noFix            []string // not in suggested_fix
}

func ptr(f float64) *float64 { return &f }

func TestAnalyze(t *testing.T) {
	nodes := td("nodes.json")
	cases := []struct {
		name       string
		in         Input
		jobs       []wantJob
		flows, bad int
		unresolved int
		exit       int
		warn       []string
	}{
		{
			name: "blocked, policy named, two node captures, GPU page",
			in: Input{Nodes: nodes, Pods: td("blocked", "pods.json"), GPU: td("blocked", "gpu.txt"),
				Flows: []string{td("blocked", "gpu-a1.jsonl"), td("blocked", "gpu-a2.jsonl")}},
			jobs: []wantJob{{
				name: "ml-team/llm-train", kind: "PyTorchJob", verdict: VerdictBlocked,
				zones:            map[string]RoleCount{"us-east-1a": {Worker: 2}, "us-east-1b": {Coordinator: 1}},
				coordinatorZones: []string{"us-east-1b"},
				// Two packets from gpu-a1 (policy-verdict + drop event
				// each, counted once), one from gpu-a2.
				drops:    ByLocality{CrossZone: 3},
				events:   ByLocality{Zone: 1, CrossZone: 3},
				policies: []string{"ml-team/zone-fence"},
				gpu:      ptr(0.005),
				// Kueue TAS, the master and its workers a podset group; the
				// zone with room for all of it named (the dump's allocatable
				// GPUs less what the other pods request), and no pin to it
				// (it half-places the job when the zone fills first).
				fix: []string{"pytorchReplicaSpecs:", "Master:", "Worker:", "us-east-1a has room for the whole job",
					"kueue.x-k8s.io/podset-required-topology: topology.kubernetes.io/zone", "kueue.x-k8s.io/podset-group-name: training",
					"kueue.x-k8s.io/queue-name:", "No pin to us-east-1a is given", "key: nvidia.com/gpu"},
				noFix: []string{"podAffinity", "nodeAffinity:"},
			}},
			flows: 7, exit: 1,
		},
		{
			name: "blocked, no policy named (bare flows, numeric drop reason)",
			in:   Input{Nodes: nodes, Pods: td("blocked-no-policy-name", "pods.json"), Flows: []string{td("blocked-no-policy-name", "gpu-b1.json")}},
			jobs: []wantJob{{
				name: "ml-team/tf-dist", kind: "TFJob", verdict: VerdictBlocked,
				zones:            map[string]RoleCount{"us-east-1a": {Worker: 2}, "us-east-1b": {Coordinator: 1}},
				coordinatorZones: []string{"us-east-1b"},
				drops:            ByLocality{CrossZone: 2}, events: ByLocality{CrossZone: 2}, policies: []string{},
				// The chief has GPUs and tolerates the GPU taint already.
				fix: []string{"tfReplicaSpecs:", "Chief:", "Worker:"}, noFix: []string{"tolerations"},
			}},
			flows: 2, exit: 1,
		},
		{
			name: "drops to the world block nothing",
			in:   Input{Nodes: nodes, Pods: td("world-drops", "pods.json"), Flows: []string{td("world-drops", "flows.jsonl")}},
			jobs: []wantJob{
				{name: "vision/detr", verdict: VerdictSplit, drops: ByLocality{Unknown: 1}, events: ByLocality{Unknown: 1}, policies: []string{}},
				{name: "vision/resnet", verdict: VerdictHealthy, zones: map[string]RoleCount{"us-east-1a": {Coordinator: 1, Worker: 1}},
					drops: ByLocality{Unknown: 1}, events: ByLocality{Zone: 1, Unknown: 1}, policies: []string{"vision/deny-egress"}},
			},
			flows: 3, exit: 1,
		},
		{
			name: "JobSet split, forwarded cross-zone traffic seen from both nodes counts once (pods as YAML)",
			in: Input{Nodes: nodes, Pods: td("jobset", "pods.yaml"),
				Flows: []string{td("jobset", "gpu-a1.jsonl"), td("jobset", "gpu-b1.jsonl")}},
			jobs: []wantJob{{
				name: "research/bert", kind: "JobSet", verdict: VerdictCrossZoneTraffic,
				zones:            map[string]RoleCount{"us-east-1a": {Worker: 2}, "us-east-1b": {Coordinator: 1}},
				coordinatorZones: []string{"us-east-1b"},
				events:           ByLocality{CrossZone: 2},
				// Three pods of 8 GPUs; no zone has 24 free: the advice says
				// so and offers gang admission instead of a pin.
				fix: []string{"No zone can hold every pod of JobSet research/bert now (24 GPUs in 3 pods; free GPUs by zone: us-east-1a 16, us-east-1b 8, us-east-1c 8)",
					"replicatedJobs:", "- name: workers", "kueue.x-k8s.io/podset-required-topology: topology.kubernetes.io/zone"},
				noFix: []string{"tolerations"},
			}},
			flows: 6, exit: 1,
		},
		{
			name:  "the sending node's capture alone counts the same",
			in:    Input{Nodes: nodes, Pods: td("jobset", "pods.yaml"), Flows: []string{td("jobset", "gpu-a1.jsonl")}},
			jobs:  []wantJob{{name: "research/bert", verdict: VerdictCrossZoneTraffic, events: ByLocality{CrossZone: 2}}},
			flows: 3, exit: 1,
		},
		{
			name: "MPIJob launcher alone in another zone, no flows",
			in:   Input{Nodes: nodes, Pods: td("mpijob", "pods.json"), Flows: []string{td("mpijob", "flows.jsonl")}},
			jobs: []wantJob{{
				name: "hpc/pi", kind: "MPIJob", verdict: VerdictSplit,
				zones:            map[string]RoleCount{"us-east-1a": {Worker: 2}, "us-east-1b": {Coordinator: 1}},
				coordinatorZones: []string{"us-east-1b"}, policies: []string{},
				fix: []string{"mpiReplicaSpecs:", "Launcher:", "Worker:", "podset-required-topology: topology.kubernetes.io/zone",
					"effect: NoSchedule\n            key: nvidia.com/gpu\n            operator: Exists"},
			}},
			exit: 1,
		},
		{
			name: "nodes with only the legacy zone label",
			in:   Input{Nodes: td("legacy", "nodes.json"), Pods: td("legacy", "pods.json")},
			jobs: []wantJob{{
				name: "legacy/old-train", verdict: VerdictSplit,
				zones:            map[string]RoleCount{"eu-west-1a": {Worker: 1}, "eu-west-1b": {Coordinator: 1}, "unknown": {Worker: 1}},
				coordinatorZones: []string{"eu-west-1b"},
				// No GPU node is tainted: no tolerations.
				fix: []string{"pytorchReplicaSpecs:"}, noFix: []string{"tolerations"},
			}},
			exit: 1,
		},
		{
			name: "pending and finished pods do not count",
			in:   Input{Nodes: nodes, Pods: td("pending-finished", "pods.json")},
			jobs: []wantJob{{
				name: "ml-team/finetune", verdict: VerdictHealthy,
				zones:            map[string]RoleCount{"us-east-1a": {Coordinator: 1, Worker: 1}},
				coordinatorZones: []string{"us-east-1a"},
			}},
			exit: 0,
		},
		{
			name: "IPv6",
			in:   Input{Nodes: nodes, Pods: td("ipv6", "pods.json"), Flows: []string{td("ipv6", "gpu-b1.jsonl")}},
			jobs: []wantJob{{
				name: "ml6/llm6", verdict: VerdictBlocked,
				zones: map[string]RoleCount{"us-east-1a": {Worker: 2}, "us-east-1b": {Coordinator: 1}},
				// The drop from an address no dump places is the job's,
				// of unknown locality, and not what blocks it.
				drops: ByLocality{CrossZone: 1, Unknown: 1}, events: ByLocality{CrossZone: 1, Unknown: 1},
				policies: []string{"ml6/zone-fence"},
			}},
			flows: 3, unresolved: 1, exit: 1,
		},
		{
			name:  "garbage lines in a flow file are counted and skipped",
			in:    Input{Nodes: nodes, Pods: td("jobset", "pods.yaml"), Flows: []string{td("garbage", "flows.jsonl")}},
			jobs:  []wantJob{{name: "research/bert", verdict: VerdictCrossZoneTraffic, events: ByLocality{CrossZone: 1}}},
			flows: 1, bad: 2, exit: 1,
			warn: []string{td("garbage", "flows.jsonl") + ":2: skipped", td("garbage", "flows.jsonl") + ":3: skipped"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var warn bytes.Buffer
			c.in.Warn = &warn
			rep, err := Run(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if rep.FlowsRead != c.flows || rep.BadLines != c.bad || rep.UnresolvedFlows != c.unresolved {
				t.Errorf("flows_read %d bad_lines %d unresolved_flows %d, want %d %d %d",
					rep.FlowsRead, rep.BadLines, rep.UnresolvedFlows, c.flows, c.bad, c.unresolved)
			}
			if got := rep.ExitCode(); got != c.exit {
				t.Errorf("exit code %d, want %d", got, c.exit)
			}
			for _, w := range c.warn {
				if !strings.Contains(warn.String(), w) {
					t.Errorf("warnings %q lack %q", warn.String(), w)
				}
			}
			if len(c.warn) == 0 && warn.Len() > 0 {
				t.Errorf("unexpected warnings: %s", warn.String())
			}
			if len(rep.Jobs) != len(c.jobs) {
				t.Fatalf("%d jobs, want %d: %+v", len(rep.Jobs), len(c.jobs), rep.Jobs)
			}
			for i, w := range c.jobs {
				checkJob(t, &rep.Jobs[i], &w)
			}
		})
	}
}

func checkJob(t *testing.T, j *Job, w *wantJob) {
	t.Helper()
	if got := j.Namespace + "/" + j.JobName; got != w.name {
		t.Fatalf("job %s, want %s", got, w.name)
	}
	if w.kind != "" && j.JobKind != w.kind {
		t.Errorf("%s: kind %s, want %s", w.name, j.JobKind, w.kind)
	}
	if j.Verdict != w.verdict {
		t.Errorf("%s: verdict %s, want %s", w.name, j.Verdict, w.verdict)
	}
	if j.SplitZone != (w.verdict != VerdictHealthy) {
		t.Errorf("%s: split_zone %v with verdict %s", w.name, j.SplitZone, j.Verdict)
	}
	if w.zones != nil && !reflect.DeepEqual(j.Zones, w.zones) {
		t.Errorf("%s: zones %v, want %v", w.name, j.Zones, w.zones)
	}
	if w.coordinatorZones != nil && !reflect.DeepEqual(j.CoordinatorZones, w.coordinatorZones) {
		t.Errorf("%s: coordinator_zones %v, want %v", w.name, j.CoordinatorZones, w.coordinatorZones)
	}
	if j.PolicyDrops != w.drops {
		t.Errorf("%s: policy_drops %+v, want %+v", w.name, j.PolicyDrops, w.drops)
	}
	if j.FlowEvents != w.events {
		t.Errorf("%s: flow_events %+v, want %+v", w.name, j.FlowEvents, w.events)
	}
	if w.policies != nil && !reflect.DeepEqual(j.DenyingPolicies, w.policies) {
		t.Errorf("%s: denying_policies %v, want %v", w.name, j.DenyingPolicies, w.policies)
	}
	switch {
	case w.gpu == nil && j.GPUUtilization != nil:
		t.Errorf("%s: gpu_utilization %v, want null", w.name, *j.GPUUtilization)
	case w.gpu != nil && (j.GPUUtilization == nil || *j.GPUUtilization != *w.gpu):
		t.Errorf("%s: gpu_utilization %v, want %v", w.name, j.GPUUtilization, *w.gpu)
	}
	if (j.SuggestedFix != "") != j.SplitZone {
		t.Errorf("%s: suggested_fix %q for split_zone %v", w.name, j.SuggestedFix, j.SplitZone)
	}
	if j.SuggestedFix != "" {
		var v map[string]any
		if err := yaml.Unmarshal([]byte(j.SuggestedFix), &v); err != nil || v["spec"] == nil {
			t.Errorf("%s: suggested_fix is not a YAML manifest fragment (%v):\n%s", w.name, err, j.SuggestedFix)
		}
	}
	for _, s := range w.fix {
		if !strings.Contains(j.SuggestedFix, s) {
			t.Errorf("%s: suggested_fix lacks %q:\n%s", w.name, s, j.SuggestedFix)
		}
	}
	for _, s := range w.noFix {
		if strings.Contains(j.SuggestedFix, s) {
			t.Errorf("%s: suggested_fix has %q:\n%s", w.name, s, j.SuggestedFix)
		}
	}
}

func TestUnreadableInput(t *testing.T) {
	nodes, pods := td("nodes.json"), td("mpijob", "pods.json")
	cases := []struct {
		name string
		in   Input
		want []string // substrings of the error
	}{
		{"missing nodes file", Input{Nodes: td("nope.json"), Pods: pods}, []string{"reading nodes", td("nope.json")}},
		{"JSON syntax error", Input{Nodes: td("broken", "nodes.json"), Pods: pods}, []string{td("broken", "nodes.json") + ":5:", "invalid character ','"}},
		{"YAML syntax error", Input{Nodes: nodes, Pods: td("broken", "pods.yaml")}, []string{td("broken", "pods.yaml") + ":11: yaml: mapping values are not allowed"}},
		{"not a pod", Input{Nodes: nodes, Pods: td("blocked", "gpu.txt")}, []string{td("blocked", "gpu.txt") + ":1:"}},
		{"a node where pods belong", Input{Nodes: nodes, Pods: td("legacy", "nodes.json")}, nil},
		{"flows that are no flows", Input{Nodes: nodes, Pods: pods, Flows: []string{td("broken", "flows.jsonl")}},
			[]string{td("broken", "flows.jsonl") + ":1: not hubble observe output"}},
		{"missing flow file", Input{Nodes: nodes, Pods: pods, Flows: []string{td("nope.jsonl")}}, []string{td("nope.jsonl")}},
		{"bad GPU page", Input{Nodes: nodes, Pods: pods, GPU: td("broken", "gpu.txt")}, []string{td("broken", "gpu.txt"), "line 2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Run(c.in)
			if c.want == nil {
				// A List of nodes holds no pod: nothing to analyze, no error.
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestGolden pins the whole JSON document and the text report of one
// case; run with -update to rewrite them after a deliberate change.
func TestGolden(t *testing.T) {
	rep, err := Run(Input{Nodes: td("nodes.json"), Pods: td("blocked", "pods.json"), GPU: td("blocked", "gpu.txt"),
		Flows: []string{td("blocked", "gpu-a1.jsonl"), td("blocked", "gpu-a2.jsonl")}})
	if err != nil {
		t.Fatal(err)
	}
	var js, text bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for file, got := range map[string][]byte{td("blocked", "report.json"): js.Bytes(), td("blocked", "report.txt"): text.Bytes()} {
		if *update {
			if err := os.WriteFile(file, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs (go test ./analyze -run TestGolden -update):\n%s", file, got)
		}
	}
}

func TestTextWorstFirst(t *testing.T) {
	rep := &Report{Jobs: []Job{
		{Namespace: "a", JobName: "healthy", Verdict: VerdictHealthy},
		{Namespace: "b", JobName: "split", Verdict: VerdictSplit, SplitZone: true},
		{Namespace: "c", JobName: "blocked", Verdict: VerdictBlocked, SplitZone: true},
		{Namespace: "d", JobName: "slow", Verdict: VerdictCrossZoneTraffic, SplitZone: true},
	}}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	last := -1
	for _, name := range []string{"c/blocked", "d/slow", "b/split", "a/healthy"} {
		i := strings.Index(out, name)
		if i < last {
			t.Errorf("%s is not after the worse jobs:\n%s", name, out)
		}
		last = i
	}
}

// TestFinishedLauncher: an MPIJob whose launcher completed while its
// workers run (mpi-operator's default CleanPodPolicy is None) has no
// coordinator in the launcher's zone: finished pods count toward no zone,
// role or split, and take no room.
func TestFinishedLauncher(t *testing.T) {
	b, err := os.ReadFile(td("mpijob", "pods.json"))
	if err != nil {
		t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	for _, it := range list["items"].([]any) {
		p := it.(map[string]any)
		if p["metadata"].(map[string]any)["name"] == "pi-launcher-tntsp" {
			p["status"].(map[string]any)["phase"] = "Succeeded"
		}
	}
	b, _ = json.Marshal(list)
	path := filepath.Join(t.TempDir(), "pods.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(Input{Nodes: td("nodes.json"), Pods: path})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Jobs) != 1 {
		t.Fatalf("jobs %+v, want hpc/pi", rep.Jobs)
	}
	// The index counts the live pods only: with no live launcher, worker 0
	// is the rank-0 guess (topology); what matters here is that the
	// launcher's zone holds nothing.
	j := rep.Jobs[0]
	if j.SplitZone || j.Verdict != VerdictHealthy || len(j.Zones) != 1 || j.Zones["us-east-1a"].Worker+j.Zones["us-east-1a"].Coordinator != 2 || j.SuggestedFix != "" {
		t.Errorf("with the launcher finished in us-east-1b: %+v, want two pods in us-east-1a, healthy", j)
	}
}
