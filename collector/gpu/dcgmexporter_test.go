package gpu

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// realData holds dcgm-exporter pages captured by other projects.
const realData = "../../../shared/realdata/dcgm"

func TestParseDCGMExporterRealPages(t *testing.T) {
	dir := testenv.RealData(t, "dcgm")
	files, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
	if len(files) == 0 {
		t.Fatalf("no dcgm-exporter page (*.txt) in %s", dir)
	}
	// What each page says of GPU_UTIL (percent) for its GPU.
	want := map[string]struct {
		uuid, node string
		util       float64
		skipped    int
	}{
		"datadog-integrations-core-dcgm-fixture-metrics.txt": {"GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "424773df46e0", 0, 3}, // its PROF series carry no labels,
		"dcgm-exporter-issue-363-metrics-excerpt.txt":        {"GPU-7ad09335-aadb-19c3-e3a8", "k8s-gpu1", 0, 0},
		"gpu-monitoring-tools-issue-138-metrics-excerpt.txt": {"GPU-6bf47ca9-ad3e-15db-beed-1079a7d74116", "", 0.44, 0},
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			ss, skipped, err := ParseDCGMExporter(bytes.NewReader(b), time.Unix(0, 0))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if len(ss) != 1 {
				t.Fatalf("%d samples, want one GPU: %+v", len(ss), ss)
			}
			s := ss[0]
			if s.Index != 0 || s.MIG() || !inRange(s.Util) || s.Device != "nvidia0" {
				t.Errorf("sample %+v: want GPU 0, whole, utilization in 0..1", s)
			}
			w, ok := want[filepath.Base(f)]
			if !ok {
				t.Logf("new page, parsed as %+v (skipped %d)", s, skipped)
				return
			}
			if s.UUID != w.uuid || s.Node != w.node || s.Util != w.util || skipped != w.skipped {
				t.Errorf("got %s %q util=%v skipped=%d; want %s %q util=%v skipped=%d", s.UUID, s.Node, s.Util, skipped, w.uuid, w.node, w.util, w.skipped)
			}
		})
	}
}

func inRange(v float64) bool { return !math.IsNaN(v) && v >= 0 && v <= 1 }

// A page in the current dcgm-exporter format with MIG, profiling fields,
// lower-case labels, a blank sentinel and Kubernetes labels.
const page = `# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaaaaaa-0000-4000-8000-000000000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-a1",container="main",namespace="ml",pod="llm-worker-0"} 96
DCGM_FI_DEV_GPU_UTIL{gpu="1",uuid="GPU-aaaaaaaa-0001-4000-8000-000000000001",device="nvidia1",hostname="gpu-a1"} 2147483632
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-aaaaaaaa-0000-4000-8000-000000000000",Hostname="gpu-a1"} 0.95
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="2",UUID="GPU-aaaaaaaa-0002-4000-8000-000000000002",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="gpu-a1"} 0.40
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="2",UUID="GPU-aaaaaaaa-0002-4000-8000-000000000002",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="gpu-a1"} 140737488355328
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aaaaaaaa-0000-4000-8000-000000000000",Hostname="gpu-a1"} 0.12
DCGM_FI_PROF_SM_ACTIVE{gpu="2",UUID="GPU-aaaaaaaa-0002-4000-8000-000000000002",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="gpu-a1"} 0.33
# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-aaaaaaaa-0000-4000-8000-000000000000",Hostname="gpu-a1"} 0.05
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0"} 0.5
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaaaaaaa-0000-4000-8000-000000000000"} 21383
`

