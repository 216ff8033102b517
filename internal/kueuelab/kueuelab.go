// Package kueuelab runs the real Kueue manager (built by hack/tools.sh from
// sigs.k8s.io/kueue at the pinned version) against a schedlab cluster:
// its CRDs and webhook configurations from the same module, its webhook
// server on loopback with a test CA and registered with the test apiserver
// by URL, topology-aware scheduling on (beta, on by default in v0.17).
// Start runs it with the plain-pod integration only (no training controller
// runs in a schedlab cluster); Attach runs it on a cluster of one's own
// (internal/trainlab's bed) with the job integrations asked for, e.g. the
// JobSet one beside the real JobSet controller.
package kueuelab

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// Kueue's names, as sigs.k8s.io/kueue v0.17.0 spells them
// (apis/kueue/v1beta2/topology_types.go, pkg/controller/jobs/pod/constants).
const (
	APIVersion              = "kueue.x-k8s.io/v1beta2"
	QueueLabel              = "kueue.x-k8s.io/queue-name"
	PodGroupNameLabel       = "kueue.x-k8s.io/pod-group-name"
	PodGroupTotalAnnotation = "kueue.x-k8s.io/pod-group-total-count"
	RequiredTopology        = "kueue.x-k8s.io/podset-required-topology"
	PreferredTopology       = "kueue.x-k8s.io/podset-preferred-topology"
	PodSetGroupName         = "kueue.x-k8s.io/podset-group-name"
	AdmissionGate           = "kueue.x-k8s.io/admission"
	TopologyGate            = "kueue.x-k8s.io/topology"
	ManagedLabel            = "kueue.x-k8s.io/managed"
	// NamespaceLabel (="true") puts a namespace under Kueue: its
	// managedJobsNamespaceSelector and the pod webhook's namespaceSelector.
	// Elsewhere pods are Kueue's business not at all (its pod webhook walks
	// the controller owner of any pod in a managed namespace).
	NamespaceLabel = "kueuelab.zonewatch.io/managed"
)

// Lab is a schedlab cluster with Kueue's manager reconciling it.
type Lab struct {
	*schedlab.Lab
	Dyn dynamic.Interface
	Log string
}

var (
	// GVRs of Kueue's objects.
	TopologyGVR  = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "topologies"}
	FlavorGVR    = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "resourceflavors"}
	CQGVR        = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "clusterqueues"}
	LQGVR        = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "localqueues"}
	WorkloadGVR  = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
	mutatingGVR  = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"}
	validateGVR  = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}
	webhookKinds = []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
)

// Start starts the lab (schedlab.Start) and Kueue's manager against it,
// with the plain-pod integration only.
func Start(t testing.TB) *Lab {
	t.Helper()
	testenv.ToolsBin(t, "etcd", "kube-apiserver", "kube-scheduler", "kueue", "kueue.d")
	root(t)
	return Attach(t, schedlab.Start(t), FrameworkPod)
}

// Kueue's job integrations (config integrations.frameworks) that Attach
// can turn on, each with the path its webhooks are served at.
const (
	FrameworkPod        = "pod"
	FrameworkJobSet     = "jobset.x-k8s.io/jobset"
	FrameworkPyTorchJob = "kubeflow.org/pytorchjob"
	FrameworkTFJob      = "kubeflow.org/tfjob"
	FrameworkRayCluster = "ray.io/raycluster"
	FrameworkMPIJob     = "kubeflow.org/mpijob"
	FrameworkTrainJob   = "trainer.kubeflow.org/trainjob"
	FrameworkRayJob     = "ray.io/rayjob"
	// FrameworkLWS manages a LeaderWorkerSet's groups as pod groups: Kueue
	// turns its pod integration on with it (leaderworkerset_controller.go
	// ImplicitlyEnabledFrameworkNames), so Attach registers the pod
	// webhook too.
	FrameworkLWS = "leaderworkerset.x-k8s.io/leaderworkerset"
)

