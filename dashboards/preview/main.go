// Command preview draws a static HTML picture of each generated dashboard
// from a live Prometheus: every panel at its grid position, with its queries'
// latest values (stats, tables, bar gauges) or their last range (time
// series). It approximates Grafana; it is for the README and for eyeballing
// what the end-to-end Prometheus returns, not a Grafana replacement.
//
//	go run ./dashboards/preview -prometheus http://127.0.0.1:9090 -out /tmp/preview \
//	  -var namespace=.* -var job_name=.* \
//	  -var zonewatch-job-drilldown:namespace=ml-research -var zonewatch-job-drilldown:job_name=bert-finetune
//
// With -chromium it also screenshots each page to <name>.png (headless).
// With -check it also runs every query dashboards.Queries extracts (panels,
// variables, annotations) and exits 1 if any fails or returns no data.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/zonewatch/zonewatch/dashboards"
)

type varFlags []string

func (v *varFlags) String() string     { return strings.Join(*v, ",") }
func (v *varFlags) Set(s string) error { *v = append(*v, s); return nil }

func main() {
	var vars varFlags
	prom := flag.String("prometheus", "http://127.0.0.1:9090", "Prometheus base URL")
	out := flag.String("out", "preview", "output folder")
	in := flag.String("json", "dashboards/json", "folder of dashboard JSON")
	rng := flag.Duration("range", 30*time.Minute, "time range shown (Grafana's $__range)")
	rate := flag.Duration("rate-interval", time.Minute, "value of $__rate_interval (>= 4 scrape intervals)")
	width := flag.Int("width", 1600, "page width in pixels")
	chromium := flag.String("chromium", "", "chromium binary: also write <name>.png screenshots")
	check := flag.Bool("check", false, "run every query of every dashboard; exit 1 if one fails or returns no data")
	flag.Var(&vars, "var", "variable value, name=value or <dashboard file stem>:name=value (repeatable)")
	flag.Parse()

	if err := run(*prom, *in, *out, *rng, *rate, *width, *chromium, *check, vars); err != nil {
		fmt.Fprintln(os.Stderr, "preview:", err)
		os.Exit(1)
	}
}

