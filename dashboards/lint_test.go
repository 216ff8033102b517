package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/zonewatch/zonewatch/rules"
)

// Odd durations stand in for Grafana's interval variables, so the parsed
// query still says which variable a range came from.
const (
	rateIntervalSentinel = 4321 * time.Second
	rangeSentinel        = 8765 * time.Second
	clusterSentinel      = "lint-cluster"
	scrapeJobSentinel    = "lint-scrape-job"
)

var lintVars = map[string]string{
	"__rate_interval": "4321s",
	"__range":         "8765s",
	"__range_s":       "8765",
	"__interval":      "1234s",
	"namespace":       "lint-ns",
	"job_name":        "lint-job",
	"cluster":         clusterSentinel,
	"scrape_job":      scrapeJobSentinel,
}

// The panel plugins hack/schema-check/dashboard-types.ts checks options for.
var lintPanelTypes = map[string]bool{"row": true, "stat": true, "timeseries": true, "table": true, "bargauge": true, "text": true}

type lintRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type lintPanel struct {
	ID          int      `json:"id"`
	Type        string   `json:"type"`
	Title       string   `json:"title"`
	Description string   `json:"description"`
	Datasource  *lintRef `json:"datasource"`
	GridPos     struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		Expr       string   `json:"expr"`
		RefID      string   `json:"refId"`
		Datasource *lintRef `json:"datasource"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []struct {
			Properties []struct {
				ID    string `json:"id"`
				Value any    `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Links []struct {
		Title string `json:"title"`
		Type  string `json:"type"`
		URL   string `json:"url"`
	} `json:"links"`
	Panels []lintPanel `json:"panels"`
}

type lintDashboard struct {
	UID     string      `json:"uid"`
	Title   string      `json:"title"`
	Tags    []string    `json:"tags"`
	Panels  []lintPanel `json:"panels"`
	Refresh string      `json:"refresh"`
	Time    struct {
		From, To string
	} `json:"time"`
	Templating struct {
		List []struct {
			Name       string   `json:"name"`
			Type       string   `json:"type"`
			Query      any      `json:"query"`
			Datasource *lintRef `json:"datasource"`
			Hide       int      `json:"hide"`
			Current    *struct {
				Value any `json:"value"`
			} `json:"current"`
		} `json:"list"`
	} `json:"templating"`
}

// allPanels flattens rows (collapsed rows nest their panels).
func allPanels(ps []lintPanel) []lintPanel {
	var out []lintPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// lintCase is a generator variant and what its dashboards must show.
type lintCase struct {
	dashboards []Dashboard
	want       lintWant
}

// lintWant is what the options ask of every dashboard: the cluster
// variable shown or hidden, the label the cluster matcher uses, the scrape
// job variable's default.
type lintWant struct {
	clusterShown bool
	clusterLabel string
	scrapeJob    string
}

// committedWant is what the committed dashboards (DefaultOptions) show.
var committedWant = lintWant{clusterLabel: defaultClusterLabel, scrapeJob: "zonewatch"}

// lintCases are the generator variants every lint runs on: the committed
// dashboards and cluster-aware variants (the conventional label name and
// another, with another scrape job).
func lintCases(t *testing.T) map[string]lintCase {
	t.Helper()
	cases := map[string]lintCase{}
	for name, c := range map[string]struct {
		clusterLabel, scrapeJob string
		want                    lintWant
	}{
		"default":     {"", "", committedWant},
		"cluster":     {"cluster", "", lintWant{true, "cluster", "zonewatch"}},
		"k8s_cluster": {"k8s_cluster", "monitoring/zonewatch", lintWant{true, "k8s_cluster", "monitoring/zonewatch"}},
	} {
		o := DefaultOptions()
		o.ClusterLabel = c.clusterLabel
		if c.scrapeJob != "" {
			o.ScrapeJob = c.scrapeJob
		}
		ds, err := Generate(o)
		if err != nil {
			t.Fatal(err)
		}
		cases[name] = lintCase{ds, c.want}
	}
	return cases
}

func TestLintDashboards(t *testing.T) {
	for variant, c := range lintCases(t) {
		for _, d := range c.dashboards {
			t.Run(variant+"/"+d.Name, func(t *testing.T) {
				lintDashboardJSON(t, d.JSON, c.want)
			})
		}
	}
}

// TestLintCommittedJSON lints the files on disk too, so a hand edit that
// somehow matches nothing in the generator is still caught here.
func TestLintCommittedJSON(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(repoRoot, JSONDir, "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no committed dashboards in %s (%v); %s", JSONDir, err, regenerate)
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			lintDashboardJSON(t, b, committedWant)
		})
	}
}

