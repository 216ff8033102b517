package gpu

import (
	"slices"
	"sync"

	resourcev1 "k8s.io/api/resource/v1"
)

// DRADriver is the NVIDIA DRA driver's name (NVIDIA/k8s-dra-driver-gpu,
// cmd/gpu-kubelet-plugin/main.go), the driver of the ResourceSlices and
// PodResources claim resources that are GPUs.
const DRADriver = "gpu.nvidia.com"

// draDevice names one device the DRA way: driver, pool, device. The
// triplet is unique (k8s.io/kubelet podresources v1 ClaimResource).
type draDevice struct {
	driver, pool, device string
}

// Slices maps DRA devices to GPU UUIDs from the ResourceSlices the NVIDIA
// DRA driver publishes: each device carries its UUID (GPU-... for a whole
// GPU, MIG-... for a MIG device) as attribute "uuid". Safe for concurrent
// use; the discovery's ResourceSlice watch keeps it current.
type Slices struct {
	mu      sync.RWMutex
	bySlice map[string][]draDevice // slice name -> its devices
	uuids   map[draDevice]string
}

// NewSlices returns an empty index.
func NewSlices() *Slices {
	return &Slices{bySlice: map[string][]draDevice{}, uuids: map[draDevice]string{}}
}

// Upsert adds or replaces a slice's devices.
func (s *Slices) Upsert(rs *resourcev1.ResourceSlice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteLocked(rs.Name)
	driver, pool := rs.Spec.Driver, rs.Spec.Pool.Name
	var devs []draDevice
	for i := range rs.Spec.Devices {
		d := &rs.Spec.Devices[i]
		uuid := deviceUUID(driver, d.Attributes)
		if uuid == "" {
			continue
		}
		k := draDevice{driver: driver, pool: pool, device: d.Name}
		s.uuids[k] = uuid
		devs = append(devs, k)
	}
	s.bySlice[rs.Name] = devs
}

// Delete removes a slice's devices.
func (s *Slices) Delete(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteLocked(name)
}

func (s *Slices) deleteLocked(name string) {
	for _, k := range s.bySlice[name] {
		delete(s.uuids, k)
	}
	delete(s.bySlice, name)
}

// DeviceUUID returns the UUID of a DRA device.
func (s *Slices) DeviceUUID(driver, pool, device string) (string, bool) {
	if s == nil {
		return "", false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	u, ok := s.uuids[draDevice{driver, pool, device}]
	return u, ok
}

// Len returns the number of devices with a UUID.
func (s *Slices) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.uuids)
}

// deviceUUID reads attribute uuid, bare or qualified with the driver's
// domain (a bare name is in the driver's domain: resource.k8s.io/v1
// Device.Attributes).
func deviceUUID(driver string, attrs map[resourcev1.QualifiedName]resourcev1.DeviceAttribute) string {
	for _, name := range []resourcev1.QualifiedName{"uuid", resourcev1.QualifiedName(driver + "/uuid")} {
		if a, ok := attrs[name]; ok && a.StringValue != nil {
			return *a.StringValue
		}
	}
	return ""
}

// isGPUDriver reports whether claim resources of a DRA driver are GPUs.
func (f ResourceFilter) isGPUDriver(driver string) bool {
	return driver == DRADriver || slices.Contains(f.DRADrivers, driver)
}
