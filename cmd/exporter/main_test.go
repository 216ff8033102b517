package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// doc reads a file of docs/.
func doc(t *testing.T, name string) string {
	b, err := os.ReadFile("../../docs/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrapeUntil scrapes url until every name in want has a series.
func scrapeUntil(t *testing.T, url string, want []string) map[string]*dto.MetricFamily {
	deadline := time.Now().Add(60 * time.Second)
	for {
		fams, err := scrape(url)
		missing := []string{}
		for _, w := range want {
			if fams[w] == nil {
				missing = append(missing, w)
			}
		}
		if err == nil && len(missing) == 0 {
			return fams
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: scrape error %v; missing %v", err, missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	fams := map[string]*dto.MetricFamily{}
	p := expfmt.NewTextParser(model.UTF8Validation)
	got, err := p.TextToMetricFamilies(resp.Body)
	for k, v := range got {
		fams[k] = v
	}
	return fams, err
}

var tableMetric = regexp.MustCompile("(?m)^\\| `(zonewatch_[a-z_]+)`")

// TestSimulatedExporter runs the whole exporter on the simulated cluster
// (what `make run` does) and checks that every exported metric is in the
// metric table of docs/metrics.md and every metric there is exported (but
// the per-node view's, which a run without --node-name does not have).
func TestSimulatedExporter(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulated exporter")
	}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		// In-process: --bpf.confine would start this test binary again as
		// its child (the e2e tests run the binary confined).
		done <- run(ctx, []string{"--simulate", "--no-bpf.confine", "--web.listen-address=" + addr, "--probe.listen-address=127.0.0.1:0", "--log.level=warn"})
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("exit code %d after SIGTERM-like shutdown", code)
			}
		case <-time.After(15 * time.Second):
			t.Error("exporter did not shut down within 15s")
		}
	}()

	documented := map[string]bool{}
	for _, m := range tableMetric.FindAllStringSubmatch(doc(t, "metrics.md"), -1) {
		documented[m[1]] = true
	}
	// The ipcache reader, the remote jobs' feeds and the lean node view
	// run in the per-node view only (--node-name set), which this run is
	// not: their families are documented but not served here
	// (TestMetricsDocMatchesCode checks them against the code).
	perNodeOnly := map[string]bool{}
	for name, d := range declaredMetrics(t) {
		if d.pkg == "collector/ipcache" || strings.HasPrefix(name, "zonewatch_kube_remote_job") || strings.HasPrefix(name, "zonewatch_kube_node_") {
			perNodeOnly[name] = true
		}
	}
	var want []string
	for name := range documented {
		if !perNodeOnly[name] {
			want = append(want, name)
		}
	}
	sort.Strings(want)
	// Every documented family, so the golden below does not depend on
	// how far the simulation has got.
	fams := scrapeUntil(t, "http://"+addr+"/metrics", want)
	for name := range fams {
		if strings.HasPrefix(name, "zonewatch_") && !documented[name] {
			t.Errorf("%s is exported but not in the metric table of docs/metrics.md", name)
		}
	}
	for _, name := range want {
		if fams[name] == nil {
			t.Errorf("%s is in the metric table of docs/metrics.md but the simulated exporter does not export it", name)
		}
	}
	checkExposition(t, "http://"+addr+"/metrics", fams)

	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %s", path, resp.Status)
		}
	}
}
