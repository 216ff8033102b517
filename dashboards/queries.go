package dashboards

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
)

// QueryKind says where in a dashboard a query lives.
type QueryKind string

const (
	KindPanel      QueryKind = "panel"
	KindVariable   QueryKind = "variable"
	KindAnnotation QueryKind = "annotation"
)

// Query is one PromQL query of a dashboard with its template variables
// substituted: send Expr to Prometheus (/api/v1/query when Instant, else
// /api/v1/query_range) and expect data.
type Query struct {
	Dashboard string    // dashboard UID
	Kind      QueryKind // panel target, variable or annotation
	Title     string    // panel title, variable name or annotation name
	PanelID   int       // 0 unless Kind is KindPanel
	RefID     string    // target refId ("" for variables)
	Instant   bool      // an instant query (tables, stats); else a range query
	Raw       string    // the query as written in the dashboard
	// Expr is PromQL ready to run. A variable's label_values(selector,
	// label) becomes count by (label) (selector): it returns a series per
	// value the variable would offer.
	Expr string
	// Label is the label whose values a label_values variable offers (the
	// scrape_job variable offers job's); "" otherwise.
	Label string
}

// BuiltinVars are values for Grafana's built-in variables that Queries uses
// unless vars overrides them. Pick $__rate_interval to cover at least four
// scrape intervals of the Prometheus under test.
var BuiltinVars = map[string]string{
	"__rate_interval": "1m",
	"__interval":      "30s",
	"__interval_ms":   "30000",
	"__range":         "1h",
	"__range_s":       "3600",
	"__range_ms":      "3600000",
}

// Queries returns every query of a dashboard (panel targets, including
// panels inside collapsed rows, query variables and annotations) with
// template variables substituted from vars, over the dashboard's constant
// variables (the prices, the cluster label) and the saved defaults of its
// other variables (what Grafana shows first: the scrape job, the hidden
// cluster variable's All), over BuiltinVars. A variable that is neither in
// vars, saved nor built in is an error, so a test cannot silently run a
// query with a "$namespace" left in it.
func Queries(dashboardJSON []byte, vars map[string]string) ([]Query, error) {
	var d struct {
		UID        string      `json:"uid"`
		Panels     []jsonPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Annotations struct {
			List []struct {
				Name   string `json:"name"`
				Expr   string `json:"expr"` // legacy Prometheus annotations
				Target *struct {
					Expr  string `json:"expr"`
					RefID string `json:"refId"`
				} `json:"target"`
			} `json:"list"`
		} `json:"annotations"`
	}
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		return nil, fmt.Errorf("decoding dashboard: %w", err)
	}
	all := maps.Clone(BuiltinVars)
	defaults, err := Defaults(dashboardJSON)
	if err != nil {
		return nil, err
	}
	maps.Copy(all, defaults)
	maps.Copy(all, vars)

	var out []Query
	var errs []error
	add := func(q Query) {
		expr, err := Substitute(q.Raw, all)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", q.Kind, q.Title, err))
			return
		}
		if q.Kind == KindVariable {
			if expr, q.Label, err = variableExpr(expr); err != nil {
				errs = append(errs, fmt.Errorf("variable %q: %w", q.Title, err))
				return
			}
		}
		q.Dashboard = d.UID
		q.Expr = expr
		out = append(out, q)
	}

	var walk func([]jsonPanel)
	walk = func(ps []jsonPanel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				if t.Expr == "" {
					continue
				}
				add(Query{Kind: KindPanel, Title: p.Title, PanelID: p.ID, RefID: t.RefID, Instant: t.Instant && !t.Range, Raw: t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)

	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := variableQuery(v.Query)
		if err != nil {
			errs = append(errs, fmt.Errorf("variable %q: %w", v.Name, err))
			continue
		}
		add(Query{Kind: KindVariable, Title: v.Name, Instant: true, Raw: q})
	}

	for _, a := range d.Annotations.List {
		expr, ref := a.Expr, ""
		if a.Target != nil && a.Target.Expr != "" {
			expr, ref = a.Target.Expr, a.Target.RefID
		}
		if expr == "" {
			continue // not a Prometheus annotation (e.g. Grafana's built-in)
		}
		add(Query{Kind: KindAnnotation, Title: a.Name, RefID: ref, Raw: expr})
	}
	return out, errors.Join(errs...)
}

