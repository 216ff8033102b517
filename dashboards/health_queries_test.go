package dashboards

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// Four exporters over 20 minutes (one sample a minute):
//   - A on gpu-a1 (pods of ml/llama): hubble down from minute 10 to 14.
//   - B on gpu-b1 (pods of ml/llama and ml/fine): every source up.
//   - C (no job pods, so no node name): conntrack down all along.
//   - D in Relay mode (pods of ml/relayed on n1 and n2, so no node name):
//     hubble down from minute 15, still down.
//
// And alerts: a page and a warning firing, an info alert pending, and an
// alert that is not zonewatch's.
const healthSeries = `
      - series: 'zonewatch_job_pod_info{job="zonewatch",instance="a:19420",namespace="ml",job_name="llama",pod="p0",node="gpu-a1"}'
        values: '1x19'
      - series: 'zonewatch_job_pod_info{job="zonewatch",instance="b:19420",namespace="ml",job_name="llama",pod="p1",node="gpu-b1"}'
        values: '1x19'
      - series: 'zonewatch_job_pod_info{job="zonewatch",instance="b:19420",namespace="ml",job_name="fine",pod="f0",node="gpu-b1"}'
        values: '1x19'
      - series: 'zonewatch_job_pod_info{job="zonewatch",instance="d:19420",namespace="ml",job_name="relayed",pod="r0",node="n1"}'
        values: '1x19'
      - series: 'zonewatch_job_pod_info{job="zonewatch",instance="d:19420",namespace="ml",job_name="relayed",pod="r1",node="n2"}'
        values: '1x19'
      - series: 'zonewatch_source_up{job="zonewatch",instance="a:19420",source="hubble"}'
        values: '1x9 0x4 1x4'
      - series: 'zonewatch_source_up{job="zonewatch",instance="a:19420",source="gpu"}'
        values: '1x19'
      - series: 'zonewatch_source_up{job="zonewatch",instance="b:19420",source="hubble"}'
        values: '1x19'
      - series: 'zonewatch_source_up{job="zonewatch",instance="c:19420",source="conntrack"}'
        values: '0x19'
      - series: 'zonewatch_source_up{job="zonewatch",instance="d:19420",source="hubble"}'
        values: '1x14 0x4'
      # Another scrape job's exporters are not zonewatch's of this job.
      - series: 'zonewatch_source_up{job="other",instance="e:19420",source="hubble"}'
        values: '0x19'
      - series: 'up{job="zonewatch",instance="a:19420"}'
        values: '1x19'
      - series: 'up{job="zonewatch",instance="b:19420"}'
        values: '1x19'
      - series: 'up{job="zonewatch",instance="c:19420"}'
        values: '1x19'
      - series: 'up{job="zonewatch",instance="d:19420"}'
        values: '1x19'
      - series: 'ALERTS{alertname="ZonewatchIdleGPUSplitJob",alertstate="firing",severity="critical",namespace="ml",job_name="llama"}'
        values: '1x19'
      - series: 'ALERTS_FOR_STATE{alertname="ZonewatchIdleGPUSplitJob",severity="critical",namespace="ml",job_name="llama"}'
        values: '120x19'
      - series: 'ALERTS{alertname="ZonewatchGPUSourceDown",alertstate="firing",severity="warning",node="gpu-c2",source="gpu",instance="c:19420"}'
        values: '1x19'
      - series: 'ALERTS_FOR_STATE{alertname="ZonewatchGPUSourceDown",severity="warning",node="gpu-c2",source="gpu",instance="c:19420"}'
        values: '300x19'
      - series: 'ALERTS{alertname="ZonewatchCrossZoneCost",alertstate="pending",severity="info",namespace="ml",job_name="llama"}'
        values: '1x19'
      - series: 'ALERTS_FOR_STATE{alertname="ZonewatchCrossZoneCost",severity="info",namespace="ml",job_name="llama"}'
        values: '600x19'
      - series: 'ALERTS{alertname="KubePodCrashLooping",alertstate="firing",severity="critical",namespace="ml"}'
        values: '1x19'
`

