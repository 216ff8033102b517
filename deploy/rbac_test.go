package deploy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// ownerCRDs are the job controllers' kinds installed on the RBAC test's
// apiserver (minimal schemas, real group, version and plural): the exporter
// watches those it resolves owners through (kube.OwnerResources) and must
// leave the others alone.
var ownerCRDs = []struct{ group, version, kind, plural string }{
	{"jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"},
	{"ray.io", "v1", "RayCluster", "rayclusters"},
	{"ray.io", "v1", "RayJob", "rayjobs"},
	{"leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets"},
	{"trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs"},
	{"kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"},
}

const (
	rbacNode   = "gpu-a1"
	dcgmNS     = "gpu-operator"
	dcgmPod    = "nvidia-dcgm-exporter-x7k2p"
	exporterSA = "zonewatch"
)

// rbacCluster is an apiserver with RBAC enforced and an audit log, the
// owner CRDs, a GPU node with a dcgm-exporter pod in another namespace, and
// a JobSet's pod.
type rbacCluster struct {
	api *testenv.APIServer
	bin string
	dir string
}

func startRBACCluster(t *testing.T) *rbacCluster {
	t.Helper()
	testenv.ToolsBin(t, "etcd", "kube-apiserver")
	testenv.CanStartAs(t)
	bin := buildExporter(t)
	api := testenv.StartAPIServer(t, testenv.WithAuditLog())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(api.Config)
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, c := range ownerCRDs {
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": c.plural + "." + c.group},
			"spec": map[string]any{
				"group": c.group, "scope": "Namespaced",
				"names": map[string]any{"kind": c.kind, "listKind": c.kind + "List", "plural": c.plural, "singular": strings.ToLower(c.kind)},
				"versions": []any{map[string]any{"name": c.version, "served": true, "storage": true,
					"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
			},
		}}
		if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("CRD %s: %v", crd.GetName(), err)
		}
	}
	for _, c := range ownerCRDs {
		waitEstablished(ctx, t, dyn.Resource(crdGVR), c.plural+"."+c.group)
	}

	client := kubernetes.NewForConfigOrDie(api.Config)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: rbacNode, Labels: map[string]string{
		"topology.kubernetes.io/zone": "zone-a", "topology.kubernetes.io/region": "region-1"}}}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
		Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
		Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
	}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{dcgmNS, "ml"} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pods := []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: dcgmNS, Name: dcgmPod, Labels: map[string]string{"app": "nvidia-dcgm-exporter"}},
			Spec: corev1.PodSpec{NodeName: rbacNode, Containers: []corev1.Container{{Name: "nvidia-dcgm-exporter", Image: "dcgm-exporter",
				Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: int32(testenv.FreePort(t))}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "llm-node-0-0", Labels: map[string]string{
			"jobset.sigs.k8s.io/jobset-name": "llm", "jobset.sigs.k8s.io/replicatedjob-name": "node"}},
			Spec: corev1.PodSpec{NodeName: rbacNode, Containers: []corev1.Container{{Name: "trainer", Image: "trainer",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}}}}}},
	}
	for _, p := range pods {
		created, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return &rbacCluster{api: api, bin: bin, dir: t.TempDir()}
}

func buildExporter(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the exporter")
	}
	dir, err := os.MkdirTemp("", "zonewatch-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Any UID runs it: the Relay-mode pod runs as nobody.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "zonewatch-exporter")
	if out, err := exec.Command(gobin, "build", "-o", bin, "../cmd/exporter").CombinedOutput(); err != nil {
		t.Fatalf("building the exporter: %v\n%s", err, out)
	}
	return bin
}

// runningExporter is one exporter process of the RBAC tests.
type runningExporter struct {
	addr string
	log  string
}

// exporterMode is how the chart runs the exporter: its securityContext
// (rendered from the chart) and the mode's args.
type exporterMode struct {
	name   string
	values string // helm values of the mode
	args   func(c *rbacCluster, hubbleAddr string) []string
}

var exporterModes = []exporterMode{
	{"daemonset", "", func(c *rbacCluster, hubbleAddr string) []string {
		return []string{"--node-name=" + rbacNode, "--hubble.address=unix://" + filepath.Join(c.dir, "absent-hubble.sock"),
			"--gpu.source=auto", "--gpu.podresources-socket=", "--no-conntrack.enabled"}
	}},
	{"relay", "hubble: {relay: {enabled: true}}", func(c *rbacCluster, hubbleAddr string) []string {
		return []string{"--node-name=", "--hubble.address=" + hubbleAddr, "--gpu.source=none", "--no-conntrack.enabled"}
	}},
}

