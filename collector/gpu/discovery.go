package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
)

// DefaultDCGMExporterSelectors select dcgm-exporter pods as the NVIDIA GPU
// Operator labels them (assets/state-dcgm-exporter DaemonSet, v23.9 to
// v26.7: app=nvidia-dcgm-exporter) and as the dcgm-exporter Helm chart does
// (deployment/templates/_helpers.tpl: app.kubernetes.io/name=dcgm-exporter).
var DefaultDCGMExporterSelectors = []string{"app=nvidia-dcgm-exporter", "app.kubernetes.io/name=dcgm-exporter"}

// DefaultDCGMExporterPort is dcgm-exporter's listen port (DCGM_EXPORTER_LISTEN
// ":9400" in both), used when the pod names no port "metrics".
const DefaultDCGMExporterPort = 9400

// DiscoveryOptions configure a Discovery.
type DiscoveryOptions struct {
	// Node is this exporter's node; required.
	Node string
	// Selectors are label selectors for dcgm-exporter pods, any of which
	// matches; nil takes DefaultDCGMExporterSelectors.
	Selectors []string
	// Port is used when a matching pod has no container port "metrics";
	// 0 takes DefaultDCGMExporterPort.
	Port int
	// Resources says which extended resources are GPUs (Extra).
	Resources ResourceFilter
	// Slices, when set, is kept current from this node's ResourceSlices
	// (served from Kubernetes 1.34; skipped where the API has none).
	Slices *Slices
	Logger *slog.Logger
}

// Discovery watches this node through the API: its pods (any namespace,
// field selector spec.nodeName), the node object, and its DRA
// ResourceSlices. From them it knows
//   - where this node's dcgm-exporter listens (a Running pod matching the
//     selectors: its pod IP and metrics port), following restarts and IP
//     changes;
//   - whether the node has GPUs at all (capacity or allocatable of a GPU
//     resource, a GPU-requesting pod bound to it, or a DRA GPU slice), so
//     that a GPU node whose GPUs cannot be read is visible and a CPU node
//     stays silent;
//   - which pods on the node are finished or terminating, which keep no
//     GPUs in the join.
type Discovery struct {
	opts      DiscoveryOptions
	selectors []klabels.Selector
	logger    *slog.Logger
	informers kubeapi.Informers
	synced    []cache.InformerSynced

	mu       sync.Mutex
	pods     map[PodRef]*nodePod
	capacity string         // GPU resource in node capacity/allocatable, "" if none
	draGPUs  map[string]int // slice name -> GPU devices
	changed  chan struct{}
	// denied logs a missing RBAC rule once, loud; refused is closed then.
	denied      *kube.Denials
	refused     chan struct{}
	refusedOnce sync.Once
}

// nodePod is what discovery keeps of a pod on this node.
type nodePod struct {
	namespace, name string
	exporter        bool // matches a dcgm-exporter selector
	ip              string
	port            int
	running, ready  bool
	gone            bool   // finished (Succeeded, Failed) or terminating
	gpuResource     string // a GPU resource it requests, "" if none
	created         metav1.Time
}

// DCGMExporterPod is a dcgm-exporter discovery found.
type DCGMExporterPod struct {
	Namespace, Name string
	URL             string
}

