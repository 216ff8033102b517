package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// clusterCilium is what the Cilium agents of a cluster would hold, derived
// from the cluster's objects: the ipcache (every pod address with its node
// and identity, every node address, every node's pod CIDR) and the
// identities (a pod's labels as Cilium's own label filter keeps them, with
// its namespace). Each node's view of it (nodeIPCache) gives its own
// endpoints no tunnel endpoint, as the agent does. As Cilium v1.20.2's
// node manager writes them (pkg/node/manager/manager.go, NodeUpdated): a
// node's InternalIP with no tunnel endpoint (nodeAddressHasTunnelIP: only
// with the host firewall or node encryption), a remote node's pod CIDRs as
// world entries with the node's IP as tunnel endpoint (podCIDREntries),
// none for the local node's.
type clusterCilium struct {
	mu      sync.Mutex
	entries map[netip.Addr]ciliumEntry
	cidrs   map[netip.Prefix]ciliumEntry // pod CIDRs: node and its IP
	ids     map[string]uint32            // identity labels (sorted, with namespace) -> id
	labels  map[uint32]identityLabels
	live    map[uint32]bool // identities some pod has now
}

type ciliumEntry struct {
	node     string
	nodeIP   netip.Addr
	identity uint32
}

type identityLabels struct {
	namespace string
	labels    map[string]string
}

func newClusterCilium() *clusterCilium {
	return &clusterCilium{ids: map[string]uint32{}, labels: map[uint32]identityLabels{}}
}

// ciliumIgnored is the default label filter of Cilium v1.20.2
// (pkg/labelsfilter, defaultLabelPrefixCfg): the label keys an identity
// leaves out, each pattern matched at the start of the key. Of the keys
// the job rules read it drops the completion index (also kept as an
// annotation, which identities never hold).
var ciliumIgnored = regexp.MustCompile(`^(io\.kubernetes|kubernetes\.io|statefulset\.kubernetes\.io/pod-name|apps\.kubernetes\.io/pod-index|` +
	`batch\.kubernetes\.io/job-completion-index|batch\.kubernetes\.io/controller-uid|.*beta\.kubernetes\.io|k8s\.io|pod-template-generation|` +
	`pod-template-hash|controller-revision-hash|controller-uid|annotation.*|etcd_node|topology\.kubernetes\.io)`)

// identity allocates (or finds) the identity of a pod's labels as Cilium
// derives it: the labels its default filter keeps, and the namespace.
func (c *clusterCilium) identity(ns string, podLabels map[string]string) uint32 {
	kept := map[string]string{}
	var keys []string
	for k, v := range podLabels {
		if !ciliumIgnored.MatchString(k) {
			kept[k] = v
			keys = append(keys, k+"="+v)
		}
	}
	sort.Strings(keys)
	key := ns + "|" + strings.Join(keys, ",")
	id, ok := c.ids[key]
	if !ok {
		id = uint32(100000 + len(c.ids))
		c.ids[key] = id
		c.labels[id] = identityLabels{ns, kept}
	}
	return id
}

// sync rebuilds the ipcache from the cluster's current nodes and pods.
func (c *clusterCilium) sync(nodes []corev1.Node, pods []corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = map[netip.Addr]ciliumEntry{}
	c.cidrs = map[netip.Prefix]ciliumEntry{}
	c.live = map[uint32]bool{}
	nodeIP := map[string]netip.Addr{}
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP {
				nodeIP[n.Name] = ip
				c.entries[ip] = ciliumEntry{node: n.Name, identity: 6} // remote-node
			}
		}
		if pfx, err := netip.ParsePrefix(n.Spec.PodCIDR); err == nil {
			c.cidrs[pfx] = ciliumEntry{node: n.Name, nodeIP: nodeIP[n.Name], identity: 2} // world
		}
	}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Spec.NodeName == "" || p.Status.PodIP == "" ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			continue
		}
		id := c.identity(p.Namespace, p.Labels)
		c.live[id] = true
		c.entries[ip] = ciliumEntry{node: p.Spec.NodeName, nodeIP: nodeIP[p.Spec.NodeName], identity: id}
	}
}

func (c *clusterCilium) entry(a netip.Addr) (ciliumEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[a]
	return e, ok
}

// podCIDR returns the pod CIDR entry holding a.
func (c *clusterCilium) podCIDR(a netip.Addr) (netip.Prefix, ciliumEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, e := range c.cidrs {
		if p.Contains(a) {
			return p, e, true
		}
	}
	return netip.Prefix{}, ciliumEntry{}, false
}

// Labels implements topology.Identities: an identity is known while a pod
// has it (the agents' identity cache; Cilium collects unused ones later).
func (c *clusterCilium) Labels(id uint32) (string, map[string]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.labels[id]
	if !ok || !c.live[id] {
		return "", nil, false
	}
	return l.namespace, l.labels, true
}

// nodeIPCache is one node's ipcache.
type nodeIPCache struct {
	c    *clusterCilium
	node string
}

