package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

var (
	codeBlock = regexp.MustCompile("(?ms)^ *```([a-z]*)\n(.*?)^ *```$")
	// README: helm install zonewatch deploy/helm/zonewatch --namespace NS
	readmeNamespace = regexp.MustCompile(`helm install zonewatch deploy/helm/zonewatch --namespace ([a-z0-9-]+)`)
	kubectlNS       = regexp.MustCompile(`(?:^|\s)(?:-n|--namespace)[ =]([^\s]+)`)
	placeholder     = regexp.MustCompile(`^[A-Z_]+$`)
	// The agent CLI run in a Cilium pod: `-- cilium <command>` (cilium-dbg
	// from 1.15; the hubble CLI is another binary).
	agentCLI = regexp.MustCompile(`--\s+cilium\s`)
	// A zonewatch flag: dotted (--gpu.source), as every serve flag but a few.
	dottedFlag = regexp.MustCompile(`--([a-z]+\.[a-z][a-z0-9.-]*[a-z0-9])`)
	// A flag row of docs/flags.md (generated from the command line).
	flagsRow    = regexp.MustCompile("(?m)^\\| `--(?:\\[no-\\])?([a-z0-9.-]+)`")
	metricRow   = regexp.MustCompile("^\\| `(zonewatch_[a-z0-9_]+)` \\| [a-z]+ \\|([^|]*)\\|")
	agentExempt = "1.14" // a line that says it is for Cilium 1.14 may use `cilium`
)

// Target labels Prometheus (and the Prometheus Operator's PodMonitor
// job) puts on every zonewatch series besides the exporter's own.
var targetLabels = []string{"instance", "job", "namespace", "pod", "container", "endpoint"}

// metricLabels reads docs/metrics.md's table: metric -> label names
// (`cmd/exporter`'s TestMetricsDocMatchesCode holds it to the code).
func metricLabels(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	var above []string
	for _, line := range strings.Split(string(b), "\n") {
		m := metricRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var ls []string
		if cell := strings.TrimSpace(m[2]); cell == "same" {
			ls = above
		} else {
			for _, l := range strings.Split(cell, ",") {
				if l = strings.TrimSpace(l); l != "" {
					ls = append(ls, l)
				}
			}
		}
		out[m[1]], above = ls, ls
	}
	if len(out) < 20 {
		t.Fatalf("read %d metrics from docs/metrics.md: the table reader is broken", len(out))
	}
	return out
}

// promqlProblems returns the label names expr uses on zonewatch metrics
// that those metrics do not have: in matchers, and in by/without of an
// aggregation over one selector (where the labels are the metric's).
func promqlProblems(expr parser.Expr, labels map[string][]string) []string {
	has := func(metric, l string) bool {
		return slices.Contains(labels[metric], l) || slices.Contains(targetLabels, l)
	}
	var out []string
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			if _, known := labels[n.Name]; !known {
				if strings.HasPrefix(n.Name, "zonewatch_") {
					out = append(out, n.Name+" is not a metric of docs/metrics.md")
				}
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != "__name__" && !has(n.Name, m.Name) {
					out = append(out, n.Name+" has no label "+m.Name)
				}
			}
		case *parser.AggregateExpr:
			var sels []*parser.VectorSelector
			parser.Inspect(n.Expr, func(inner parser.Node, _ []parser.Node) error {
				if vs, ok := inner.(*parser.VectorSelector); ok {
					sels = append(sels, vs)
				}
				return nil
			})
			if len(sels) != 1 {
				return nil
			}
			if _, known := labels[sels[0].Name]; !known {
				return nil
			}
			for _, l := range n.Grouping {
				if !has(sels[0].Name, l) {
					out = append(out, n.Op.String()+" by ("+l+") over "+sels[0].Name+", which has no label "+l)
				}
			}
		}
		return nil
	})
	return out
}

// TestRunbookCommands checks the commands of docs/runbooks.md against the
// README and the code: kubectl namespaces are the one the README installs
// zonewatch into (or Cilium's, the GPU Operator's, a placeholder); the
// Cilium agent's CLI is cilium-dbg (`cilium` only on a line about 1.14);
// PromQL parses and names only labels its zonewatch metrics have (the
// runbooks once used -n zonewatch, `cilium status` and
// `sum by (instance, source)` of the lost events, whose label is buffer);
// every dotted zonewatch flag is one docs/flags.md lists. The README's own
// shell blocks are held to the same namespace and CLI rules.
func TestRunbookCommands(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := readmeNamespace.FindSubmatch(readme)
	if m == nil {
		t.Fatal("README has no `helm install zonewatch deploy/helm/zonewatch --namespace NS`: update this test")
	}
	ns := string(m[1])
	namespaces := []string{ns, "kube-system", "gpu-operator"}

	flagsDoc, err := os.ReadFile("flags.md")
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	for _, f := range flagsRow.FindAllStringSubmatch(string(flagsDoc), -1) {
		flags[f[1]] = true
	}

	b, err := os.ReadFile("runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	// The README's own shell blocks follow the same rules.
	for _, blk := range codeBlock.FindAllStringSubmatch(string(readme), -1) {
		if blk[1] == "sh" {
			checkShell(t, "README.md", blk[2], ns, namespaces)
		}
	}
	labels := metricLabels(t)
	p := parser.NewParser(parser.Options{})
	blocks := map[string]int{}
	for _, blk := range codeBlock.FindAllStringSubmatch(string(b), -1) {
		lang, body := blk[1], blk[2]
		blocks[lang]++
		switch lang {
		case "sh":
			checkShell(t, "runbooks.md", body, ns, namespaces)
		case "promql":
			for _, q := range strings.Split(strings.TrimSpace(body), "\n") {
				if q = strings.TrimSpace(q); q == "" {
					continue
				}
				expr, err := p.ParseExpr(q)
				if err != nil {
					t.Errorf("runbooks.md: %v: %s", err, q)
					continue
				}
				for _, problem := range promqlProblems(expr, labels) {
					t.Errorf("runbooks.md: %s: %s", problem, q)
				}
			}
		}
	}
	t.Logf("code blocks in runbooks.md: %v; the README installs into %q", blocks, ns)
	if blocks["sh"] == 0 || blocks["promql"] == 0 {
		t.Fatalf("found the code blocks %v in runbooks.md: the reader is broken", blocks)
	}
	for _, f := range dottedFlag.FindAllStringSubmatch(string(b), -1) {
		if !flags[f[1]] {
			t.Errorf("runbooks.md names --%s, which docs/flags.md (the command line) does not list", f[1])
		}
	}
}

// checkShell checks a shell block's kubectl namespaces and Cilium agent CLI.
func checkShell(t *testing.T, file, body, ns string, namespaces []string) {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		for _, n := range kubectlNS.FindAllStringSubmatch(line, -1) {
			if !slices.Contains(namespaces, n[1]) && !placeholder.MatchString(n[1]) {
				t.Errorf("%s: namespace %q, the README installs zonewatch into %q (others allowed: %v): %s", file, n[1], ns, namespaces[1:], line)
			}
		}
		if agentCLI.MatchString(line) && !strings.Contains(line, agentExempt) {
			t.Errorf("%s: `cilium` in the agent pod is cilium-dbg since Cilium 1.15 (`cilium` only for 1.14): %s", file, line)
		}
	}
}