// securityContext is the container identity the chart gives mode m: the
// committed DaemonSet's for the default values, else rendered with helm
// (false without helm, unless tools are required).
func (m exporterMode) securityContext(t *testing.T) (testenv.SecurityContext, bool) {
	t.Helper()
	if m.values == "" {
		return testenv.ChartSecurityContext(t), true
	}
	if _, err := os.Stat(filepath.Join(testenv.ToolsBin(t), "helm")); err != nil && !testenv.Required() {
		return testenv.SecurityContext{}, false
	}
	_, spec := workload(t, render(t, m.values))
	sc, err := testenv.SecurityContextOf(spec, "exporter")
	if err != nil {
		t.Fatalf("%s: %v", m.name, err)
	}
	return sc, true
}

// start runs the exporter of mode m as id, with the container identity
// the chart gives that mode.
func (c *rbacCluster) start(t *testing.T, m exporterMode, id *testenv.Identity) runningExporter {
	t.Helper()
	sc, ok := m.securityContext(t)
	if !ok {
		t.Fatalf("%s mode: no helm to render its securityContext", m.name)
	}
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	probe := strconv.Itoa(testenv.FreePort(t))
	name := "exporter-" + m.name + "-" + strings.ReplaceAll(strings.TrimPrefix(id.User, "system:serviceaccount:"), ":", "-")
	args := append([]string{"--kubeconfig=" + id.Kubeconfig, "--web.listen-address=" + addr,
		"--probe.listen-address=127.0.0.1:" + probe, "--probe.port=" + probe, "--log.level=info"},
		m.args(c, "127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)))...)
	t.Logf("%s exporter as %s with %s", m.name, id.User, sc)
	testenv.StartAs(t, c.dir, name, sc, c.bin, args...)
	return runningExporter{addr: addr, log: filepath.Join(c.dir, name+".log")}
}

// sourceUp returns zonewatch_source_up by source, from /metrics.
func (e runningExporter) sourceUp() (map[string]string, error) {
	resp, err := http.Get("http://" + e.addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, `zonewatch_source_up{source="`); ok {
			src, val, _ := strings.Cut(rest, `"} `)
			out[src] = val
		}
	}
	return out, nil
}

// waitSources waits until /metrics reports want (source -> "0"/"1").
func (e runningExporter) waitSources(t *testing.T, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var got map[string]string
	var err error
	for time.Now().Before(deadline) {
		got, err = e.sourceUp()
		ok := err == nil
		for k, v := range want {
			ok = ok && got[k] == v
		}
		if ok {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	logs, _ := os.ReadFile(e.log)
	t.Fatalf("zonewatch_source_up = %v (err %v), want %v\nexporter log:\n%s", got, err, want, logs)
}

// access is what one resource was asked for, or is granted, by verb.
type access map[string]map[string]bool // "group/resource" -> verb set

func (a access) add(res, verb string) {
	if a[res] == nil {
		a[res] = map[string]bool{}
	}
	a[res][verb] = true
}

func verbsOf(m map[string]bool) string {
	var v []string
	for k := range m {
		v = append(v, k)
	}
	sort.Strings(v)
	if len(v) == 0 {
		return "-"
	}
	return strings.Join(v, ",")
}

func resName(group, res string) string {
	if group == "" {
		return res
	}
	return res + "." + group
}

// granted expands the role's rules to group/resource -> verbs (wildcards
// kept as "*").
func granted(role *rbacv1.ClusterRole) access {
	out := access{}
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out.add(resName(g, res), v)
				}
			}
		}
	}
	return out
}

