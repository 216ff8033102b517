package collector_test

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/zonewatch/zonewatch/collector"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

var update = flag.Bool("update", false, "rewrite golden files")

type up bool

func (u up) Up() bool { return bool(u) }

// simIndex fills an index from the built-in scenario through the same
// conversion the informers use.
func simIndex() *topology.Index {
	s := sim.Default()
	x := topology.NewIndex()
	nodes, pods := s.KubeObjects()
	for _, n := range nodes {
		x.UpsertNode(kube.NodeFrom(n))
	}
	for _, p := range pods {
		x.UpsertPod(0, kube.PodFrom(topology.DefaultRules(), p))
	}
	return x
}

func render(t testing.TB, reg prometheus.Gatherer) []byte {
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.Bytes()
}

var durationLine = regexp.MustCompile(`(?m)^(zonewatch_scrape_collector_duration_seconds\{[^}]*\}) .*$`)

// TestPlacementGolden compares /metrics for the simulated cluster, seen from
// node gpu-a1 and from everywhere, with golden files, and has promtool lint
// the exposition.
func TestPlacementGolden(t *testing.T) {
	index := simIndex()
	for _, node := range []string{"gpu-a1", ""} {
		name := node
		if name == "" {
			name = "all-nodes"
		}
		t.Run(name, func(t *testing.T) {
			exp := collector.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
			exp.Add("placement", collector.NewPlacement(index, node))
			exp.AddSource("kubernetes", up(true))
			exp.AddSource("hubble", up(false))
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(exp)
			got := durationLine.ReplaceAll(render(t, reg), []byte("$1 0"))
			golden := filepath.Join("testdata", "placement-"+name+".golden")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./collector -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("/metrics differs from %s (run go test ./collector -update and review the diff):\n%s", golden, got)
			}
			promtoolCheckMetrics(t, got)
		})
	}
}

func promtoolCheckMetrics(t *testing.T, exposition []byte) {
	t.Helper()
	bin := testenv.ToolsBin(t, "promtool")
	cmd := exec.Command(filepath.Join(bin, "promtool"), "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// bigIndex is a cluster of jobs x podsPerJob pods on a node per 4 pods, so
// a node holds 4 pods (of 4 jobs) whatever the cluster size.
func bigIndex(jobs, podsPerJob int) *topology.Index {
	x := topology.NewIndex()
	nodes := jobs * podsPerJob / 4
	for i := 0; i < nodes; i++ {
		x.UpsertNode(topology.Node{Name: fmt.Sprintf("node-%05d", i), Zone: fmt.Sprintf("zone-%d", i%4)})
	}
	for j := 0; j < jobs; j++ {
		for k := 0; k < podsPerJob; k++ {
			n := (j*podsPerJob + k*7) % nodes
			x.UpsertPod(0, topology.Pod{
				Namespace: fmt.Sprintf("team-%d", j%50), Name: fmt.Sprintf("job-%d-%d", j, k), Node: fmt.Sprintf("node-%05d", n),
				IPs:      []netip.Addr{netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), byte(2 + k)})},
				Identity: topology.Identity{Kind: "PyTorchJob", Name: fmt.Sprintf("job-%d", j), Role: topology.RoleWorker},
			})
		}
	}
	return x
}