func lintDashboardJSON(t *testing.T, b []byte, want lintWant) {
	var d lintDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("decoding: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both required", d.UID, d.Title)
	}
	if !contains(d.Tags, Tag) {
		t.Errorf("tags %v lack %q (the dashboard links list dashboards by it)", d.Tags, Tag)
	}
	if d.Time.From == "" || d.Refresh == "" {
		t.Errorf("time.from %q, refresh %q: both required", d.Time.From, d.Refresh)
	}

	// Variables: exactly one data source variable, every query variable
	// on it; the scrape job and cluster variables with their defaults, the
	// cluster one shown only when a cluster label is configured.
	defined := map[string]bool{} // variables a test must give values for
	datasources := 0
	var clusterHide, scrapeJob any = "absent", "absent"
	clusterLabel := ""
	for _, v := range d.Templating.List {
		defined[v.Name] = v.Type != "constant" // Queries reads constants from the JSON
		switch v.Type {
		case "datasource":
			datasources++
			if v.Name != "datasource" || v.Query != "prometheus" {
				t.Errorf("datasource variable %q of %v: want name datasource, query prometheus", v.Name, v.Query)
			}
		case "query":
			checkRef(t, "variable "+v.Name, v.Datasource)
			switch v.Name {
			case "cluster":
				clusterHide = v.Hide
			case varScrapeJob:
				if v.Current != nil {
					scrapeJob = v.Current.Value
				}
			}
		case "constant":
			s, _ := v.Query.(string)
			if v.Name == varClusterLabel {
				clusterLabel = s
				if !labelNameRE.MatchString(s) || v.Hide != 2 {
					t.Errorf("constant %q = %v (hide %d): want a hidden label name", v.Name, v.Query, v.Hide)
				}
				continue
			}
			if _, err := strconv.ParseFloat(s, 64); err != nil || v.Hide != 2 {
				t.Errorf("constant %q = %v (hide %d): want a hidden number", v.Name, v.Query, v.Hide)
			}
		default:
			t.Errorf("variable %q has type %q; only datasource, query and constant variables are expected", v.Name, v.Type)
		}
	}
	if datasources != 1 {
		t.Errorf("%d datasource variables, want exactly 1", datasources)
	}
	if wantHide := map[bool]int{true: 0, false: 2}[want.clusterShown]; clusterHide != wantHide {
		t.Errorf("cluster variable hide = %v, want %d (shown: %v)", clusterHide, wantHide, want.clusterShown)
	}
	if clusterLabel != want.clusterLabel {
		t.Errorf("constant %s = %q, want %q", varClusterLabel, clusterLabel, want.clusterLabel)
	}
	if scrapeJob != want.scrapeJob {
		t.Errorf("variable %s defaults to %v, want %q", varScrapeJob, scrapeJob, want.scrapeJob)
	}

	// Panels: identity, text, units, data source, layout.
	ids := map[int]string{}
	titles := map[string]bool{}
	var boxes []lintPanel
	for _, p := range allPanels(d.Panels) {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID <= 0 {
			t.Errorf("%s: id must be positive", where)
		}
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("%s: id %d already used by %q", where, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if !lintPanelTypes[p.Type] {
			t.Errorf("%s: panel type %q is not one hack/schema-check/dashboard-types.ts checks", where, p.Type)
		}
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("%s: no title", where)
		}
		if p.Type == "row" {
			continue
		}
		if titles[p.Title] {
			t.Errorf("%s: title used twice in the dashboard", where)
		}
		titles[p.Title] = true
		if len(p.Description) < 40 || !strings.HasSuffix(p.Description, ".") {
			t.Errorf("%s: description %q must tell an operator what to do (40+ characters, a sentence)", where, p.Description)
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: gridPos %+v outside the 24-column grid", where, p.GridPos)
		}
		boxes = append(boxes, p)
		if p.Type == "text" {
			continue // no data, so no unit and no data source
		}
		if p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("%s: no unit", where)
		}
		for _, o := range p.FieldConfig.Overrides {
			for _, prop := range o.Properties {
				if prop.ID == "unit" && prop.Value == "" {
					t.Errorf("%s: override with an empty unit", where)
				}
			}
		}
		checkRef(t, where, p.Datasource)
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", where)
		}
		for _, tg := range p.Targets {
			checkRef(t, where+" target "+tg.RefID, tg.Datasource)
		}
	}
	for i, a := range boxes {
		for _, b := range boxes[i+1:] {
			if overlap(a, b) {
				t.Errorf("panels %q and %q overlap (%+v, %+v)", a.Title, b.Title, a.GridPos, b.GridPos)
			}
		}
	}

	// Queries: every one substitutes with the dashboard's own variables,
	// parses, and uses counters only in rate()/increase() over Grafana's
	// intervals.
	vars := map[string]string{}
	for name, needed := range defined {
		if !needed {
			continue
		}
		if v, ok := lintVars[name]; ok {
			vars[name] = v
		} else {
			vars[name] = "lint-" + name
		}
	}
	for _, name := range []string{"__rate_interval", "__range", "__range_s", "__interval"} {
		vars[name] = lintVars[name]
	}
	qs, err := queriesWith(b, vars)
	if err != nil {
		t.Fatalf("extracting queries: %v", err)
	}
	if len(qs) == 0 {
		t.Fatal("no queries")
	}
	p := parser.NewParser(parser.Options{})
	for _, q := range qs {
		where := fmt.Sprintf("%s %q %s", q.Kind, q.Title, q.RefID)
		expr, err := p.ParseExpr(q.Expr)
		if err != nil {
			t.Errorf("%s: %v\n  query: %s", where, err, q.Expr)
			continue
		}
		// The variables that pick the cluster cannot depend on it.
		cl := clusterLabel
		if q.Kind == KindVariable && (q.Title == "cluster" || q.Title == varScrapeJob) {
			cl = ""
		}
		for _, problem := range lintExpr(expr, cl) {
			t.Errorf("%s: %s\n  query: %s", where, problem, q.Raw)
		}
	}
}

