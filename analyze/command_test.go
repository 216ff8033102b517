package analyze

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"
)

// command parses args with the analyze command on a fresh app, as the
// exporter's run does, and runs it. A parse error is bad usage: 2.
func command(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	app := kingpin.New("zonewatch-exporter", "")
	app.Terminate(nil)
	var out, errb bytes.Buffer
	app.UsageWriter(&errb)
	app.ErrorWriter(&errb)
	// The exporter declares --kube.job-rule for every command.
	rules := app.Flag("kube.job-rule", "").Strings()
	run := AddCommand(app, rules, &out, &errb)
	if _, err := app.Parse(append([]string{"analyze"}, args...)); err != nil {
		return 2, out.String(), err.Error()
	}
	return run(), out.String(), errb.String()
}

func TestCommandExitCodes(t *testing.T) {
	nodes := "--nodes=" + td("nodes.json")
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr []string
	}{
		{"no job split", []string{nodes, "--pods", td("pending-finished", "pods.json")}, 0,
			[]string{"HEALTHY  ml-team/finetune (PyTorchJob)", "1 training job: 0 blocked"}, nil},
		{"blocked, json", []string{nodes, "--pods", td("blocked", "pods.json"), "--flows", td("blocked", "gpu-a1.jsonl"), "-o", "json"}, 1,
			[]string{`"verdict": "blocked"`}, nil},
		{"split", []string{nodes, "--pods", td("mpijob", "pods.json")}, 1, []string{"SPLIT  hpc/pi (MPIJob)", "mpiReplicaSpecs:"}, nil},
		{"garbage lines warned, not fatal", []string{nodes, "--pods", td("jobset", "pods.yaml"), "--flows", td("garbage", "flows.jsonl")}, 1,
			[]string{"CROSS ZONE TRAFFIC  research/bert"}, []string{td("garbage", "flows.jsonl") + ":2: skipped"}},
		{"flow files after --flows (a shell glob)", []string{nodes, "--pods", td("jobset", "pods.yaml"), "--flows", td("jobset", "gpu-b1.jsonl"), td("jobset", "gpu-a1.jsonl")}, 1,
			[]string{"CROSS ZONE TRAFFIC  research/bert", "6 flows read"}, nil},
		{"no job at all", []string{nodes, "--pods", td("legacy", "nodes.json")}, 0, []string{"No pod of a training job"}, nil},
		{"unreadable pods", []string{nodes, "--pods", td("nope.json")}, 2, nil, []string{"zonewatch-exporter analyze: reading pods", td("nope.json")}},
		{"unreadable flows", []string{nodes, "--pods", td("mpijob", "pods.json"), "--flows", td("broken", "flows.jsonl")}, 2,
			nil, []string{td("broken", "flows.jsonl") + ":1:"}},
		{"bad job rule", []string{nodes, "--pods", td("mpijob", "pods.json"), "--kube.job-rule", "name=x"}, 2, nil, []string{"--kube.job-rule"}},
		{"no --nodes", []string{"--pods", td("mpijob", "pods.json")}, 2, nil, []string{"--nodes"}},
		{"no --pods", []string{nodes}, 2, nil, []string{"--pods"}},
		{"bad --output", []string{nodes, "--pods", td("mpijob", "pods.json"), "--output", "xml"}, 2, nil, []string{"xml"}},
		{"custom job rule", []string{nodes, "--pods", td("mpijob", "pods.json"), "--kube.job-rule", "name=training.kubeflow.org/job-name,kind=HPCJob"}, 1,
			[]string{"SPLIT  hpc/pi (HPCJob)", "every pod template", "podset-required-topology: topology.kubernetes.io/zone"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := command(t, c.args...)
			if code != c.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, c.code, stderr)
			}
			for _, s := range c.stdout {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout)
				}
			}
			for _, s := range c.stderr {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr lacks %q:\n%s", s, stderr)
				}
			}
			if c.code == 2 && stdout != "" {
				t.Errorf("a failed run printed a report:\n%s", stdout)
			}
		})
	}
}

// TestJSONShape checks the documented document: every field present, in
// this order, jobs sorted by namespace then name, empty lists as [].
func TestJSONShape(t *testing.T) {
	code, stdout, stderr := command(t, "--nodes", td("nodes.json"), "--pods", td("world-drops", "pods.json"), "--output", "json")
	if code != 1 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var doc struct {
		Jobs []map[string]json.RawMessage `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatal(err)
	}
	fields := []string{"namespace", "job_name", "job_kind", "zones", "split_zone", "coordinator_zones", "policy_drops",
		"denying_policies", "selected_policies", "flow_events", "gpu_utilization", "verdict", "suggested_fix"}
	for _, j := range doc.Jobs {
		if len(j) != len(fields) {
			t.Errorf("job has %d fields, want %d: %v", len(j), len(fields), j)
		}
		for _, f := range fields {
			if _, ok := j[f]; !ok {
				t.Errorf("job lacks %q", f)
			}
		}
		if string(j["denying_policies"]) != "[]" || string(j["gpu_utilization"]) != "null" {
			t.Errorf("denying_policies %s gpu_utilization %s, want [] and null", j["denying_policies"], j["gpu_utilization"])
		}
	}
	last := -1
	for _, f := range fields {
		i := strings.Index(stdout, `"`+f+`"`)
		if i < last {
			t.Errorf("field %q out of order", f)
		}
		last = i
	}
	for _, top := range []string{`"jobs"`, `"flows_read"`, `"bad_lines"`, `"unresolved_flows"`, `"lost_events"`} {
		if !strings.Contains(stdout, top) {
			t.Errorf("no %s", top)
		}
	}
	if len(doc.Jobs) != 2 || string(doc.Jobs[0]["job_name"]) != `"detr"` || string(doc.Jobs[1]["job_name"]) != `"resnet"` {
		t.Errorf("jobs not sorted by namespace, name: %s", stdout)
	}
}

// TestDocumented fails when a flag or a JSON field is missing from
// docs/analyze.md, or its example is not the golden report.
func TestDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/analyze.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	app := kingpin.New("x", "")
	AddCommand(app, new([]string), nil, nil)
	for _, f := range app.GetCommand("analyze").Model().Flags {
		if !strings.Contains(doc, "`--"+f.Name) {
			t.Errorf("flag --%s is not in docs/analyze.md", f.Name)
		}
	}
	// The example is the golden text report.
	report, err := os.ReadFile(td("blocked", "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(doc, string(report)) {
		t.Errorf("docs/analyze.md's example is not testdata/blocked/report.txt")
	}
	for _, f := range []string{"namespace", "job_name", "job_kind", "zones", "split_zone", "coordinator_zones", "policy_drops",
		"denying_policies", "flow_events", "gpu_utilization", "verdict", "suggested_fix", "flows_read", "bad_lines", "unresolved_flows"} {
		if !strings.Contains(doc, "`"+f+"`") {
			t.Errorf("field %s is not in docs/analyze.md", f)
		}
	}
}
