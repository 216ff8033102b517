package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/topology"
)

// Services feeds the index the cluster's Services (their cluster IPs) and
// EndpointSlices (their ready addresses): where a datapath leaves a
// connection's VIP in place (kube-proxy DNATs after Cilium's conntrack and
// Hubble see the packet), the VIP is placed as the Service's one ready
// backend, or counted as Service traffic (topology/services.go,
// docs/conntrack.md). Both informers keep only those fields.
type Services struct {
	index    *topology.Index
	logger   *slog.Logger
	synced   []cache.InformerSynced
	isSynced atomic.Bool
	denied   *Denials
	// SkippedServices and SkippedSlices count the addresses of Services
	// (cluster IPs) and EndpointSlices (ready endpoints) that do not parse:
	// skipped, never placed (zonewatch_kube_addresses_skipped_total).
	SkippedServices, SkippedSlices atomic.Uint64
}

// ServiceResources are what the Service informers list and watch (the
// chart's ClusterRole grants them; deploy/chart_test.go checks it).
var ServiceResources = []schema.GroupResource{{Resource: "services"}, {Group: "discovery.k8s.io", Resource: "endpointslices"}}

// CachedService is what the Service informer keeps of a Service.
type CachedService struct {
	topology.Service
	ResourceVersion string
}

// GetObjectMeta gives the informer what it keys and orders by.
func (c *CachedService) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, ResourceVersion: c.ResourceVersion}
}

// CachedEndpointSlice is what the EndpointSlice informer keeps.
type CachedEndpointSlice struct {
	topology.EndpointSlice
	ResourceVersion string
}

// GetObjectMeta gives the informer what it keys and orders by.
func (c *CachedEndpointSlice) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, ResourceVersion: c.ResourceVersion}
}

// The Service and EndpointSlice informers' selectors (NewServices).
var (
	serviceFields = fields.AndSelectors(fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone),
		fields.OneTermNotEqualSelector("spec.type", string(corev1.ServiceTypeExternalName))).String()
	sliceLabels = "!" + corev1.IsHeadlessService
)

// NewServices prepares the Service and EndpointSlice informers; Run
// starts them.
func NewServices(client kubeapi.Interface, index *topology.Index, resync time.Duration, logger *slog.Logger) (*Services, kubeapi.Informers, error) {
	s := &Services{index: index, logger: logger, denied: NewDenials("kubernetes", logger)}
	// Only what can place an address: Services with a cluster IP (not
	// headless, not ExternalName: a job's headless Service has none) and
	// the EndpointSlices of such Services (the EndpointSlice controller
	// labels a headless Service's slices service.kubernetes.io/headless,
	// as kube-proxy selects them), so that what an exporter lists and
	// watches does not grow with the jobs' headless Services.
	si := kubeapi.NewInformer(client, kubeapi.Services, metav1.NamespaceAll, resync, func(o *metav1.ListOptions) { o.FieldSelector = serviceFields })
	if err := si.SetTransform(s.stripService); err != nil {
		return nil, nil, fmt.Errorf("service informer transform: %w", err)
	}
	if err := s.denied.Watch(si, ServiceResources[0]); err != nil {
		return nil, nil, fmt.Errorf("service informer error handler: %w", err)
	}
	reg, err := si.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.service(o) },
		UpdateFunc: func(_, o any) { s.service(o) },
		DeleteFunc: func(o any) {
			if c, ok := tombstone(o).(*CachedService); ok {
				index.DeleteService(c.Namespace, c.Name)
			}
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("service informer handler: %w", err)
	}
	s.synced = append(s.synced, reg.HasSynced)
	ei := kubeapi.NewInformer(client, kubeapi.EndpointSlices, metav1.NamespaceAll, resync, func(o *metav1.ListOptions) { o.LabelSelector = sliceLabels })
	if err := ei.SetTransform(s.stripSlice); err != nil {
		return nil, nil, fmt.Errorf("endpointslice informer transform: %w", err)
	}
	if err := s.denied.Watch(ei, ServiceResources[1]); err != nil {
		return nil, nil, fmt.Errorf("endpointslice informer error handler: %w", err)
	}
	reg, err = ei.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.slice(o) },
		UpdateFunc: func(_, o any) { s.slice(o) },
		DeleteFunc: func(o any) {
			if c, ok := tombstone(o).(*CachedEndpointSlice); ok {
				index.DeleteEndpointSlice(c.Namespace, c.Name)
			}
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("endpointslice informer handler: %w", err)
	}
	s.synced = append(s.synced, reg.HasSynced)
	return s, kubeapi.Informers{si, ei}, nil
}

