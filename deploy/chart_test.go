// Package deploy holds the tests of the Helm chart (deploy/helm/zonewatch)
// and of the manifests rendered from it (deploy/manifests).
package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/collector/fence"
	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

const (
	chartDir     = "helm/zonewatch"
	manifestsDir = "manifests"
	release      = "zonewatch"
	namespace    = "monitoring"
	regenerate   = "run `deploy/render.sh` (make generate) and commit deploy/manifests"
)

func helm(t *testing.T) string {
	t.Helper()
	return filepath.Join(testenv.ToolsBin(t, "helm"), "helm")
}

// runHelm runs helm with the values file (YAML, may be empty) and returns stdout.
func runHelm(t *testing.T, values string, args ...string) (string, error) {
	t.Helper()
	if values != "" {
		// Not t.TempDir: helm splits --values at commas, which subtest names have.
		dir, err := os.MkdirTemp("", "zonewatch-values-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		f := filepath.Join(dir, "values.yaml")
		if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", f)
	}
	cmd := exec.Command(helm(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// render is `helm template` of the chart with the values, as objects.
func render(t *testing.T, values string) []*unstructured.Unstructured {
	t.Helper()
	out, err := runHelm(t, values, "template", release, chartDir, "--namespace", namespace)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, strings.NewReader(out))
}

func decode(t *testing.T, r io.Reader) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decoding rendered YAML: %v", err)
		}
		if m == nil {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func typed[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &v, true); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return &v
}

// workload is the exporter's pod spec and the kind that runs it.
func workload(t *testing.T, objs []*unstructured.Unstructured) (string, *corev1.PodSpec) {
	t.Helper()
	ds, deps := ofKind(objs, "DaemonSet"), ofKind(objs, "Deployment")
	switch {
	case len(ds) == 1 && len(deps) == 0:
		return "DaemonSet", &typed[appsv1.DaemonSet](t, ds[0]).Spec.Template.Spec
	case len(deps) == 1 && len(ds) == 0:
		d := typed[appsv1.Deployment](t, deps[0])
		return "Deployment", &d.Spec.Template.Spec
	}
	t.Fatalf("want one DaemonSet or one Deployment, got %d and %d", len(ds), len(deps))
	return "", nil
}

func hostPaths(spec *corev1.PodSpec) []string {
	var out []string
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out = append(out, v.HostPath.Path)
		}
	}
	return out
}

func addedCaps(c *corev1.Container) []string {
	var out []string
	if c.SecurityContext != nil && c.SecurityContext.Capabilities != nil {
		for _, cp := range c.SecurityContext.Capabilities.Add {
			out = append(out, string(cp))
		}
	}
	return out
}

// variant is one set of values and what must hold for it.
type variant struct {
	name   string
	values string
	check  func(t *testing.T, objs []*unstructured.Unstructured, kind string, spec *corev1.PodSpec)
}