func (n nodeIPCache) Lookup(a netip.Addr) (topology.RemoteEntry, bool) {
	e, ok := n.c.entry(a)
	if !ok {
		if p, e, ok := n.c.podCIDR(a); ok && e.node != n.node {
			return topology.RemoteEntry{NodeIP: e.nodeIP, Identity: e.identity, Bits: uint8(p.Bits())}, true
		}
		return topology.RemoteEntry{Identity: 2}, true // the world prefix, 0.0.0.0/0
	}
	out := topology.RemoteEntry{NodeIP: e.nodeIP, Identity: e.identity, Bits: 32}
	if e.node == n.node || e.identity == 6 {
		out.NodeIP = netip.Addr{} // this node's endpoints, node addresses: no tunnel endpoint
	}
	return out, true
}

// randomCluster is the test's cluster: nodes in zones, jobs of several
// controllers and pods of no job, each pod with an address of its node.
type randomCluster struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	dyn    dynamic.Interface
	r      *rand.Rand
	nodes  int
	zones  map[string]string // node -> zone label
	jobs   map[string][]*corev1.Pod
	seq    int
	nextIP map[string]int
}

func (c *randomCluster) nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

func (c *randomCluster) createNodes() {
	for i := range c.nodes {
		name := c.nodeName(i)
		c.zones[name] = fmt.Sprintf("zone-%d", i%3)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelZone: c.zones[name], kube.LabelRegion: "r1"}},
			Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.1.%d.0/24", i)}}
		created, err := c.client.CoreV1().Nodes().Create(c.ctx, n, metav1.CreateOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		addr := fmt.Sprintf("10.0.0.%d", i+1)
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
		if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
			c.t.Fatal(err)
		}
		// The node's Cilium agent: a host-network pod with the node's
		// address, through which the lean node view finds the node behind
		// a tunnel endpoint.
		agent := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "cilium-" + name, Labels: map[string]string{"k8s-app": "cilium"}},
			Spec: corev1.PodSpec{NodeName: name, HostNetwork: true, Containers: []corev1.Container{{Name: "cilium-agent", Image: "cilium"}}}}
		pod, err := c.client.CoreV1().Pods(agent.Namespace).Create(c.ctx, agent, metav1.CreateOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: addr, PodIP: addr, PodIPs: []corev1.PodIP{{IP: addr}}}
		if _, err := c.client.CoreV1().Pods(pod.Namespace).UpdateStatus(c.ctx, pod, metav1.UpdateOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *randomCluster) relabelNode() {
	name := c.nodeName(c.r.IntN(c.nodes))
	n, err := c.client.CoreV1().Nodes().Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.zones[name] = fmt.Sprintf("zone-%d", c.r.IntN(4))
	n.Labels[kube.LabelZone] = c.zones[name]
	if _, err := c.client.CoreV1().Nodes().Update(c.ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// owner creates an owner object (a custom resource, or a batch Job: a
// JobSet's, Indexed, or a RayJob's submitter) in ns, controlled by ctrl
// (nil for none), and returns a controller reference to it.
func (c *randomCluster) owner(ns, apiVersion, kind, plural, name string, labels map[string]string, ctrl *metav1.OwnerReference) *metav1.OwnerReference {
	gv, _ := schema.ParseGroupVersion(apiVersion)
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "spec": map[string]any{}}}
	obj.SetNamespace(ns)
	obj.SetName(name)
	obj.SetLabels(labels)
	if ctrl != nil {
		obj.SetOwnerReferences([]metav1.OwnerReference{*ctrl})
	}
	if kind == "Job" {
		spec := map[string]any{"template": map[string]any{"spec": map[string]any{"restartPolicy": "Never", "containers": []any{map[string]any{"name": "node", "image": "trainer"}}}}}
		if labels["jobset.sigs.k8s.io/jobset-name"] != "" {
			spec["completionMode"], spec["completions"], spec["parallelism"] = "Indexed", int64(2), int64(2)
		}
		obj.Object["spec"] = spec
	}
	created, err := c.dyn.Resource(gv.WithResource(plural)).Namespace(ns).Create(c.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create %s %s/%s: %v", kind, ns, name, err)
	}
	yes := true
	return &metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: created.GetUID(), Controller: &yes}
}

