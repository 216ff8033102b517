package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/zonewatch/zonewatch/rules"
)

var (
	headingRE   = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	alertNameRE = regexp.MustCompile(`\bZonewatch[A-Z][A-Za-z]+\b`)
)

// runbookAnchors are the anchors GitHub gives the headings of
// docs/runbooks.md, and "" (the document itself).
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{"": true}
	for _, m := range headingRE.FindAllStringSubmatch(string(b), -1) {
		var a strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
				a.WriteRune(r)
			case r == ' ':
				a.WriteRune('-')
			}
		}
		anchors[a.String()] = true
	}
	if len(anchors) < 10 {
		t.Fatalf("read %d anchors from docs/runbooks.md: the heading reader is broken", len(anchors))
	}
	return anchors
}

// runbookLinkProblems checks a dashboard's panel links: each one is a
// runbook section that exists (at base), a panel whose description names a
// runbook links one, and a panel that names an alert links its section.
// It returns the panels that name a runbook and the problems.
func runbookLinkProblems(dashboardJSON []byte, base string, anchors map[string]bool) (naming int, problems []string) {
	var d lintDashboard
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		return 0, []string{err.Error()}
	}
	for _, p := range allPanels(d.Panels) {
		where := fmt.Sprintf("panel %q", p.Title)
		linked := map[string]bool{}
		for _, l := range p.Links {
			doc, anchor, _ := strings.Cut(l.URL, "#")
			switch {
			case l.Type != "link" || doc != base:
				problems = append(problems, fmt.Sprintf("%s: link %q to %q is not a section of the runbooks at %s", where, l.Title, l.URL, base))
			case !anchors[anchor]:
				problems = append(problems, fmt.Sprintf("%s: link %q: docs/runbooks.md has no section #%s", where, l.Title, anchor))
			case !strings.HasPrefix(l.Title, "Runbook: "):
				problems = append(problems, fmt.Sprintf("%s: link title %q does not say it is a runbook", where, l.Title))
			}
			linked[anchor] = true
		}
		alerts := alertNameRE.FindAllString(p.Description, -1)
		if len(alerts) == 0 && !strings.Contains(strings.ToLower(p.Description), "runbook") {
			continue
		}
		naming++
		if len(p.Links) == 0 {
			problems = append(problems, fmt.Sprintf("%s names a runbook but links none: %s", where, p.Description))
		}
		for _, a := range alerts {
			if !linked[strings.ToLower(a)] {
				problems = append(problems, fmt.Sprintf("%s names %s but does not link its runbook section", where, a))
			}
		}
	}
	return naming, problems
}

// TestRunbookLinks: in every variant and in the committed JSON, each panel
// that names a runbook or an alert links it, at the rules' runbook document,
// and every section linked exists in docs/runbooks.md.
func TestRunbookLinks(t *testing.T) {
	anchors := runbookAnchors(t)
	check := func(t *testing.T, uid string, b []byte) {
		naming, problems := runbookLinkProblems(b, rules.DefaultRunbookBaseURL, anchors)
		for _, p := range problems {
			t.Error(p)
		}
		if uid != UIDCost && naming == 0 {
			t.Errorf("no panel names a runbook: the check reads nothing")
		}
	}
	for variant, c := range lintCases(t) {
		for _, d := range c.dashboards {
			t.Run(variant+"/"+d.Name, func(t *testing.T) { check(t, d.UID, d.JSON) })
		}
	}
	paths, _ := filepath.Glob(filepath.Join(repoRoot, JSONDir, "*.json"))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var d struct{ UID string }
		_ = json.Unmarshal(b, &d)
		t.Run("committed/"+filepath.Base(p), func(t *testing.T) { check(t, d.UID, b) })
	}
}

// TestRunbookLinksCatchMistakes proves the check is not vacuous.
func TestRunbookLinksCatchMistakes(t *testing.T) {
	anchors := map[string]bool{"": true, "zonewatchexporterdown": true}
	base := "https://example.com/runbooks.md"
	for _, tc := range []struct{ panel, want string }{
		{`{"title": "a", "description": "Follow the runbook."}`, "links none"},
		{`{"title": "a", "description": "When ZonewatchExporterDown fires.", "links": [{"title": "Runbook: x", "type": "link", "url": "https://example.com/runbooks.md"}]}`, "does not link its runbook section"},
		{`{"title": "a", "description": "x", "links": [{"title": "Runbook: x", "type": "link", "url": "https://example.com/runbooks.md#nope"}]}`, "no section #nope"},
		{`{"title": "a", "description": "x", "links": [{"title": "Runbook: x", "type": "link", "url": "https://elsewhere.example/runbooks.md#zonewatchexporterdown"}]}`, "is not a section of the runbooks"},
		{`{"title": "a", "description": "x", "links": [{"title": "Docs", "type": "link", "url": "https://example.com/runbooks.md#zonewatchexporterdown"}]}`, "does not say it is a runbook"},
	} {
		_, problems := runbookLinkProblems([]byte(`{"panels": [`+tc.panel+`]}`), base, anchors)
		if !strings.Contains(strings.Join(problems, "; "), tc.want) {
			t.Errorf("%s: problems %q, want one saying %q", tc.panel, problems, tc.want)
		}
	}
	good := `{"title": "a", "description": "When ZonewatchExporterDown fires, follow the runbook.", "links": [{"title": "Runbook: ZonewatchExporterDown", "type": "link", "url": "https://example.com/runbooks.md#zonewatchexporterdown"}]}`
	if _, problems := runbookLinkProblems([]byte(`{"panels": [`+good+`]}`), base, anchors); len(problems) > 0 {
		t.Errorf("a correct panel: %q", problems)
	}
}

// TestFiringAlertsSelectEveryAlert: the firing-alerts panels select
// zonewatch's alerts by name; every alert of the rule pack must match.
func TestFiringAlertsSelectEveryAlert(t *testing.T) {
	_, pattern, _ := strings.Cut(alertNames, `=~"`)
	re := regexp.MustCompile("^(?:" + strings.TrimSuffix(pattern, `"`) + ")$")
	b, err := rules.Generate(rules.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^ *- alert: (\S+)$`).FindAllStringSubmatch(string(b), -1)
	if len(alerts) < 10 {
		t.Fatalf("read %d alerts from the rule file: the reader is broken", len(alerts))
	}
	for _, a := range alerts {
		if !re.MatchString(a[1]) {
			t.Errorf("alert %s does not match %s: the firing-alerts panels would leave it out", a[1], alertNames)
		}
	}
}