var variants = []variant{
	{"default", "", func(t *testing.T, objs []*unstructured.Unstructured, kind string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantKind(t, kind, "DaemonSet")
		wantArgs(t, c, "--hubble.enabled", "--hubble.address=unix:///var/run/cilium/hubble.sock",
			"--gpu.source=auto", "--gpu.podresources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
			"--conntrack.enabled", "--conntrack.bpffs-path=/sys/fs/bpf/tc/globals",
			"--ipcache.bpffs-path=/sys/fs/bpf/tc/globals", "--ipcache.refresh-interval=10s")
		noArgPrefix(t, c, "--kube.pod-view")
		noArgPrefix(t, c, "--no-bpf.confine")
		wantHostPaths(t, spec, "/var/run/cilium", "/var/lib/kubelet/pod-resources", "/sys/fs/bpf")
		wantCaps(t, c, "BPF")
		wantUser(t, spec, 0)
		for _, m := range c.VolumeMounts {
			if m.Name == "bpffs" && (m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer) {
				t.Errorf("bpffs mount propagation %v, want HostToContainer", m.MountPropagation)
			}
		}
		env := map[string]*corev1.EnvVar{}
		for i := range c.Env {
			env[c.Env[i].Name] = &c.Env[i]
		}
		if e := env["NODE_NAME"]; e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
			t.Errorf("NODE_NAME not from the downward API spec.nodeName: %+v", e)
		}
		if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists || spec.Tolerations[0].Key != "" {
			t.Errorf("tolerations %+v, want one operator: Exists", spec.Tolerations)
		}
		if spec.NodeSelector["kubernetes.io/os"] != "linux" {
			t.Errorf("nodeSelector %v, want kubernetes.io/os: linux", spec.NodeSelector)
		}
		if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
			t.Errorf("liveness probe %+v, want GET /healthz", c.LivenessProbe)
		}
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("readiness probe %+v, want GET /readyz", c.ReadinessProbe)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
		}
		ds := typed[appsv1.DaemonSet](t, ofKind(objs, "DaemonSet")[0])
		if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
			t.Errorf("update strategy %q, want RollingUpdate", ds.Spec.UpdateStrategy.Type)
		}
		wantKinds(t, objs, map[string]int{"ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "DaemonSet": 1,
			"PodMonitor": 1, "PrometheusRule": 1, "ConfigMap": 3})
		for _, cm := range ofKind(objs, "ConfigMap") {
			if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetAnnotations()["grafana_folder"] == "" {
				t.Errorf("ConfigMap %s: labels %v annotations %v, want grafana_dashboard: \"1\" and grafana_folder", cm.GetName(), cm.GetLabels(), cm.GetAnnotations())
			}
		}
		pm := ofKind(objs, "PodMonitor")[0]
		eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		wantEndpoint(t, eps, "zonewatch")
	}},
	{"hubble off", "hubble: {enabled: false}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantArgs(t, c, "--no-hubble.enabled")
		noArgPrefix(t, c, "--hubble.address")
		wantHostPaths(t, spec, "/var/lib/kubelet/pod-resources", "/sys/fs/bpf")
		wantCaps(t, c, "BPF")
	}},
	{"gpu none", "gpu: {source: none}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantArgs(t, c, "--gpu.source=none")
		noArgPrefix(t, c, "--gpu.podresources-socket")
		wantHostPaths(t, spec, "/var/run/cilium", "/sys/fs/bpf")
	}},
	{"gpu dcgm-exporter without PodResources", "gpu: {source: dcgm-exporter, podResources: {enabled: false}}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantArgs(t, c, "--gpu.source=dcgm-exporter", "--gpu.podresources-socket=")
		noArgPrefix(t, c, "--gpu.dcgm-exporter-url")
		wantHostPaths(t, spec, "/var/run/cilium", "/sys/fs/bpf")
	}},
	{"gpu dcgm-exporter on the host network, other labels", "gpu: {dcgmExporterURL: 'http://$(HOST_IP):9400/metrics', dcgmExporterSelectors: [app=my-dcgm-exporter]}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantArgs(t, c, "--gpu.source=auto", "--gpu.dcgm-exporter-url=http://$(HOST_IP):9400/metrics", "--gpu.dcgm-exporter-selector=app=my-dcgm-exporter")
	}},
	// The ipcache keeps its mount and capability without conntrack (issue 44).
	{"conntrack off", "conntrack: {enabled: false}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantArgs(t, c, "--no-conntrack.enabled", "--ipcache.bpffs-path=/sys/fs/bpf/tc/globals")
		noArgPrefix(t, c, "--kube.pod-view")
		wantHostPaths(t, spec, "/var/run/cilium", "/var/lib/kubelet/pod-resources", "/sys/fs/bpf")
		wantCaps(t, c, "BPF")
		wantUser(t, spec, 0)
	}},
	{"ipcache off", "ipcache: {enabled: false}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantArgs(t, c, "--conntrack.enabled", "--kube.pod-view=cluster")
		noArgPrefix(t, c, "--ipcache.")
		wantHostPaths(t, spec, "/var/run/cilium", "/var/lib/kubelet/pod-resources", "/sys/fs/bpf")
		wantCaps(t, c, "BPF")
	}},
	{"conntrack and ipcache off", "conntrack: {enabled: false}\nipcache: {enabled: false}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantArgs(t, c, "--no-conntrack.enabled", "--kube.pod-view=cluster")
		wantHostPaths(t, spec, "/var/run/cilium", "/var/lib/kubelet/pod-resources")
		wantCaps(t, c)
		wantUser(t, spec, 0) // PodResources and the Hubble socket are root's
	}},
	{"confinement off", "bpfConfine: false", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		wantArgs(t, &spec.Containers[0], "--no-bpf.confine")
	}},
	{"conntrack on an old kernel", "conntrack: {sysAdmin: true}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		wantCaps(t, &spec.Containers[0], "BPF", "SYS_ADMIN")
	}},
	{"hubble socket group, nothing else", "hubble: {socketGroup: 1500}\ngpu: {source: none}\nconntrack: {enabled: false}\nipcache: {enabled: false}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		wantHostPaths(t, spec, "/var/run/cilium")
		wantCaps(t, &spec.Containers[0])
		wantUser(t, spec, 65534)
		if sc := spec.SecurityContext; !slices.Equal(sc.SupplementalGroups, []int64{1500}) {
			t.Errorf("supplementalGroups %v, want [1500]", sc.SupplementalGroups)
		}
	}},
	{"every source off", "hubble: {enabled: false}\ngpu: {source: none}\nconntrack: {enabled: false}\nipcache: {enabled: false}", func(t *testing.T, _ []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		wantHostPaths(t, spec)
		wantCaps(t, &spec.Containers[0])
		wantUser(t, spec, 65534)
		wantArgs(t, &spec.Containers[0], "--no-hubble.enabled", "--gpu.source=none", "--no-conntrack.enabled")
	}},
	{"hubble over TLS to the node's own server", "hubble: {access: tls, nodeTLS: {existingSecret: zonewatch-hubble-client}}\ngpu: {source: none}\nconntrack: {enabled: false}\nipcache: {enabled: false}", func(t *testing.T, _ []*unstructured.Unstructured, kind string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantKind(t, kind, "DaemonSet")
		wantArgs(t, c, "--hubble.enabled", "--hubble.address=$(HOST_IP):4244", "--hubble.tls",
			"--hubble.tls.ca-file=/etc/zonewatch/hubble-tls/ca.crt", "--hubble.tls.cert-file=/etc/zonewatch/hubble-tls/tls.crt",
			"--hubble.tls.key-file=/etc/zonewatch/hubble-tls/tls.key", "--hubble.tls.server-name=$(NODE_NAME).default.hubble-grpc.cilium.io")
		// Nothing of the agent's is mounted: no host path at all here.
		wantHostPaths(t, spec)
		wantUser(t, spec, 65534)
		var secret bool
		for _, v := range spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName == "zonewatch-hubble-client" && v.Name == "hubble-tls" {
				secret = true
			}
		}
		if !secret {
			t.Errorf("no hubble-tls volume of the Secret zonewatch-hubble-client: %+v", spec.Volumes)
		}
	}},
	{"hubble relay", "hubble: {relay: {enabled: true, address: 'hubble-relay.kube-system.svc:443', tls: {enabled: true, existingSecret: hubble-relay-ca, clientCert: true, serverName: '*.hubble-relay.cilium.io'}}}",
		func(t *testing.T, objs []*unstructured.Unstructured, kind string, spec *corev1.PodSpec) {
			c := &spec.Containers[0]
			wantKind(t, kind, "Deployment")
			d := typed[appsv1.Deployment](t, ofKind(objs, "Deployment")[0])
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("Relay Deployment: replicas %v strategy %q, want 1 and Recreate (never two at once)", d.Spec.Replicas, d.Spec.Strategy.Type)
			}
			wantArgs(t, c, "--node-name=", "--hubble.address=hubble-relay.kube-system.svc:443", "--hubble.tls",
				"--hubble.tls.ca-file=/etc/zonewatch/hubble-tls/ca.crt", "--hubble.tls.cert-file=/etc/zonewatch/hubble-tls/tls.crt", "--hubble.tls.server-name=*.hubble-relay.cilium.io",
				"--gpu.source=none", "--no-conntrack.enabled")
			for _, e := range c.Env {
				if e.Name == "NODE_NAME" {
					t.Error("Relay mode sets NODE_NAME: the exporter would export one node only")
				}
			}
			wantHostPaths(t, spec)
			wantCaps(t, c)
			wantUser(t, spec, 65534)
			if len(spec.Tolerations) != 0 {
				t.Errorf("Relay-mode tolerations %+v, want none: the pod must leave a node that is gone", spec.Tolerations)
			}
		}},
	{"service monitor", "podMonitor: {enabled: false}\nserviceMonitor: {enabled: true, labels: {release: kps}}", func(t *testing.T, objs []*unstructured.Unstructured, _ string, _ *corev1.PodSpec) {
		wantKinds(t, objs, map[string]int{"PodMonitor": 0, "ServiceMonitor": 1, "Service": 1})
		sm := ofKind(objs, "ServiceMonitor")[0]
		if sm.GetLabels()["release"] != "kps" {
			t.Errorf("ServiceMonitor labels %v lack release: kps", sm.GetLabels())
		}
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		wantEndpoint(t, eps, "zonewatch")
		svc := typed[corev1.Service](t, ofKind(objs, "Service")[0])
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("Service clusterIP %q, want None (headless)", svc.Spec.ClusterIP)
		}
	}},
	{"pod monitor labels and job", "podMonitor: {labels: {release: kps}}\nscrape: {job: zw}\nrules: {selector: 'job=\"zw\"'}", func(t *testing.T, objs []*unstructured.Unstructured, _ string, _ *corev1.PodSpec) {
		pm := ofKind(objs, "PodMonitor")[0]
		if pm.GetLabels()["release"] != "kps" {
			t.Errorf("PodMonitor labels %v lack release: kps", pm.GetLabels())
		}
		eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		wantEndpoint(t, eps, "zw")
	}},
	{"web config with TLS and basic auth", `webConfig:
  tls: true
  basicAuth: true
  config:
    tls_server_config: {cert_file: /etc/zonewatch/tls/tls.crt, key_file: /etc/zonewatch/tls/tls.key}
    basic_auth_users: {prometheus: "$2y$10$abcdefghijklmnopqrstuuJ3F7o0kq3RZ0ZxYQw7e0xg6m1x8r1a"}
extraVolumes: [{name: tls, secret: {secretName: zonewatch-tls}}]
extraVolumeMounts: [{name: tls, mountPath: /etc/zonewatch/tls, readOnly: true}]
scrape:
  tlsConfig: {insecureSkipVerify: true}
  basicAuth: {username: {name: zonewatch-scrape, key: username}, password: {name: zonewatch-scrape, key: password}}
`, func(t *testing.T, objs []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantArgs(t, c, "--web.config.file=/etc/zonewatch/web/web-config.yml")
		wantKinds(t, objs, map[string]int{"Secret": 1})
		sec := typed[corev1.Secret](t, ofKind(objs, "Secret")[0])
		if !strings.Contains(sec.StringData["web-config.yml"], "basic_auth_users") {
			t.Errorf("web config Secret lacks the config: %q", sec.StringData)
		}
		if c.LivenessProbe.TCPSocket == nil || c.ReadinessProbe.TCPSocket == nil {
			t.Error("with basic auth the probes must be TCP checks (the kubelet cannot log in)")
		}
		pm := ofKind(objs, "PodMonitor")[0]
		eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		if s, _, _ := unstructured.NestedString(eps[0].(map[string]any), "scheme"); s != "https" {
			t.Errorf("PodMonitor scheme %q, want https", s)
		}
	}},
	{"web config with TLS only", "webConfig: {tls: true, existingSecret: my-web-config}", func(t *testing.T, objs []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		c := &spec.Containers[0]
		wantKinds(t, objs, map[string]int{"Secret": 0})
		if c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("readiness probe %+v, want GET over HTTPS", c.ReadinessProbe)
		}
	}},
	{"rules and dashboards off", "prometheusRule: {enabled: false}\ndashboards: {enabled: false}", func(t *testing.T, objs []*unstructured.Unstructured, _ string, _ *corev1.PodSpec) {
		wantKinds(t, objs, map[string]int{"PrometheusRule": 0, "ConfigMap": 0})
	}},
	{"no RBAC, existing service account", "rbac: {create: false}\nserviceAccount: {create: false, name: monitoring-reader}", func(t *testing.T, objs []*unstructured.Unstructured, _ string, spec *corev1.PodSpec) {
		wantKinds(t, objs, map[string]int{"ServiceAccount": 0, "ClusterRole": 0, "ClusterRoleBinding": 0})
		if spec.ServiceAccountName != "monitoring-reader" {
			t.Errorf("serviceAccountName %q, want monitoring-reader", spec.ServiceAccountName)
		}
	}},
}

