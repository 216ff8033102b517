package rules

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPricePresetsDocumented keeps docs/cost.md's price table and the
// presets in step: each preset's row names its source, the day it was read
// and its prices.
func TestPricePresetsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "cost.md"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := PricePresets[DefaultPricePreset]; !ok {
		t.Fatalf("default preset %q is not a preset", DefaultPricePreset)
	}
	d := DefaultConfig()
	if p := PricePresets[DefaultPricePreset]; d.CrossZoneDollarsPerGB != p.CrossZoneDollarsPerGB || d.CrossRegionDollarsPerGB != p.CrossRegionDollarsPerGB {
		t.Errorf("DefaultConfig prices %v/%v are not the %s preset's %v/%v", d.CrossZoneDollarsPerGB, d.CrossRegionDollarsPerGB, DefaultPricePreset, p.CrossZoneDollarsPerGB, p.CrossRegionDollarsPerGB)
	}
	for name, p := range PricePresets {
		var row string
		for _, line := range strings.Split(string(doc), "\n") {
			if strings.HasPrefix(line, "| `"+name+"`") {
				row = line
			}
		}
		if row == "" {
			t.Errorf("docs/cost.md has no row for preset %s", name)
			continue
		}
		for _, want := range []string{p.Source, p.Checked, strconv.FormatFloat(p.CrossZoneDollarsPerGB, 'f', -1, 64), strconv.FormatFloat(p.CrossRegionDollarsPerGB, 'f', -1, 64)} {
			if !strings.Contains(row, want) {
				t.Errorf("docs/cost.md row for %s lacks %q: %s", name, want, row)
			}
		}
		if p.BothDirections != strings.Contains(row, "| yes |") {
			t.Errorf("docs/cost.md row for %s: both directions billed should say %v", name, p.BothDirections)
		}
	}
}
