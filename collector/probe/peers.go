package probe

import (
	"context"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// DefaultSelector selects the chart's exporter pods.
const DefaultSelector = "app.kubernetes.io/name=zonewatch"

// exporterPod is what the peer list keeps of an exporter pod.
type exporterPod struct {
	namespace, name, node, ip string
	ready                     bool
}

// PodPeers lists the Running exporter pods that match a label selector,
// from an informer, with each node's zone from zoneOf.
type PodPeers struct {
	store  cache.Store
	port   int
	zoneOf func(node string) string
	start  func(stop <-chan struct{})
}

// NewPodPeers watches the exporter pods selected by selector in every
// namespace.
func NewPodPeers(client kubernetes.Interface, selector string, port int, zoneOf func(string) string) *PodPeers {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	}))
	inf := f.Core().V1().Pods().Informer()
	// Keep only what probing needs.
	_ = inf.SetTransform(func(o any) (any, error) {
		p, ok := o.(*corev1.Pod)
		if !ok {
			return o, nil
		}
		ready := p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil
		return &exporterPod{namespace: p.Namespace, name: p.Name, node: p.Spec.NodeName, ip: p.Status.PodIP, ready: ready}, nil
	})
	return &PodPeers{store: inf.GetStore(), port: port, zoneOf: zoneOf, start: f.Start}
}

// Start starts the informer.
func (pp *PodPeers) Start(ctx context.Context) { pp.start(ctx.Done()) }

// Peers implements Peers.
func (pp *PodPeers) Peers() []Peer {
	var out []Peer
	for _, o := range pp.store.List() {
		p, ok := o.(*exporterPod)
		if !ok || !p.ready || p.ip == "" || p.node == "" {
			continue
		}
		out = append(out, Peer{Node: p.node, Zone: pp.zoneOf(p.node), Addr: net.JoinHostPort(p.ip, strconv.Itoa(pp.port))})
	}
	return out
}