// TestHealthQueries evaluates the firing-alerts, per-node source health
// and data completeness queries with promtool on the series above at
// minute 19 ($__range is BuiltinVars' 1h: the whole history).
func TestHealthQueries(t *testing.T) {
	promtool := filepath.Join(testenv.ToolsBin(t, "promtool"), "promtool")
	ds, err := Generate(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	byUID := map[string][]byte{}
	for _, d := range ds {
		byUID[d.UID] = d.JSON
	}
	query := func(uid, title, ref, job string) string {
		t.Helper()
		qs, err := Queries(byUID[uid], map[string]string{"namespace": "ml", "job_name": job})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Kind == KindPanel && q.Title == title && q.RefID == ref {
				return q.Expr
			}
		}
		t.Fatalf("%s: no panel %q with query %s", uid, title, ref)
		return ""
	}
	type sample struct {
		labels string
		value  float64
	}
	var tests strings.Builder
	check := func(uid, title, ref, job string, want ...sample) {
		fmt.Fprintf(&tests, "      - expr: %s\n        eval_time: 19m\n        exp_samples:\n", strconv.Quote(query(uid, title, ref, job)))
		if len(want) == 0 {
			tests.WriteString("          []\n")
		}
		for _, s := range want {
			fmt.Fprintf(&tests, "          - labels: %s\n            value: %v\n", strconv.Quote(s.labels), s.value)
		}
	}

	check(UIDOverview, "Firing critical alerts", "A", "", sample{"{}", 1})
	check(UIDOverview, "Firing warning alerts", "A", "", sample{"{}", 1})
	check(UIDOverview, "Firing info alerts", "A", "", sample{"{}", 0})
	check(UIDOverview, "Firing zonewatch alerts", "A", "",
		sample{`{alertname="ZonewatchIdleGPUSplitJob",severity="critical",namespace="ml",job_name="llama"}`, 120000},
		sample{`{alertname="ZonewatchGPUSourceDown",severity="warning",node="gpu-c2",source="gpu",instance="c:19420"}`, 300000})
	// Down now, or at some time in the range: by node where the exporter
	// places pods on one node, else by instance.
	check(UIDOverview, "Sources down by node", "A", "",
		sample{`{node="gpu-a1",instance="a:19420",source="hubble"}`, 1},
		sample{`{instance="c:19420",source="conntrack"}`, 0},
		sample{`{instance="d:19420",source="hubble"}`, 0})
	check(UIDOverview, "Sources down by node", "B", "",
		sample{`{node="gpu-a1",instance="a:19420",source="hubble"}`, 0.75},
		sample{`{instance="c:19420",source="conntrack"}`, 0},
		sample{`{instance="d:19420",source="hubble"}`, 0.75})
	// The job's nodes only: ml/llama on gpu-a1 and gpu-b1; ml/fine on
	// gpu-b1, complete; ml/relayed through the Relay-mode exporter.
	check(UIDJob, "Data complete over the range", "A", "llama", sample{"{}", 0})
	check(UIDJob, "Data complete over the range", "A", "fine", sample{"{}", 1})
	check(UIDJob, "Data complete over the range", "A", "relayed", sample{"{}", 0})
	check(UIDJob, "Sources down on the job's nodes", "A", "llama", sample{`{node="gpu-a1",instance="a:19420",source="hubble"}`, 1})
	check(UIDJob, "Sources down on the job's nodes", "B", "llama", sample{`{node="gpu-a1",instance="a:19420",source="hubble"}`, 0.75})
	check(UIDJob, "Sources down on the job's nodes", "A", "fine")
	check(UIDJob, "Sources down on the job's nodes", "A", "relayed", sample{`{instance="d:19420",source="hubble"}`, 0})
	check(UIDJob, "Sources down on the job's nodes", "B", "relayed", sample{`{instance="d:19420",source="hubble"}`, 0.75})

	test := "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:" + healthSeries +
		"    promql_expr_test:\n" + tests.String()
	path := filepath.Join(t.TempDir(), "health_queries_test.yml")
	if err := os.WriteFile(path, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules %s:\n%s\n%v", path, out, err)
	}
}