// BenchmarkMetricsRender renders /metrics (the placement collector in the
// root collector, through promhttp): the whole cluster at 2,000 jobs of 10
// pods (one replica with Relay; warm: the rendered series are reused, cold:
// a new collector renders every job), and one node's view (DaemonSet) at
// 200 and 2,000 jobs, which must cost the same; -gatherer serves the
// placement series beside the registry (Gatherer), as cmd/exporter does.
func BenchmarkMetricsRender(b *testing.B) {
	small, large := bigIndex(200, 10), bigIndex(2000, 10)
	for _, c := range []struct {
		name  string
		index *topology.Index
		node  string
		cold  bool
	}{
		{"all-2000-jobs", large, "", false},
		{"all-2000-jobs-cold", large, "", true},
		{"one-node-200-jobs", small, "node-00007", false},
		{"one-node-2000-jobs", large, "node-00007", false},
		{"one-node-2000-jobs-cold", large, "node-00007", true},
		{"all-2000-jobs-gatherer", large, "", false},
		{"one-node-200-jobs-gatherer", small, "node-00007", false},
		{"one-node-2000-jobs-gatherer", large, "node-00007", false},
	} {
		b.Run(c.name, func(b *testing.B) {
			exp := collector.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
			gatherer := strings.HasSuffix(c.name, "-gatherer")
			p := collector.NewPlacement(c.index, c.node)
			if !gatherer {
				exp.Add("placement", p)
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(exp)
			h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
			if gatherer { // as cmd/exporter serves it
				h = promhttp.HandlerFor(collector.Gatherer(reg, p), promhttp.HandlerOpts{})
			}
			req := httptest.NewRequest("GET", "/metrics", nil)
			h.ServeHTTP(httptest.NewRecorder(), req) // warm: the series are rendered
			b.ReportAllocs()
			b.ResetTimer()
			var size int
			for i := 0; i < b.N; i++ {
				if c.cold {
					exp.Add("placement", collector.NewPlacement(c.index, c.node))
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				size = rec.Body.Len()
			}
			b.ReportMetric(float64(size), "bytes/scrape")
		})
	}
}

// TestShardPlacement: two Relay shards export, between them, each pod
// series once and each job's series from every shard that holds one of
// its pods, as the DaemonSet exporters do per node.
func TestShardPlacement(t *testing.T) {
	index := simIndex()
	count := map[string]int{}
	for i := range 2 {
		owns := func(node string) bool { return int(node[len(node)-1])%2 == i } // gpu-a1, gpu-b2, ...
		exp := collector.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
		exp.Add("placement", collector.NewShardPlacement(index, owns))
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(exp)
		for _, line := range bytes.Split(render(t, reg), []byte("\n")) {
			if bytes.HasPrefix(line, []byte("zonewatch_job_")) {
				count[string(line)]++
			}
		}
	}
	whole := map[string]int{}
	exp := collector.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	exp.Add("placement", collector.NewPlacement(index, ""))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(exp)
	for _, line := range bytes.Split(render(t, reg), []byte("\n")) {
		if bytes.HasPrefix(line, []byte("zonewatch_job_")) {
			whole[string(line)]++
		}
	}
	for line := range whole {
		n := count[line]
		if bytes.HasPrefix([]byte(line), []byte("zonewatch_job_pod_info")) && n != 1 || n < 1 {
			t.Errorf("%d shards export %s", n, line)
		}
	}
	if len(count) != len(whole) {
		t.Errorf("shards export %d distinct series, the whole cluster %d", len(count), len(whole))
	}
}

// TestPlacementCacheHeap reports (with -v) the heap of the rendered series
// a Relay replica keeps for 2,000 jobs of 10 pods. Measured, not asserted.
func TestPlacementCacheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("heap measurement")
	}
	index := bigIndex(2000, 10)
	index.Placements("")
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	base := heap()
	p := collector.NewPlacement(index, "")
	ch := make(chan prometheus.Metric, 30000)
	if err := p.Update(ch); err != nil {
		t.Fatal(err)
	}
	t.Logf("rendered series: %d, %.1f MiB", len(ch), float64(heap()-base)/(1<<20))
	close(ch)
	for range ch {
	}
	runtime.KeepAlive(p)
}

