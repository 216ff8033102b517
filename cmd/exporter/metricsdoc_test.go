package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The metric docs against the code. TestSimulatedExporter compares the
// metric names of docs/metrics.md with what the simulated exporter serves,
// and the series identities (type, label names) with
// testdata/exposition.golden; it runs outside -short and sees only what the
// simulation runs (no ipcache reader without --node-name). The tests here
// run everywhere and read the code itself: every family the exporter's
// packages declare (prometheus.NewDesc, New{Counter,Gauge,Histogram,
// Summary}[Vec]) must be a row of docs/metrics.md with its label names and
// type, every table that lists metrics with their labels (metrics.md,
// hubble.md) must list them as declared, and every source registered for
// zonewatch_source_up must be named where the docs list the sources.

const repoRoot = "../.."

// declaredMetric is a metric family as the code declares it.
type declaredMetric struct {
	name   string
	typ    string   // counter, gauge, histogram, summary; "" for a Desc (typed when collected)
	labels []string // sorted
	help   string
	pkg    string // the declaring package's folder, relative to the repository root
	pos    string
}

// metricCtor matches the client_golang constructors that take Opts.
var metricCtor = regexp.MustCompile(`^New(Counter|Gauge|Histogram|Summary)(Vec)?$`)

// skipDirs are folders whose code is not the exporter's: test helpers,
// end-to-end tests, tools, and anything with its own go.mod.
var skipDirs = map[string]bool{".git": true, ".tools": true, "tmp": true, "dist": true, "testdata": true,
	"node_modules": true, "internal": true, "e2e": true, "hack": true}

// declaredMetrics parses every non-test Go file of the module outside
// skipDirs and returns the zonewatch_ families it declares, by name.
// Names, help and label lists must be constant expressions (literals,
// constants, concatenations, package-level []string literals): a
// declaration the scan cannot read fails the test, so that no family
// escapes it.
func declaredMetrics(t *testing.T) map[string]declaredMetric {
	t.Helper()
	byDir := map[string][]*ast.File{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != repoRoot {
				if skipDirs[d.Name()] {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		byDir[filepath.Dir(path)] = append(byDir[filepath.Dir(path)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]declaredMetric{}
	for dir, files := range byDir {
		rel, _ := filepath.Rel(repoRoot, dir)
		s := newConstScope(files)
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				m, ok, problem := s.metricOf(call)
				pos := fset.Position(call.Pos())
				pos.Filename, _ = filepath.Rel(repoRoot, pos.Filename)
				if problem != "" {
					t.Errorf("%s: %s: extend declaredMetrics or declare it with constants", pos, problem)
				}
				if !ok || !strings.HasPrefix(m.name, "zonewatch_") {
					return true
				}
				m.pkg, m.pos = filepath.ToSlash(rel), pos.String()
				if prev, dup := out[m.name]; dup && (prev.typ != m.typ || !slices.Equal(prev.labels, m.labels)) {
					t.Errorf("%s declared twice, differently: %s and %s", m.name, prev.pos, m.pos)
				}
				out[m.name] = m
				return true
			})
		}
	}
	if len(out) == 0 {
		t.Fatal("no zonewatch_ metric declared: the scan is broken")
	}
	return out
}

// constScope holds a package's constant strings and []string literals.
type constScope struct {
	strs  map[string]string
	lists map[string][]string
}

func newConstScope(files []*ast.File) *constScope {
	s := &constScope{strs: map[string]string{}, lists: map[string][]string{}}
	var specs []*ast.ValueSpec
	for _, f := range files {
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && (g.Tok == token.CONST || g.Tok == token.VAR) {
				for _, sp := range g.Specs {
					specs = append(specs, sp.(*ast.ValueSpec))
				}
			}
		}
	}
	// Constants may refer to constants declared later: evaluate until
	// nothing new resolves.
	for changed := true; changed; {
		changed = false
		for _, sp := range specs {
			for i, name := range sp.Names {
				if i >= len(sp.Values) {
					continue
				}
				if _, done := s.strs[name.Name]; done {
					continue
				}
				if _, done := s.lists[name.Name]; done {
					continue
				}
				if v, ok := s.str(sp.Values[i]); ok {
					s.strs[name.Name], changed = v, true
				} else if l, ok := s.list(sp.Values[i]); ok && sp.Values[i] != nil {
					if _, lit := sp.Values[i].(*ast.CompositeLit); lit {
						s.lists[name.Name], changed = l, true
					}
				}
			}
		}
	}
	return s
}