func run(prom, in, out string, rng, rate time.Duration, width int, chromium string, check bool, vars []string) error {
	files, err := filepath.Glob(filepath.Join(in, "*.json"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no dashboards in %s", in)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	now := time.Now()
	var empty []string
	for _, f := range files {
		stem := strings.TrimSuffix(filepath.Base(f), ".json")
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		vs := map[string]string{
			"__rate_interval": promDuration(rate),
			"__interval":      promDuration(rng / 200),
			"__range":         promDuration(rng),
			"__range_s":       strconv.Itoa(int(rng.Seconds())),
		}
		for _, v := range vars {
			name, value, _ := strings.Cut(v, "=")
			if d, n, ok := strings.Cut(name, ":"); ok {
				if d != stem {
					continue
				}
				name = n
			}
			vs[name] = value
		}
		// What the dashboard sets itself (constants, saved defaults) unless -var says otherwise.
		defaults, err := dashboards.Defaults(b)
		if err != nil {
			return fmt.Errorf("%s: %w", stem, err)
		}
		for k, v := range defaults {
			if _, set := vs[k]; !set {
				vs[k] = v
			}
		}
		p := &page{prom: strings.TrimRight(prom, "/"), vars: vs, now: now, rng: rng, width: width}
		if check {
			qs, err := dashboards.Queries(b, vs)
			if err != nil {
				return fmt.Errorf("%s: %w", stem, err)
			}
			for _, q := range qs {
				res, err := p.query(q.Expr, q.Instant)
				switch {
				case err != nil:
					empty = append(empty, fmt.Sprintf("%s: %s %q %s: %v", stem, q.Kind, q.Title, q.RefID, err))
				case len(res) == 0:
					empty = append(empty, fmt.Sprintf("%s: %s %q %s: no data\n    %s", stem, q.Kind, q.Title, q.RefID, q.Expr))
				}
			}
			fmt.Printf("checked %d queries of %s\n", len(qs), stem)
		}
		doc, err := p.render(b)
		if err != nil {
			return fmt.Errorf("%s: %w", stem, err)
		}
		dst := filepath.Join(out, stem+".html")
		if err := os.WriteFile(dst, []byte(doc), 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", dst)
		if chromium != "" {
			png := filepath.Join(out, stem+".png")
			abs, _ := filepath.Abs(dst)
			cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
				"--hide-scrollbars", "--force-device-scale-factor=1",
				fmt.Sprintf("--window-size=%d,%d", width, p.height), "--screenshot="+png, "file://"+abs)
			if o, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("chromium: %v\n%s", err, o)
			}
			fmt.Println("wrote", png)
		}
	}
	if len(empty) > 0 {
		return fmt.Errorf("%d queries failed or returned no data:\n%s", len(empty), strings.Join(empty, "\n"))
	}
	return nil
}

func promDuration(d time.Duration) string { return strconv.Itoa(int(d.Seconds())) + "s" }

// Dashboard JSON, the parts the preview draws.

type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	GridPos     struct{ X, Y, W, H int }
	Targets     []struct {
		Expr         string `json:"expr"`
		RefID        string `json:"refId"`
		LegendFormat string `json:"legendFormat"`
		Instant      bool   `json:"instant"`
	} `json:"targets"`
	Options struct {
		Content   string `json:"content"`
		TextMode  string `json:"textMode"`
		ColorMode string `json:"colorMode"`
		SortBy    []struct {
			DisplayName string `json:"displayName"`
			Desc        bool   `json:"desc"`
		} `json:"sortBy"`
	} `json:"options"`
	FieldConfig struct {
		Defaults  fieldDefaults `json:"defaults"`
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options any    `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string          `json:"id"`
				Value json.RawMessage `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Transformations []struct {
		ID      string `json:"id"`
		Options struct {
			ExcludeByName map[string]bool   `json:"excludeByName"`
			RenameByName  map[string]string `json:"renameByName"`
			IndexByName   map[string]int    `json:"indexByName"`
		} `json:"options"`
	} `json:"transformations"`
}

type fieldDefaults struct {
	Unit       string   `json:"unit"`
	Min        *float64 `json:"min"`
	Max        *float64 `json:"max"`
	NoValue    string   `json:"noValue"`
	Thresholds struct {
		Steps []struct {
			Value *float64 `json:"value"`
			Color string   `json:"color"`
		} `json:"steps"`
	} `json:"thresholds"`
	Mappings []mapping `json:"mappings"`
}

type mapping struct {
	Type    string `json:"type"`
	Options map[string]struct {
		Text  string `json:"text"`
		Color string `json:"color"`
	} `json:"options"`
}

type page struct {
	prom   string
	vars   map[string]string
	now    time.Time
	rng    time.Duration
	width  int
	height int
}

func (p *page) render(b []byte) (string, error) {
	var d struct {
		Title      string  `json:"title"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return "", err
	}
	var varBar []string
	for _, v := range d.Templating.List {
		switch v.Type {
		case "constant":
			if s, ok := v.Query.(string); ok {
				if _, set := p.vars[v.Name]; !set {
					p.vars[v.Name] = s
				}
			}
		case "query":
			varBar = append(varBar, fmt.Sprintf("<span class=var><b>%s</b> %s</span>", html.EscapeString(v.Name), html.EscapeString(displayVar(p.vars[v.Name]))))
		}
	}
	colW := float64(p.width-16) / 24
	const rowH = 30
	var body strings.Builder
	maxY := 0
	for _, pn := range d.Panels {
		g := pn.GridPos
		maxY = max(maxY, g.Y+g.H)
		style := fmt.Sprintf("left:%.0fpx;top:%dpx;width:%.0fpx;height:%dpx", 8+float64(g.X)*colW, 56+g.Y*rowH, float64(g.W)*colW-8, g.H*rowH-8)
		if pn.Type == "row" {
			fmt.Fprintf(&body, "<div class=row style=%q>%s</div>\n", style, html.EscapeString(pn.Title))
			continue
		}
		inner, err := p.panelBody(pn, float64(g.W)*colW-8, float64(g.H*rowH-8-28))
		if err != nil {
			inner = "<div class=err>" + html.EscapeString(err.Error()) + "</div>"
		}
		fmt.Fprintf(&body, "<div class=panel style=%q><div class=title>%s</div><div class=body>%s</div></div>\n", style, html.EscapeString(p.interp(pn.Title)), inner)
	}
	p.height = 56 + maxY*rowH + 16
	return fmt.Sprintf(`<!doctype html><html><head><meta charset=utf-8><title>%s</title><style>%s</style></head>
<body style="width:%dpx;height:%dpx"><div class=top><span class=dash>%s</span>%s<span class=time>last %s · preview from Prometheus data</span></div>
%s</body></html>`, html.EscapeString(d.Title), css, p.width, p.height, html.EscapeString(d.Title), strings.Join(varBar, ""), p.rng, body.String()), nil
}

func displayVar(v string) string {
	if v == ".*" || v == "" {
		return "All"
	}
	return v
}

var tmplVarRE = regexp.MustCompile(`\$\{([a-zA-Z0-9_]+)(?::[^}]*)?\}|\$([a-zA-Z0-9_]+)`)

func (p *page) interp(s string) string {
	return tmplVarRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := tmplVarRE.FindStringSubmatch(m)
		if v, ok := p.vars[sub[1]+sub[2]]; ok {
			return v
		}
		return m
	})
}

const css = `
body{margin:0;background:#111217;color:#ccccdc;font:13px/1.35 "DejaVu Sans",Inter,Helvetica,Arial,sans-serif;position:relative}
.top{height:44px;display:flex;align-items:center;gap:18px;padding:0 12px;border-bottom:1px solid #2a2d35}
.dash{font-size:17px;color:#fff;font-weight:600}.var{background:#181b1f;border:1px solid #2a2d35;padding:3px 8px;border-radius:2px}
.var b{color:#6e9fff;font-weight:500;margin-right:6px}.time{margin-left:auto;color:#8e8e9e}
.row{position:absolute;color:#fff;font-size:15px;font-weight:500;display:flex;align-items:flex-end;padding-bottom:2px}
.panel{position:absolute;background:#181b1f;border:1px solid #2a2d35;border-radius:2px;overflow:hidden}
.title{height:28px;line-height:28px;padding:0 8px;color:#ccccdc;font-weight:500;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.body{position:absolute;top:28px;left:0;right:0;bottom:0;overflow:hidden}
.stats{display:flex;height:100%;gap:4px;padding:0 6px 6px}.stat{flex:1;display:flex;flex-direction:column;align-items:center;justify-content:center;border-radius:2px;min-width:0}
.stat .v{font-size:30px;font-weight:500;color:#fff;white-space:nowrap}.stat .n{font-size:12px;color:#fff;opacity:.85;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;max-width:95%}
.novalue{display:flex;height:100%;align-items:center;justify-content:center;color:#8e8e9e;font-size:16px}
table{border-collapse:collapse;width:100%;font-size:12px}th{text-align:left;color:#6e9fff;font-weight:500;padding:4px 8px;border-bottom:1px solid #2a2d35;white-space:nowrap}
td{padding:3px 8px;border-bottom:1px solid #202226;white-space:nowrap}td.num{text-align:right}th.num{text-align:right}td a{color:#6e9fff;text-decoration:none}
.legend{position:absolute;left:8px;right:8px;bottom:2px;font-size:11px;display:flex;flex-wrap:wrap;gap:2px 12px;max-height:34px;overflow:hidden}.sw{display:inline-block;width:12px;height:3px;margin-right:4px;vertical-align:middle}
.bars{padding:4px 10px}.bar{display:flex;align-items:center;gap:8px;margin:4px 0}.bar .l{width:40%;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}.bar .t{flex:1;background:#22252b;height:18px}.bar .f{height:18px}.bar .x{width:40px;text-align:right}
.md{padding:4px 10px;font-size:12px}.md td{white-space:normal}.md table{margin:4px 0}.md td,.md th{border:1px solid #2a2d35}.md code{background:#22252b;padding:0 3px}
.err{color:#f2495c;padding:8px;font-size:11px}
`

var palette = []string{"#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0", "#37872d", "#fade2a"}

var namedColors = map[string]string{"green": "#37872d", "red": "#c4162a", "orange": "#fa6400", "blue": "#1f60c4", "text": "#ccccdc", "yellow": "#e0b400"}

func color(c string) string {
	if v, ok := namedColors[c]; ok {
		return v
	}
	return c
}

// Prometheus API.

type series struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

func (p *page) query(expr string, instant bool) ([]series, error) {
	q := url.Values{"query": {expr}}
	path := "/api/v1/query"
	if instant {
		q.Set("time", strconv.FormatInt(p.now.Unix(), 10))
	} else {
		path = "/api/v1/query_range"
		q.Set("start", strconv.FormatInt(p.now.Add(-p.rng).Unix(), 10))
		q.Set("end", strconv.FormatInt(p.now.Unix(), 10))
		q.Set("step", strconv.Itoa(max(1, int(p.rng.Seconds()/200))))
	}
	resp, err := http.Get(p.prom + path + "?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []series `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", expr, r.Error)
	}
	return r.Data.Result, nil
}

func sampleValue(v any) float64 {
	s, _ := v.(string)
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

func (p *page) expr(e string) (string, error) { return dashboards.Substitute(e, p.vars) }

func legend(format string, m map[string]string) string {
	if format == "" {
		var ks []string
		for k, v := range m {
			if k != "__name__" {
				ks = append(ks, k+"="+v)
			}
		}
		sort.Strings(ks)
		return strings.Join(ks, ", ")
	}
	return regexp.MustCompile(`\{\{\s*([a-zA-Z0-9_]+)\s*\}\}`).ReplaceAllStringFunc(format, func(s string) string {
		return m[strings.Trim(s, "{} ")]
	})
}

// Panels.

func (p *page) panelBody(pn panel, w, h float64) (string, error) {
	switch pn.Type {
	case "text":
		return "<div class=md>" + markdown(p.interp(pn.Options.Content)) + "</div>", nil
	case "stat":
		return p.stat(pn)
	case "timeseries":
		return p.timeseries(pn, w, h)
	case "table":
		return p.table(pn)
	case "bargauge":
		return p.bargauge(pn)
	}
	return "", fmt.Errorf("panel type %s not drawn", pn.Type)
}

type point struct {
	name string
	v    float64
}

func (p *page) instantPoints(pn panel) ([]point, error) {
	var pts []point
	for _, t := range pn.Targets {
		e, err := p.expr(t.Expr)
		if err != nil {
			return nil, err
		}
		res, err := p.query(e, true)
		if err != nil {
			return nil, err
		}
		for _, s := range res {
			pts = append(pts, point{legend(t.LegendFormat, s.Metric), sampleValue(s.Value[1])})
		}
	}
	return pts, nil
}

func (p *page) stat(pn panel) (string, error) {
	pts, err := p.instantPoints(pn)
	if err != nil {
		return "", err
	}
	df := pn.FieldConfig.Defaults
	if len(pts) == 0 {
		nv := df.NoValue
		if nv == "" {
			nv = "No data"
		}
		return "<div class=novalue>" + html.EscapeString(nv) + "</div>", nil
	}
	sort.SliceStable(pts, func(i, j int) bool { return pts[i].name < pts[j].name })
	var b strings.Builder
	b.WriteString("<div class=stats>")
	for _, pt := range pts {
		text, col := formatValue(pt.v, df.Unit), thresholdColor(df, pt.v)
		if mt, mc, ok := mapValue(df.Mappings, pt.v); ok {
			text = mt
			if mc != "" {
				col = mc
			}
		}
		bg := color(col)
		if pn.Options.ColorMode == "none" {
			bg = "transparent"
		}
		switch pn.Options.TextMode {
		case "name":
			fmt.Fprintf(&b, "<div class=stat style='background:%s'><div class=v>%s</div></div>", bg, html.EscapeString(pt.name))
		case "value_and_name":
			fmt.Fprintf(&b, "<div class=stat style='background:%s'><div class=n>%s</div><div class=v style='font-size:22px'>%s</div></div>", bg, html.EscapeString(pt.name), html.EscapeString(text))
		default:
			fmt.Fprintf(&b, "<div class=stat style='background:%s'><div class=v>%s</div></div>", bg, html.EscapeString(text))
		}
	}
	b.WriteString("</div>")
	return b.String(), nil
}

func thresholdColor(df fieldDefaults, v float64) string {
	c := "green"
	for _, s := range df.Thresholds.Steps {
		if s.Value == nil || v >= *s.Value {
			c = s.Color
		}
	}
	return c
}

func mapValue(ms []mapping, v float64) (string, string, bool) {
	key := strconv.FormatFloat(v, 'f', -1, 64)
	for _, m := range ms {
		if r, ok := m.Options[key]; ok && m.Type == "value" {
			return r.Text, r.Color, true
		}
	}
	return "", "", false
}

func (p *page) timeseries(pn panel, w, h float64) (string, error) {
	type line struct {
		name string
		pts  [][2]float64
	}
	var lines []line
	for _, t := range pn.Targets {
		e, err := p.expr(t.Expr)
		if err != nil {
			return "", err
		}
		res, err := p.query(e, false)
		if err != nil {
			return "", err
		}
		for _, s := range res {
			l := line{name: legend(t.LegendFormat, s.Metric)}
			for _, v := range s.Values {
				ts, _ := v[0].(float64)
				l.pts = append(l.pts, [2]float64{ts, sampleValue(v[1])})
			}
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return "<div class=novalue>No data</div>", nil
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].name < lines[j].name })
	df := pn.FieldConfig.Defaults
	t0, t1 := float64(p.now.Add(-p.rng).Unix()), float64(p.now.Unix())
	lo, hi := 0.0, 0.0
	for _, l := range lines {
		for _, pt := range l.pts {
			hi = math.Max(hi, pt[1])
			lo = math.Min(lo, pt[1])
		}
	}
	if df.Max != nil {
		hi = math.Max(hi, *df.Max)
	}
	if hi == lo {
		hi = lo + 1
	}
	hi *= 1.08
	const left, bottom = 80.0, 40.0
	pw, ph := w-left-8, h-bottom-16
	var b strings.Builder
	fmt.Fprintf(&b, "<svg width='%.0f' height='%.0f' style='position:absolute;left:0;top:0'>", w, h)
	for i := 0; i <= 3; i++ {
		y := 12 + ph - ph*float64(i)/3
		v := lo + (hi-lo)*float64(i)/3
		fmt.Fprintf(&b, "<line x1='%.0f' x2='%.0f' y1='%.1f' y2='%.1f' stroke='#2a2d35'/><text x='%.0f' y='%.1f' fill='#8e8e9e' font-size='10' text-anchor='end'>%s</text>",
			left, left+pw, y, y, left-4, y+3, html.EscapeString(formatValue(v, df.Unit)))
	}
	for i, l := range lines {
		var pts []string
		for _, pt := range l.pts {
			x := left + pw*(pt[0]-t0)/(t1-t0)
			y := 12 + ph - ph*(pt[1]-lo)/(hi-lo)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		}
		fmt.Fprintf(&b, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='%s'/>", palette[i%len(palette)], strings.Join(pts, " "))
	}
	b.WriteString("</svg><div class=legend>")
	for i, l := range lines {
		last := l.pts[len(l.pts)-1][1]
		fmt.Fprintf(&b, "<span><span class=sw style='background:%s'></span>%s <span style='color:#8e8e9e'>%s</span></span>", palette[i%len(palette)], html.EscapeString(l.name), html.EscapeString(formatValue(last, df.Unit)))
	}
	b.WriteString("</div>")
	return b.String(), nil
}

func (p *page) bargauge(pn panel) (string, error) {
	pts, err := p.instantPoints(pn)
	if err != nil {
		return "", err
	}
	if len(pts) == 0 {
		return "<div class=novalue>No data</div>", nil
	}
	sort.SliceStable(pts, func(i, j int) bool { return pts[i].name < pts[j].name })
	hi := 0.0
	for _, pt := range pts {
		hi = math.Max(hi, pt.v)
	}
	var b strings.Builder
	b.WriteString("<div class=bars>")
	for i, pt := range pts {
		fmt.Fprintf(&b, "<div class=bar><span class=l>%s</span><span class=t><div class=f style='width:%.0f%%;background:%s'></div></span><span class=x>%s</span></div>",
			html.EscapeString(pt.name), 100*pt.v/math.Max(hi, 1e-9), palette[i%len(palette)], html.EscapeString(formatValue(pt.v, pn.FieldConfig.Defaults.Unit)))
	}
	b.WriteString("</div>")
	return b.String(), nil
}

// table joins instant queries on their labels, as Grafana's merge and
// organize transformations do for these dashboards.
func (p *page) table(pn panel) (string, error) {
	type row struct {
		labels map[string]string
		values map[string]float64
	}
	rows := map[string]*row{}
	var order []string
	labelCols := map[string]bool{}
	var valueCols []string
	for _, t := range pn.Targets {
		e, err := p.expr(t.Expr)
		if err != nil {
			return "", err
		}
		res, err := p.query(e, true)
		if err != nil {
			return "", err
		}
		col := "Value #" + t.RefID
		if len(pn.Targets) == 1 {
			col = "Value"
		}
		valueCols = append(valueCols, col)
		for _, s := range res {
			delete(s.Metric, "__name__")
			var kv []string
			for k, v := range s.Metric {
				kv = append(kv, k+"="+v)
				labelCols[k] = true
			}
			sort.Strings(kv)
			key := strings.Join(kv, ",")
			r, ok := rows[key]
			if !ok {
				r = &row{labels: s.Metric, values: map[string]float64{}}
				rows[key] = r
				order = append(order, key)
			}
			r.values[col] = sampleValue(s.Value[1])
		}
	}
	var exclude map[string]bool
	rename, index := map[string]string{}, map[string]int{}
	for _, tr := range pn.Transformations {
		if tr.ID == "organize" {
			exclude, rename, index = tr.Options.ExcludeByName, tr.Options.RenameByName, tr.Options.IndexByName
		}
	}
	var lcols []string
	for c := range labelCols {
		lcols = append(lcols, c)
	}
	sort.Slice(lcols, func(i, j int) bool {
		ii, iok := index[lcols[i]]
		jj, jok := index[lcols[j]]
		if iok && jok {
			return ii < jj
		}
		if iok != jok {
			return iok
		}
		return lcols[i] < lcols[j]
	})
	name := func(c string) string {
		if r, ok := rename[c]; ok && r != "" {
			return r
		}
		return c
	}
	unit := map[string]string{}
	maps := map[string][]mapping{}
	links := map[string]bool{}
	for _, o := range pn.FieldConfig.Overrides {
		n, _ := o.Matcher.Options.(string)
		for _, prop := range o.Properties {
			switch prop.ID {
			case "unit":
				var u string
				_ = json.Unmarshal(prop.Value, &u)
				unit[n] = u
			case "mappings":
				var m []mapping
				_ = json.Unmarshal(prop.Value, &m)
				maps[n] = m
			case "links":
				links[n] = true
			}
		}
	}
	if len(rows) == 0 {
		nv := pn.FieldConfig.Defaults.NoValue
		if nv == "" {
			nv = "No data"
		}
		return "<div class=novalue>" + html.EscapeString(nv) + "</div>", nil
	}
	if len(pn.Options.SortBy) > 0 {
		sb := pn.Options.SortBy[0]
		var src string
		for _, c := range valueCols {
			if name(c) == sb.DisplayName {
				src = c
			}
		}
		sort.SliceStable(order, func(i, j int) bool {
			a, b := rows[order[i]], rows[order[j]]
			if src == "" {
				return a.labels[sb.DisplayName] < b.labels[sb.DisplayName]
			}
			if sb.Desc {
				return a.values[src] > b.values[src]
			}
			return a.values[src] < b.values[src]
		})
	}
	var b strings.Builder
	b.WriteString("<table><tr>")
	for _, c := range lcols {
		if !exclude[c] {
			fmt.Fprintf(&b, "<th>%s</th>", html.EscapeString(name(c)))
		}
	}
	for _, c := range valueCols {
		if !exclude[c] && !exclude["Value"] {
			fmt.Fprintf(&b, "<th class=num>%s</th>", html.EscapeString(name(c)))
		}
	}
	b.WriteString("</tr>")
	for _, k := range order {
		r := rows[k]
		b.WriteString("<tr>")
		for _, c := range lcols {
			if exclude[c] {
				continue
			}
			v := html.EscapeString(r.labels[c])
			if links[name(c)] {
				v = "<a>" + v + "</a>"
			}
			fmt.Fprintf(&b, "<td>%s</td>", v)
		}
		for _, c := range valueCols {
			if exclude[c] || exclude["Value"] {
				continue
			}
			v, ok := r.values[c]
			text := ""
			if ok {
				text = formatValue(v, unit[name(c)])
				if mt, _, ok := mapValue(maps[name(c)], v); ok {
					text = mt
				}
			}
			fmt.Fprintf(&b, "<td class=num>%s</td>", html.EscapeString(text))
		}
		b.WriteString("</tr>")
	}
	b.WriteString("</table>")
	return b.String(), nil
}

// Units: the ones the generator uses, formatted roughly as Grafana does.

func formatValue(v float64, unit string) string {
	switch {
	case unit == "percentunit":
		return trim(v*100, 1) + "%"
	case unit == "Bps":
		return si(v, []string{"B/s", "kB/s", "MB/s", "GB/s", "TB/s"})
	case unit == "decbytes":
		return si(v, []string{"B", "kB", "MB", "GB", "TB", "PB"})
	case unit == "currencyUSD":
		if math.Abs(v) >= 1e6 {
			return "$" + trim(v/1e6, 2) + "M"
		}
		if math.Abs(v) >= 1e4 {
			return "$" + trim(v/1e3, 1) + "K"
		}
		return "$" + strconv.FormatFloat(v, 'f', 2, 64)
	case unit == "eps":
		return trim(v, 2) + " eps"
	case unit == "cpm":
		return trim(v, 2) + " cpm"
	case unit == "s":
		if v < 1 {
			return trim(v*1000, 1) + " ms"
		}
		return trim(v, 2) + " s"
	case unit == "dateTimeFromNow":
		ago := time.Since(time.UnixMilli(int64(v)))
		if ago < time.Hour {
			return fmt.Sprintf("%d minutes ago", int(ago.Minutes()))
		}
		return fmt.Sprintf("%d hours ago", int(ago.Hours()))
	case strings.HasPrefix(unit, "suffix:"):
		return trim(v, 2) + strings.TrimPrefix(unit, "suffix:")
	}
	return trim(v, 2)
}

func si(v float64, units []string) string {
	i := 0
	for math.Abs(v) >= 1000 && i < len(units)-1 {
		v /= 1000
		i++
	}
	return trim(v, 2) + " " + units[i]
}

func trim(v float64, decimals int) string {
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// markdown renders the little markdown the text panels use: tables,
// paragraphs, **bold** and `code`.
func markdown(s string) string {
	inline := func(t string) string {
		t = html.EscapeString(t)
		t = regexp.MustCompile(`\*\*(.+?)\*\*`).ReplaceAllString(t, "<b>$1</b>")
		return regexp.MustCompile("`(.+?)`").ReplaceAllString(t, "<code>$1</code>")
	}
	var b strings.Builder
	inTable := false
	for _, para := range strings.Split(s, "\n") {
		line := strings.TrimSpace(para)
		if strings.HasPrefix(line, "|") {
			cells := strings.Split(strings.Trim(line, "|"), "|")
			if strings.HasPrefix(strings.TrimSpace(cells[0]), "---") {
				continue
			}
			if !inTable {
				b.WriteString("<table>")
				inTable = true
			}
			b.WriteString("<tr>")
			for _, c := range cells {
				b.WriteString("<td>" + inline(strings.TrimSpace(c)) + "</td>")
			}
			b.WriteString("</tr>")
			continue
		}
		if inTable {
			b.WriteString("</table>")
			inTable = false
		}
		if line != "" {
			b.WriteString("<p>" + inline(line) + "</p>")
		}
	}
	if inTable {
		b.WriteString("</table>")
	}
	return b.String()
}
