package kube_test

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/topology"
)

// TestServicesFromAPIServer: the Service and EndpointSlice informers
// against a real kube-apiserver. The apiserver allocates the ClusterIP;
// the index places it as the one ready backend (a pod of n-b's CIDR), as
// the Service alone once a second ready endpoint comes, and the endpoint
// that is not ready never counts. Deleting the Service forgets its VIP.
func TestServicesFromAPIServer(t *testing.T) {
	c := startCluster(t)
	idx := topology.NewIndex()
	idx.UpsertNode(topology.Node{Name: "n-b", Zone: "zone-b", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}})
	log := &syncBuffer{}
	s, f, err := kube.NewServices(c.kapi, idx, 0, slog.New(slog.NewTextHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(c.ctx, f); err != nil {
		t.Fatal(err)
	}
	if !s.Up() {
		t.Fatal("not up after Run")
	}
	svc, err := c.client.CoreV1().Services("ml").Create(c.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dataset"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 8080}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr(svc.Spec.ClusterIP)
	yes, no := true, false
	slice := func(name string, ready map[string]*bool) *discoveryv1.EndpointSlice {
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "dataset"}},
			AddressType: discoveryv1.AddressTypeIPv4}
		for ip, r := range ready {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: r}})
		}
		return es
	}
	if _, err := c.client.DiscoveryV1().EndpointSlices("ml").Create(c.ctx, slice("dataset-1", map[string]*bool{"10.244.2.7": nil, "10.244.2.8": &no}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	await := func(what string, ok func(topology.Endpoint, bool) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			e, found := idx.LookupIP(vip)
			if ok(e, found) {
				return
			}
			if time.Now().After(deadline) {
				sv, vv := idx.ServiceCounts()
				t.Fatalf("%s: LookupIP(%s) = %+v, %v (index: %d services, %d VIPs); log:\n%s", what, vip, e, found, sv, vv, log)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	await("one ready backend (the other is not ready)", func(e topology.Endpoint, ok bool) bool {
		return ok && e.Node == "n-b" && e.Zone == "zone-b" && e.Service != nil && e.Service.String() == "ml/dataset"
	})
	if _, err := c.client.DiscoveryV1().EndpointSlices("ml").Create(c.ctx, slice("dataset-2", map[string]*bool{"10.244.2.9": &yes}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	await("two ready backends", func(e topology.Endpoint, ok bool) bool { return ok && e.Node == "" && e.Service != nil })
	if err := c.client.CoreV1().Services("ml").Delete(c.ctx, "dataset", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	await("Service deleted", func(e topology.Endpoint, ok bool) bool { return !ok && e.Service == nil })

	// A job's headless Service and its slice (labelled as the
	// EndpointSlice controller labels a headless Service's) place nothing
	// and are not even listed: then a ClusterIP Service, whose placement
	// says both watches have passed them.
	sv0, _ := idx.ServiceCounts()
	if _, err := c.client.CoreV1().Services("ml").Create(c.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "workers"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 23456}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	headless := slice("workers-1", map[string]*bool{"10.244.2.10": nil})
	headless.Labels = map[string]string{discoveryv1.LabelServiceName: "workers", corev1.IsHeadlessService: ""}
	if _, err := c.client.DiscoveryV1().EndpointSlices("ml").Create(c.ctx, headless, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err = c.client.CoreV1().Services("ml").Create(c.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dataset"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 8080}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip = netip.MustParseAddr(svc.Spec.ClusterIP)
	if err := c.client.DiscoveryV1().EndpointSlices("ml").DeleteCollection(c.ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=dataset"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.DiscoveryV1().EndpointSlices("ml").Create(c.ctx, slice("dataset-3", map[string]*bool{"10.244.2.11": nil}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	await("the ClusterIP Service after the headless one", func(e topology.Endpoint, ok bool) bool {
		return ok && e.Node == "n-b" && e.Service != nil && e.Service.String() == "ml/dataset"
	})
	// dataset was held already (its slices outlived it): no new name.
	if sv1, _ := idx.ServiceCounts(); sv1 != sv0 {
		t.Errorf("the index holds %d services, want %d: the headless Service or its slice was listed", sv1, sv0)
	}
	if n := s.SkippedServices.Load() + s.SkippedSlices.Load(); n != 0 {
		t.Errorf("skipped %d addresses, want 0", n)
	}
	svcs, vips := idx.ServiceCounts()
	t.Logf("index at the end: %d services (the apiserver's kubernetes Service, and dataset's slices), %d cluster IP (kubernetes')", svcs, vips)
}

// TestServiceFromBadAddresses: addresses that do not parse are counted
// and skipped; headless and FQDN objects have none.
func TestServiceFromBadAddresses(t *testing.T) {
	s, bad := kube.ServiceFrom(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "x"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.9", ClusterIPs: []string{"10.96.0.9", "fd00::zz"}}})
	if bad != 1 || len(s.ClusterIPs) != 1 || s.ClusterIPs[0] != netip.MustParseAddr("10.96.0.9") {
		t.Errorf("ServiceFrom: %+v, %d bad", s, bad)
	}
	if s, bad := kube.ServiceFrom(&corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, ClusterIPs: []string{corev1.ClusterIPNone}}}); bad != 0 || len(s.ClusterIPs) != 0 {
		t.Errorf("headless: %+v, %d bad", s, bad)
	}
	es, bad := kube.EndpointSliceFrom(&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{discoveryv1.LabelServiceName: "x"}},
		Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{"10.1.2.3", "nope"}}}})
	if bad != 1 || es.Service != "x" || len(es.Ready) != 1 {
		t.Errorf("EndpointSliceFrom: %+v, %d bad", es, bad)
	}
	if es, _ := kube.EndpointSliceFrom(&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeFQDN,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"db.example.com"}}}}); len(es.Ready) != 0 {
		t.Errorf("FQDN slice: %+v", es)
	}
}