func (s *constScope) str(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(e.Value)
		return v, err == nil
	case *ast.Ident:
		v, ok := s.strs[e.Name]
		return v, ok
	case *ast.ParenExpr:
		return s.str(e.X)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok := s.str(e.X)
		if !ok {
			return "", false
		}
		b, ok := s.str(e.Y)
		return a + b, ok
	}
	return "", false
}

// list reads a []string{...} of constants, a package-level one by name, or
// nil.
func (s *constScope) list(e ast.Expr) ([]string, bool) {
	switch e := e.(type) {
	case *ast.Ident:
		if e.Name == "nil" {
			return nil, true
		}
		l, ok := s.lists[e.Name]
		return l, ok
	case *ast.CompositeLit:
		at, ok := e.Type.(*ast.ArrayType)
		if !ok {
			return nil, false
		}
		if id, ok := at.Elt.(*ast.Ident); !ok || id.Name != "string" {
			return nil, false
		}
		var out []string
		for _, el := range e.Elts {
			v, ok := s.str(el)
			if !ok {
				return nil, false
			}
			out = append(out, v)
		}
		return out, true
	}
	return nil, false
}

func funName(call *ast.CallExpr) string {
	switch f := call.Fun.(type) {
	case *ast.SelectorExpr:
		return f.Sel.Name
	case *ast.Ident:
		return f.Name
	}
	return ""
}

// metricOf reads a metric declaration: ok when call is one, problem when it
// is one the scan cannot read.
func (s *constScope) metricOf(call *ast.CallExpr) (m declaredMetric, ok bool, problem string) {
	name := funName(call)
	switch {
	case name == "NewDesc" && len(call.Args) == 4:
		n, ok1 := s.str(call.Args[0])
		h, ok2 := s.str(call.Args[1])
		l, ok3 := s.list(call.Args[2])
		if !ok1 {
			return m, false, "a NewDesc whose name is not a constant"
		}
		if !strings.HasPrefix(n, "zonewatch_") {
			return m, false, ""
		}
		if !ok2 || !ok3 {
			return m, false, "NewDesc(" + n + "): help or label names are not constants"
		}
		sort.Strings(l)
		return declaredMetric{name: n, help: h, labels: l}, true, ""
	case metricCtor.MatchString(name) && len(call.Args) >= 1:
		opts := call.Args[0]
		if u, isAddr := opts.(*ast.UnaryExpr); isAddr {
			opts = u.X
		}
		lit, isLit := opts.(*ast.CompositeLit)
		if !isLit {
			return m, false, ""
		}
		var parts []string
		var help string
		for _, field := range []string{"Namespace", "Subsystem", "Name", "Help"} {
			for _, el := range lit.Elts {
				kv, isKV := el.(*ast.KeyValueExpr)
				if k, isIdent := kv.Key.(*ast.Ident); !isKV || !isIdent || k.Name != field {
					continue
				}
				v, ok := s.str(kv.Value)
				if !ok {
					return m, false, name + ": " + field + " is not a constant"
				}
				if field == "Help" {
					help = v
				} else if v != "" {
					parts = append(parts, v)
				}
			}
		}
		n := strings.Join(parts, "_")
		if !strings.HasPrefix(n, "zonewatch_") {
			return m, false, ""
		}
		var l []string
		if strings.HasSuffix(name, "Vec") {
			if len(call.Args) != 2 {
				return m, false, name + "(" + n + "): no label names"
			}
			var ok bool
			if l, ok = s.list(call.Args[1]); !ok {
				return m, false, name + "(" + n + "): label names are not constants"
			}
		}
		sort.Strings(l)
		typ := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(name, "New"), "Vec"))
		return declaredMetric{name: n, typ: typ, help: help, labels: l}, true, ""
	}
	return m, false, ""
}

