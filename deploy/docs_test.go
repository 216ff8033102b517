package deploy

import (
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

var watchRow = regexp.MustCompile("^\\| `([a-z]+)` \\| `?([a-z0-9.-]+)`? \\|")

// TestWatchedResourcesDocumented: what the informers list and watch
// (readResources, which TestClusterRoleReadsOnlyPodsAndNodes holds the
// ClusterRole to and TestExporterRBACAudit the apiserver's audit log) is
// docs/topology.md's table of watches, row for row, and every resource of
// it is named where values.yaml and SECURITY.md describe the ClusterRole;
// the README links that table instead of listing a part of it (each once
// listed fewer resources than the ClusterRole grants).
func TestWatchedResourcesDocumented(t *testing.T) {
	want := map[string]bool{}
	for group, resources := range readResources() {
		for _, r := range resources {
			want[group+"/"+r] = true
		}
	}

	table := testenv.DocPassage(t, "../docs/topology.md", "| resource | API group |", "")
	got := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		m := watchRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		group := m[2]
		if group == "core" {
			group = ""
		}
		got[group+"/"+m[1]] = true
	}
	for _, k := range sortedKeys(want) {
		if !got[k] {
			t.Errorf("docs/topology.md's table of watches lacks %s (group/resource), which the exporter watches", k)
		}
	}
	for _, k := range sortedKeys(got) {
		if !want[k] {
			t.Errorf("docs/topology.md's table of watches lists %s (group/resource), which the exporter does not watch", k)
		}
	}

	for _, doc := range []struct{ file, marker, end string }{
		{filepath.Join(chartDir, "values.yaml"), "\nrbac:\n", "  create:"},
		{"../SECURITY.md", "The Helm chart's defaults", ""},
	} {
		text := testenv.DocPassage(t, doc.file, doc.marker, doc.end)
		for _, k := range sortedKeys(want) {
			res := k[strings.Index(k, "/")+1:]
			if !regexp.MustCompile(`(?i)\b` + res + `\b`).MatchString(text) {
				t.Errorf("%s does not name %s where it lists what the ClusterRole grants:\n%s", doc.file, res, text)
			}
		}
	}

	readme := testenv.DocPassage(t, "../README.md", "Its ClusterRole allows only list and watch", "")
	if !strings.Contains(readme, "(docs/topology.md#what-the-exporter-watches)") {
		t.Errorf("README.md's ClusterRole sentence does not link docs/topology.md#what-the-exporter-watches:\n%s", readme)
	}
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return slices.Compact(out)
}