// queriesWith is Queries without BuiltinVars, so a built-in the lint does
// not know is an error too.
func queriesWith(b []byte, vars map[string]string) ([]Query, error) {
	saved := BuiltinVars
	BuiltinVars = map[string]string{}
	defer func() { BuiltinVars = saved }()
	return Queries(b, vars)
}

// lintExpr returns what is wrong with a parsed query. clusterLabel is the
// label every selector must match on $cluster ("" for none).
func lintExpr(expr parser.Expr, clusterLabel string) []string {
	var problems []string
	parser.Inspect(expr, func(node parser.Node, path []parser.Node) error {
		switch n := node.(type) {
		case *parser.Call:
			if n.Func.Name == "irate" {
				problems = append(problems, "irate() hides spikes between points; use rate()")
			}
		case *parser.VectorSelector:
			// The rule pack's price series are one per locality for every
			// cluster: they carry no cluster label.
			if clusterLabel != "" && n.Name != "" && n.Name != rules.RecTransferPrice && !hasMatcher(n.LabelMatchers, clusterLabel, labels.MatchRegexp, clusterSentinel) {
				problems = append(problems, fmt.Sprintf("%s lacks the %s=~\"$cluster\" matcher", n.Name, clusterLabel))
			}
			// The exporters' job label is the scrape_job variable, never
			// written into a query.
			for _, m := range n.LabelMatchers {
				if m.Name == "job" && !(m.Type == labels.MatchEqual && m.Value == scrapeJobSentinel) {
					problems = append(problems, fmt.Sprintf("%s selects %s: want job=\"$%s\"", n.Name, m, varScrapeJob))
				}
			}
			if strings.HasSuffix(n.Name, "_total") {
				if msg := counterUse(n.Name, ancestors(path)); msg != "" {
					problems = append(problems, msg)
				}
			}
		}
		return nil
	})
	return problems
}