// NewDiscovery prepares the informers; Run starts them.
func NewDiscovery(client kubeapi.Interface, o DiscoveryOptions) (*Discovery, error) {
	if o.Node == "" {
		return nil, fmt.Errorf("gpu discovery needs the node name")
	}
	if o.Selectors == nil {
		o.Selectors = DefaultDCGMExporterSelectors
	}
	if o.Port == 0 {
		o.Port = DefaultDCGMExporterPort
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Discovery{opts: o, logger: o.Logger, pods: map[PodRef]*nodePod{}, draGPUs: map[string]int{}, changed: make(chan struct{}, 1),
		denied: kube.NewDenials("gpu", o.Logger), refused: make(chan struct{})}
	for _, s := range o.Selectors {
		sel, err := klabels.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("dcgm-exporter selector %q: %w", s, err)
		}
		d.selectors = append(d.selectors, sel)
	}

	pi := kubeapi.NewInformer(client, kubeapi.Pods, metav1.NamespaceAll, 0, func(lo *metav1.ListOptions) {
		lo.FieldSelector = "spec.nodeName=" + o.Node
	})
	if err := pi.SetTransform(stripNodePod); err != nil {
		return nil, err
	}
	if err := d.watchDenied(pi, corev1.Resource("pods")); err != nil {
		return nil, err
	}
	if _, err := pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    d.podChanged,
		UpdateFunc: func(_, o any) { d.podChanged(o) },
		DeleteFunc: d.podDeleted,
	}); err != nil {
		return nil, err
	}
	d.informers = append(d.informers, pi)
	d.synced = append(d.synced, pi.HasSynced)

	ni := kubeapi.NewInformer(client, kubeapi.Nodes, "", 0, func(lo *metav1.ListOptions) {
		lo.FieldSelector = "metadata.name=" + o.Node
	})
	if err := ni.SetTransform(stripGPUNode(o.Resources)); err != nil {
		return nil, err
	}
	if err := d.watchDenied(ni, corev1.Resource("nodes")); err != nil {
		return nil, err
	}
	if _, err := ni.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    d.nodeChanged,
		UpdateFunc: func(_, o any) { d.nodeChanged(o) },
		DeleteFunc: func(any) { d.setCapacity("") },
	}); err != nil {
		return nil, err
	}
	d.informers = append(d.informers, ni)
	d.synced = append(d.synced, ni.HasSynced)

	if servesResourceSlices(client) {
		ri := kubeapi.NewInformer(client, kubeapi.ResourceSlices, "", 0, func(lo *metav1.ListOptions) {
			lo.FieldSelector = resourcev1.ResourceSliceSelectorNodeName + "=" + o.Node
		})
		if err := d.watchDenied(ri, resourcev1.Resource("resourceslices")); err != nil {
			return nil, err
		}
		if _, err := ri.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    d.sliceChanged,
			UpdateFunc: func(_, o any) { d.sliceChanged(o) },
			DeleteFunc: d.sliceDeleted,
		}); err != nil {
			return nil, err
		}
		d.informers = append(d.informers, ri)
		d.synced = append(d.synced, ri.HasSynced)
	} else {
		o.Logger.Debug("the API serves no resource.k8s.io/v1 ResourceSlices: DRA GPUs are not mapped")
	}
	return d, nil
}

// servesResourceSlices reports whether the API has resource.k8s.io/v1
// resourceslices (GA in Kubernetes 1.34); watching a missing resource
// would log an error on every retry.
func servesResourceSlices(client kubeapi.Interface) bool {
	rl, err := client.ServerResourcesForGroupVersion(resourcev1.SchemeGroupVersion.String())
	if err != nil {
		return false
	}
	for _, r := range rl.APIResources {
		if r.Name == "resourceslices" {
			return true
		}
	}
	return false
}

// Run starts the informers and returns once they have synced (false when
// ctx ended first); they keep running until ctx ends.
func (d *Discovery) Run(ctx context.Context) bool {
	d.informers.Start(ctx.Done())
	return cache.WaitForCacheSync(ctx.Done(), d.synced...)
}

// watchDenied makes a 403 on inf loud (kube.Denials: one error line with
// the ClusterRole rule to add) and closes Refused.
func (d *Discovery) watchDenied(inf cache.SharedIndexInformer, gr schema.GroupResource) error {
	return inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if !d.denied.Note(gr, err) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
			return
		}
		d.refusedOnce.Do(func() { close(d.refused) })
	})
}

// Refused is closed when the API first refused one of discovery's lists or
// watches (RBAC): this node's GPUs cannot be found until the rule is
// granted, and the GPU source is down rather than absent.
func (d *Discovery) Refused() <-chan struct{} { return d.refused }

