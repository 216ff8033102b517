package topology

import (
	"os"
	"strings"
	"testing"
)

// TestIdentityDoc: docs/topology.md's job identity table lists the
// built-in rules' name labels in the order they are tried, and the custom
// rule syntax as ParseRule reads it.
func TestIdentityDoc(t *testing.T) {
	b, err := os.ReadFile("../docs/topology.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## Job identity")
	end := strings.Index(doc, "### Top owners")
	if start < 0 || end < start {
		t.Fatal("docs/topology.md lacks the Job identity section")
	}
	var labels []string
	for _, line := range strings.Split(doc[start:end], "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[2]), "`") {
			continue
		}
		labels = append(labels, strings.Trim(strings.TrimSpace(cells[2]), "`"))
	}
	if want := NameLabels(DefaultRules()); strings.Join(labels, " ") != strings.Join(want, " ") {
		t.Errorf("table rows name %v, rules try %v", labels, want)
	}
	if !strings.Contains(doc, "`"+RuleSyntax+"`") {
		t.Errorf("docs/topology.md lacks the rule syntax %s", RuleSyntax)
	}
}