// jobPods returns the pods of a new job of a random controller, as its
// controller labels and owns them (the owner objects a top owner is
// resolved through are created first): every controller shape of the
// identity tests (topology/identity_test.go).
func (c *randomCluster) jobPods(ns string) (string, []*corev1.Pod) {
	c.seq++
	name := fmt.Sprintf("j%d", c.seq)
	var pods []*corev1.Pod
	var owner *metav1.OwnerReference
	add := func(pod string, labels map[string]string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, Labels: labels}}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		pods = append(pods, p)
	}
	yes := true
	n := 1 + c.r.IntN(4)
	switch c.r.IntN(9) {
	case 0: // PyTorchJob: a master and workers
		owner = &metav1.OwnerReference{APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob", Name: name, UID: "00000000-0000-0000-0000-000000000001", Controller: &yes}
		add(name+"-master-0", map[string]string{"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": "master",
			"training.kubeflow.org/replica-index": "0", "training.kubeflow.org/job-role": "master", "training.kubeflow.org/operator-name": "pytorchjob-controller"})
		for i := range n {
			add(fmt.Sprintf("%s-worker-%d", name, i), map[string]string{"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": "worker",
				"training.kubeflow.org/replica-index": fmt.Sprint(i), "training.kubeflow.org/operator-name": "pytorchjob-controller"})
		}
	case 1: // JobSet: its Jobs' pods carry the batch labels too
		for i := range n + 1 {
			add(fmt.Sprintf("%s-node-0-%d", name, i), map[string]string{"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "node",
				"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-name": name + "-node-0", topology.LabelCompletionIndex: fmt.Sprint(i)})
		}
	case 2: // LeaderWorkerSet: two groups
		for g := range 2 {
			for w := range n {
				add(fmt.Sprintf("%s-%d-%d", name, g, w), map[string]string{"leaderworkerset.sigs.k8s.io/name": name,
					"leaderworkerset.sigs.k8s.io/group-index": fmt.Sprint(g), "leaderworkerset.sigs.k8s.io/worker-index": fmt.Sprint(w)})
			}
		}
	case 3: // an Indexed batch Job, of one pod (no training job) or more
		for i := range n {
			add(fmt.Sprintf("%s-%d", name, i), map[string]string{"batch.kubernetes.io/job-name": name, topology.LabelCompletionIndex: fmt.Sprint(i)})
		}
	case 4: // Volcano
		add(name+"-master-0", map[string]string{"volcano.sh/job-name": name, "volcano.sh/task-spec": "master"})
		for i := range n {
			add(fmt.Sprintf("%s-worker-%d", name, i), map[string]string{"volcano.sh/job-name": name, "volcano.sh/task-spec": "worker"})
		}
	case 5: // TrainJob (Kubeflow Trainer v2): TrainJob -> JobSet -> Job -> pods
		tj := c.owner(ns, "trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs", name, nil, nil)
		js := c.owner(ns, "jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", name, nil, tj)
		owner = c.owner(ns, "batch/v1", "Job", "jobs", name+"-node-0", map[string]string{"jobset.sigs.k8s.io/jobset-name": name}, js)
		for i := range n + 1 {
			add(fmt.Sprintf("%s-node-0-%d", name, i), map[string]string{"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "node",
				"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-name": name + "-node-0", topology.LabelCompletionIndex: fmt.Sprint(i)})
		}
	case 6: // MPIJob v2 (mpi-operator v0.8.0): a launcher Job's pod, workers owned by the MPIJob
		owner = &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: name + "-launcher", UID: "00000000-0000-0000-0000-000000000002", Controller: &yes}
		add(name+"-launcher-abcde", map[string]string{"batch.kubernetes.io/job-name": name + "-launcher", "job-name": name + "-launcher",
			"training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": "launcher",
			"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/replica-index": "0"})
		owner = &metav1.OwnerReference{APIVersion: "kubeflow.org/v2beta1", Kind: "MPIJob", Name: name, UID: "00000000-0000-0000-0000-000000000003", Controller: &yes}
		for i := range n {
			add(fmt.Sprintf("%s-worker-%d", name, i), map[string]string{"training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": "worker",
				"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/replica-index": fmt.Sprint(i)})
		}
	case 7: // RayJob (KubeRay v1.6.0, as internal/trainlab's TestRealMPIAndRay sees it): its RayCluster's head and workers, and its submitter
		rj := c.owner(ns, "ray.io/v1", "RayJob", "rayjobs", name, nil, nil)
		cluster := name + "-x7k2p"
		rayJob := map[string]string{"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": name}
		owner = c.owner(ns, "ray.io/v1", "RayCluster", "rayclusters", cluster, rayJob, rj)
		add(cluster+"-head-abcde", map[string]string{"ray.io/cluster": cluster, "ray.io/node-type": "head", "ray.io/group": "headgroup", "ray.io/is-ray-node": "yes"})
		for i := range n {
			add(fmt.Sprintf("%s-gpu-worker-%d", cluster, i), map[string]string{"ray.io/cluster": cluster, "ray.io/node-type": "worker", "ray.io/group": "gpu", "ray.io/is-ray-node": "yes"})
		}
		// The originated-from labels are on the submitter's Job, not its
		// pod, which carries the Job controller's labels only.
		owner = c.owner(ns, "batch/v1", "Job", "jobs", name, rayJob, rj)
		add(name+"-klmno", map[string]string{"batch.kubernetes.io/job-name": name, "job-name": name})
	default: // a RayCluster of its own
		owner = c.owner(ns, "ray.io/v1", "RayCluster", "rayclusters", name, nil, nil)
		add(name+"-head-abcde", map[string]string{"ray.io/cluster": name, "ray.io/node-type": "head", "ray.io/group": "headgroup", "ray.io/is-ray-node": "yes"})
		for i := range n {
			add(fmt.Sprintf("%s-gpu-worker-%d", name, i), map[string]string{"ray.io/cluster": name, "ray.io/node-type": "worker", "ray.io/group": "gpu", "ray.io/is-ray-node": "yes"})
		}
	}
	return name, pods
}

