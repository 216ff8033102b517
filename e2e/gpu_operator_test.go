package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/rules"
	"github.com/zonewatch/zonewatch/sim"
)

// TestGPUOperatorDefaults runs the exporter as the chart does on a GPU
// Operator cluster, with no GPU source flags (gpu.source=auto), on one GPU
// node and one CPU node, against the real kube-apiserver, Prometheus and
// Alertmanager. The GPU node's dcgm-exporter cannot be found at first:
// source_up{source="gpu"} is 0 there and ZonewatchGPUSourceDown fires; the
// CPU node exports no GPU source and raises nothing. Then the GPU
// Operator's dcgm-exporter pod appears on the GPU node (its pod IP a
// loopback address serving the page) and the GPU series come, joined with
// their jobs, and the alert resolves.
func TestGPUOperatorDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts etcd, kube-apiserver, Prometheus, Alertmanager and two exporters")
	}
	inLane(t)
	tools := testenv.ToolsBin(t, "etcd", "kube-apiserver", "prometheus", "alertmanager")
	bin := exporterBinary(t)
	dir := t.TempDir()
	api := testenv.StartAPIServer(t)
	client := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	s := sim.Default()
	createObjects(ctx, t, client, s)
	gpuNode, cpuNode := "", ""
	for _, j := range s.Jobs {
		for _, p := range j.Pods {
			if p.Role == "worker" && len(p.GPUs) > 0 && gpuNode == "" {
				gpuNode = p.Node
			}
		}
	}
	for _, n := range s.Nodes {
		if len(n.GPUs) == 0 && cpuNode == "" {
			cpuNode = n.Name
		}
	}
	kubeletSock := filepath.Join(dir, "kubelet.sock")
	kubelet, err := sim.StartPodResources(s, gpuNode, kubeletSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.Close)

	exporterKubeconfig := api.ChartIdentity(t, nil).Kubeconfig
	start := func(node string, extra ...string) exporter {
		addr := exporterAddr(t, node)
		args := append([]string{"--node-name=" + node, "--kubeconfig=" + exporterKubeconfig, "--web.listen-address=" + addr,
			"--no-hubble.enabled", "--no-conntrack.enabled", "--no-probe.enabled", "--gpu.interval=2s"}, extra...)
		testenv.StartAs(t, dir, "exporter-"+node, testenv.ChartSecurityContext(t), bin, args...)
		return exporter{node: node, addr: addr}
	}
	// The kubelet socket is the node's, not a GPU source setting; the CPU
	// node's exporter keeps the default path, where nothing listens.
	gpuExp := start(gpuNode, "--gpu.podresources-socket="+kubeletSock)
	cpuExp := start(cpuNode)
	for _, e := range []exporter{gpuExp, cpuExp} {
		if !waitHTTP(t, "http://"+e.addr+"/readyz", 2*time.Minute) {
			t.FailNow()
		}
	}

	cfg := testRulesConfig()
	hook := newWebhook(t)
	amAddr := startAlertmanager(t, tools, dir, hook.url)
	p := startPrometheus(t, tools, dir, testRuleFile(t, cfg), amAddr, []exporter{gpuExp, cpuExp})

	if !eventually(t, time.Minute, "source_up{source=\"gpu\"} 0 on the GPU node", func() (bool, string) {
		v, err := p.vector(`zonewatch_source_up{source="gpu"}`)
		if err != nil {
			return false, err.Error()
		}
		return len(v) == 1 && string(v[0].Metric["instance"]) == gpuExp.addr && v[0].Value == 0, v.String()
	}) {
		t.FailNow()
	}
	if !eventually(t, 90*time.Second, rules.AlertGPUSourceDown+" firing for the GPU node", func() (bool, string) {
		_, _, ok := hook.find("", alertIs(rules.AlertGPUSourceDown, "firing", "node", gpuNode, "source", "gpu"))
		return ok, fmt.Sprintf("%d notifications", len(hook.all()))
	}) {
		t.FailNow()
	}
	// Logged once, at warn, saying what to change; nothing on the CPU node.
	logOf := func(node string) string {
		b, err := os.ReadFile(filepath.Join(dir, "exporter-"+node+".log"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var warns []string
	for _, line := range strings.Split(logOf(gpuNode), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "feed=gpu") {
			warns = append(warns, line)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "no Running dcgm-exporter pod on node "+gpuNode) || !strings.Contains(warns[0], "--gpu.dcgm-exporter-url") {
		t.Errorf("GPU node's gpu warnings: %q; want one saying what to change", warns)
	}
	if l := logOf(cpuNode); strings.Contains(l, "feed=gpu") || strings.Contains(l, "GPU node") {
		t.Errorf("the CPU node's exporter logs about GPUs:\n%s", l)
	}
	fams, err := scrapeExporter(cpuExp.addr)
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range fams {
		for _, se := range f.series {
			if strings.HasPrefix(name, "zonewatch_gpu_") ||
				name == "zonewatch_source_up" && (se.labels["source"] == "gpu" || se.labels["source"] == "podresources") {
				t.Errorf("the CPU node exports %s %v", name, se.labels)
			}
		}
	}

	// The GPU Operator's dcgm-exporter comes up on the GPU node.
	pageAddr := freeLoopback(t, "127.0.0.200")
	_, portStr, _ := net.SplitHostPort(pageAddr)
	port, _ := strconv.Atoi(portStr)
	stopOld := servePage(t, pageAddr, s, gpuNode)
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu-operator"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createDCGMExporterPod(ctx, t, client, "nvidia-dcgm-exporter-x2k9q", gpuNode, port, "127.0.0.200")
	appeared := time.Now()
	if !eventually(t, time.Minute, "GPU series with job labels from the discovered dcgm-exporter", func() (bool, string) {
		v, err := p.vector(`zonewatch_gpu_graphics_engine_active_ratio{node="` + gpuNode + `",job_name!=""} and on() (zonewatch_source_up{source="gpu",instance="` + gpuExp.addr + `"} == 1)`)
		return err == nil && len(v) > 0, fmt.Sprint(len(v), err)
	}) {
		t.FailNow()
	}
	t.Logf("GPU series in Prometheus %.1fs after the dcgm-exporter pod appeared (--gpu.interval=2s, 1s scrape)", time.Since(appeared).Seconds())
	eventually(t, time.Minute, rules.AlertGPUSourceDown+" resolved", func() (bool, string) {
		_, _, ok := hook.find("", alertIs(rules.AlertGPUSourceDown, "resolved", "node", gpuNode, "source", "gpu"))
		return ok, fmt.Sprintf("%d notifications", len(hook.all()))
	})

	// The DaemonSet replaces the pod: the old one and its address go, the
	// new one has another IP. The exporter follows with no restart.
	if err := client.CoreV1().Pods("gpu-operator").Delete(ctx, "nvidia-dcgm-exporter-x2k9q", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	stopOld()
	newAddr := net.JoinHostPort("127.0.0.201", portStr)
	servePage(t, newAddr, s, gpuNode)
	createDCGMExporterPod(ctx, t, client, "nvidia-dcgm-exporter-7fmw4", gpuNode, port, "127.0.0.201")
	replaced := time.Now()
	readErrs := func() (up, errs float64, n int, err error) {
		fams, err := scrapeExporter(gpuExp.addr)
		if err != nil {
			return 0, 0, 0, err
		}
		return fams["zonewatch_source_up"].sum(map[string]string{"source": "gpu"}),
			fams["zonewatch_gpu_read_errors_total"].sum(map[string]string{"source": "gpu"}),
			len(fams["zonewatch_gpu_graphics_engine_active_ratio"].seriesOrNil()), nil
	}
	eventually(t, time.Minute, "the exporter follows the new dcgm-exporter pod", func() (bool, string) {
		up1, errs1, _, err := readErrs()
		if err != nil {
			return false, err.Error()
		}
		time.Sleep(5 * time.Second) // over two reads (--gpu.interval=2s)
		up2, errs2, n, err := readErrs()
		if err != nil {
			return false, err.Error()
		}
		// No failed read across two reads: the new address answers.
		return up1 == 1 && up2 == 1 && errs1 == errs2 && n > 0, fmt.Sprintf("source_up %v then %v, read errors %v then %v, %d GPU series", up1, up2, errs1, errs2, n)
	})
	t.Logf("following the replaced pod confirmed %.1fs after it appeared (includes a 5s stability window)", time.Since(replaced).Seconds())

	for _, n := range hook.all() {
		for _, a := range n.Alerts {
			if a.Labels["node"] == cpuNode || a.Labels["alertname"] != rules.AlertGPUSourceDown && strings.Contains(a.Labels["alertname"], "GPU") {
				t.Errorf("unexpected alert %v", a.Labels)
			}
		}
	}
}

// servePage serves node's dcgm-exporter page at addr; the returned func
// stops it.
func servePage(t *testing.T, addr string, s *sim.Scenario, node string) func() {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		writeDCGMExporterPage(rw, r, s, node)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	stop := func() { _ = srv.Close() }
	t.Cleanup(stop)
	return stop
}

// createDCGMExporterPod creates a dcgm-exporter pod as the GPU Operator's
// DaemonSet makes it (NVIDIA/gpu-operator v26.7.0
// assets/state-dcgm-exporter/0800_daemonset.yaml: label
// app=nvidia-dcgm-exporter, port "metrics", no hostNetwork), Running at ip.
func createDCGMExporterPod(ctx context.Context, t *testing.T, client kubernetes.Interface, name, node string, port int, ip string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpu-operator", Labels: map[string]string{"app": "nvidia-dcgm-exporter"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "nvidia-dcgm-exporter", Image: "nvcr.io/nvidia/k8s/dcgm-exporter",
			Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: int32(port)}}}}},
	}
	created, err := client.CoreV1().Pods("gpu-operator").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if _, err := client.CoreV1().Pods("gpu-operator").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// freeLoopback returns ip:port with a port free on ip.