// TestChart lints and renders the chart for each variant and checks what
// must hold for every one (hardening, RBAC) and for that one.
func TestChart(t *testing.T) {
	helm(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			if out, err := runHelm(t, v.values, "lint", "--strict", chartDir, "--namespace", namespace); err != nil {
				t.Fatalf("helm lint: %v", err)
			} else if strings.Contains(out, "[ERROR]") || strings.Contains(out, "[WARNING]") {
				t.Errorf("helm lint:\n%s", out)
			}
			objs := render(t, v.values)
			kind, spec := workload(t, objs)
			checkHardened(t, spec)
			checkRBAC(t, objs)
			for _, o := range objs {
				if ns := o.GetNamespace(); o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" && ns != namespace {
					t.Errorf("%s %s in namespace %q, want %q", o.GetKind(), o.GetName(), ns, namespace)
				}
			}
			v.check(t, objs, kind, spec)
		})
	}
}

// TestChartRefusesBadValues: values that would break the install fail at
// `helm template`, saying why. Two monitors would scrape every series twice.
func TestChartRefusesBadValues(t *testing.T) {
	helm(t)
	for _, tc := range []struct{ values, want string }{
		{"serviceMonitor: {enabled: true}", "scraped twice"},
		{"gpu: {source: dcgm_exporter}", "/gpu/source"},
		{"conntrack: {layout: newest}", "/conntrack/layout"},
		{"hubble: {socketGroup: cilium}", "/hubble/socketGroup"},
		{"hubble: {access: sock}", "/hubble/access"},
		{"hubble: {access: tls}", "hubble.access=tls needs hubble.nodeTLS.existingSecret"},
		{"scrape: {job: ''}", "/scrape/job"},
	} {
		_, err := runHelm(t, tc.values, "template", release, chartDir)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template with %s: %v, want a failure naming %q", tc.values, err, tc.want)
		}
	}
}

