package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

const expositionGolden = "testdata/exposition.golden"

// identities renders what a scrape exposes, values stripped: each zonewatch
// family's name and type, and the label names of its series (node_exporter
// keeps such a golden of its whole /metrics page).
func identities(fams map[string]*dto.MetricFamily) string {
	var names []string
	for name := range fams {
		if strings.HasPrefix(name, "zonewatch_") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		f := fams[name]
		sets := map[string]bool{}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName())
			}
			sort.Strings(ls)
			sets["{"+strings.Join(ls, ",")+"}"] = true
		}
		var keys []string
		for k := range sets {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&b, "%s %s %s\n", name, strings.ToLower(f.GetType().String()), strings.Join(keys, " "))
	}
	return b.String()
}

// checkExposition compares the simulated exporter's series identities with
// testdata/exposition.golden (-update rewrites it) and runs `promtool check
// metrics` over the whole page.
func checkExposition(t *testing.T, url string, fams map[string]*dto.MetricFamily) {
	t.Helper()
	got := identities(fams)
	if *update {
		if err := os.WriteFile(expositionGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(expositionGolden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the exposition's series identities differ from %s (go test ./cmd/exporter -run TestSimulatedExporter -update, and review the diff):\n%s",
			expositionGolden, lineDiff(string(want), got))
	}

	t.Run("promtool check metrics", func(t *testing.T) {
		promtool := filepath.Join(testenv.ToolsBin(t, "promtool"), "promtool")
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		page, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(page)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics over the whole /metrics: %v\n%s", err, out)
		}
	})
}

// lineDiff lists the lines only in want (-) or only in got (+).
func lineDiff(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var out []string
	for l := range w {
		if !g[l] {
			out = append(out, "- "+l)
		}
	}
	for l := range g {
		if !w[l] {
			out = append(out, "+ "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