// goldenMetric is a family of testdata/exposition.golden: what the
// simulated exporter served (TestSimulatedExporter keeps it true).
type goldenMetric struct {
	typ    string
	labels []string
}

func goldenMetrics(t *testing.T) map[string]goldenMetric {
	t.Helper()
	b, err := os.ReadFile(expositionGolden)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]goldenMetric{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Fatalf("%s: line %q", expositionGolden, line)
		}
		set := map[string]bool{}
		for _, ls := range f[2:] {
			for _, l := range strings.Split(strings.Trim(ls, "{}"), ",") {
				if l != "" {
					set[l] = true
				}
			}
		}
		g := goldenMetric{typ: f[1]}
		for l := range set {
			g.labels = append(g.labels, l)
		}
		sort.Strings(g.labels)
		out[f[0]] = g
	}
	return out
}

// docMetric is a row of a docs table that lists metrics with their labels.
type docMetric struct {
	file, name, typ string
	labels          []string
	cell            string // the meaning column, for the source list
}

var (
	docMetricCell = regexp.MustCompile("^`(zonewatch_[a-z0-9_]+)(\\{[^}]*\\})?`$")
	selectorLabel = regexp.MustCompile(`([a-z_]+)\s*=~?`)
)

// cells splits a Markdown table row, keeping escaped pipes.
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimSuffix(strings.TrimPrefix(row, "|"), "|")
	var out []string
	for _, c := range strings.Split(strings.ReplaceAll(row, `\|`, "\x00"), "|") {
		out = append(out, strings.TrimSpace(strings.ReplaceAll(c, "\x00", `\|`)))
	}
	return out
}

// docLabels reads a labels cell: "a, b" or "`a, b`", "`a` = `v1`, `v2`"
// (a label and its values), "same" (the row above's), or empty.
func docLabels(cell string, above []string) []string {
	cell = strings.TrimSpace(cell)
	if cell == "same" {
		return slices.Clone(above)
	}
	var out []string
	plain := strings.ReplaceAll(cell, "`", "")
	if strings.Contains(plain, "=") {
		for _, m := range selectorLabel.FindAllStringSubmatch(plain, -1) {
			out = append(out, m[1])
		}
	} else {
		for _, l := range strings.Split(plain, ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}

// docMetricTables reads every table of docs/*.md whose header has a metric
// and a labels column.
func docMetricTables(t *testing.T) []docMetric {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	var out []docMetric
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		base := "docs/" + filepath.Base(file)
		col := map[string]int{}
		var above []string
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "|") {
				col = map[string]int{}
				continue
			}
			c := cells(line)
			if len(col) == 0 {
				for i, h := range c {
					col[h] = i
				}
				if _, ok := col["metric"]; !ok {
					col = map[string]int{"-": -1}
				} else if _, ok := col["labels"]; !ok {
					col = map[string]int{"-": -1}
				}
				continue
			}
			mi, ok := col["metric"]
			if !ok || mi >= len(c) {
				continue
			}
			m := docMetricCell.FindStringSubmatch(c[mi])
			if m == nil {
				continue
			}
			d := docMetric{file: base, name: m[1]}
			for _, s := range selectorLabel.FindAllStringSubmatch(m[2], -1) {
				d.labels = append(d.labels, s[1])
			}
			if li := col["labels"]; li < len(c) {
				d.labels = append(d.labels, docLabels(c[li], above)...)
			}
			sort.Strings(d.labels)
			d.labels = slices.Compact(d.labels)
			if ti, ok := col["type"]; ok && ti < len(c) {
				d.typ = c[ti]
			}
			if mi, ok := col["meaning"]; ok && mi < len(c) {
				d.cell = c[mi]
			}
			above = d.labels
			out = append(out, d)
		}
	}
	return out
}