// Up reports whether discovery's informers have synced: the GPU source's
// zonewatch_source_up while discovery is refused.
func (d *Discovery) Up() bool {
	for _, s := range d.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Changed is signalled (without blocking the watch) whenever the
// dcgm-exporter endpoint or the node's GPU presence may have changed.
func (d *Discovery) Changed() <-chan struct{} { return d.changed }

func (d *Discovery) notify() {
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

// stripNodePod keeps what discovery reads of a pod; a node holds at most a
// few hundred pods, but their specs can be large.
func stripNodePod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p.ManagedFields = nil
	p.Annotations = nil
	p.Spec.Volumes = nil
	for _, cs := range [][]corev1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for i := range cs {
			c := &cs[i]
			c.Env, c.EnvFrom, c.Command, c.Args, c.VolumeMounts = nil, nil, nil, nil, nil
			c.LivenessProbe, c.ReadinessProbe, c.StartupProbe = nil, nil, nil
		}
	}
	p.Status.ContainerStatuses, p.Status.InitContainerStatuses = nil, nil
	return p, nil
}

// stripGPUNode keeps a node's name and its GPU resources.
func stripGPUNode(f ResourceFilter) func(any) (any, error) {
	return func(obj any) (any, error) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return obj, nil
		}
		keep := func(l corev1.ResourceList) corev1.ResourceList {
			out := corev1.ResourceList{}
			for name, q := range l {
				if f.Match(string(name)) {
					out[name] = q
				}
			}
			return out
		}
		return &corev1.Node{
			TypeMeta:   n.TypeMeta,
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion},
			Status:     corev1.NodeStatus{Capacity: keep(n.Status.Capacity), Allocatable: keep(n.Status.Allocatable)},
		}, nil
	}
}

func (d *Discovery) podChanged(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	np := &nodePod{
		namespace: p.Namespace, name: p.Name, ip: p.Status.PodIP, created: p.CreationTimestamp,
		running:     p.Status.Phase == corev1.PodRunning,
		gone:        p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil,
		gpuResource: gpuRequest(p, d.opts.Resources),
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			np.ready = true
		}
	}
	set := klabels.Set(p.Labels)
	for _, s := range d.selectors {
		if s.Matches(set) {
			np.exporter = true
			np.port = metricsPort(p, d.opts.Port)
			break
		}
	}
	d.mu.Lock()
	d.pods[PodRef{p.Namespace, p.Name}] = np
	d.mu.Unlock()
	d.notify()
}

func (d *Discovery) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	d.mu.Lock()
	delete(d.pods, PodRef{p.Namespace, p.Name})
	d.mu.Unlock()
	d.notify()
}

func (d *Discovery) nodeChanged(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	d.setCapacity(gpuResourceOf(n.Status.Capacity, n.Status.Allocatable))
}

func (d *Discovery) setCapacity(res string) {
	d.mu.Lock()
	d.capacity = res
	d.mu.Unlock()
	d.notify()
}

func (d *Discovery) sliceChanged(obj any) {
	rs, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return
	}
	gpus := 0
	if d.opts.Resources.isGPUDriver(rs.Spec.Driver) {
		gpus = len(rs.Spec.Devices)
		if d.opts.Slices != nil {
			d.opts.Slices.Upsert(rs)
		}
	}
	d.mu.Lock()
	d.draGPUs[rs.Name] = gpus
	d.mu.Unlock()
	d.notify()
}

func (d *Discovery) sliceDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	rs, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return
	}
	if d.opts.Slices != nil {
		d.opts.Slices.Delete(rs.Name)
	}
	d.mu.Lock()
	delete(d.draGPUs, rs.Name)
	d.mu.Unlock()
	d.notify()
}

// gpuResourceOf names a GPU resource with a positive quantity.
func gpuResourceOf(lists ...corev1.ResourceList) string {
	for _, l := range lists {
		names := make([]string, 0, len(l))
		for name, q := range l {
			if q.Sign() > 0 {
				names = append(names, string(name)+"="+q.String())
			}
		}
		if len(names) > 0 {
			sort.Strings(names)
			return names[0]
		}
	}
	return ""
}

// gpuRequest names a GPU resource a pod's containers request or limit.
func gpuRequest(p *corev1.Pod, f ResourceFilter) string {
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			for _, l := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for name, q := range l {
					if f.Match(string(name)) && q.Cmp(resource.Quantity{}) > 0 {
						return string(name)
					}
				}
			}
		}
	}
	return ""
}