// allows reports whether role grants verb on group/resource[/sub].
func allows(role *rbacv1.ClusterRole, group, res, verb string) bool {
	for _, r := range role.Rules {
		if (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, res) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

// auditReport compares what the exporter asked for (audit events) with
// what role grants. problems: every request the role does not grant, or
// that the apiserver refused; table: used and granted verbs per resource;
// unused: grants never used.
func auditReport(events []testenv.AuditEvent, role *rbacv1.ClusterRole) (problems []string, table string, unused []string) {
	used := access{}
	nonResource := map[string]bool{}
	for _, e := range events {
		if e.ObjectRef == nil {
			path, _, _ := strings.Cut(e.RequestURI, "?")
			nonResource[e.Verb+" "+path] = true
			if e.Decision() == "forbid" || e.Code() == http.StatusForbidden {
				problems = append(problems, fmt.Sprintf("%s %s refused (%d): %s", e.Verb, path, e.Code(), e.Annotations["authorization.k8s.io/reason"]))
			}
			continue
		}
		res := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
		used.add(resName(e.ObjectRef.APIGroup, res), e.Verb)
		if !allows(role, e.ObjectRef.APIGroup, res, e.Verb) {
			problems = append(problems, fmt.Sprintf("%s %s (%s): used, and the ClusterRole %s does not grant it (response %d); add %s",
				e.Verb, resName(e.ObjectRef.APIGroup, res), e.RequestURI, role.Name, e.Code(),
				fmt.Sprintf(`{apiGroups: [%q], resources: [%q], verbs: [%q]}`, e.ObjectRef.APIGroup, res, e.Verb)))
		} else if e.Code() == http.StatusForbidden {
			problems = append(problems, fmt.Sprintf("%s %s refused although granted: %s", e.Verb, resName(e.ObjectRef.APIGroup, res), e.Annotations["authorization.k8s.io/reason"]))
		}
	}
	grants := granted(role)
	var names []string
	for r := range used {
		names = append(names, r)
	}
	for r := range grants {
		if used[r] == nil {
			names = append(names, r)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "%-44s %-22s %-22s\n", "resource", "used", "granted")
	for _, r := range names {
		fmt.Fprintf(&b, "%-44s %-22s %-22s\n", r, verbsOf(used[r]), verbsOf(grants[r]))
		for v := range grants[r] {
			if !used[r][v] && v != "*" {
				unused = append(unused, v+" "+r)
			}
		}
	}
	var nr []string
	for k := range nonResource {
		nr = append(nr, k)
	}
	sort.Strings(nr)
	fmt.Fprintf(&b, "non-resource requests (discovery; granted to every authenticated user by system:discovery): %s\n", strings.Join(nr, ", "))
	sort.Strings(unused)
	dedup := slices.Compact(problems)
	return dedup, b.String(), unused
}

// TestExporterRBACAudit runs the exporter in both of the chart's modes as
// the chart's ServiceAccount, bound to the ClusterRole of deploy/manifests,
// against an apiserver enforcing RBAC, with the chart's container
// securityContext, and compares what it asked for (the audit log) with what
// the role grants: anything used and not granted fails; anything granted
// and never used is reported.
func TestExporterRBACAudit(t *testing.T) {
	c := startRBACCluster(t)
	id := c.api.ChartIdentity(t, nil)
	role := testenv.LoadChartRBAC(t).ClusterRole
	if want := "system:serviceaccount:" + namespace + ":" + exporterSA; id.User != want {
		t.Fatalf("chart ServiceAccount authenticates as %s, want %s", id.User, want)
	}
	for _, m := range exporterModes {
		if _, ok := m.securityContext(t); !ok {
			t.Logf("helm not found: the %s mode is not run", m.name)
			continue
		}
		e := c.start(t, m, id)
		want := map[string]string{"kubernetes": "1"}
		if m.name == "daemonset" {
			// The dcgm-exporter pod (another namespace) was found: the GPU
			// source is wired (down: nothing listens at the pod's port).
			// The probe's peer informer lists the exporter pods.
			want["gpu"], want["probe"] = "0", "1"
		}
		e.waitSources(t, want)
	}
	// Let the watches run a moment, as they do between a pod's restarts.
	time.Sleep(2 * time.Second)
	events := c.api.AuditEvents(t, id.User)
	if len(events) == 0 {
		t.Fatalf("no audit events of %s in %s", id.User, c.api.AuditLog)
	}
	problems, table, unused := auditReport(events, &role)
	t.Logf("what the exporter (DaemonSet and Relay mode) asked the apiserver for, and what ClusterRole %s grants (%d requests):\n%s", role.Name, len(events), table)
	for _, u := range unused {
		t.Logf("granted and never used: %s", u)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestExporterRBACDenied removes one rule of the chart's ClusterRole at a
// time, in both of the chart's modes: each source it starves reports
// zonewatch_source_up 0 and logs one error line naming the verb, the
// resource and the rule to add; the exporter keeps serving the rest, the
// audit comparison fails on the request, and once the rule is granted again
// the starved sources come up by themselves.
func TestExporterRBACDenied(t *testing.T) {
	c := startRBACCluster(t)
	type denial struct{ source, resource string }
	daemonset, relay := exporterModes[0], exporterModes[1]
	for _, tc := range []struct {
		name, group, resource string
		mode                  exporterMode
		// sources' zonewatch_source_up with the rule missing, and once it
		// is granted again (nil: not checked)
		want, recovered map[string]string
		// one error line each
		denied []denial
	}{
		{"resourceslices", "resource.k8s.io", "resourceslices", daemonset, map[string]string{"kubernetes": "1", "gpu": "0"}, nil,
			[]denial{{"gpu", "resourceslices.resource.k8s.io"}}},
		// The probe's peer informer lists pods too: its own line and
		// source_up.
		{"pods-and-nodes", "", "pods", daemonset, map[string]string{"kubernetes": "0", "probe": "0"}, map[string]string{"kubernetes": "1", "probe": "1"},
			[]denial{{"kubernetes", "pods"}, {"kubernetes", "nodes"}, {"kubernetes", "services"}, {"probe", "pods"}}},
		{"relay-pods-and-nodes", "", "pods", relay, map[string]string{"kubernetes": "0"}, map[string]string{"kubernetes": "1"},
			[]denial{{"kubernetes", "pods"}, {"kubernetes", "nodes"}, {"kubernetes", "services"}}},
		{"endpointslices", "discovery.k8s.io", "endpointslices", daemonset, map[string]string{"kubernetes": "0"}, map[string]string{"kubernetes": "1"},
			[]denial{{"kubernetes", "endpointslices.discovery.k8s.io"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := tc.mode.securityContext(t); !ok {
				t.Skipf("helm not found: the %s mode is not run", tc.mode.name)
			}
			name := exporterSA + "-" + tc.name
			// Its own ServiceAccount, role and binding: no other case's
			// grants in RBAC's cache.
			rename := func(r *testenv.ChartRBAC) {
				r.ServiceAccount.Name, r.ClusterRole.Name, r.Binding.Name, r.Binding.RoleRef.Name, r.Binding.Subjects[0].Name = name, name, name, name, name
			}
			var role rbacv1.ClusterRole
			id := c.api.ChartIdentity(t, func(r *testenv.ChartRBAC) {
				rename(r)
				r.ClusterRole.Rules = slices.DeleteFunc(r.ClusterRole.Rules, func(p rbacv1.PolicyRule) bool {
					return slices.Contains(p.APIGroups, tc.group) && slices.Contains(p.Resources, tc.resource)
				})
				role = r.ClusterRole
			})
			e := c.start(t, tc.mode, id)
			e.waitSources(t, tc.want)
			// The lines are logged as each informer's first list is refused,
			// which may come after source_up reads 0 (it does from the start).
			lines := func(want []string) (logs string, out []string) {
				b, _ := os.ReadFile(e.log)
				for _, l := range strings.Split(string(b), "\n") {
					if containsAll(l, want) && verbRE.MatchString(l) {
						out = append(out, l)
					}
				}
				return string(b), out
			}
			wants := make([][]string, len(tc.denied))
			for i, d := range tc.denied {
				gr := schema.ParseGroupResource(d.resource)
				wants[i] = []string{`level=ERROR`, `msg="permission denied: add the rule to zonewatch's ClusterRole`,
					`starved_source=` + d.source + ` `, `resource=` + d.resource, `user=` + id.User,
					`rule="{apiGroups: [\"` + gr.Group + `\"], resources: [\"` + gr.Resource + `\"], verbs: [\"list\", \"watch\"]}"`}
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
					if _, got := lines(wants[i]); len(got) > 0 {
						break
					}
				}
			}
			// The informers retry meanwhile (client-go's backoff starts at
			// 800 ms): still one line each.
			time.Sleep(2 * time.Second)
			for _, want := range wants {
				logs, got := lines(want)
				if len(got) != 1 {
					t.Errorf("the exporter log has %d lines with %q and verb=list or watch, want 1:\n%s", len(got), want, logs)
				} else {
					t.Logf("what the user sees: %s", got[0])
				}
			}
			// Still serving: /metrics answered above; /healthz too.
			resp, err := http.Get("http://" + e.addr + "/healthz")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("/healthz with a rule missing: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
			problems, table, _ := auditReport(c.api.AuditEvents(t, id.User), &role)
			t.Logf("with the %s rule removed:\n%s", tc.name, table)
			found := false
			for _, p := range problems {
				found = found || strings.Contains(p, "resources: [\""+tc.resource+"\"]")
			}
			if !found {
				t.Errorf("the audit comparison did not flag the missing %s rule; problems: %q", tc.resource, problems)
			} else {
				t.Logf("the audit comparison flags it: %s", problems[0])
			}
			if tc.recovered != nil {
				c.api.ChartIdentity(t, rename) // the chart's rules again
				e.waitSources(t, tc.recovered)
			}
		})
	}
}

var verbRE = regexp.MustCompile(` verb=(list|watch) `)

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