// place creates a pod on a random node (or unscheduled) and runs it.
func (c *randomCluster) place(p *corev1.Pod) {
	p = p.DeepCopy()
	p.ResourceVersion, p.UID = "", ""
	p.Spec = corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}
	unscheduled := c.r.IntN(12) == 0
	if !unscheduled {
		p.Spec.NodeName = c.nodeName(c.r.IntN(c.nodes))
	}
	created, err := c.client.CoreV1().Pods(p.Namespace).Create(c.ctx, p, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	if unscheduled {
		return
	}
	node := created.Spec.NodeName
	c.nextIP[node]++
	ip := fmt.Sprintf("10.1.%s.%d", strings.TrimPrefix(node, "node-"), 1+c.nextIP[node]%250)
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if c.r.IntN(15) == 0 {
		created.Status.Phase = corev1.PodSucceeded
	}
	if _, err := c.client.CoreV1().Pods(p.Namespace).UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *randomCluster) deletePod(p *corev1.Pod) {
	err := c.client.CoreV1().Pods(p.Namespace).Delete(c.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil {
		c.t.Fatal(err)
	}
}

// churn makes one random change: a job created, deleted or one of its pods
// re-placed, a node relabelled, a pod of no job created.
func (c *randomCluster) churn() {
	names := make([]string, 0, len(c.jobs))
	for j := range c.jobs {
		names = append(names, j)
	}
	sort.Strings(names)
	switch op := c.r.IntN(10); {
	case op < 3 || len(names) < 3:
		ns := []string{"ml", "research"}[c.r.IntN(2)]
		name, pods := c.jobPods(ns)
		for _, p := range pods {
			c.place(p)
		}
		c.jobs[ns+"/"+name] = pods
	case op < 5:
		j := names[c.r.IntN(len(names))]
		for _, p := range c.jobs[j] {
			c.deletePod(p)
		}
		delete(c.jobs, j)
	case op < 8:
		pods := c.jobs[names[c.r.IntN(len(names))]]
		p := pods[c.r.IntN(len(pods))]
		c.deletePod(p)
		c.waitGone(p)
		c.place(p)
	case op < 9:
		c.relabelNode()
	default:
		c.seq++
		c.place(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: fmt.Sprintf("web-%d", c.seq), Labels: map[string]string{"app": "web"}}})
	}
}