// TestMetricsDocMatchesCode: every declared family is a row of
// docs/metrics.md, and every row of a metric table there or in another doc
// names a family the exporter has, with its label names and type.
func TestMetricsDocMatchesCode(t *testing.T) {
	declared := declaredMetrics(t)
	golden := goldenMetrics(t)
	rows := docMetricTables(t)
	t.Logf("%d families declared in the code, %d in %s, %d rows of metric tables in docs/", len(declared), len(golden), expositionGolden, len(rows))

	inMetricsMD := map[string]bool{}
	for _, d := range rows {
		if d.file == "docs/metrics.md" {
			inMetricsMD[d.name] = true
		}
	}
	var names []string
	for n := range declared {
		names = append(names, n)
	}
	for n := range golden {
		if _, ok := declared[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if !inMetricsMD[n] {
			where := "the simulated exporter serves it (" + expositionGolden + ")"
			if d, ok := declared[n]; ok {
				where = "declared at " + d.pos
			}
			t.Errorf("%s is not in the metric table of docs/metrics.md: %s", n, where)
		}
	}
	for n, d := range declared {
		if g, ok := golden[n]; ok && (!slices.Equal(g.labels, d.labels) || d.typ != "" && d.typ != g.typ) {
			t.Errorf("%s: declared %s %v at %s, %s has %s %v: go test ./cmd/exporter -run TestSimulatedExporter -update", n, d.typ, d.labels, d.pos, expositionGolden, g.typ, g.labels)
		}
	}

	for _, r := range rows {
		wantLabels, wantType, known := []string(nil), "", false
		if d, ok := declared[r.name]; ok {
			wantLabels, wantType, known = d.labels, d.typ, true
		}
		if g, ok := golden[r.name]; ok {
			if !known {
				wantLabels = g.labels
			}
			wantType, known = g.typ, true
		}
		if !known {
			t.Errorf("%s lists %s, which the exporter does not declare", r.file, r.name)
			continue
		}
		if !slices.Equal(r.labels, wantLabels) {
			t.Errorf("%s: %s has the labels %v, the exporter %v", r.file, r.name, r.labels, wantLabels)
		}
		if r.typ != "" && wantType != "" && r.typ != wantType {
			t.Errorf("%s: %s is a %s, the exporter's a %s", r.file, r.name, r.typ, wantType)
		}
	}
}

// addSource matches the wiring's w.exporter.AddSource("name", ...).
var addSource = regexp.MustCompile(`AddSource\("([a-z]+)"`)

// TestSourcesDocumented: every source the wiring registers for
// zonewatch_source_up is named in docs/metrics.md's source_up row and in
// the metric's help.
func TestSourcesDocumented(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	sources := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range addSource.FindAllStringSubmatch(string(b), -1) {
			sources[m[1]] = true
		}
	}
	if len(sources) < 5 {
		t.Fatalf("found the sources %v: the scan of AddSource is broken", sources)
	}
	var row string
	for _, d := range docMetricTables(t) {
		if d.file == "docs/metrics.md" && d.name == "zonewatch_source_up" {
			row = d.cell
		}
	}
	help := declaredMetrics(t)["zonewatch_source_up"].help
	if row == "" || help == "" {
		t.Fatalf("no zonewatch_source_up row in docs/metrics.md (%q) or declaration (%q)", row, help)
	}
	word := func(text, w string) bool {
		return regexp.MustCompile(`\b` + regexp.QuoteMeta(w) + `\b`).MatchString(text)
	}
	for s := range sources {
		if !word(row, s) {
			t.Errorf("source %q is registered (AddSource) but not named in docs/metrics.md's zonewatch_source_up row: %s", s, row)
		}
		if !word(help, s) {
			t.Errorf("source %q is registered (AddSource) but not named in zonewatch_source_up's help: %s", s, help)
		}
	}
}
