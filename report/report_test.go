package report

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"

	"github.com/zonewatch/zonewatch/rules"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// sample is one series of an instant-vector result.
type sample struct {
	labels map[string]string
	value  float64
}

// promAPI serves /api/v1/query in the Prometheus HTTP API's documented
// response format (https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries):
// each query gets the result of the first key it contains.
type promAPI struct {
	t       *testing.T
	results []struct {
		contains string
		samples  []sample
	}
	auth    string // last Authorization header
	queries []string
}

func (p *promAPI) on(contains string, s ...sample) *promAPI {
	p.results = append(p.results, struct {
		contains string
		samples  []sample
	}{contains, s})
	return p
}

func (p *promAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/query" {
		http.NotFound(w, r)
		return
	}
	_ = r.ParseForm()
	q := r.Form.Get("query")
	p.auth = r.Header.Get("Authorization")
	p.queries = append(p.queries, q)
	ts, _ := strconv.ParseFloat(r.Form.Get("time"), 64)
	type res struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	out := []res{}
	for _, c := range p.results {
		if strings.Contains(q, c.contains) {
			for _, s := range c.samples {
				out = append(out, res{s.labels, [2]any{ts, strconv.FormatFloat(s.value, 'g', -1, 64)}})
			}
			break
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": out}})
}

func l(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// withRulePack answers the price series as the rule pack records them.
func withRulePack(p *promAPI) *promAPI {
	return p.
		on(rules.RecTransferPrice, sample{l("__name__", rules.RecTransferPrice, "locality", "cross_zone"), 0.01},
			sample{l("__name__", rules.RecTransferPrice, "locality", "cross_region"), 0.02}).
		on(rules.RecGPUPrice, sample{l("__name__", rules.RecGPUPrice), 4})
}

// fixed is a month with two namespaces: a costly job, a blocked job with
// idle GPUs and a denying policy, and a cheap one.
func fixed(t *testing.T) *promAPI {
	p := withRulePack(&promAPI{t: t})
	p.on("zonewatch_job_network_bytes_total",
		sample{l("namespace", "research", "job_name", "mpi-costly", "locality", "cross_zone"), 12_345_678_901_234},
		sample{l("namespace", "research", "job_name", "mpi-costly", "locality", "cross_region"), 1_000_000_000},
		sample{l("namespace", "ml-team", "job_name", "llm-slow", "locality", "cross_zone"), 250_000_000_000},
		sample{l("namespace", "ml-team", "job_name", "resnet|pipes", "locality", "cross_zone"), 1_500_000})
	p.on(rules.RecSplitIdleGPUCost,
		sample{l("namespace", "ml-team", "job_name", "llm-blocked"), 1234.5})
	p.on("zonewatch_job_policy_drops_total",
		sample{l("namespace", "ml-team", "job_name", "llm-blocked", "policy", "ml-team/zone-boundary"), 1520},
		sample{l("namespace", "ml-team", "job_name", "llm-blocked", "policy", "cluster/deny-cross-az"), 3},
		sample{l("namespace", "research", "job_name", "mpi-costly", "policy", "data/minio-ingress"), 7})
	return p
}

var (
	from = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	to   = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
)

// run runs the command line against srv, as a user would.
func run(t *testing.T, srv *httptest.Server, args ...string) (string, string, int) {
	t.Helper()
	app := kingpin.New("zonewatch-exporter", "")
	var stdout, stderr bytes.Buffer
	f := AddCommand(app, &stdout, &stderr)
	if _, err := app.Parse(append([]string{"report", "--prometheus.url", srv.URL}, args...)); err != nil {
		t.Fatal(err)
	}
	code := f()
	return stdout.String(), stderr.String(), code
}

func TestFormatsGolden(t *testing.T) {
	p := fixed(t)
	srv := httptest.NewServer(p)
	defer srv.Close()
	for _, format := range Formats {
		t.Run(format, func(t *testing.T) {
			out, stderr, code := run(t, srv, "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "-o", format)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			ext := map[string]string{"text": "txt", "markdown": "md"}[format]
			if ext == "" {
				ext = format
			}
			golden := filepath.Join("testdata", "report."+ext)
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./report -update writes it)", err)
			}
			if out != string(want) {
				t.Errorf("%s output differs from %s (go test ./report -update):\n%s", format, golden, out)
			}
		})
	}
	// Every query asks for the period in whole seconds at its end.
	for _, q := range p.queries {
		if strings.Contains(q, "[") && !strings.Contains(q, "[2592000s") {
			t.Errorf("query without the 30-day range: %s", q)
		}
	}
}

// TestFigures checks the arithmetic against numbers worked out by hand.
func TestFigures(t *testing.T) {
	srv := httptest.NewServer(fixed(t))
	defer srv.Close()
	out, stderr, code := run(t, srv, "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339), "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	byJob := map[string]Line{}
	for _, l := range r.Jobs {
		byJob[l.Namespace+"/"+l.Job] = l
	}
	costly := byJob["research/mpi-costly"]
	// 12345.678901234 GB * 0.01 + 1 GB * 0.02
	if got, want := costly.TransferDollars, 12345.678901234*0.01+0.02; !near(got, want) {
		t.Errorf("mpi-costly transfer $ = %v, want %v", got, want)
	}
	blocked := byJob["ml-team/llm-blocked"]
	if !near(blocked.IdleGPUHours, 1234.5/4) || !near(blocked.IdleGPUDollars, 1234.5) {
		t.Errorf("llm-blocked idle GPU: %v h, $%v; want %v h, $1234.5", blocked.IdleGPUHours, blocked.IdleGPUDollars, 1234.5/4)
	}
	if got := strings.Join(blocked.DenyingPolicies, ","); got != "cluster/deny-cross-az,ml-team/zone-boundary" {
		t.Errorf("llm-blocked policies = %s", got)
	}
	for i := 1; i < len(r.Jobs); i++ {
		if r.Jobs[i].TotalDollars > r.Jobs[i-1].TotalDollars {
			t.Errorf("not costliest first: %s ($%v) after %s ($%v)", r.Jobs[i].Job, r.Jobs[i].TotalDollars, r.Jobs[i-1].Job, r.Jobs[i-1].TotalDollars)
		}
	}
	var sum float64
	for _, n := range r.Namespaces {
		sum += n.TotalDollars
	}
	if !near(sum, r.Total.TotalDollars) {
		t.Errorf("namespaces add up to %v, total says %v", sum, r.Total.TotalDollars)
	}
	// 30 days = 720 h; a month is 730 h.
	if !near(r.MonthlyProjection.TotalDollars, r.Total.TotalDollars*730/720) {
		t.Errorf("projection %v, want %v", r.MonthlyProjection.TotalDollars, r.Total.TotalDollars*730/720)
	}
	if r.SchemaVersion != SchemaVersion || len(r.Notes) == 0 {
		t.Errorf("schema %d, %d notes", r.SchemaVersion, len(r.Notes))
	}
}

// TestFormatsAgree: the text, CSV and Markdown tables show the JSON's
// numbers, to the cent.
func TestFormatsAgree(t *testing.T) {
	srv := httptest.NewServer(fixed(t))
	defer srv.Close()
	args := []string{"--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339)}
	js, _, _ := run(t, srv, append(args, "-o", "json")...)
	var r Report
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatal(err)
	}
	csvOut, _, _ := run(t, srv, append(args, "-o", "csv")...)
	rows, err := csv.NewReader(strings.NewReader(csvOut)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	text, _, _ := run(t, srv, append(args, "-o", "text")...)
	md, _, _ := run(t, srv, append(args, "-o", "markdown")...)
	for _, j := range r.Jobs {
		found := false
		for _, row := range rows {
			if row[0] == "job" && row[1] == j.Namespace && row[2] == j.Job {
				found = true
				if row[5] != usd(j.TransferDollars) || row[8] != usd(j.TotalDollars) || row[3] != gb(j.CrossZoneGB) {
					t.Errorf("CSV row %v disagrees with JSON %+v", row, j)
				}
			}
		}
		if !found {
			t.Errorf("CSV lacks job %s/%s", j.Namespace, j.Job)
		}
		for name, out := range map[string]string{"text": text, "markdown": md} {
			if !strings.Contains(out, usd(j.TotalDollars)) || !strings.Contains(out, gb(j.CrossZoneGB)) {
				t.Errorf("%s lacks %s/%s's figures %s $, %s GB", name, j.Namespace, j.Job, usd(j.TotalDollars), gb(j.CrossZoneGB))
			}
		}
	}
	if !strings.Contains(md, `resnet\|pipes`) {
		t.Errorf("markdown does not escape | in a job name")
	}
}

// TestWithoutRulePack: a Prometheus that scrapes zonewatch but does not run
// its rule pack gets an error that names what is missing.
func TestWithoutRulePack(t *testing.T) {
	p := &promAPI{t: t}
	p.on("zonewatch_job_network_bytes_total", sample{l("namespace", "a", "job_name", "b", "locality", "cross_zone"), 1e9})
	srv := httptest.NewServer(p)
	defer srv.Close()
	out, stderr, code := run(t, srv, "--last", "7d")
	if code != 2 || out != "" {
		t.Fatalf("exit %d, stdout %q; want 2 and nothing", code, out)
	}
	for _, want := range []string{rules.RecTransferPrice, rules.RecGPUPrice, "rule pack is not loaded", "docs/cost.md"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("error does not say %q:\n%s", want, stderr)
		}
	}
	_, err := Build(t.Context(), nil, Options{From: to, To: from})
	if err == nil || !strings.Contains(err.Error(), "period is empty") {
		t.Errorf("reversed period: %v", err)
	}
	q := QueryAPIFor(t, srv.URL)
	if _, err := Build(t.Context(), q, Options{From: from, To: to}); !errors.Is(err, ErrMissingSeries) {
		t.Errorf("Build error %v, want ErrMissingSeries", err)
	}
}

// TestAuth: the bearer token file reaches Prometheus as promtool sends it.
func TestAuth(t *testing.T) {
	p := fixed(t)
	srv := httptest.NewServer(p)
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := run(t, srv, "--bearer-token-file", tok); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if p.auth != "Bearer s3cret" {
		t.Errorf("Authorization = %q", p.auth)
	}
	pass := filepath.Join(t.TempDir(), "pass")
	if err := os.WriteFile(pass, []byte("pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := run(t, srv, "--basic-auth.username", "finops", "--basic-auth.password-file", pass); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.HasPrefix(p.auth, "Basic ") {
		t.Errorf("Authorization = %q, want basic auth", p.auth)
	}
}

func TestPeriod(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		from, to, last string
		want           time.Duration
		err            bool
	}{
		{last: "30d", want: 30 * 24 * time.Hour},
		{last: "1w", want: 7 * 24 * time.Hour},
		{from: "2026-11-01T00:00:00Z", to: "2026-12-01T00:00:00Z", last: "30d", want: 30 * 24 * time.Hour},
		{last: "30 days", err: true},
		{from: "yesterday", err: true},
	} {
		f, e, err := period(c.from, c.to, c.last, now)
		if (err != nil) != c.err {
			t.Errorf("%+v: err %v", c, err)
			continue
		}
		if err == nil && e.Sub(f) != c.want {
			t.Errorf("%+v: period %s", c, e.Sub(f))
		}
	}
}

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

// QueryAPIFor is the command's own client to a Prometheus API at url.
func QueryAPIFor(t *testing.T, url string) Querier {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: url})
	if err != nil {
		t.Fatal(err)
	}
	return QueryAPI{API: v1.NewAPI(c), Timeout: time.Minute}
}