func (c *randomCluster) waitGone(p *corev1.Pod) {
	for range 100 {
		if _, err := c.client.CoreV1().Pods(p.Namespace).Get(c.ctx, p.Name, metav1.GetOptions{}); err != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("pod %s/%s not gone", p.Namespace, p.Name)
}

// observed is everything one node's exporter exports from a view: the
// node's placements, the Hubble counters and the conntrack byte series of
// the same flows and connections, and which jobs exist.
type observed struct {
	Placements []string
	Hubble     []string
	Bytes      []string
	JobsExist  []string
}

// addrInfo is one address of the cluster, as the flows name it.
type addrInfo struct {
	ip       netip.Addr
	node     string // the pod's (or node's) node
	ns, pod  string
	workload string
	identity uint32
}

// observe runs the exporter's consumers, Hubble's aggregator and the
// conntrack poller, over idx with the same flows on node, and returns how
// many pairs of addresses it ran them for.
func observe(t *testing.T, idx *topology.Index, node string, addrs []addrInfo) (observed, int) {
	t.Helper()
	var o observed
	for _, jp := range idx.Placements(node) {
		jp.Version = 0
		o.Placements = append(o.Placements, fmt.Sprintf("%+v", jp))
	}
	agg := hubble.NewAggregator(idx, node, time.Hour, nil)
	ep := func(a addrInfo) hubble.EndpointFields {
		e := hubble.EndpointFields{Identity: a.identity, Namespace: a.ns, PodName: a.pod, Workload: a.workload}
		if a.node == node && a.pod != "" {
			e.ID = 1000 // only the observing node's endpoints have an ID
		}
		if a.node == "" {
			e.Identity = 2 // world
		}
		return e
	}
	src := conntrack.NewMemSource()
	tab := conntrack.NewMemTable(conntrack.KeySize4)
	port := uint16(1000)
	pairs := 0
	for _, a := range addrs {
		for _, b := range addrs {
			if a.ip == b.ip {
				continue
			}
			pairs++
			for _, tmpl := range []hubble.Fields{
				{Verdict: flowpb.Verdict_FORWARDED, EventType: 4, Point: flowpb.TraceObservationPoint_TO_STACK, Direction: flowpb.TrafficDirection_EGRESS},
				{Verdict: flowpb.Verdict_FORWARDED, EventType: 4, Point: flowpb.TraceObservationPoint_TO_ENDPOINT, Direction: flowpb.TrafficDirection_INGRESS},
				{Verdict: flowpb.Verdict_DROPPED, EventType: 1, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, Direction: flowpb.TrafficDirection_INGRESS},
				{Verdict: flowpb.Verdict_DROPPED, EventType: 5, DropReasonDesc: flowpb.DropReason_POLICY_DENY, Direction: flowpb.TrafficDirection_EGRESS,
					EgressDeniedBy: hubble.PolicyRef{Namespace: "ml", Name: "zone-fence"}},
			} {
				f := tmpl
				port++
				f.NodeName, f.SrcIP, f.DstIP = node, a.ip.String(), b.ip.String()
				f.SrcPort, f.DstPort, f.Proto = uint32(port), 29500, 6
				f.Src, f.Dst = ep(a), ep(b)
				agg.ObserveFields(&f)
			}
			// Cilium on node holds the opener's entry where a runs and the
			// acceptor's where b runs (combined counters).
			tu := conntrack.Tuple{Src: a.ip, Dst: b.ip, SrcPort: port, DstPort: 29500, Proto: 6}
			v := conntrack.Value{TxFlagsSeen: 0x12, RxFlagsSeen: 0x12, SrcSecID: a.identity, Packets: 10, Bytes: 1000}
			if a.node == "" {
				v.SrcSecID = 2
			}
			if a.node == node {
				tab.Put(tu, v)
			}
			if b.node == node {
				tu.Flags = 1
				tab.Put(tu, v)
			}
		}
	}
	for _, vec := range []prometheus.Collector{agg.Drops(), agg.Events(), agg.PeerDrops()} {
		o.Hubble = append(o.Hubble, collect(t, vec)...)
	}
	src.Set(conntrack.MapTCP4, tab)
	p, err := conntrack.New(src, idx, conntrack.Config{Node: node, Layout: conntrack.LayoutCombined, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1e9, 0)
	p.Poll(t0)
	for i := range tab.Len() {
		tab.SetBytes(i, uint64(5000+100*i))
	}
	p.Poll(t0.Add(10 * time.Second))
	o.Bytes = collect(t, p)
	return o, pairs
}

// seriesLabel reads one label of a series as collect renders it.
func seriesLabel(s, name string) string {
	m := regexp.MustCompile(`[{,]` + name + `=([^,}]*)`).FindStringSubmatch(s)
	if m == nil {
		return ""
	}
	return m[1]
}

// seriesJob is the namespace/name of a series' job; empty for none.
func seriesJob(s string) string {
	if j := seriesLabel(s, "job_name"); j != "" {
		return seriesLabel(s, "namespace") + "/" + j
	}
	return ""
}

// existing fills in which of the jobs named in either view's series each
// view says exist (the counters' reaping asks it).
func existing(a, b *observed, ia, ib *topology.Index) {
	var names []string
	for _, o := range []*observed{a, b} {
		for _, s := range slices.Concat(o.Hubble, o.Bytes) {
			if j := seriesJob(s); j != "" {
				names = append(names, j)
			}
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	for _, pair := range []struct {
		o   *observed
		idx *topology.Index
	}{{a, ia}, {b, ib}} {
		for _, j := range names {
			ns, name, _ := strings.Cut(j, "/")
			if pair.idx.JobExists(ns, name) {
				pair.o.JobsExist = append(pair.o.JobsExist, j)
			}
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

type updater interface {
	Update(ch chan<- prometheus.Metric) error
}

// collect renders a collector's series as sorted "name{labels} value".
func collect(t *testing.T, c any) []string {
	t.Helper()
	ch := make(chan prometheus.Metric, 1<<16)
	switch c := c.(type) {
	case updater:
		if err := c.Update(ch); err != nil {
			t.Fatal(err)
		}
	case prometheus.Collector:
		c.Collect(ch)
	}
	close(ch)
	var out []string
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		var lv []string
		for _, l := range pb.GetLabel() {
			lv = append(lv, l.GetName()+"="+l.GetValue())
		}
		v := pb.GetCounter().GetValue() + pb.GetGauge().GetValue()
		name := fqName.FindStringSubmatch(m.Desc().String())[1]
		out = append(out, fmt.Sprintf("%s{%s} %g", name, strings.Join(lv, ","), v))
	}
	sort.Strings(out)
	return out
}

// TestPerNodeViewMatchesClusterWide is the differential test of the
// per-node view (issues 34 and 45), with the chart's lean node view
// (PeerNodes: each node's agent a host-network pod with the node's
// address, as Cilium's DaemonSet runs it): on the real kube-apiserver with the
// owner kinds' CRDs, a randomized cluster (every controller shape of the
// identity tests: PyTorchJobs, MPIJobs, JobSets, TrainJobs,
// LeaderWorkerSets, Indexed Jobs, Volcano jobs, RayJobs with their
// RayCluster and submitter, RayClusters; pods of no job, some unscheduled
// or finished) goes through rounds of churn (jobs created, deleted, pods
// re-placed, nodes relabelled). Both views resolve owners. After each
// round, every node's exporter view (NewLocal: the node's pods and its
// jobs' pods, with the ipcache and the identities' labels Cilium would
// hold for that cluster, as the fence's CiliumIdentity informer gives the
// exporter, and the remote jobs it lists on demand) must export exactly
// what the cluster-wide view (NewLive) exports on that node: placements,
// Hubble drop and flow counters (with peer workloads), conntrack bytes and
// unattributed bytes, and which jobs exist (the counters' reaping), over
// every pair of addresses, jobs with no pod on the node included. A round
// waits (30 s at most) for the views to agree: the first flows of a pair
// ask for the remote jobs an identity cannot name (a RayJob's submitter,
// an Indexed Job's pod), whose feeds then list them. The last line counts
// the series compared, those of jobs with no pod on the node, the pairs
// left out (none) and the series that still differed at a round's end.
func TestPerNodeViewMatchesClusterWide(t *testing.T) {
	testenv.Integration(t)
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	client := kubernetes.NewForConfigOrDie(api.Config)
	dyn := dynamic.NewForConfigOrDie(api.Config)
	meta := metadata.NewForConfigOrDie(api.Config)
	for _, ns := range []string{"ml", "research"} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Group, version, kind, plural as cited in TestOwnerChainAgainstKubeAPIServer.
	crds := &cluster{t: t, ctx: ctx, client: client, dyn: dyn}
	crds.crd("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
	crds.crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
	crds.crd("ray.io", "v1", "RayCluster", "rayclusters")
	crds.crd("ray.io", "v1", "RayJob", "rayjobs")
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("ZONEWATCH_PERNODE_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (ZONEWATCH_PERNODE_SEED repeats it)", seed)
	c := &randomCluster{t: t, ctx: ctx, client: client, dyn: dyn, r: rand.New(rand.NewPCG(seed, 34)), nodes: 6,
		zones: map[string]string{}, jobs: map[string][]*corev1.Pod{}, nextIP: map[string]int{}}
	c.createNodes()
	for range 8 {
		c.churn()
	}

	rules := topology.DefaultRules()
	logger := slog.New(slog.DiscardHandler)
	wide := topology.NewIndex()
	l, fs, err := kube.NewLive(kubeapi.NewForConfigOrDie(api.Config), wide, rules, 0, logger)
	if err != nil {
		t.Fatal(err)
	}
	l.WithOwners(meta, kubeapi.NewForConfigOrDie(api.Config))
	if err := l.Run(ctx, fs); err != nil {
		t.Fatal(err)
	}
	cil := newClusterCilium()
	type view struct {
		node    string
		index   *topology.Index
		feed    *kube.Live
		traffic *feedTraffic
		remote  map[string]bool // selectors of feeds run for remote jobs only
	}
	var views []view
	for i := range c.nodes {
		node := c.nodeName(i)
		idx := topology.NewIndex()
		idx.SetRemote(node, nodeIPCache{cil, node}, cil, rules)
		// Each node's own client, to measure what its job feeds cost.
		tr := &feedTraffic{by: map[string]*feedCost{}}
		cfg := rest.CopyConfig(api.Config)
		cfg.WrapTransport = tr.wrap
		nodeClient := kubeapi.NewForConfigOrDie(cfg)
		// The chart's node view (peers), its nodes read again every 5 s
		// instead of 30 minutes: the rounds relabel nodes, which a
		// cluster does not (a node's topology labels change only with
		// the node), and the views must agree within a round.
		l, fs, err := kube.NewLocal(nodeClient, idx, rules, node, 0, logger, kube.PeerNodes(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		l.WithOwners(meta, kubeapi.NewForConfigOrDie(api.Config))
		if err := l.Run(ctx, fs); err != nil {
			t.Fatal(err)
		}
		views = append(views, view{node, idx, l, tr, map[string]bool{}})
	}

	// Totals over the rounds, of the series the cluster-wide view exports
	// on each node.
	var series, remoteSeries, skipped, mismatches int
	var compared atomic.Int64
	defer func() { t.Logf("%d rounds compared", compared.Load()) }()
	check := func(round int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var pods []corev1.Pod
			for _, ns := range []string{"ml", "research"} {
				pl, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				pods = append(pods, pl.Items...)
			}
			cil.sync(nodes.Items, pods)
			var addrs []addrInfo
			for _, n := range nodes.Items {
				e, _ := cil.entry(netip.MustParseAddr(n.Status.Addresses[0].Address))
				addrs = append(addrs, addrInfo{ip: netip.MustParseAddr(n.Status.Addresses[0].Address), node: n.Name, identity: e.identity})
			}
			for _, p := range pods {
				if p.Status.PodIP == "" {
					continue
				}
				ip := netip.MustParseAddr(p.Status.PodIP)
				e, _ := cil.entry(ip)
				workload := p.Labels["app"]
				for _, r := range rules {
					if v := p.Labels[r.NameLabel]; v != "" {
						workload = v
						break
					}
				}
				a := addrInfo{ip: ip, node: p.Spec.NodeName, identity: e.identity}
				if e.identity != 0 {
					// Hubble names an endpoint from what Cilium holds of it:
					// a pod that finished has no endpoint any more.
					a.ns, a.pod, a.workload = p.Namespace, p.Name, workload
				}
				addrs = append(addrs, a)
			}
			addrs = append(addrs, addrInfo{ip: netip.MustParseAddr("10.1.0.250")}, // a pod CIDR address no pod has
				addrInfo{ip: netip.MustParseAddr("10.99.0.1")}, addrInfo{ip: netip.MustParseAddr("8.8.8.8")})
			var diffs []string
			var rSeries, rRemote, rSkipped, rDiffs int
			for _, v := range views {
				want, wantPairs := observe(t, wide, v.node, addrs)
				got, gotPairs := observe(t, v.index, v.node, addrs)
				rSkipped += 2*len(addrs)*(len(addrs)-1) - wantPairs - gotPairs
				existing(&want, &got, wide, v.index)
				local := map[string]bool{}
				for _, p := range pods {
					if p.Spec.NodeName != v.node {
						continue
					}
					if e, ok := wide.LookupPod(p.Namespace, p.Name); ok && e.Job != nil {
						local[e.Job.Namespace+"/"+e.Job.Name] = true
					}
				}
				for _, s := range slices.Concat(want.Placements, want.Hubble, want.Bytes) {
					rSeries++
					if j := seriesJob(s); j != "" && !local[j] {
						rRemote++
					}
				}
				if reflect.DeepEqual(want, got) {
					continue
				}
				for _, part := range [][2][]string{{want.Placements, got.Placements}, {want.Hubble, got.Hubble}, {want.Bytes, got.Bytes}, {want.JobsExist, got.JobsExist}} {
					for i := range 2 {
						for _, s := range part[i] {
							if !slices.Contains(part[1-i], s) {
								rDiffs++
							}
						}
					}
				}
				var places strings.Builder
				for _, a := range addrs {
					we, wok := wide.LookupIP(a.ip)
					le, lok := v.index.LookupIP(a.ip)
					jobName := func(e topology.Endpoint) string {
						if e.Job == nil {
							return ""
						}
						return e.Job.Namespace + "/" + e.Job.Name + "/" + e.Job.Kind
					}
					if we.Node != le.Node || we.Zone != le.Zone || jobName(we) != jobName(le) || wok != lok {
						ent, eok := nodeIPCache{cil, v.node}.Lookup(a.ip)
						ns, labels, lok2 := cil.Labels(ent.Identity)
						fmt.Fprintf(&places, "  %s (%s/%s on %q): cluster-wide %+v %v, per-node %+v %v; ipcache %+v %v, identity %s %v %v\n", a.ip, a.ns, a.pod, a.node, we, wok, le, lok, ent, eok, ns, labels, lok2)
					}
				}
				// The first flow the two views classify apart.
				cw, cl := hubble.NewClassifier(wide, v.node), hubble.NewClassifier(v.index, v.node)
			flows:
				for _, a := range addrs {
					for _, b := range addrs {
						if a.ip == b.ip {
							continue
						}
						f := hubble.Fields{Verdict: flowpb.Verdict_DROPPED, EventType: 1, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, Direction: flowpb.TrafficDirection_INGRESS,
							NodeName: v.node, SrcIP: a.ip.String(), DstIP: b.ip.String(), SrcPort: 1, DstPort: 2, Proto: 6}
						f.Src = hubble.EndpointFields{Identity: a.identity, Namespace: a.ns, PodName: a.pod, Workload: a.workload}
						f.Dst = hubble.EndpointFields{Identity: b.identity, Namespace: b.ns, PodName: b.pod, Workload: b.workload}
						if a.node == v.node && a.pod != "" {
							f.Src.ID = 1000
						}
						if b.node == v.node && b.pod != "" {
							f.Dst.ID = 1000
						}
						rw, rl := cw.ClassifyFields(&f), cl.ClassifyFields(&f)
						if fmt.Sprint(rw.Job, rw.Peer, rw.Locality, rw.Src.Zone, rw.Dst.Zone, rw.Local) != fmt.Sprint(rl.Job, rl.Peer, rl.Locality, rl.Src.Zone, rl.Dst.Zone, rl.Local) {
							fmt.Fprintf(&places, "  flow %+v -> %+v: cluster-wide %+v / %+v job %v, per-node %+v / %+v job %v\n", a, b, rw.Src, rw.Dst, rw.Job, rl.Src, rl.Dst, rl.Job)
							break flows
						}
					}
				}
				diffs = append(diffs, fmt.Sprintf("node %s:\n%s%s", v.node, places.String(), diffObserved(want, got)))
			}
			if len(diffs) > 0 && time.Now().Before(deadline) {
				time.Sleep(500 * time.Millisecond)
				continue
			}
			series, remoteSeries, skipped, mismatches = series+rSeries, remoteSeries+rRemote, skipped+rSkipped, mismatches+rDiffs
			var nf []string
			for _, v := range views {
				n, st := v.feed.RemoteJobs()
				for _, s := range kube.RemoteOnlyFeeds(v.feed) {
					v.remote[s] = true
				}
				nf = append(nf, fmt.Sprintf("%s:%d (%d for %d remote jobs, %d started)", v.node, v.feed.Feeds(), len(kube.RemoteOnlyFeeds(v.feed)), n, st.Started))
			}
			n, p, j := wide.Counts()
			if len(diffs) > 0 {
				t.Errorf("round %d: the per-node views still differ from the cluster-wide one after 30 s (%d series):\n%s", round, rDiffs, strings.Join(diffs, "\n"))
			} else {
				compared.Add(1)
			}
			t.Logf("round %d: %d nodes, %d job pods, %d jobs, %d addresses: %d series, %d of jobs with no pod on the node, %d differ; job feeds per node %v",
				round, n, p, j, len(addrs), rSeries, rRemote, rDiffs, nf)
			return
		}
	}
	check(0)
	for round := 1; round <= 8; round++ {
		for range 6 {
			c.churn()
		}
		check(round)
	}
	// What listing remote jobs on demand costs each node: the watches its
	// job feeds opened and the bytes they read (lists and watch events),
	// all of them and those of feeds run for remote jobs only.
	var all, remote feedCost
	var most int
	for _, v := range views {
		a, r := v.traffic.sum(func(string) bool { return true }), v.traffic.sum(func(s string) bool { return v.remote[s] })
		all.add(a)
		remote.add(r)
		most = max(most, len(v.remote))
	}
	t.Logf("pernode-cost: nodes=%d job_feed_watches=%d job_feed_bytes=%d remote_feed_watches=%d remote_feed_bytes=%d remote_feeds_per_node_max=%d",
		len(views), all.watches, all.bytes, remote.watches, remote.bytes, most)
	var reads kube.PeerNodeStats
	for _, v := range views {
		st := v.feed.PeerNodeReads()
		reads.ByName += st.ByName
		reads.ByEndpoint += st.ByEndpoint
		reads.ByPodAddress += st.ByPodAddress
		reads.Found += st.Found
		reads.Unresolved += st.Unresolved
	}
	t.Logf("the lean node view, all nodes: %d node reads by name, %d host-network pod lists by tunnel endpoint, %d pod lists by address; lookups %d found, %d unresolved",
		reads.ByName, reads.ByEndpoint, reads.ByPodAddress, reads.Found, reads.Unresolved)
	if reads.ByEndpoint == 0 || reads.Found == 0 {
		t.Errorf("the per-node views found no node behind a tunnel endpoint: the test does not run the lean node view")
	}
	t.Logf("pernode-diff: series=%d remote_job_series=%d skipped=%d mismatches=%d", series, remoteSeries, skipped, mismatches)
	if skipped != 0 || mismatches != 0 {
		t.Errorf("%d pairs left out, %d series differ", skipped, mismatches)
	}
}

// feedTraffic counts, per job feed (namespace/label=value), the watches a
// node's job pod informers open and the bytes of the response bodies they
// read.
type feedTraffic struct {
	mu sync.Mutex
	by map[string]*feedCost
}

type feedCost struct {
	watches int
	bytes   int64
	n       *atomic.Int64
}

func (c *feedCost) add(o feedCost) { c.watches, c.bytes = c.watches+o.watches, c.bytes+o.bytes }

func (tr *feedTraffic) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		sel := r.URL.Query().Get("labelSelector")
		p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		if sel == "" || len(p) < 5 || p[len(p)-1] != "pods" {
			return rt.RoundTrip(r)
		}
		key := p[len(p)-2] + "/" + sel
		tr.mu.Lock()
		c := tr.by[key]
		if c == nil {
			c = &feedCost{n: &atomic.Int64{}}
			tr.by[key] = c
		}
		if w := r.URL.Query().Get("watch"); w == "true" || w == "1" {
			c.watches++
		}
		tr.mu.Unlock()
		resp, err := rt.RoundTrip(r)
		if err == nil {
			resp.Body = &countingBody{resp.Body, c.n}
		}
		return resp, err
	})
}

// sum adds up the feeds that keep says.
func (tr *feedTraffic) sum(keep func(feed string) bool) feedCost {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out feedCost
	for k, c := range tr.by {
		if keep(k) {
			out.add(feedCost{watches: c.watches, bytes: c.n.Load()})
		}
	}
	return out
}

// diffObserved lists what one view exports and the other does not.
func diffObserved(want, got observed) string {
	var b strings.Builder
	for _, part := range []struct {
		name      string
		want, got []string
	}{{"placements", want.Placements, got.Placements}, {"hubble", want.Hubble, got.Hubble}, {"bytes", want.Bytes, got.Bytes}, {"jobs existing", want.JobsExist, got.JobsExist}} {
		for _, s := range part.want {
			if !slices.Contains(part.got, s) {
				fmt.Fprintf(&b, "  %s: cluster-wide only: %s\n", part.name, s)
			}
		}
		for _, s := range part.got {
			if !slices.Contains(part.want, s) {
				fmt.Fprintf(&b, "  %s: per-node only: %s\n", part.name, s)
			}
		}
	}
	return b.String()
}