// Defaults returns the values a dashboard gives its variables by itself:
// every constant's (the prices, the cluster label) and the saved value of
// every other variable that has one (the scrape job; the hidden cluster
// variable's All, sent as its allValue, .* when unset), as Grafana uses
// them when the dashboard opens.
func Defaults(dashboardJSON []byte) (map[string]string, error) {
	var d struct {
		Templating struct {
			List []struct {
				Name     string          `json:"name"`
				Type     string          `json:"type"`
				Query    json.RawMessage `json:"query"`
				AllValue string          `json:"allValue"`
				Current  *struct {
					Value any `json:"value"`
				} `json:"current"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		return nil, fmt.Errorf("decoding dashboard: %w", err)
	}
	out := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type == "constant" {
			var value string
			if err := json.Unmarshal(v.Query, &value); err != nil {
				return nil, fmt.Errorf("constant variable %q: query is not a string: %s", v.Name, v.Query)
			}
			out[v.Name] = value
			continue
		}
		if v.Current == nil {
			continue
		}
		switch s, _ := v.Current.Value.(string); {
		case s == "":
		case s == "$__all" && v.AllValue != "":
			out[v.Name] = v.AllValue
		case s == "$__all":
			out[v.Name] = ".*"
		default:
			out[v.Name] = s
		}
	}
	return out, nil
}

type jsonPanel struct {
	ID      int    `json:"id"`
	Title   string `json:"title"`
	Targets []struct {
		Expr    string `json:"expr"`
		RefID   string `json:"refId"`
		Instant bool   `json:"instant"`
		Range   bool   `json:"range"`
	} `json:"targets"`
	Panels []jsonPanel `json:"panels"` // a collapsed row's panels
}

// variableQuery reads a query variable's query: a string, or the object
// newer Grafana saves ({"query": "...", "qryType": ...}).
func variableQuery(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var m struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &m); err != nil || m.Query == "" {
		return "", fmt.Errorf("unreadable query %s", raw)
	}
	return m.Query, nil
}

var labelValuesRE = regexp.MustCompile(`^\s*label_values\(\s*(?:(.*\S)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
var queryResultRE = regexp.MustCompile(`^\s*query_result\((.*)\)\s*$`)

// variableExpr turns a Grafana Prometheus variable query into PromQL and
// the label whose values it offers ("" for query_result).
func variableExpr(q string) (string, string, error) {
	if m := labelValuesRE.FindStringSubmatch(q); m != nil {
		sel, label := m[1], m[2]
		if sel == "" {
			sel = fmt.Sprintf("{%s!=\"\"}", label)
		}
		return fmt.Sprintf("count by (%s) (%s)", label, sel), label, nil
	}
	if m := queryResultRE.FindStringSubmatch(q); m != nil {
		return m[1], "", nil
	}
	return "", "", fmt.Errorf("unsupported variable query %q (want label_values or query_result)", q)
}

// varRE matches Grafana's variable syntaxes: $name, ${name}, ${name:format}
// and [[name]], [[name:format]].
var varRE = regexp.MustCompile(`\$\{([a-zA-Z0-9_]+)(?::[^}]*)?\}|\[\[([a-zA-Z0-9_]+)(?::[^\]]*)?\]\]|\$([a-zA-Z0-9_]+)`)

// Substitute replaces template variables in s with their values; the format
// suffix (${var:regex}) is ignored. Unknown variables are an error.
func Substitute(s string, vars map[string]string) (string, error) {
	var missing []string
	out := varRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := varRE.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		v, ok := vars[name]
		if !ok {
			missing = append(missing, name)
			return m
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("no value for variable(s) %s in %q", strings.Join(missing, ", "), s)
	}
	return out, nil
}
