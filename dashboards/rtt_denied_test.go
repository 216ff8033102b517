package dashboards

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

const rttMatrixTitle = "Round trip between zones (probe p50)"

// TestRTTMatrixShowsPolicyDenied evaluates the RTT matrix's query with
// promtool against the rule pack: a zone fence enforced on the peer's node
// (the prober counts timeouts, the peer counts the dropped probes inbound)
// makes the pair's cell the "denied by policy" value, while a measured
// pair keeps its round trip.
func TestRTTMatrixShowsPolicyDenied(t *testing.T) {
	promtool := filepath.Join(testenv.ToolsBin(t, "promtool"), "promtool")
	ds, err := Generate(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var expr string
	for _, d := range ds {
		qs, err := Queries(d.JSON, map[string]string{"namespace": "ml", "job_name": "llama"})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Title == rttMatrixTitle {
				expr = q.Expr
				if !strings.Contains(string(d.JSON), `"text": "denied by policy"`) {
					t.Errorf("%s: no value mapping to \"denied by policy\"", d.Name)
				}
			}
		}
	}
	if expr == "" {
		t.Fatalf("no panel %q", rttMatrixTitle)
	}
	rulesFile, err := filepath.Abs("../rules/zonewatch.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	test := `rule_files: [` + strconv.Quote(rulesFile) + `]
evaluation_interval: 1m
group_eval_order: [zonewatch.rules, zonewatch.jobs, zonewatch.health]
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="zonewatch",instance="10.0.1.1:19420"}'
        values: '1x20'
      - series: 'up{job="zonewatch",instance="10.0.2.1:19420"}'
        values: '1x20'
      # zone-a's prober: its probes to zone-b time out; zone-b's exporter
      # counts them dropped by policy on its node.
      - series: 'zonewatch_probe_failures_total{job="zonewatch",instance="10.0.1.1:19420",src_zone="zone-a",dst_zone="zone-b",reason="timeout"}'
        values: '0+6x20'
      - series: 'zonewatch_probe_failures_total{job="zonewatch",instance="10.0.1.1:19420",src_zone="zone-a",dst_zone="zone-b",reason="policy_denied"}'
        values: '0x20'
      - series: 'zonewatch_probe_inbound_denied_total{job="zonewatch",instance="10.0.2.1:19420",src_zone="zone-a",dst_zone="zone-b"}'
        values: '0+12x20'
      # In zone-a the probes pass: (61, 122] us.
      - series: 'zonewatch_zone_rtt_seconds{job="zonewatch",instance="10.0.1.1:19420",src_zone="zone-a",dst_zone="zone-a"}'
        values: '{{schema:0 sum:0 count:0}}+{{schema:0 sum:0.0009 count:10 offset:-13 buckets:[10]}}x20'
    promql_expr_test:
      - expr: ` + strconv.Quote(expr) + `
        eval_time: 10m
        exp_samples:
          - labels: '{src_zone="zone-a",dst_zone="zone-b"}'
            value: -1
          - labels: 'src_zone_dst_zone_quantile:zonewatch_zone_rtt_seconds:histogram_quantile{quantile="0.5",src_zone="zone-a",dst_zone="zone-a"}'
            value: 8.631674575031097e-05
`
	path := filepath.Join(t.TempDir(), "rtt_matrix_test.yml")
	if err := os.WriteFile(path, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules (the RTT matrix query %s):\n%s\n%v", expr, out, err)
	}
}