// checkHardened: the container is never privileged, drops every capability
// and adds back only those of the sources, and mounts host paths read-only.
func checkHardened(t *testing.T, spec *corev1.PodSpec) {
	t.Helper()
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Error("pod uses a host namespace")
	}
	psc := spec.SecurityContext
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccomp profile %+v, want RuntimeDefault", psc)
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
		t.Fatalf("%d containers, %d init containers: want one container", len(spec.Containers), len(spec.InitContainers))
	}
	c := &spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("container has no securityContext")
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("container privileged is not false")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("container allowPrivilegeEscalation is not false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("container root filesystem is not read-only")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("capabilities %+v, want drop [ALL]", sc.Capabilities)
	}
	for _, cp := range addedCaps(c) {
		if cp != "BPF" && cp != "SYS_ADMIN" {
			t.Errorf("capability %s added: no source needs it", cp)
		}
	}
	hostVolumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostVolumes[v.Name] = true
		}
	}
	for _, m := range c.VolumeMounts {
		if hostVolumes[m.Name] && !m.ReadOnly {
			t.Errorf("host path volume %s mounted read-write", m.Name)
		}
	}
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Error("the pod must mount its service account token: the informers need it")
	}
}

func wantKind(t *testing.T, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("exporter runs as a %s, want a %s", got, want)
	}
}

