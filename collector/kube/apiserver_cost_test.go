package kube_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// traffic counts what the exporter asks of and receives from the
// apiserver, per resource: requests, watches opened and the bytes of the
// response bodies it reads (after any gzip: what it decodes).
type traffic struct {
	mu      sync.Mutex
	lists   map[string]int
	watches map[string]int
	bytes   map[string]*atomic.Int64
}

func (tr *traffic) resource(r *http.Request) string {
	p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	return p[len(p)-1]
}

func (tr *traffic) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		res := tr.resource(r)
		tr.mu.Lock()
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
			tr.watches[res]++
		} else {
			tr.lists[res]++
		}
		n := tr.bytes[res]
		if n == nil {
			n = &atomic.Int64{}
			tr.bytes[res] = n
		}
		tr.mu.Unlock()
		resp, err := rt.RoundTrip(r)
		if err == nil {
			resp.Body = &countingBody{resp.Body, n}
		}
		return resp, err
	})
}

func (tr *traffic) total(res string) int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if n := tr.bytes[res]; n != nil {
		return n.Load()
	}
	return 0
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestAPIServerCost measures what one exporter costs the apiserver on the
// real kube-apiserver: 1,000 nodes and 5,000 job pods (500 PyTorchJobs of
// 10), besides 2,000 pods of no job; the watches it opens, the bytes of its
// first sync, and the bytes it receives under churn (pod status updates,
// pods replaced, node status updates). Measured, not asserted: opt in with
// ZONEWATCH_APISERVER_COST=1 (about a minute on 2 cores); the figures are
// in docs/performance.md.
func TestAPIServerCost(t *testing.T) {
	if os.Getenv("ZONEWATCH_APISERVER_COST") == "" {
		t.Skip("set ZONEWATCH_APISERVER_COST=1 to measure the apiserver cost at 1,000 nodes and 5,000 job pods")
	}
	const nodes, jobs, perJob, others = 1000, 500, 10, 2000
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	fast := rest.CopyConfig(api.Config)
	fast.QPS, fast.Burst = 5000, 10000
	fast.ContentType = "application/vnd.kubernetes.protobuf"
	writer := kubernetes.NewForConfigOrDie(fast)
	if _, err := writer.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	parallel := func(n int, fn func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		var failed atomic.Value
		work := make(chan int)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					if err := fn(i); err != nil {
						failed.Store(err)
					}
				}
			}()
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	parallel(nodes, func(i int) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%04d", i), Labels: map[string]string{
			kube.LabelZone: fmt.Sprintf("zone-%d", i%3), kube.LabelRegion: "r1", "kubernetes.io/hostname": fmt.Sprintf("node-%04d", i),
			"node.kubernetes.io/instance-type": "p5.48xlarge"}},
			Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)}}
		_, err := writer.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		return err
	})
	pod := func(i int, job bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: fmt.Sprintf("other-%d", i), Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%04d", i%nodes), Containers: []corev1.Container{{Name: "c", Image: "nvcr.io/nvidia/pytorch:24.05-py3",
				Env: []corev1.EnvVar{{Name: "NCCL_DEBUG", Value: "INFO"}}}}}}
		if job {
			j, k := i/perJob, i%perJob
			p.Name = fmt.Sprintf("job-%d-worker-%d", j, k)
			p.Labels = map[string]string{"training.kubeflow.org/job-name": fmt.Sprintf("job-%d", j), "training.kubeflow.org/replica-type": "worker",
				"training.kubeflow.org/replica-index": fmt.Sprint(k), "training.kubeflow.org/operator-name": "pytorchjob-controller"}
		}
		return p
	}
	running := func(p *corev1.Pod, i int) error {
		ip := fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256)
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		_, err := writer.CoreV1().Pods("ml").UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	}
	create := func(i int, job bool) error {
		created, err := writer.CoreV1().Pods("ml").Create(ctx, pod(i, job), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		return running(created, i)
	}
	parallel(jobs*perJob, func(i int) error { return create(i, true) })
	parallel(others, func(i int) error { return create(jobs*perJob+i, false) })
	t.Logf("created %d nodes, %d job pods, %d other pods in %v", nodes, jobs*perJob, others, time.Since(start).Round(time.Second))

	tr := &traffic{lists: map[string]int{}, watches: map[string]int{}, bytes: map[string]*atomic.Int64{}}
	cfg := rest.CopyConfig(api.Config)
	cfg.WrapTransport = tr.wrap
	meta := metadata.NewForConfigOrDie(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf" // as cmd/exporter/kube.go
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client := kubernetes.NewForConfigOrDie(cfg)
	index := topology.NewIndex()
	l, factories, err := kube.NewLive(client, index, topology.DefaultRules(), 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	l.WithOwners(meta, client.Discovery())
	syncStart := time.Now()
	if err := l.Run(ctx, factories); err != nil {
		t.Fatal(err)
	}
	n, p, j := index.Counts()
	if n != nodes || p != jobs*perJob || j != jobs {
		t.Fatalf("index holds %d nodes, %d job pods, %d jobs", n, p, j)
	}
	tr.mu.Lock()
	t.Logf("sync in %v: lists %v, watches opened %v", time.Since(syncStart).Round(time.Millisecond), tr.lists, tr.watches)
	tr.mu.Unlock()
	syncNodes, syncPods := tr.total("nodes"), tr.total("pods")
	t.Logf("sync bytes: nodes %d (%d per node), pods %d (%d per job pod)", syncNodes, syncNodes/nodes, syncPods, syncPods/int64(jobs*perJob))

	// Churn: every job pod's status changes once (a kubelet condition
	// update), 500 job pods are replaced (delete, create, running), every
	// node's status changes once (a heartbeat-like condition update), and
	// every other pod's status changes once (not watched: no bytes).
	settle := func() { time.Sleep(2 * time.Second) }
	b0 := tr.total("pods")
	parallel(jobs*perJob, func(i int) error {
		p, err := writer.CoreV1().Pods("ml").Get(ctx, pod(i, true).Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue})
		_, err = writer.CoreV1().Pods("ml").UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	settle()
	statusBytes := tr.total("pods") - b0
	b0 = tr.total("pods")
	parallel(others, func(i int) error {
		p, err := writer.CoreV1().Pods("ml").Get(ctx, pod(jobs*perJob+i, false).Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue})
		_, err = writer.CoreV1().Pods("ml").UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	settle()
	otherBytes := tr.total("pods") - b0
	b0 = tr.total("pods")
	const replaced = 500
	parallel(replaced, func(i int) error {
		return writer.CoreV1().Pods("ml").Delete(ctx, pod(i, true).Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	parallel(replaced, func(i int) error { return create(i, true) })
	settle()
	replaceBytes := tr.total("pods") - b0
	n0 := tr.total("nodes")
	parallel(nodes, func(i int) error {
		nd, err := writer.CoreV1().Nodes().Get(ctx, fmt.Sprintf("node-%04d", i), metav1.GetOptions{})
		if err != nil {
			return err
		}
		nd.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		_, err = writer.CoreV1().Nodes().UpdateStatus(ctx, nd, metav1.UpdateOptions{})
		return err
	})
	settle()
	nodeBytes := tr.total("nodes") - n0
	t.Logf("churn bytes: job pod status updates %d (%d per update), other pods' updates %d, job pods replaced %d (%d per replacement), node status updates %d (%d per update)",
		statusBytes, statusBytes/int64(jobs*perJob), otherBytes, replaceBytes, replaceBytes/replaced, nodeBytes, nodeBytes/nodes)
	tr.mu.Lock()
	t.Logf("watches opened in all: %v", tr.watches)
	tr.mu.Unlock()

	// The exporter process itself on this cluster, Relay mode (every
	// node's jobs) and DaemonSet mode (one node's), from its own
	// process_* and go_* metrics and /proc after sync and 20 scrapes; each
	// mode as the chart runs it and with the variants of
	// ZONEWATCH_APISERVER_COST_ENV ("GOMEMLIMIT=40MiB;GOGC=50,GOMEMLIMIT=40MiB":
	// variants split by ';', settings by ','), and other builds of the
	// exporter to compare with ZONEWATCH_APISERVER_COST_BINS
	// ("name=/path;...").
	bin := filepath.Join(t.TempDir(), "zonewatch-exporter")
	build := exec.Command("go", "build", "-o", bin, "./cmd/exporter")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	variants := []string{""}
	if v := os.Getenv("ZONEWATCH_APISERVER_COST_ENV"); v != "" {
		variants = append(variants, strings.Split(v, ";")...)
	}
	bins := [][2]string{{"this tree", bin}}
	for _, nb := range strings.Split(os.Getenv("ZONEWATCH_APISERVER_COST_BINS"), ";") {
		if name, path, ok := strings.Cut(nb, "="); ok {
			bins = append(bins, [2]string{name, path})
		}
	}
	for _, b := range bins {
		if st, err := os.Stat(b[1]); err == nil {
			t.Logf("exporter binary %q: %d bytes", b[0], st.Size())
		}
		for _, node := range []string{"", "node-0007"} {
			for _, env := range variants {
				runExporter(t, api, b[1], b[0], node, env)
			}
		}
	}
}

// runExporter runs the exporter binary on the test's cluster with the
// settings of env ("K=V,K=V") and logs its memory after sync and 20
// scrapes: the resident set and its parts (/proc: anonymous, file-backed
// pages of the binary, the peak), and the Go runtime's own figures from
// its go_* metrics (heap in use, idle and released, the next GC's goal,
// stacks, all the runtime holds).
func runExporter(t *testing.T, api *testenv.APIServer, bin, build, node, env string) {
	t.Helper()
	for _, kv := range strings.Split(env, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			t.Setenv(k, v)
			defer os.Unsetenv(k)
		}
	}
	// A fresh copy of the binary, written 32 KiB at a time as a container
	// runtime extracts an image layer: how many of its pages the process
	// maps depends on how the page cache holds the file (the kernel maps
	// a faulting page's whole folio and cached neighbours; one write of
	// the whole file made 9-10 MiB more of them resident, the linker's
	// output 14-19 MiB less), so every build runs from a copy written the
	// same way.
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(t.TempDir(), "zonewatch-exporter")
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	for len(data) > 0 {
		n, err := out.Write(data[:min(len(data), 32<<10)])
		if err != nil {
			t.Fatal(err)
		}
		data = data[n:]
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := testenv.Start(t, t.TempDir(), "exporter", bin, "--kubeconfig="+api.Kubeconfig, "--node-name="+node,
		"--web.listen-address="+addr, "--no-hubble.enabled", "--gpu.source=none", "--no-conntrack.enabled", "--no-probe.enabled")
	defer func() { _ = cmd.Process.Kill() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("exporter (node %q) not ready", node)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var page []byte
	for range 20 {
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		page, _ = io.ReadAll(res.Body)
		res.Body.Close()
	}
	metric := func(name string) string {
		for _, line := range strings.Split(string(page), "\n") {
			if strings.HasPrefix(line, name+" ") {
				return strings.TrimPrefix(line, name+" ")
			}
		}
		return "?"
	}
	mib := func(name string) string {
		var v float64
		if _, err := fmt.Sscan(metric(name), &v); err != nil {
			return "?"
		}
		return fmt.Sprintf("%.1f", v/(1<<20))
	}
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	// The pages it still uses: clear the referenced bits, scrape for 5 s,
	// count the pages touched again (most of the binary's resident pages
	// were touched once, at start and during the first sync).
	referenced := "?"
	if os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", cmd.Process.Pid), []byte("1"), 0) == nil {
		for range 20 {
			if res, err := http.Get("http://" + addr + "/metrics"); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			time.Sleep(250 * time.Millisecond)
		}
		rollup, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", cmd.Process.Pid))
		for _, line := range strings.Split(string(rollup), "\n") {
			if f, ok := strings.CutPrefix(line, "Referenced:"); ok {
				var kb float64
				fmt.Sscan(f, &kb)
				referenced = fmt.Sprintf("%.1f", kb/1024)
			}
		}
	}
	proc := func(field string) string {
		for _, line := range strings.Split(string(status), "\n") {
			if f, ok := strings.CutPrefix(line, field+":"); ok {
				var kb float64
				fmt.Sscan(f, &kb)
				return fmt.Sprintf("%.1f", kb/1024)
			}
		}
		return "?"
	}
	mode := "Relay (all nodes)"
	if node != "" {
		mode = "DaemonSet (" + node + ")"
	}
	if env == "" {
		env = "chart env"
	}
	t.Logf("exporter (%s) %s, %s: RSS %s MiB (anon %s, file %s, peak %s, referenced in 5 s of scrapes %s); Go heap in use %s, idle %s, released %s, next GC %s, stacks %s, runtime total %s MiB; CPU %s s (sync and 20 scrapes); page %d bytes",
		build, mode, env, proc("VmRSS"), proc("RssAnon"), proc("RssFile"), proc("VmHWM"), referenced,
		mib("go_memstats_heap_inuse_bytes"), mib("go_memstats_heap_idle_bytes"), mib("go_memstats_heap_released_bytes"),
		mib("go_memstats_next_gc_bytes"), mib("go_memstats_stack_inuse_bytes"), mib("go_memstats_sys_bytes"),
		metric("process_cpu_seconds_total"), len(page))
}
