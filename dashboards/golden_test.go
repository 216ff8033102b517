package dashboards

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zonewatch/zonewatch/rules"
)

const regenerate = "run `go run ./dashboards/gen` from the repository root and commit the result"

// repoRoot is the repository root, seen from this package's directory.
const repoRoot = ".."

// TestGeneratedFilesUpToDate fails when the committed JSON, ConfigMaps or
// Helm copies differ from what the generator writes now.
func TestGeneratedFilesUpToDate(t *testing.T) {
	files, err := Files(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range files {
		got, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(p)))
		if err != nil {
			t.Errorf("%s: %v; %s", p, err, regenerate)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is out of date (first difference at line %d); %s", p, firstDiffLine(got, want), regenerate)
		}
	}
	// A dashboard removed from the generator must not linger on disk.
	for _, dir := range []string{JSONDir, ConfigMapDir, HelmDir} {
		entries, err := os.ReadDir(filepath.Join(repoRoot, dir))
		if err != nil {
			t.Errorf("%s: %v; %s", dir, err, regenerate)
			continue
		}
		for _, e := range entries {
			if _, ok := files[dir+"/"+e.Name()]; !ok {
				t.Errorf("%s/%s is not generated any more: delete it (%s)", dir, e.Name(), regenerate)
			}
		}
	}
}

func firstDiffLine(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

func TestGenerateIsDeterministic(t *testing.T) {
	a, err := Files(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Files(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for p := range a {
		if !bytes.Equal(a[p], b[p]) {
			t.Errorf("%s differs between two runs", p)
		}
	}
}

func TestConfigMapCarriesDashboard(t *testing.T) {
	ds, err := Generate(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		cm := string(ConfigMap(d, "zonewatch"))
		for _, want := range []string{
			"kind: ConfigMap\n",
			"  name: " + d.Name + "\n",
			"    grafana_dashboard: \"1\"\n",
			"    grafana_folder: \"zonewatch\"\n",
			"  " + d.Name + ".json: |-\n",
		} {
			if !strings.Contains(cm, want) {
				t.Errorf("%s ConfigMap lacks %q", d.Name, want)
			}
		}
		// The block scalar, unindented, is the dashboard JSON byte for byte.
		_, block, _ := strings.Cut(cm, ".json: |-\n")
		var json strings.Builder
		for line := range strings.Lines(block) {
			if !strings.HasPrefix(line, "    ") {
				t.Fatalf("%s ConfigMap: line %q is not indented into the block", d.Name, line)
			}
			json.WriteString(strings.TrimPrefix(line, "    "))
		}
		if json.String() != string(d.JSON) {
			t.Errorf("%s ConfigMap does not carry the dashboard JSON unchanged", d.Name)
		}
		if len(cm) > 256*1024 {
			// kubectl apply keeps a copy in an annotation limited to 256 KiB.
			t.Errorf("%s ConfigMap is %d bytes; kubectl apply fails above 256 KiB", d.Name, len(cm))
		}
	}
}

func TestOptionsValidated(t *testing.T) {
	for name, mutate := range map[string]func(*Options){
		"no scrape job":        func(o *Options) { o.ScrapeJob = "" },
		"free GPUs":            func(o *Options) { o.GPUUSDPerHour = 0 },
		"negative transfer":    func(o *Options) { o.CrossZoneUSDPerGB = -1 },
		"idle above 1":         func(o *Options) { o.IdleGPUUtilization = 1.5 },
		"no folder":            func(o *Options) { o.Folder = "" },
		"cluster label syntax": func(o *Options) { o.ClusterLabel = `cluster="x"` },
		"cluster label digit":  func(o *Options) { o.ClusterLabel = "1cluster" },
		"runbook fragment":     func(o *Options) { o.RunbookBaseURL = rules.DefaultRunbookBaseURL + "#top" },
		"no runbook":           func(o *Options) { o.RunbookBaseURL = "" },
	} {
		o := DefaultOptions()
		mutate(&o)
		if _, err := Generate(o); err == nil {
			t.Errorf("%s: Generate accepted invalid options", name)
		}
	}
}

func TestStableIdentity(t *testing.T) {
	ds, err := Generate(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, d := range ds {
		uids = append(uids, d.UID)
		if len(d.UID) > 40 {
			t.Errorf("uid %q is longer than Grafana's 40 characters", d.UID)
		}
	}
	if want := []string{UIDOverview, UIDJob, UIDCost}; !slices.Equal(uids, want) {
		t.Errorf("uids = %v, want %v (links and bookmarks depend on them)", uids, want)
	}
}