func wantArgs(t *testing.T, c *corev1.Container, want ...string) {
	t.Helper()
	for _, a := range want {
		if !slices.Contains(c.Args, a) {
			t.Errorf("args lack %q:\n%s", a, strings.Join(c.Args, "\n"))
		}
	}
}

func noArgPrefix(t *testing.T, c *corev1.Container, prefix string) {
	t.Helper()
	for _, a := range c.Args {
		if strings.HasPrefix(a, prefix) {
			t.Errorf("unexpected arg %q", a)
		}
	}
}

func wantHostPaths(t *testing.T, spec *corev1.PodSpec, want ...string) {
	t.Helper()
	got := hostPaths(spec)
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("host paths %v, want %v", got, want)
	}
}

func wantCaps(t *testing.T, c *corev1.Container, want ...string) {
	t.Helper()
	if got := addedCaps(c); !slices.Equal(got, want) {
		t.Errorf("added capabilities %v, want %v", got, want)
	}
}

func wantUser(t *testing.T, spec *corev1.PodSpec, uid int64) {
	t.Helper()
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != uid {
		t.Fatalf("pod securityContext %+v, want runAsUser %d", sc, uid)
	}
	if nonRoot := sc.RunAsNonRoot != nil && *sc.RunAsNonRoot; nonRoot != (uid != 0) {
		t.Errorf("runAsNonRoot %v with runAsUser %d", nonRoot, uid)
	}
}