// TestGathererSamePage: the placement series served by Gatherer (beside
// the registry) make the same /metrics page as through the registry,
// placement's duration and success included, and promtool accepts it.
func TestGathererSamePage(t *testing.T) {
	for _, c := range []struct {
		name  string
		index *topology.Index
		node  string
	}{{"sim-all", simIndex(), ""}, {"sim-gpu-a1", simIndex(), "gpu-a1"}, {"200-jobs", bigIndex(200, 10), ""}} {
		t.Run(c.name, func(t *testing.T) {
			page := func(viaGatherer bool) []byte {
				exp := collector.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
				exp.AddSource("kubernetes", up(true))
				p := collector.NewPlacement(c.index, c.node)
				reg := prometheus.NewPedanticRegistry()
				reg.MustRegister(exp)
				var g prometheus.Gatherer = reg
				if viaGatherer {
					g = collector.Gatherer(reg, p)
				} else {
					exp.Add("placement", p)
				}
				return durationLine.ReplaceAll(render(t, g), []byte("$1 0"))
			}
			want, got := page(false), page(true)
			if !bytes.Equal(got, want) {
				t.Fatalf("Gatherer page differs:\n%s\nregistry page:\n%s", got, want)
			}
			if c.name == "sim-all" {
				promtoolCheckMetrics(t, got)
			}
		})
	}
	// Registered twice, the families are refused, not doubled.
	exp := collector.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	p := collector.NewPlacement(simIndex(), "")
	exp.Add("placement", p)
	reg := prometheus.NewRegistry()
	reg.MustRegister(exp)
	if _, err := collector.Gatherer(reg, p).Gather(); err == nil {
		t.Error("a placement collector gathered twice is not an error")
	}
}

// TestMultiZoneInfo: a job whose pods carry zonewatch.io/multi-zone (as a
// label, or as an annotation) has zonewatch_job_multi_zone_info with its
// value, through the registry and through Gatherer alike; other jobs have
// none.
func TestMultiZoneInfo(t *testing.T) {
	s := sim.Default()
	x := topology.NewIndex()
	nodes, pods := s.KubeObjects()
	for _, n := range nodes {
		x.UpsertNode(kube.NodeFrom(n))
	}
	marked := map[string]string{} // job -> value
	for _, p := range pods {
		id := kube.PodFrom(topology.DefaultRules(), p).Identity
		v, seen := marked[id.Name]
		if id.Name != "" && !seen && len(marked) < 2 {
			v, seen = "reviewed", true
			if len(marked) == 0 {
				v = topology.MultiZoneIntentional
			}
			marked[id.Name] = v
		}
		if seen {
			p = p.DeepCopy()
			if v == topology.MultiZoneIntentional {
				p.Labels[topology.LabelMultiZone] = v
			} else {
				if p.Annotations == nil {
					p.Annotations = map[string]string{}
				}
				p.Annotations[topology.LabelMultiZone] = v
			}
		}
		x.UpsertPod(0, kube.PodFrom(topology.DefaultRules(), p))
	}
	if len(marked) != 2 {
		t.Fatalf("marked %v, want two jobs", marked)
	}
	page := func(viaGatherer bool) []byte {
		exp := collector.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
		p := collector.NewPlacement(x, "")
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(exp)
		var g prometheus.Gatherer = reg
		if viaGatherer {
			g = collector.Gatherer(reg, p)
		} else {
			exp.Add("placement", p)
		}
		return durationLine.ReplaceAll(render(t, g), []byte("$1 0"))
	}
	want, got := page(false), page(true)
	if !bytes.Equal(got, want) {
		t.Fatalf("Gatherer page differs:\n%s\nregistry page:\n%s", got, want)
	}
	var lines []string
	for _, l := range strings.Split(string(got), "\n") {
		if strings.HasPrefix(l, "zonewatch_job_multi_zone_info{") {
			lines = append(lines, l)
		}
	}
	if len(lines) != len(marked) {
		t.Fatalf("%d multi-zone series, want %d:\n%s", len(lines), len(marked), strings.Join(lines, "\n"))
	}
	for job, v := range marked {
		if !slices.ContainsFunc(lines, func(l string) bool {
			return strings.Contains(l, `job_name="`+job+`",multi_zone="`+v+`"`) && strings.HasSuffix(l, " 1")
		}) {
			t.Errorf("no series for %s with multi_zone=%q:\n%s", job, v, strings.Join(lines, "\n"))
		}
	}
	promtoolCheckMetrics(t, got)
}
