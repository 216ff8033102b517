package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/zonewatch/zonewatch/dashboards"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/rules"
)

// templateVar is a dashboard variable as far as choosing values goes.
type templateVar struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Multi      bool   `json:"multi"`
	IncludeAll bool   `json:"includeAll"`
	AllValue   string `json:"allValue"`
}

// checkDashboards runs every query of every generated dashboard the way
// Grafana would: query variables resolved from this Prometheus in order,
// multi-value variables set to "All", single-value ones set to each value
// in turn. Instant queries (stats, tables, variables) run at snapshot, when
// every symptom is live, or else at the end (to) — a sum_over_time over a
// subquery needs whole minutes behind it; range queries and annotations
// over [from, to]. Each query must parse and return data for at least one
// choice of values.
func checkDashboards(t *testing.T, p *prom, snapshot, from, to time.Time) {
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "dashboards", "json", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no generated dashboards found (%v)", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		var d struct {
			Templating struct {
				List []templateVar `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var vars []templateVar
		for _, v := range d.Templating.List {
			if v.Type == "query" {
				vars = append(vars, v)
			}
		}
		choices, err := varChoices(p, b, vars, snapshot)
		if err != nil {
			t.Errorf("%s: variables: %v", name, err)
			continue
		}
		type result struct {
			q       dashboards.Query
			dataFor []string
			errs    []string
		}
		results := map[string]*result{} // by kind/panel/refId/title
		var order []string
		for _, vals := range choices {
			qs, err := dashboards.Queries(b, vals)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for _, q := range qs {
				key := fmt.Sprintf("%s/%d/%s/%s", q.Kind, q.PanelID, q.RefID, q.Title)
				r := results[key]
				if r == nil {
					r = &result{q: q}
					results[key] = r
					order = append(order, key)
				}
				ok, err := hasData(p, q, snapshot, from, to)
				if err == nil && !ok && q.Instant {
					ok, err = hasData(p, q, to, from, to)
				}
				switch {
				case err != nil:
					r.errs = append(r.errs, err.Error())
				case ok:
					r.dataFor = append(r.dataFor, describe(vals))
				}
			}
		}
		withData := 0
		for _, key := range order {
			r := results[key]
			if len(r.errs) > 0 {
				t.Errorf("%s: %s %q (%s): %s", name, r.q.Kind, r.q.Title, r.q.RefID, r.errs[0])
				continue
			}
			if len(r.dataFor) == 0 {
				t.Errorf("%s: %s %q (%s) returned no data for any of %d variable choices: %s",
					name, r.q.Kind, r.q.Title, r.q.RefID, len(choices), r.q.Expr)
				continue
			}
			withData++
		}
		t.Logf("%s: %d of %d queries return data (%d variable choices)", name, withData, len(order), len(choices))
	}
}

// checkHealthPanels checks what the firing-alerts, per-node source and
// data-completeness panels say at snapshot against what the scenarios did:
// the blocked job pages, Hubble was down on hubbleFailNode and the GPU
// source on gpuFailNode (so the blocked job's data has a gap).
func checkHealthPanels(t *testing.T, p *prom, snapshot time.Time) {
	read := func(uid string) []byte {
		b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "dashboards", "json", uid+".json"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	run := func(uid, title, ref string, vars map[string]string) model.Vector {
		t.Helper()
		qs, err := dashboards.Queries(read(uid), vars)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Kind == dashboards.KindPanel && q.Title == title && q.RefID == ref {
				v, err := p.query(q.Expr, snapshot)
				if err != nil {
					t.Fatalf("%s %q: %v", uid, title, err)
				}
				vec, _ := v.(model.Vector)
				t.Logf("%s %q %s: %v", uid, title, ref, vec)
				return vec
			}
		}
		t.Fatalf("%s: no panel %q with query %s", uid, title, ref)
		return nil
	}
	has := func(vec model.Vector, ok func(model.Sample) bool) bool {
		for _, s := range vec {
			if ok(*s) {
				return true
			}
		}
		return false
	}
	is := func(s model.Sample, kv ...string) bool {
		for i := 0; i+1 < len(kv); i += 2 {
			if string(s.Metric[model.LabelName(kv[i])]) != kv[i+1] {
				return false
			}
		}
		return true
	}
	all := map[string]string{"namespace": ".*"}

	if v := run(dashboards.UIDOverview, "Firing critical alerts", "A", all); len(v) != 1 || v[0].Value < 1 {
		t.Errorf("firing critical alerts = %v while %s pages", v, blockedJob)
	}
	if v := run(dashboards.UIDOverview, "Firing zonewatch alerts", "A", all); !has(v, func(s model.Sample) bool {
		return is(s, "alertname", rules.AlertIdleGPUSplitJob, "severity", "critical", "namespace", blockedNS, "job_name", blockedJob) && s.Value > 0
	}) {
		t.Errorf("the firing-alerts table does not list %s for %s/%s", rules.AlertIdleGPUSplitJob, blockedNS, blockedJob)
	}
	gaps := run(dashboards.UIDOverview, "Sources down by node", "B", all)
	for _, want := range [][2]string{{hubbleFailNode, "hubble"}, {gpuFailNode, "gpu"}} {
		if !has(gaps, func(s model.Sample) bool { return is(s, "node", want[0], "source", want[1]) && s.Value < 1 }) {
			t.Errorf("sources down by node: no %s down on %s over the range", want[1], want[0])
		}
	}
	// The simulated nodes have no Cilium ipcache map, so every job's data
	// reads incomplete here; the table tells which gap the test made.
	job := map[string]string{"namespace": blockedNS, "job_name": blockedJob}
	if v := run(dashboards.UIDJob, "Data complete over the range", "A", job); len(v) != 1 || v[0].Value != 0 {
		t.Errorf("%s's data complete = %v, want 0: Hubble was down on its coordinator's node %s", blockedJob, v, hubbleFailNode)
	}
	if v := run(dashboards.UIDJob, "Sources down on the job's nodes", "B", job); !has(v, func(s model.Sample) bool {
		return is(s, "node", hubbleFailNode, "source", "hubble") && s.Value < 1
	}) {
		t.Errorf("%s's sources down: no hubble down on %s", blockedJob, hubbleFailNode)
	}
}

func describe(vals map[string]string) string {
	var parts []string
	for k, v := range vals {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// varChoices resolves the query variables in order, as Grafana does, and
// returns every combination of values a user could pick (multi-value
// variables only as "All").
func varChoices(p *prom, dash []byte, vars []templateVar, at time.Time) ([]map[string]string, error) {
	placeholder := map[string]string{}
	for _, v := range vars {
		placeholder[v.Name] = "zonewatch-e2e-unset"
	}
	var walk func(i int, set map[string]string) ([]map[string]string, error)
	walk = func(i int, set map[string]string) ([]map[string]string, error) {
		if i == len(vars) {
			out := map[string]string{}
			for k, v := range set {
				out[k] = v
			}
			return []map[string]string{out}, nil
		}
		v := vars[i]
		if v.Multi && v.IncludeAll {
			all := v.AllValue
			if all == "" {
				all = ".*"
			}
			set[v.Name] = all
			return walk(i+1, set)
		}
		vals := map[string]string{}
		for k, x := range placeholder {
			vals[k] = x
		}
		for k, x := range set {
			vals[k] = x
		}
		qs, err := dashboards.Queries(dash, vals)
		if err != nil {
			return nil, err
		}
		var expr string
		label := model.LabelName(v.Name)
		for _, q := range qs {
			if q.Kind == dashboards.KindVariable && q.Title == v.Name {
				expr = q.Expr
				if q.Label != "" {
					label = model.LabelName(q.Label)
				}
			}
		}
		res, err := p.query(expr, at)
		if err != nil {
			return nil, err
		}
		vec, _ := res.(model.Vector)
		if len(vec) == 0 {
			return nil, fmt.Errorf("variable %s: %s offers no values", v.Name, expr)
		}
		var out []map[string]string
		for _, s := range vec {
			set[v.Name] = string(s.Metric[label])
			more, err := walk(i+1, set)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		}
		delete(set, v.Name)
		return out, nil
	}
	return walk(0, map[string]string{})
}

// hasData runs q as Grafana would and reports whether anything came back.
func hasData(p *prom, q dashboards.Query, snapshot, from, to time.Time) (bool, error) {
	if q.Instant {
		v, err := p.query(q.Expr, snapshot)
		if err != nil {
			return false, err
		}
		return nonEmpty(v), nil
	}
	step := max(to.Sub(from)/300, time.Second).Round(time.Second)
	v, err := p.rangeQuery(q.Expr, from, to, step)
	if err != nil {
		return false, err
	}
	return nonEmpty(v), nil
}

func nonEmpty(v model.Value) bool {
	switch v := v.(type) {
	case model.Vector:
		return len(v) > 0
	case model.Matrix:
		for _, s := range v {
			if len(s.Values) > 0 || len(s.Histograms) > 0 {
				return true
			}
		}
		return false
	case *model.Scalar, *model.String:
		return true
	}
	return false
}