func wantKinds(t *testing.T, objs []*unstructured.Unstructured, want map[string]int) {
	t.Helper()
	for kind, n := range want {
		if got := len(ofKind(objs, kind)); got != n {
			t.Errorf("%d %s objects, want %d", got, kind, n)
		}
	}
}

// wantEndpoint: one scrape endpoint that keeps the exporter's labels and
// sets the Prometheus job label the rules select.
func wantEndpoint(t *testing.T, eps []any, job string) {
	t.Helper()
	if len(eps) != 1 {
		t.Fatalf("%d scrape endpoints, want 1", len(eps))
	}
	ep := eps[0].(map[string]any)
	if ep["honorLabels"] != true {
		t.Errorf("honorLabels %v, want true: the exporter's namespace and pod labels would become exported_*", ep["honorLabels"])
	}
	if ep["port"] != "metrics" {
		t.Errorf("endpoint port %v, want metrics", ep["port"])
	}
	rls, _, _ := unstructured.NestedSlice(ep, "relabelings")
	found := false
	for _, r := range rls {
		r := r.(map[string]any)
		if r["targetLabel"] == "job" && r["replacement"] == job && (r["action"] == nil || r["action"] == "replace") {
			found = true
		}
	}
	if !found {
		t.Errorf("relabelings %v do not set job=%q", rls, job)
	}
	node := false
	for _, r := range rls {
		r := r.(map[string]any)
		src, _ := r["sourceLabels"].([]any)
		if r["targetLabel"] == "node" && len(src) == 1 && src[0] == "__meta_kubernetes_pod_node_name" {
			node = true
		}
	}
	if !node {
		t.Errorf("relabelings %v do not set node from __meta_kubernetes_pod_node_name: the per-node alerts (ZonewatchExporterDown) would carry no node", rls)
	}
}

// checkRBAC: the ClusterRole grants list and watch on pods and nodes
// and on the owner kinds (kube.OwnerResources), and nothing else; the
// binding gives it to the exporter's ServiceAccount only; there is no
// other RBAC object.
func checkRBAC(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		switch o.GetKind() {
		case "Role", "RoleBinding":
			t.Errorf("%s %s: zonewatch needs no namespaced RBAC", o.GetKind(), o.GetName())
		case "ClusterRole":
			checkClusterRole(t, typed[rbacv1.ClusterRole](t, o))
		case "ClusterRoleBinding":
			b := typed[rbacv1.ClusterRoleBinding](t, o)
			roles := ofKind(objs, "ClusterRole")
			if len(roles) != 1 || b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != roles[0].GetName() {
				t.Errorf("ClusterRoleBinding %s binds %+v, want the chart's ClusterRole", b.Name, b.RoleRef)
			}
			if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Namespace != namespace {
				t.Errorf("ClusterRoleBinding %s subjects %+v, want the exporter's ServiceAccount only", b.Name, b.Subjects)
			}
		}
	}
}

func checkClusterRole(t *testing.T, r *rbacv1.ClusterRole) {
	t.Helper()
	for _, p := range clusterRoleProblems(r) {
		t.Errorf("ClusterRole %s: %s", r.Name, p)
	}
}

// readResources are what the informers list and watch: group -> resources.
func readResources() map[string][]string {
	out := map[string][]string{"": {"pods", "nodes"}}
	for _, o := range kube.OwnerResources {
		out[o.GVR.Group] = append(out[o.GVR.Group], o.GVR.Resource)
	}
	for _, r := range gpu.ReadResources {
		out[r.Group] = append(out[r.Group], r.Resource)
	}
	for _, r := range kube.ServiceResources {
		out[r.Group] = append(out[r.Group], r.Resource)
	}
	for _, r := range fence.ReadResources {
		out[r.Group] = append(out[r.Group], r.Resource)
	}
	return out
}

// getResources are what the exporter reads by name: group -> resources.
func getResources() map[string][]string {
	out := map[string][]string{}
	for _, r := range fence.GetResources {
		out[r.Group] = append(out[r.Group], r.Resource)
	}
	return out
}

