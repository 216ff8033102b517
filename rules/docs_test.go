package rules

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// The places that list the rule pack's groups and alerts, against what the
// generator writes (the rule files are its output: TestCommittedFilesAreGenerated).

var (
	groupName = regexp.MustCompile(`\bzonewatch\.[a-z]+\b`)
	// A row of the README's alert table: | [Alert](docs/runbooks.md#anchor) | severity | fires when | for |
	readmeAlertRow = regexp.MustCompile(`^\| \[(Zonewatch[A-Za-z]+)\]\(docs/runbooks\.md#([a-z]+)\) \| ([a-z]+) \|.*\| ([^|]+) \|$`)
	recordRow      = regexp.MustCompile("^\\| `([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)` \\|")
)

func sortedSet(in []string) []string {
	out := slices.Clone(in)
	sort.Strings(out)
	return slices.Compact(out)
}

// TestDocsListTheRuleGroups: where the README and the chart's NOTES.txt
// tell the user which groups Prometheus' Rule health page shows, they name
// exactly the groups the generator writes (both once named two of three).
func TestDocsListTheRuleGroups(t *testing.T) {
	groups, err := configuredGroups(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, g := range groups {
		want = append(want, g.Name)
	}
	want = sortedSet(want)
	root := repoRoot(t)
	for _, doc := range []struct{ file, marker string }{
		{"README.md", "Rule health lists"},
		{"deploy/helm/zonewatch/templates/NOTES.txt", "Rule health lists"},
	} {
		got := sortedSet(groupName.FindAllString(testenv.DocPassage(t, filepath.Join(root, doc.file), doc.marker, ""), -1))
		if !slices.Equal(got, want) {
			t.Errorf("%s lists the rule groups %v, the rule files have %v", doc.file, got, want)
		}
	}
}

// TestReadmeAlertTable: the README's alert table has one row per alert the
// generator writes, with its severity, its runbook anchor and its default
// for:, and no other row.
func TestReadmeAlertTable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ anchor, severity, forCell string }
	rows := map[string]row{}
	for _, line := range strings.Split(string(b), "\n") {
		if m := readmeAlertRow.FindStringSubmatch(line); m != nil {
			if _, dup := rows[m[1]]; dup {
				t.Errorf("README: %s has two rows", m[1])
			}
			rows[m[1]] = row{m[2], m[3], strings.TrimSpace(m[4])}
		}
	}
	if len(rows) == 0 {
		t.Fatal("no alert rows in the README (| [ZonewatchX](docs/runbooks.md#zonewatchx) | severity | ... | for |): update this test")
	}
	alerts := 0
	for _, r := range generate(t, DefaultConfig()) {
		if r.Alert == "" {
			continue
		}
		alerts++
		got, ok := rows[r.Alert]
		if !ok {
			t.Errorf("README: no row for the alert %s in the alert table", r.Alert)
			continue
		}
		delete(rows, r.Alert)
		if got.anchor != anchorOf(r.Alert) {
			t.Errorf("README: %s links #%s, its runbook_url #%s", r.Alert, got.anchor, anchorOf(r.Alert))
		}
		if got.severity != r.Labels["severity"] {
			t.Errorf("README: %s is %s in the table, %s in the rules", r.Alert, got.severity, r.Labels["severity"])
		}
		if f := strings.Fields(got.forCell); len(f) == 0 || f[0] != r.For {
			t.Errorf("README: %s's default for is %q in the table, %s in the rules", r.Alert, got.forCell, r.For)
		}
	}
	for name := range rows {
		t.Errorf("README: the alert table lists %s, which the rules do not have", name)
	}
	if alerts == 0 {
		t.Fatal("the generator wrote no alert")
	}
}

// TestRulesDocRecordingTable: docs/rules.md's recording-rule table lists
// exactly the generator's recording rules.
func TestRulesDocRecordingTable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "rules.md"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(string(b), "\n") {
		if m := recordRow.FindStringSubmatch(line); m != nil {
			got = append(got, m[1])
		}
	}
	var want []string
	for _, r := range generate(t, DefaultConfig()) {
		if r.Record != "" {
			want = append(want, r.Record)
		}
	}
	got, want = sortedSet(got), sortedSet(want)
	for _, r := range want {
		if !slices.Contains(got, r) {
			t.Errorf("docs/rules.md: the recording rule %s is not in the table", r)
		}
	}
	for _, r := range got {
		if !slices.Contains(want, r) {
			t.Errorf("docs/rules.md: the table lists %s, which the rules do not record", r)
		}
	}
}