// counterUse checks that a counter sits in rate(x[$__rate_interval]) or
// increase(x[$__rate_interval] or [$__range]).
func counterUse(name string, path []parser.Node) string {
	bad := fmt.Sprintf("counter %s must appear only as rate(%s[$__rate_interval]) or increase(%s[$__rate_interval|$__range])", name, name, name)
	if len(path) < 2 {
		return bad
	}
	m, ok := path[len(path)-1].(*parser.MatrixSelector)
	c, ok2 := path[len(path)-2].(*parser.Call)
	if !ok || !ok2 {
		return bad
	}
	switch {
	case c.Func.Name == "rate" && m.Range == rateIntervalSentinel:
	case c.Func.Name == "increase" && (m.Range == rateIntervalSentinel || m.Range == rangeSentinel):
	default:
		return bad
	}
	return ""
}

// ancestors drops the Expressions lists Walk puts between a call and its
// arguments.
func ancestors(path []parser.Node) []parser.Node {
	out := make([]parser.Node, 0, len(path))
	for _, n := range path {
		if _, ok := n.(parser.Expressions); !ok {
			out = append(out, n)
		}
	}
	return out
}

func hasMatcher(ms []*labels.Matcher, name string, typ labels.MatchType, value string) bool {
	for _, m := range ms {
		if m.Name == name && m.Type == typ && m.Value == value {
			return true
		}
	}
	return false
}

func checkRef(t *testing.T, where string, ref *lintRef) {
	t.Helper()
	if ref == nil || ref.Type != "prometheus" || ref.UID != "${datasource}" {
		t.Errorf("%s: data source %+v, want the ${datasource} variable", where, ref)
	}
}

func overlap(a, b lintPanel) bool {
	ag, bg := a.GridPos, b.GridPos
	return ag.X < bg.X+bg.W && bg.X < ag.X+ag.W && ag.Y < bg.Y+bg.H && bg.Y < ag.Y+ag.H
}

func contains(xs []string, x string) bool {
	for _, s := range xs {
		if s == x {
			return true
		}
	}
	return false
}

// TestLintCatchesMistakes proves the lint is not vacuous: each broken query
// must be reported.
func TestLintCatchesMistakes(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	for _, tc := range []struct {
		expr         string
		clusterLabel string
		want         string
	}{
		{`zonewatch_job_policy_drops_total`, "", "counter"},
		{`sum(zonewatch_job_policy_drops_total)`, "", "counter"},
		{`rate(zonewatch_job_policy_drops_total[5m])`, "", "counter"},
		{`increase(zonewatch_job_network_bytes_total[1h])`, "", "counter"},
		{`irate(zonewatch_job_policy_drops_total[4321s])`, "", "irate"},
		{`delta(zonewatch_job_policy_drops_total[4321s])`, "", "counter"},
		{`rate(zonewatch_job_policy_drops_total[8765s])`, "", "counter"},
		{`zonewatch_job_zones{namespace="x"}`, "cluster", "cluster"},
		{`zonewatch_job_zones{cluster=~"lint-cluster"}`, "k8s_cluster", "k8s_cluster"},
		{`up{job="zonewatch"}`, "", "scrape_job"},
		{`up{job=~"lint-scrape-job"}`, "", "scrape_job"},
	} {
		expr, err := p.ParseExpr(tc.expr)
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		problems := strings.Join(lintExpr(expr, tc.clusterLabel), "; ")
		if !strings.Contains(problems, tc.want) {
			t.Errorf("%s: lint said %q, want a %q problem", tc.expr, problems, tc.want)
		}
	}
	for _, ok := range []string{
		`sum by (namespace) (rate(zonewatch_job_policy_drops_total{namespace="x"}[4321s]))`,
		`sum(increase(zonewatch_job_network_bytes_total[8765s])) / 1e9`,
		`label_replace(sum by (policy) (rate(zonewatch_job_policy_drops_total[4321s])), "policy", "x", "policy", "")`,
	} {
		expr, err := p.ParseExpr(ok)
		if err != nil {
			t.Fatalf("%s: %v", ok, err)
		}
		if problems := lintExpr(expr, ""); len(problems) > 0 {
			t.Errorf("%s: unexpected problems %v", ok, problems)
		}
	}
}