var frameworkWebhooks = map[string]string{
	FrameworkPod:        "--v1-pod",
	FrameworkJobSet:     "-jobset-x-k8s-io-v1alpha2-jobset",
	FrameworkPyTorchJob: "-kubeflow-org-v1-pytorchjob",
	FrameworkTFJob:      "-kubeflow-org-v1-tfjob",
	FrameworkRayCluster: "-ray-io-v1-raycluster",
	FrameworkMPIJob:     "-kubeflow-org-v2beta1-mpijob",
	FrameworkTrainJob:   "-trainer-kubeflow-org-v1alpha1-trainjob",
	FrameworkRayJob:     "-ray-io-v1-rayjob",
	FrameworkLWS:        "-leaderworkerset-x-k8s-io-v1-leaderworkerset",
}

func root(t testing.TB) {
	t.Helper()
	testenv.Root(t, "Kueue's manager runs in a private mount namespace (its metrics certificate path is fixed under /etc)")
	if _, err := exec.LookPath("unshare"); err != nil {
		testenv.Unmet(t, "unshare (util-linux) not found")
	}
}

// Attach starts Kueue's manager against a lab already running (e.g. the
// training-controller bed of internal/trainlab, whose controllers' CRDs
// must be installed first: Kueue sets up an integration only for a CRD it
// finds), with the given job integrations (FrameworkPod, FrameworkJobSet)
// and only their webhooks and Kueue's own registered. The manager insists
// on a metrics certificate at /etc/kueue/metrics/certs when its internal
// certificate management is off (cmd/kueue/main.go): it runs in a private
// mount namespace where an overlay on /etc adds that folder, so the
// host's /etc is not touched.
func Attach(t testing.TB, lab *schedlab.Lab, frameworks ...string) *Lab {
	t.Helper()
	bin := testenv.ToolsBin(t, "kueue", "kueue.d")
	root(t)
	if slices.Contains(frameworks, FrameworkLWS) && !slices.Contains(frameworks, FrameworkPod) {
		frameworks = append(slices.Clone(frameworks), FrameworkPod)
	}
	var suffixes []string
	for _, f := range frameworks {
		s, ok := frameworkWebhooks[f]
		if !ok {
			t.Fatalf("kueuelab: integration %q is not one the lab registers webhooks for", f)
		}
		suffixes = append(suffixes, s)
	}
	dyn, err := dynamic.NewForConfig(lab.API.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kd := filepath.Join(bin, "kueue.d")
	crds, err := filepath.Glob(filepath.Join(kd, "crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no Kueue CRDs in %s/crds (%v)", kd, err)
	}
	if err := testenv.InstallCRDs(ctx, dyn, crds...); err != nil {
		t.Fatal(err)
	}
	if err := lab.EnsureNamespace(ctx, "kueue-system", nil); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certDir := filepath.Join(dir, "webhook-certs")
	metricsDir := filepath.Join(dir, "metrics-certs")
	for _, d := range []string{certDir, metricsDir} {
		ca.WriteServing(t, d)
	}
	webhookPort, healthPort, metricsPort := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	quoted := make([]string, len(frameworks))
	for i, f := range frameworks {
		quoted[i] = strconv.Quote(f)
	}
	cfg := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: 127.0.0.1:%d
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
managedJobsNamespaceSelector:
  matchLabels:
    %s: "true"
integrations:
  frameworks: [%s]
`, healthPort, metricsPort, webhookPort, certDir, NamespaceLabel, strings.Join(quoted, ", "))
	cfgPath := filepath.Join(dir, "kueue-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	over := filepath.Join(dir, "etc-overlay")
	script := strings.Join([]string{
		"set -e",
		"mount -t tmpfs tmpfs " + over,
		"mkdir -p " + over + "/u/kueue/metrics/certs " + over + "/w",
		"cp " + metricsDir + "/tls.crt " + metricsDir + "/tls.key " + over + "/u/kueue/metrics/certs/",
		"mount -t overlay overlay -o lowerdir=/etc,upperdir=" + over + "/u,workdir=" + over + "/w /etc",
		"exec " + filepath.Join(bin, "kueue") + " --config " + cfgPath + " --feature-gates=VisibilityOnDemand=false --zap-log-level=2",
	}, "\n")
	if err := os.MkdirAll(over, 0o700); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, dir, "kueue", "unshare", "-m", "--propagation", "private", "env", "KUBECONFIG="+lab.API.Kubeconfig, "sh", "-c", script)
	if err := registerWebhooks(ctx, dyn, filepath.Join(kd, "webhook.yaml"), webhookPort, ca.PEM, suffixes); err != nil {
		t.Fatal(err)
	}
	l := &Lab{Lab: lab, Dyn: dyn, Log: filepath.Join(dir, "kueue.log")}
	wait := l.waitWebhook
	if !slices.Contains(frameworks, FrameworkPod) {
		wait = l.waitFlavorWebhook
	}
	if err := wait(ctx); err != nil {
		b, _ := os.ReadFile(l.Log)
		t.Fatalf("Kueue's webhook: %v\n--- kueue log (tail) ---\n%s", err, tailBytes(b, 6000))
	}
	return l
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// registerWebhooks creates Kueue's webhook configurations from its module,
// each webhook pointed at the loopback server by URL with the test CA, the
// configurations named kueue-mutating and kueue-validating (upstream's
// names are every kubebuilder project's). Only the webhooks of what this
// manager serves are kept: Kueue's own kinds and the integrations' (paths
// ending in one of suffixes); the others belong to integrations that are
// off, and their failurePolicy Fail would refuse those objects.
func registerWebhooks(ctx context.Context, dyn dynamic.Interface, path string, port int, caPEM []byte, suffixes []string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			if err.Error() == "EOF" {
				return nil
			}
			return err
		}
		kind, _ := m["kind"].(string)
		gvr := mutatingGVR
		switch kind {
		case webhookKinds[0]:
		case webhookKinds[1]:
			gvr = validateGVR
		default:
			continue
		}
		var keep []any
		hooks, _ := m["webhooks"].([]any)
		for _, h := range hooks {
			hook := h.(map[string]any)
			cc, _ := hook["clientConfig"].(map[string]any)
			svc, _ := cc["service"].(map[string]any)
			p, _ := svc["path"].(string)
			if !strings.Contains(p, "-kueue-x-k8s-io-") && !slices.ContainsFunc(suffixes, func(s string) bool { return strings.HasSuffix(p, s) }) {
				continue
			}
			hook["clientConfig"] = map[string]any{"url": "https://127.0.0.1:" + strconv.Itoa(port) + p, "caBundle": base64.StdEncoding.EncodeToString(caPEM)}
			if strings.HasSuffix(p, "--v1-pod") {
				hook["namespaceSelector"] = map[string]any{"matchLabels": map[string]any{NamespaceLabel: "true"}}
			}
			keep = append(keep, hook)
		}
		m["webhooks"] = keep
		m["metadata"] = map[string]any{"name": "kueue-" + strings.ToLower(strings.TrimSuffix(kind, "WebhookConfiguration"))}
		if _, err := dyn.Resource(gvr).Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("registering %s: %w", kind, err)
		}
	}
}

// waitWebhook creates a queued probe pod until Kueue's webhook answers:
// the pod comes back gated (kueue.x-k8s.io/admission) and managed.
func (l *Lab) waitWebhook(ctx context.Context) error {
	const ns = "kueue-probe"
	if err := l.EnsureNamespace(ctx, ns, map[string]string{NamespaceLabel: "true"}); err != nil {
		return err
	}
	var last error
	for i := 0; ; i++ {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("probe-%d", i), Namespace: ns, Labels: map[string]string{QueueLabel: "none"}},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{schedlab.LabelCell: "none"}, Containers: []corev1.Container{{Name: "c", Image: "registry.example.com/x:1"}}}}
		got, err := l.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err == nil {
			if Gated(got, AdmissionGate) && got.Labels[ManagedLabel] == "true" {
				return nil
			}
			last = fmt.Errorf("pod not gated by Kueue: gates %v labels %v", got.Spec.SchedulingGates, got.Labels)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(time.Second):
		}
	}
}

// waitFlavorWebhook dry-runs a ResourceFlavor until Kueue's webhook
// server answers: the flavor comes back with Kueue's resource-in-use
// finalizer (its defaulting webhook). The job integrations' webhooks are
// served by the same server, set up before it starts.
func (l *Lab) waitFlavorWebhook(ctx context.Context) error {
	rf := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": APIVersion, "kind": "ResourceFlavor", "metadata": map[string]any{"name": "kueuelab-probe"},
	}}
	var last error
	for {
		got, err := l.Dyn.Resource(FlavorGVR).Create(ctx, rf.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			if slices.Contains(got.GetFinalizers(), "kueue.x-k8s.io/resource-in-use") {
				return nil
			}
			last = fmt.Errorf("ResourceFlavor not defaulted by Kueue: finalizers %v", got.GetFinalizers())
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(time.Second):
		}
	}
}

// Gated reports whether the pod carries the scheduling gate.
func Gated(p *corev1.Pod, gate string) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == gate {
			return true
		}
	}
	return false
}

// Create creates a Kueue object from a map (apiVersion, kind, metadata, spec).
func (l *Lab) Create(ctx context.Context, gvr schema.GroupVersionResource, obj map[string]any) error {
	u := &unstructured.Unstructured{Object: obj}
	var err error
	if ns := u.GetNamespace(); ns != "" {
		_, err = l.Dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	} else {
		_, err = l.Dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return nil
}

// Queues creates, for one cell, a Topology of zone and hostname levels, a
// ResourceFlavor of the cell's GPU nodes in it, a ClusterQueue with room
// for any job and a LocalQueue "gpu" in namespace.
func (l *Lab) Queues(ctx context.Context, cell, namespace string) error {
	return l.QueuesOn(ctx, cell, namespace, map[string]string{"nvidia.com/gpu.present": "true", schedlab.LabelCell: cell})
}

// QueuesOn is Queues for the nodes of nodeLabels, the Topology, flavor
// and ClusterQueue named name.
func (l *Lab) QueuesOn(ctx context.Context, name, namespace string, nodeLabels map[string]string) error {
	flavorLabels := map[string]any{}
	for k, v := range nodeLabels {
		flavorLabels[k] = v
	}
	objs := []struct {
		gvr schema.GroupVersionResource
		obj map[string]any
	}{
		{TopologyGVR, map[string]any{"apiVersion": APIVersion, "kind": "Topology", "metadata": map[string]any{"name": name},
			"spec": map[string]any{"levels": []any{map[string]any{"nodeLabel": schedlab.LabelZone}, map[string]any{"nodeLabel": schedlab.LabelHostname}}}}},
		{FlavorGVR, map[string]any{"apiVersion": APIVersion, "kind": "ResourceFlavor", "metadata": map[string]any{"name": name},
			"spec": map[string]any{"nodeLabels": flavorLabels, "topologyName": name}}},
		{CQGVR, map[string]any{"apiVersion": APIVersion, "kind": "ClusterQueue", "metadata": map[string]any{"name": name},
			"spec": map[string]any{"namespaceSelector": map[string]any{}, "resourceGroups": []any{map[string]any{
				"coveredResources": []any{"cpu", "memory", string(schedlab.GPUResource)},
				"flavors": []any{map[string]any{"name": name, "resources": []any{
					map[string]any{"name": "cpu", "nominalQuota": "1000"},
					map[string]any{"name": "memory", "nominalQuota": "10Ti"},
					map[string]any{"name": string(schedlab.GPUResource), "nominalQuota": "1000"},
				}}},
			}}}}},
		{LQGVR, map[string]any{"apiVersion": APIVersion, "kind": "LocalQueue", "metadata": map[string]any{"name": "gpu", "namespace": namespace},
			"spec": map[string]any{"clusterQueue": name}}},
	}
	for _, o := range objs {
		if err := l.Create(ctx, o.gvr, o.obj); err != nil {
			return err
		}
	}
	return nil
}

// Workloads returns the namespace's Workloads.
func (l *Lab) Workloads(ctx context.Context, namespace string) ([]unstructured.Unstructured, error) {
	list, err := l.Dyn.Resource(WorkloadGVR).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// Admitted reports whether the Workload has condition Admitted=True.
func Admitted(wl unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		if c, _ := c.(map[string]any); c["type"] == "Admitted" && c["status"] == "True" {
			return true
		}
	}
	return false
}

// Condition returns the message of a Workload condition ("" if absent).
func Condition(wl unstructured.Unstructured, typ string) string {
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		if c, _ := c.(map[string]any); c["type"] == typ {
			s, _ := c["message"].(string)
			return fmt.Sprintf("%v: %s", c["status"], s)
		}
	}
	return ""
}
