package probe

import (
	"context"
	"log/slog"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
)

// DefaultSelector selects the chart's exporter pods.
const DefaultSelector = "app.kubernetes.io/name=zonewatch"

// PodPeers lists the Running exporter pods that match a label selector,
// from an informer, with each node's zone from zoneOf.
type PodPeers struct {
	store  cache.Store
	synced cache.InformerSynced
	port   int
	zoneOf func(node string) string
	start  func(stop <-chan struct{})
}

// NewPodPeers watches the exporter pods selected by selector in every
// namespace. A denied list or watch is logged once at error with the rule
// to add, as the other informers' are (kube.Denials, source "probe"): until
// it is granted there are no peers and Up is false.
func NewPodPeers(client kubeapi.Interface, selector string, port int, zoneOf func(string) string, logger *slog.Logger) *PodPeers {
	inf := kubeapi.NewInformer(client, kubeapi.Pods, metav1.NamespaceAll, 0, func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	})
	// Keep only what probing needs, in a Pod still: the informer's store
	// keys objects by their namespace and name.
	_ = inf.SetTransform(func(o any) (any, error) {
		p, ok := o.(*corev1.Pod)
		if !ok {
			return o, nil
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp},
			Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName},
			Status:     corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP},
		}, nil
	})
	// Fails only on a started informer.
	_ = kube.NewDenials("probe", logger).Watch(inf, schema.GroupResource{Resource: "pods"})
	return &PodPeers{store: inf.GetStore(), synced: inf.HasSynced, port: port, zoneOf: zoneOf, start: kubeapi.Informers{inf}.Start}
}

// Up reports whether the peer list has synced
// (zonewatch_source_up{source="probe"}).
func (pp *PodPeers) Up() bool { return pp.synced() }

// Start starts the informer.
func (pp *PodPeers) Start(ctx context.Context) { pp.start(ctx.Done()) }

// Peers implements Peers.
func (pp *PodPeers) Peers() []Peer {
	var out []Peer
	for _, o := range pp.store.List() {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Spec.NodeName == "" {
			continue
		}
		out = append(out, Peer{Node: p.Spec.NodeName, Zone: pp.zoneOf(p.Spec.NodeName), Addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(pp.port)),
			Pod: p.Namespace + "/" + p.Name})
	}
	return out
}
