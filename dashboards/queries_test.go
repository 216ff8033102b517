package dashboards

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestQueriesCoverEveryPanel checks the extraction the end-to-end test
// relies on: one query per panel target, every variable and annotation, and
// nothing left unsubstituted.
func TestQueriesCoverEveryPanel(t *testing.T) {
	ds, err := Generate(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"namespace": "ml", "job_name": "llama"}
	for _, d := range ds {
		var doc lintDashboard
		if err := json.Unmarshal(d.JSON, &doc); err != nil {
			t.Fatal(err)
		}
		targets, queryPanels := 0, map[int]bool{}
		for _, p := range allPanels(doc.Panels) {
			targets += len(p.Targets)
			if p.Type != "row" && p.Type != "text" {
				queryPanels[p.ID] = true
			}
		}
		qs, err := Queries(d.JSON, vars)
		if err != nil {
			t.Fatalf("%s: %v", d.Name, err)
		}
		panelQueries, variables, annotations := 0, 0, 0
		for _, q := range qs {
			if q.Dashboard != d.UID {
				t.Errorf("%s: query %q has dashboard %q", d.Name, q.Title, q.Dashboard)
			}
			if strings.Contains(q.Expr, "$") || strings.Contains(q.Expr, "[[") {
				t.Errorf("%s: %q still holds a variable: %s", d.Name, q.Title, q.Expr)
			}
			switch q.Kind {
			case KindPanel:
				panelQueries++
				delete(queryPanels, q.PanelID)
			case KindVariable:
				variables++
			case KindAnnotation:
				annotations++
			}
		}
		if panelQueries != targets {
			t.Errorf("%s: %d panel queries extracted, dashboard has %d targets", d.Name, panelQueries, targets)
		}
		if len(queryPanels) > 0 {
			t.Errorf("%s: panels without an extracted query: %v", d.Name, queryPanels)
		}
		wantVars := 0
		for _, v := range doc.Templating.List {
			if v.Type == "query" {
				wantVars++
			}
		}
		if variables != wantVars {
			t.Errorf("%s: %d variable queries, want %d", d.Name, variables, wantVars)
		}
		if d.UID == UIDJob && annotations != 1 {
			t.Errorf("%s: %d annotation queries, want the placement-change annotation", d.Name, annotations)
		}
	}
}

func TestQueriesMissingVariable(t *testing.T) {
	ds, err := Generate(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	_, err = Queries(ds[1].JSON, map[string]string{"namespace": "ml"})
	if err == nil || !strings.Contains(err.Error(), "job_name") {
		t.Fatalf("Queries without job_name: err = %v, want one naming job_name", err)
	}
}

// A hand-written dashboard in the shapes Grafana itself saves: a collapsed
// row holding its panels, a legacy annotation, a variable query object.
const grafanaSaved = `{
  "uid": "x",
  "panels": [
    {"type": "row", "id": 1, "collapsed": true, "panels": [
      {"type": "timeseries", "id": 2, "title": "inner", "targets": [
        {"refId": "A", "expr": "rate(a_total{ns=~\"${namespace:regex}\"}[$__rate_interval])"},
        {"refId": "B", "expr": "b[[job_name]] + $__range_s", "instant": true}
      ]}
    ]},
    {"type": "text", "id": 3, "title": "notes"}
  ],
  "templating": {"list": [
    {"type": "datasource", "name": "datasource", "query": "prometheus"},
    {"type": "query", "name": "namespace", "query": {"query": "label_values(up{job=\"x\"}, namespace)", "qryType": 1}},
    {"type": "query", "name": "job_name", "query": "label_values(job_name)"},
    {"type": "query", "name": "top", "query": "query_result(topk(3, up))"}
  ]},
  "annotations": {"list": [
    {"name": "Annotations & Alerts", "builtIn": 1, "type": "dashboard"},
    {"name": "legacy", "expr": "changes(up[$__interval]) > 0"}
  ]}
}`

func TestQueriesGrafanaShapes(t *testing.T) {
	qs, err := Queries([]byte(grafanaSaved), map[string]string{"namespace": "ml", "job_name": "_x", "__range_s": "60"})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind    QueryKind
		title   string
		instant bool
		expr    string
	}{
		{KindPanel, "inner", false, `rate(a_total{ns=~"ml"}[1m])`},
		{KindPanel, "inner", true, `b_x + 60`},
		{KindVariable, "namespace", true, `count by (namespace) (up{job="x"})`},
		{KindVariable, "job_name", true, `count by (job_name) ({job_name!=""})`},
		{KindVariable, "top", true, `topk(3, up)`},
		{KindAnnotation, "legacy", false, `changes(up[30s]) > 0`},
	}
	if len(qs) != len(want) {
		t.Fatalf("got %d queries %+v, want %d", len(qs), qs, len(want))
	}
	for i, w := range want {
		q := qs[i]
		if q.Kind != w.kind || q.Title != w.title || q.Instant != w.instant || q.Expr != w.expr {
			t.Errorf("query %d = {%s %q instant=%v %q}, want {%s %q instant=%v %q}", i, q.Kind, q.Title, q.Instant, q.Expr, w.kind, w.title, w.instant, w.expr)
		}
	}
}

func TestSubstitute(t *testing.T) {
	vars := map[string]string{"a": "1", "__range": "1h", "__range_s": "3600"}
	for in, want := range map[string]string{
		`x{a="$a"}`:                `x{a="1"}`,
		`x{a="${a}"}`:              `x{a="1"}`,
		`x{a=~"${a:regex}"}`:       `x{a=~"1"}`,
		`x{a="[[a]]"}`:             `x{a="1"}`,
		`x[$__range] / $__range_s`: `x[1h] / 3600`,
		`no variables`:             `no variables`,
	} {
		got, err := Substitute(in, vars)
		if err != nil || got != want {
			t.Errorf("Substitute(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := Substitute(`x{b="$b"}`, vars); err == nil || !strings.Contains(err.Error(), "b") {
		t.Errorf("unknown variable: err = %v", err)
	}
}

// TestQueriesUseSavedDefaults: the scrape job and the hidden cluster
// variable come from the dashboard's saved values unless vars set them.
func TestQueriesUseSavedDefaults(t *testing.T) {
	ds, err := Generate(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	overview := ds[0].JSON
	defaults, err := Defaults(overview)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{varScrapeJob: "zonewatch", "cluster": ".*", varClusterLabel: "cluster", varGPUPrice: "4"} {
		if defaults[k] != want {
			t.Errorf("default %s = %q, want %q", k, defaults[k], want)
		}
	}
	if _, ok := defaults["namespace"]; ok {
		t.Errorf("namespace has a default %q; the generator saves none", defaults["namespace"])
	}
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"namespace": ".*"}, `up{cluster=~".*", job="zonewatch"}`},
		{map[string]string{"namespace": ".*", varScrapeJob: "monitoring/zw", "cluster": "eu-1"}, `up{cluster=~"eu-1", job="monitoring/zw"}`},
	} {
		qs, err := Queries(overview, tc.vars)
		if err != nil {
			t.Fatal(err)
		}
		if all := exprs(qs); !strings.Contains(all, tc.want) {
			t.Errorf("vars %v: no query has %s:\n%s", tc.vars, tc.want, all)
		}
		for _, q := range qs {
			// A test picking the variable's values reads them from this label.
			if q.Kind == KindVariable && q.Title == varScrapeJob && q.Label != "job" {
				t.Errorf("variable %s offers the values of %q, want job", q.Title, q.Label)
			}
		}
	}
}
