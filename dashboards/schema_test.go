package dashboards

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSchemaCheck type-checks the dashboards against the npm package
// @grafana/schema with hack/schema-check/check.sh: the committed JSON, the
// cluster-aware variant, and two broken copies that must fail (so a check
// that accepts anything cannot pass). One tsc run covers them all.
//
// It needs node and npm (and the npm registry on a cold cache). Without
// them it skips, unless CI or ZONEWATCH_REQUIRE_TOOLS is set: then it fails.
func TestSchemaCheck(t *testing.T) {
	required := os.Getenv("CI") != "" || os.Getenv("ZONEWATCH_REQUIRE_TOOLS") != ""
	cannotRun := func(why string) {
		t.Helper()
		if required {
			t.Fatalf("schema check cannot run: %s (CI or ZONEWATCH_REQUIRE_TOOLS is set, so this fails)", why)
		}
		t.Skipf("schema check skipped: %s; set ZONEWATCH_REQUIRE_TOOLS=1 to make this a failure", why)
	}
	if testing.Short() && !required {
		t.Skip("schema check skipped in -short mode (it runs tsc)")
	}
	for _, bin := range []string{"bash", "node", "npm"} {
		if _, err := exec.LookPath(bin); err != nil {
			cannotRun(bin + " is not installed")
		}
	}

	dir := t.TempDir()
	args := []string{filepath.Join(repoRoot, "hack", "schema-check", "check.sh")}
	committed, err := filepath.Glob(filepath.Join(repoRoot, JSONDir, "*.json"))
	if err != nil || len(committed) == 0 {
		t.Fatalf("no committed dashboards (%v); %s", err, regenerate)
	}
	args = append(args, committed...)
	o := DefaultOptions()
	o.ClusterLabel = "cluster"
	withCluster, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range withCluster {
		p := filepath.Join(dir, "cluster-"+d.Name+".json")
		if err := os.WriteFile(p, d.JSON, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, p)
	}
	brokenOption := writeBroken(t, dir, "broken-option", withCluster[0].JSON, func(d map[string]any) {
		panels := d["panels"].([]any)
		panels[1].(map[string]any)["options"].(map[string]any)["colorMode"] = "rainbow"
	})
	brokenField := writeBroken(t, dir, "broken-field", withCluster[0].JSON, func(d map[string]any) {
		d["bogusTopLevel"] = true
	})
	args = append(args, brokenOption, brokenField)

	cmd := exec.Command("bash", args...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.ExitCode() == 3:
		cannotRun(strings.TrimSpace(string(out)))
	case err == nil:
		t.Fatalf("schema check accepted deliberately broken dashboards:\n%s", out)
	case !errors.As(err, &exit) || exit.ExitCode() != 1:
		t.Fatalf("schema check: %v\n%s", err, out)
	}

	var brokenOptionSeen, brokenFieldSeen bool
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, "error TS") {
			continue
		}
		switch {
		case strings.HasPrefix(line, brokenOption+":"):
			brokenOptionSeen = brokenOptionSeen || strings.Contains(line, "rainbow")
		case strings.HasPrefix(line, brokenField+":"):
			brokenFieldSeen = brokenFieldSeen || strings.Contains(line, "bogusTopLevel")
		default:
			t.Errorf("generated dashboard does not match @grafana/schema: %s", line)
		}
	}
	if !brokenOptionSeen {
		t.Errorf("schema check missed a wrong stat colorMode:\n%s", out)
	}
	if !brokenFieldSeen {
		t.Errorf("schema check missed an unknown top-level field:\n%s", out)
	}
	if t.Failed() {
		t.Logf("full output:\n%s", out)
	}
}

func writeBroken(t *testing.T, dir, name string, src []byte, breakIt func(map[string]any)) string {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(src, &d); err != nil {
		t.Fatal(err)
	}
	breakIt(d)
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