// metricsPort is the container port named "metrics" (both the GPU
// Operator's and the chart's dcgm-exporter name it so), else def.
func metricsPort(p *corev1.Pod, def int) int {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == "metrics" && cp.ContainerPort > 0 {
				return int(cp.ContainerPort)
			}
		}
	}
	return def
}

// DCGMExporter returns this node's dcgm-exporter: among the Running,
// not terminating pods that match, a ready one before one that is not yet,
// then the newest. ok is false when there is none.
func (d *Discovery) DCGMExporter() (DCGMExporterPod, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best *nodePod
	for _, p := range d.pods {
		if !p.exporter || !p.running || p.gone || p.ip == "" {
			continue
		}
		if best == nil || p.ready && !best.ready ||
			p.ready == best.ready && (best.created.Before(&p.created) || best.created.Equal(&p.created) && p.name > best.name) {
			best = p
		}
	}
	if best == nil {
		return DCGMExporterPod{}, false
	}
	url := "http://" + net.JoinHostPort(best.ip, strconv.Itoa(best.port)) + "/metrics"
	return DCGMExporterPod{Namespace: best.namespace, Name: best.name, URL: url}, true
}

// GPUNode reports whether the API says this node has GPUs, and why.
func (d *Discovery) GPUNode() (bool, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.capacity != "" {
		return true, "node capacity " + d.capacity
	}
	keys := make([]string, 0, len(d.draGPUs))
	for k, n := range d.draGPUs {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		sort.Strings(keys)
		return true, "DRA ResourceSlice " + keys[0]
	}
	var pods []string
	for k, p := range d.pods {
		if p.gpuResource != "" && !p.gone {
			pods = append(pods, k.Namespace+"/"+k.Pod+" requests "+p.gpuResource)
		}
	}
	if len(pods) > 0 {
		sort.Strings(pods)
		return true, "pod " + pods[0]
	}
	return false, ""
}

// PodGone reports whether a pod on this node is finished or terminating:
// kubelets before 1.34 still list such pods with their devices
// (kubernetes/kubernetes#119423, #132020), and they must keep no GPU.
func (d *Discovery) PodGone(namespace, name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pods[PodRef{namespace, name}]
	return p != nil && p.gone
}

// Selectors returns the dcgm-exporter selectors, for messages.
func (d *Discovery) Selectors() string { return strings.Join(d.opts.Selectors, " or ") }

// discoveredSource reads the dcgm-exporter page of whichever pod discovery
// currently names; the URL follows the pod's restarts and IP changes.
type discoveredSource struct {
	d    *Discovery
	opts Options
	mu   sync.Mutex
	url  string
	src  *DCGMExporter
}

// NewDiscoveredDCGMExporter returns a Source reading the dcgm-exporter that
// d finds on this node. Without one, Read fails saying what to change.
func NewDiscoveredDCGMExporter(d *Discovery, o Options) Source {
	return &discoveredSource{d: d, opts: o}
}

func (s *discoveredSource) Read(ctx context.Context) ([]Sample, error) {
	pod, ok := s.d.DCGMExporter()
	if !ok {
		return nil, fmt.Errorf("no Running dcgm-exporter pod on node %s (pods labelled %s, any namespace): install the NVIDIA GPU Operator or the dcgm-exporter chart, set --gpu.dcgm-exporter-selector to its pod labels, or --gpu.dcgm-exporter-url to its page",
			s.d.opts.Node, s.d.Selectors())
	}
	s.mu.Lock()
	if s.src == nil || s.url != pod.URL {
		s.url, s.src = pod.URL, NewDCGMExporter(pod.URL, s.opts.Skipped)
	}
	src := s.src
	s.mu.Unlock()
	ss, err := src.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("dcgm-exporter pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return ss, nil
}

// ReadResources are the API resources discovery lists and watches besides
// pods and nodes (the chart's ClusterRole grants list and watch on them).
var ReadResources = []schema.GroupVersionResource{resourcev1.SchemeGroupVersion.WithResource("resourceslices")}