// Run starts the informers and waits for their first sync (or ctx).
func (s *Services) Run(ctx context.Context, f kubeapi.Informers) error {
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return fmt.Errorf("waiting for service and endpointslice informers to sync: %w", ctx.Err())
	}
	s.isSynced.Store(true)
	svcs, vips := s.index.ServiceCounts()
	s.logger.Info("service informers synced", "services", svcs, "cluster_ips", vips)
	return nil
}

// Up reports whether both informers have synced.
func (s *Services) Up() bool {
	if !s.isSynced.Load() {
		return false
	}
	for _, f := range s.synced {
		if !f() {
			return false
		}
	}
	return true
}

func (s *Services) service(o any) {
	if c, ok := o.(*CachedService); ok {
		s.index.UpsertService(c.Service)
	}
}

func (s *Services) slice(o any) {
	if c, ok := o.(*CachedEndpointSlice); ok {
		s.index.UpsertEndpointSlice(c.EndpointSlice)
	}
}

// stripService keeps a Service's name and cluster IPs (none for a
// headless Service, "None").
func (s *Services) stripService(obj any) (any, error) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	c, bad := ServiceFrom(svc)
	if bad > 0 {
		s.SkippedServices.Add(uint64(bad))
	}
	return &CachedService{Service: c, ResourceVersion: svc.ResourceVersion}, nil
}

// stripSlice keeps an EndpointSlice's Service and ready addresses.
func (s *Services) stripSlice(obj any) (any, error) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	c, bad := EndpointSliceFrom(es)
	if bad > 0 {
		s.SkippedSlices.Add(uint64(bad))
	}
	return &CachedEndpointSlice{EndpointSlice: c, ResourceVersion: es.ResourceVersion}, nil
}

// ServiceFrom converts a Service: its cluster IPs (spec.clusterIPs, else
// spec.clusterIP), and how many did not parse. ExternalName and headless
// Services have none.
func ServiceFrom(svc *corev1.Service) (topology.Service, int) {
	out := topology.Service{Namespace: svc.Namespace, Name: svc.Name}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	bad := 0
	for _, s := range ips {
		if s == "" || s == corev1.ClusterIPNone {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			bad++
			continue
		}
		out.ClusterIPs = append(out.ClusterIPs, a)
	}
	return out, bad
}

// EndpointSliceFrom converts an EndpointSlice: its Service (label
// kubernetes.io/service-name; empty for a slice of no Service) and the
// addresses of its ready endpoints (conditions.ready unset counts as
// ready, as the API says), and how many addresses did not parse. FQDN
// slices have no addresses to place.
func EndpointSliceFrom(es *discoveryv1.EndpointSlice) (topology.EndpointSlice, int) {
	out := topology.EndpointSlice{Namespace: es.Namespace, Name: es.Name, Service: es.Labels[discoveryv1.LabelServiceName]}
	if es.AddressType == discoveryv1.AddressTypeFQDN {
		return out, 0
	}
	bad := 0
	for _, e := range es.Endpoints {
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			continue
		}
		for _, s := range e.Addresses {
			a, err := netip.ParseAddr(s)
			if err != nil {
				bad++
				continue
			}
			out.Ready = append(out.Ready, a)
		}
	}
	return out, bad
}
