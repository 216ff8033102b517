package topology

import (
	"net/netip"
	"slices"
)

// ServiceName names a Service. The index hands out one *ServiceName per
// Service (Endpoint.Service), never copied per lookup.
type ServiceName struct {
	Namespace, Name string
}

// String is namespace/name.
func (s *ServiceName) String() string { return s.Namespace + "/" + s.Name }

// Service is the part of a Kubernetes Service the index keeps: its
// cluster IPs (spec.clusterIPs; none for a headless Service).
type Service struct {
	Namespace, Name string
	ClusterIPs      []netip.Addr
}

// EndpointSlice is the part of an EndpointSlice the index keeps: the
// Service it belongs to (label kubernetes.io/service-name) and the
// addresses of its ready endpoints.
type EndpointSlice struct {
	Namespace, Name string
	Service         string
	Ready           []netip.Addr
}

type sliceKey struct{ namespace, name string }

type serviceRec struct {
	name   ServiceName
	vips   []netip.Addr
	slices map[sliceKey][]netip.Addr
	// backend is, per address family (familyOf), the Service's one ready
	// backend address when its EndpointSlices name exactly one of that
	// family, else invalid (none, or several: which one a connection got,
	// only the datapath knows). A dual-stack Service has one slice per
	// family, so its one pod is two addresses, one of each: a connection
	// to the IPv4 ClusterIP goes to the IPv4 one.
	backend [2]netip.Addr
}

// services is the index's view of the cluster's Services: every ClusterIP
// it has seen (the service range, as far as Services show it) and each
// Service's ready backends.
type services struct {
	byName map[podKey]*serviceRec
	vips   map[netip.Addr]*serviceRec
	// slices remembers which Service a slice fed, for its deletion and
	// for a slice that moves to another Service.
	slices map[sliceKey]string
}

func (s *services) init() {
	if s.byName == nil {
		s.byName, s.vips, s.slices = map[podKey]*serviceRec{}, map[netip.Addr]*serviceRec{}, map[sliceKey]string{}
	}
}

func (s *services) rec(namespace, name string) *serviceRec {
	k := podKey{namespace, name}
	r := s.byName[k]
	if r == nil {
		r = &serviceRec{name: ServiceName{namespace, name}, slices: map[sliceKey][]netip.Addr{}}
		s.byName[k] = r
	}
	return r
}

// drop removes a record that holds nothing any more.
func (s *services) drop(r *serviceRec) {
	if len(r.vips) == 0 && len(r.slices) == 0 {
		delete(s.byName, podKey{r.name.Namespace, r.name.Name})
	}
}

// familyOf indexes serviceRec.backend: 0 for IPv4, 1 for IPv6.
func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// resolve recomputes the Service's one backend of each family; it reports
// whether the answer changed.
func (r *serviceRec) resolve() bool {
	var one [2]netip.Addr
	var many [2]bool
	for _, addrs := range r.slices {
		for _, a := range addrs {
			f := familyOf(a)
			if !one[f].IsValid() {
				one[f] = a
			} else if a != one[f] {
				many[f] = true
			}
		}
	}
	for f := range one {
		if many[f] {
			one[f] = netip.Addr{}
		}
	}
	changed := one != r.backend
	r.backend = one
	return changed
}

// UpsertService adds or replaces a Service's cluster IPs.
func (x *Index) UpsertService(svc Service) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.svc.init()
	r := x.svc.rec(svc.Namespace, svc.Name)
	vips := make([]netip.Addr, 0, len(svc.ClusterIPs))
	for _, a := range svc.ClusterIPs {
		vips = append(vips, a.Unmap())
	}
	if slices.Equal(vips, r.vips) {
		return
	}
	for _, a := range r.vips {
		if x.svc.vips[a] == r {
			delete(x.svc.vips, a)
		}
	}
	r.vips = vips
	for _, a := range vips {
		x.svc.vips[a] = r
	}
	x.svc.drop(r)
	x.generation.Add(1)
}

// DeleteService removes a Service's cluster IPs (its slices stay until
// their own deletion arrives).
func (x *Index) DeleteService(namespace, name string) {
	x.UpsertService(Service{Namespace: namespace, Name: name})
}

// UpsertEndpointSlice adds or replaces an EndpointSlice's ready addresses.
func (x *Index) UpsertEndpointSlice(es EndpointSlice) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.svc.init()
	k := sliceKey{es.Namespace, es.Name}
	changed := false
	if old, ok := x.svc.slices[k]; ok && old != es.Service {
		changed = x.deleteSliceLocked(k) || changed
	}
	if es.Service == "" {
		if changed {
			x.generation.Add(1)
		}
		return
	}
	r := x.svc.rec(es.Namespace, es.Service)
	ready := make([]netip.Addr, 0, len(es.Ready))
	for _, a := range es.Ready {
		ready = append(ready, a.Unmap())
	}
	r.slices[k] = ready
	x.svc.slices[k] = es.Service
	if r.resolve() || changed {
		x.generation.Add(1)
	}
}

// DeleteEndpointSlice removes an EndpointSlice.
func (x *Index) DeleteEndpointSlice(namespace, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.svc.init()
	if x.deleteSliceLocked(sliceKey{namespace, name}) {
		x.generation.Add(1)
	}
}

func (x *Index) deleteSliceLocked(k sliceKey) bool {
	svc, ok := x.svc.slices[k]
	if !ok {
		return false
	}
	delete(x.svc.slices, k)
	r := x.svc.byName[podKey{k.namespace, svc}]
	if r == nil {
		return false
	}
	delete(r.slices, k)
	changed := r.resolve()
	x.svc.drop(r)
	return changed
}

// lookupServiceLocked places a Service's cluster IP: as its one ready
// backend when the EndpointSlices name exactly one (the datapath can only
// have sent the connection there), else as the Service alone, in no zone.
// Either way the endpoint names the Service.
func (x *Index) lookupServiceLocked(a netip.Addr) (Endpoint, bool) {
	r := x.svc.vips[a]
	if r == nil {
		return Endpoint{Zone: UnknownZone}, false
	}
	if b := r.backend[familyOf(a)]; b.IsValid() {
		if e, ok := x.lookupAddrLocked(b); ok {
			e.Service = &r.name
			return e, true
		}
	}
	return Endpoint{Zone: UnknownZone, Service: &r.name}, true
}

// ServiceCounts returns the number of Services and cluster IPs held.
func (x *Index) ServiceCounts() (services, vips int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.svc.byName), len(x.svc.vips)
}