func freeLoopback(t *testing.T, ip string) string {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Skipf("%s is not bindable here: %v", ip, err)
	}
	defer l.Close()
	return l.Addr().String()
}

// writeDCGMExporterPage prints node's GPUs as dcgm-exporter 4.x does with
// its Kubernetes mapping on (NVIDIA/dcgm-exporter 4.5.3-4.8.2,
// internal/pkg/rendermetrics/render_metrics.go; default counters: no
// SM_ACTIVE).
func writeDCGMExporterPage(rw http.ResponseWriter, r *http.Request, s *sim.Scenario, node string) {
	samples, err := sim.NewGPUSource(s, node).Read(r.Context())
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	owner := map[string]sim.Pod{}
	for _, p := range s.AllPods() {
		for _, u := range p.GPUs {
			owner[u] = p
		}
	}
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	for _, m := range []struct {
		name  string
		value func(u, tensor float64) string
	}{
		{"DCGM_FI_DEV_GPU_UTIL", func(u, _ float64) string { return strconv.Itoa(int(u*100 + 0.5)) }},
		{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", func(u, _ float64) string { return fmt.Sprintf("%f", u) }},
		{"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", func(_, tc float64) string { return fmt.Sprintf("%f", tc) }},
	} {
		fmt.Fprintf(rw, "# HELP %s\n# TYPE %s gauge\n", m.name, m.name)
		for _, x := range samples {
			p := owner[x.UUID]
			fmt.Fprintf(rw, "%s{gpu=\"%d\",UUID=\"%s\",pci_bus_id=\"00000000:%02X:00.0\",device=\"nvidia%d\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"%s\",container=\"%s\",namespace=\"%s\",pod=\"%s\"} %s\n",
				m.name, x.Index, x.UUID, 0x18+x.Index, x.Index, node, containerOf(p), p.Namespace, p.Name, m.value(x.Util, x.TensorActive))
		}
	}
}

func containerOf(p sim.Pod) string {
	if p.Name == "" {
		return ""
	}
	return "main"
}

func (f *dtoFamily) seriesOrNil() []dtoSeries {
	if f == nil {
		return nil
	}
	return f.series
}