func TestParseDCGMExporterPage(t *testing.T) {
	ss, skipped, err := ParseDCGMExporter(strings.NewReader(page), time.Unix(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if skipped != 1 {
		t.Errorf("skipped %d, want 1 (the series without UUID)", skipped)
	}
	if len(ss) != 4 {
		t.Fatalf("%d samples, want 4: %+v", len(ss), ss)
	}
	g0, g1, mig1, mig2 := ss[0], ss[1], ss[2], ss[3]
	if g0.UUID != "GPU-aaaaaaaa-0000-4000-8000-000000000000" || g0.Util != 0.96 || g0.GraphicsActive != 0.95 || g0.SMActive != 0.12 || g0.TensorActive != 0.05 ||
		g0.Node != "gpu-a1" || g0.Namespace != "ml" || g0.Pod != "llm-worker-0" {
		t.Errorf("GPU 0 = %+v", g0)
	}
	if g1.Index != 1 || g1.Node != "gpu-a1" || !math.IsNaN(g1.Util) {
		t.Errorf("GPU 1 (lower-case labels, blank GPU_UTIL) = %+v; want utilization NA", g1)
	}
	if mig1.GI != 1 || mig1.Index != 2 || mig1.Util != 0.40 || mig1.SMActive != 0.33 || !math.IsNaN(mig1.TensorActive) {
		t.Errorf("MIG 2/1 = %+v; want utilization from GR_ENGINE_ACTIVE", mig1)
	}
	if mig2.GI != 2 || !math.IsNaN(mig2.Util) {
		t.Errorf("MIG 2/2 = %+v; want the blank sentinel dropped", mig2)
	}
}

func readPage(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The 4.x page with the default counters: graphics-engine activity is the
// signal there (SM_ACTIVE is off in every counters CSV dcgm-exporter ships).
func TestParseDCGMExporter4xDefaultCountersWithMIG(t *testing.T) {
	ss, skipped, err := ParseDCGMExporter(bytes.NewReader(readPage(t, "dcgm-exporter-4.x-mig.txt")), time.Unix(1, 0))
	if err != nil || skipped != 0 {
		t.Fatalf("parse: %v (skipped %d)", err, skipped)
	}
	if len(ss) != 3 {
		t.Fatalf("%d samples, want GPU 0 and two MIG instances of GPU 1: %+v", len(ss), ss)
	}
	g0, mig1, mig2 := ss[0], ss[1], ss[2]
	if g0.UUID != "GPU-5f0a3c9e-1b2d-4e6f-8a7b-9c0d1e2f3a4b" || g0.Index != 0 || g0.Device != "nvidia0" || g0.MIG() ||
		g0.Util != 0.87 || g0.GraphicsActive != 0.912345 || g0.TensorActive != 0.431 || !math.IsNaN(g0.SMActive) ||
		g0.Node != "gpu-node-1" || g0.Namespace != "ml" || g0.Pod != "llm-worker-0" {
		t.Errorf("GPU 0 = %+v", g0)
	}
	if mig1.GI != 1 || mig1.Index != 1 || mig1.Device != "nvidia1" || mig1.Util != 0.25 || mig1.GraphicsActive != 0.25 ||
		mig1.TensorActive != 0.12 || mig1.Pod != "llm-eval-0" {
		t.Errorf("MIG 1/gi1 = %+v; want utilization from GR_ENGINE_ACTIVE", mig1)
	}
	if mig2.GI != 2 || mig2.Util != 0 || mig2.Pod != "" {
		t.Errorf("MIG 1/gi2 = %+v", mig2)
	}
}

func TestParseDCGMExporterNoGPUSeriesIsAnError(t *testing.T) {
	for name, tc := range map[string]struct {
		page, reason string
	}{
		"old namespace": {string(readPage(t, "dcgm-exporter-old-namespace.txt")), "1.x naming"},
		"counters CSV without utilization": {"# TYPE DCGM_FI_DEV_FB_USED gauge\n" +
			`DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-5f0a3c9e-1b2d-4e6f-8a7b-9c0d1e2f3a4b"} 1` + "\n", "counters CSV has none of"},
		"no UUID label":     {`DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5` + "\n", "no UUID label"},
		"not dcgm-exporter": {"go_goroutines 12\n", "is this a dcgm-exporter page"},
	} {
		_, _, err := ParseDCGMExporter(strings.NewReader(tc.page), time.Unix(0, 0))
		if !errors.Is(err, ErrNoGPUSeries) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: err %v, want ErrNoGPUSeries saying %q", name, err, tc.reason)
		}
	}
	// A dcgm-exporter that sees no GPU renders only HELP and TYPE lines.
	ss, _, err := ParseDCGMExporter(strings.NewReader("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"), time.Unix(0, 0))
	if err != nil || len(ss) != 0 {
		t.Errorf("page without series: %v, %v; want no GPUs and no error", ss, err)
	}
}

func TestParseDCGMExporterGarbage(t *testing.T) {
	for _, in := range []string{
		"DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 12\n",
		"DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} twelve\n",
		"\x00\x01\x02",
		"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n# TYPE DCGM_FI_DEV_GPU_UTIL counter\n",
	} {
		if _, _, err := ParseDCGMExporter(strings.NewReader(in), time.Unix(0, 0)); err == nil {
			t.Errorf("parsed %q without error", in)
		}
	}
	ss, _, err := ParseDCGMExporter(strings.NewReader(""), time.Unix(0, 0))
	if err != nil || len(ss) != 0 {
		t.Errorf("empty page: %v %v", ss, err)
	}
}

func TestDCGMExporterSource(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status != http.StatusOK {
			http.Error(w, "down", status)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(page))
	}))
	defer srv.Close()
	d := NewDCGMExporter(srv.URL+"/metrics", nil)
	ss, err := d.Read(context.Background())
	if err != nil || len(ss) != 4 {
		t.Fatalf("read: %d samples, %v", len(ss), err)
	}
	status = http.StatusServiceUnavailable
	if _, err := d.Read(context.Background()); err == nil {
		t.Error("a 503 page read as good")
	}
	srv.Close()
	if _, err := d.Read(context.Background()); err == nil {
		t.Error("a dead dcgm-exporter read as good")
	}
}

func FuzzParseDCGMExporter(f *testing.F) {
	f.Add([]byte(page))
	files, _ := filepath.Glob(filepath.Join(realData, "*.txt"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-1\",GPU_I_ID=\"-3\",gpu=\"99999999999\"} NaN\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ss, _, err := ParseDCGMExporter(bytes.NewReader(b), time.Unix(0, 0))
		if err != nil {
			return
		}
		seen := map[[2]any]bool{}
		for _, s := range ss {
			if s.UUID == "" {
				t.Fatalf("sample without UUID: %+v", s)
			}
			for _, v := range []float64{s.Util, s.SMActive, s.TensorActive} {
				if !math.IsNaN(v) && (v < 0 || v > 1) {
					t.Fatalf("ratio out of range: %+v", s)
				}
			}
			k := [2]any{s.UUID, s.GI}
			if seen[k] {
				t.Fatalf("duplicate sample %+v", s)
			}
			seen[k] = true
		}
	})
}