// clusterRoleProblems lists what r grants beyond list and watch on
// readResources and get on getResources, and what of that it lacks. No
// other get: informers only list and watch, the per-node view reads
// identities by name, and the apiserver's audit log of the exporter shows
// nothing else (TestExporterRBACAudit).
func clusterRoleProblems(r *rbacv1.ClusterRole) []string {
	var out []string
	if r.AggregationRule != nil {
		out = append(out, "aggregates other roles")
	}
	want, gets := readResources(), getResources()
	granted := map[string]bool{}
	for _, rule := range r.Rules {
		if len(rule.NonResourceURLs) > 0 {
			out = append(out, fmt.Sprintf("grants non-resource URLs %v", rule.NonResourceURLs))
		}
		if len(rule.APIGroups) != 1 || want[rule.APIGroups[0]] == nil {
			out = append(out, fmt.Sprintf("grants API groups %q, want one group of %v per rule", rule.APIGroups, want))
			continue
		}
		group := rule.APIGroups[0]
		for _, res := range rule.Resources {
			if !slices.Contains(want[group], res) {
				out = append(out, fmt.Sprintf("grants resource %q in group %q (subresources and wildcards included), want only %v", res, group, want[group]))
			}
			for _, verb := range rule.Verbs {
				if verb != "list" && verb != "watch" && (verb != "get" || !slices.Contains(gets[group], res)) {
					out = append(out, fmt.Sprintf("grants %q on %s, want list and watch only (and get on %v)", verb, res, gets))
				}
				granted[group+"/"+res+"/"+verb] = true
			}
		}
	}
	for group, resources := range want {
		for _, res := range resources {
			for _, verb := range []string{"list", "watch"} {
				if !granted[group+"/"+res+"/"+verb] {
					out = append(out, fmt.Sprintf("lacks %s on %s in group %q: the informers need it", verb, res, group))
				}
			}
		}
	}
	for group, resources := range gets {
		for _, res := range resources {
			if !granted[group+"/"+res+"/get"] {
				out = append(out, fmt.Sprintf("lacks get on %s in group %q: the per-node view reads it by name", res, group))
			}
		}
	}
	return out
}

// committed reads deploy/manifests.
func committed(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(manifestsDir, "*.yaml"))
	if len(files) == 0 {
		t.Fatalf("no manifests in deploy/%s: %s", manifestsDir, regenerate)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decode(t, bytes.NewReader(b))...)
	}
	return objs
}

// TestClusterRoleReadsOnlyPodsAndNodes checks the committed manifests (no
// helm needed); TestChart checks every variant.
func TestClusterRoleReadsOnlyPodsAndNodes(t *testing.T) {
	objs := committed(t)
	if len(ofKind(objs, "ClusterRole")) != 1 || len(ofKind(objs, "ClusterRoleBinding")) != 1 {
		t.Fatalf("want one ClusterRole and one ClusterRoleBinding in deploy/manifests")
	}
	checkRBAC(t, objs)
	_, spec := workload(t, objs)
	checkHardened(t, spec)

	// The check itself catches each way of granting more.
	for _, bad := range []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"list", "watch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "nodes", "secrets"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "nodes", "pods/exec"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"*"}, Resources: []string{"pods", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"*"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs", "cronjobs"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"ray.io"}, Resources: []string{"rayclusters"}, Verbs: []string{"get", "list", "watch", "update"}},
	} {
		if len(clusterRoleProblems(&rbacv1.ClusterRole{Rules: []rbacv1.PolicyRule{bad}})) == 0 {
			t.Errorf("rule %+v passed the ClusterRole check", bad)
		}
	}
}

// TestManifestsUpToDate renders the chart as deploy/render.sh does and
// compares it with the committed deploy/manifests.
func TestManifestsUpToDate(t *testing.T) {
	bin := helm(t)
	dir := t.TempDir()
	cmd := exec.Command("bash", "render.sh", dir)
	cmd.Env = append(os.Environ(), "HELM="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("render.sh: %v\n%s", err, out)
	}
	want, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	got, _ := filepath.Glob(filepath.Join(manifestsDir, "*.yaml"))
	names := func(files []string) []string {
		var out []string
		for _, f := range files {
			out = append(out, filepath.Base(f))
		}
		return out
	}
	if !slices.Equal(names(got), names(want)) {
		t.Fatalf("deploy/manifests has %v, the chart renders %v: %s", names(got), names(want), regenerate)
	}
	for _, f := range want {
		w, _ := os.ReadFile(f)
		g, _ := os.ReadFile(filepath.Join(manifestsDir, filepath.Base(f)))
		if !bytes.Equal(g, w) {
			t.Errorf("deploy/manifests/%s differs from the chart's default rendering (%s)", filepath.Base(f), firstDiff(g, w))
		}
	}
	if t.Failed() {
		t.Log(regenerate)
	}
}

func firstDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d: committed %q, rendered %q", i+1, gl, wl)
		}
	}
	return "same lines"
}

// TestValuesHaveGeneratedBlocks: values.yaml carries the rules and
// dashboards generators' values blocks unchanged (they write them to
// rules/helm-values.yaml and dashboards/helm-values.yaml to be merged), and
// the scrape job is the one the rules select.
func TestValuesHaveGeneratedBlocks(t *testing.T) {
	values := readYAML(t, filepath.Join(chartDir, "values.yaml"))
	for _, f := range []string{"../rules/helm-values.yaml", "../dashboards/helm-values.yaml"} {
		block := readYAML(t, f)
		for k, v := range block {
			got, _ := yaml.Marshal(values[k])
			want, _ := yaml.Marshal(v)
			if !bytes.Equal(got, want) {
				t.Errorf("values.yaml %s differs from %s: merge that block into deploy/helm/zonewatch/values.yaml\nhave:\n%s\nwant:\n%s", k, f, got, want)
			}
		}
	}
	job, _, _ := unstructured.NestedString(values, "scrape", "job")
	sel, _, _ := unstructured.NestedString(values, "rules", "selector")
	if want := fmt.Sprintf("job=%q", job); !strings.Contains(sel, want) {
		t.Errorf("rules.selector %q does not select scrape.job (%s): the rules would see no series", sel, want)
	}
}

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// TestNotes renders NOTES.txt (helm template skips it; a copy of the chart
// renders it through tpl into a ConfigMap) and checks it tells how to
// verify the install.
func TestNotes(t *testing.T) {
	bin := helm(t)
	chart := filepath.Join(t.TempDir(), "zonewatch")
	if err := os.CopyFS(chart, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(chart, "templates", "NOTES.txt"), filepath.Join(chart, "notes.txt")); err != nil {
		t.Fatal(err)
	}
	wrapper := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{ tpl (.Files.Get \"notes.txt\") . | indent 4 }}\n"
	if err := os.WriteFile(filepath.Join(chart, "templates", "notes.yaml"), []byte(wrapper), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		set  string
		want []string
	}{
		{"", []string{"rollout status daemonset/zonewatch", "curl -s http://localhost:19420/readyz", `up{job="zonewatch"}`,
			"podMonitorSelector", "bpf.ctAccounting=true", `folder "zonewatch"`}},
		{"hubble.relay.enabled=true,webConfig.existingSecret=wc,webConfig.tls=true,webConfig.basicAuth=true",
			[]string{"rollout status deployment/zonewatch", "Relay mode", "curl -sk -u USER:PASSWORD https://localhost:19420/metrics", "conntrack=off"}},
	} {
		args := []string{"template", release, chart, "--namespace", namespace, "--show-only", "templates/notes.yaml"}
		if tc.set != "" {
			args = append(args, "--set", tc.set)
		}
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal(out, &cm); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(cm.Data["notes"], w) {
				t.Errorf("NOTES.txt (--set %q) lacks %q:\n%s", tc.set, w, cm.Data["notes"])
			}
		}
	}
}

// TestExporterAcceptsChartArgs runs the real exporter with the container
// args of every variant: each flag name and value must parse (the run then
// stops at the missing kubeconfig, after parsing and before serving).
func TestExporterAcceptsChartArgs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the exporter")
	}
	helm(t)
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the exporter")
	}
	exporter := filepath.Join(t.TempDir(), "zonewatch-exporter")
	if out, err := exec.Command(gobin, "build", "-o", exporter, "../cmd/exporter").CombinedOutput(); err != nil {
		t.Fatalf("building the exporter: %v\n%s", err, out)
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			_, spec := workload(t, render(t, v.values))
			args := append(slices.Clone(spec.Containers[0].Args), "--kubeconfig=/nonexistent/zonewatch-kubeconfig")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, exporter, args...)
			cmd.Env = []string{"HOME=" + t.TempDir()} // no NODE_NAME, KUBECONFIG or ZONEWATCH_* from the test's environment
			out, _ := cmd.CombinedOutput()
			if strings.Contains(string(out), "try --help") || !strings.Contains(string(out), "/nonexistent/zonewatch-kubeconfig") {
				t.Errorf("the exporter rejects the chart's args:\n%s\nargs:\n%s", out, strings.Join(args, "\n"))
			}
		})
	}
}
