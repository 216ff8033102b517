package gpu

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is where the kubelet serves the PodResources API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// maxPodResourcesMsg bounds a List reply; a node with hundreds of pods
// stays far below it.
const maxPodResourcesMsg = 16 << 20

// PodRef is a pod a device is allocated to.
type PodRef struct {
	Namespace, Pod string
}

// Allocations maps devices to the pods holding them. Time-slicing lets
// several pods share one device.
type Allocations struct {
	byDev map[devKey][]PodRef
	// Skipped counts device ids of GPU resources that were not understood.
	Skipped int
	// Unmapped counts GPU devices allocated through DRA that no
	// ResourceSlice maps to a UUID (slice not seen yet, no uuid attribute).
	Unmapped int
}

// Lookup returns the pods holding the sample's GPU or MIG instance.
func (a *Allocations) Lookup(s *Sample) []PodRef {
	if a == nil {
		return nil
	}
	var buf [3]devKey
	for _, k := range keysFor(s, &buf) {
		if pods := a.byDev[k]; len(pods) > 0 {
			return pods
		}
	}
	return nil
}

// Len returns the number of allocated devices.
func (a *Allocations) Len() int { return len(a.byDev) }

// ResourceFilter says which allocations are NVIDIA GPUs. Device plugin
// resources: the default nvidia.com/gpu, every nvidia.com/mig-* (MIG
// "mixed" strategy), plus Extra (renamed time-sliced resources such as
// nvidia.com/gpu.shared). DRA claim resources: those of driver
// gpu.nvidia.com plus DRADrivers, mapped to GPUs through Slices (nil:
// every DRA GPU is unmapped).
type ResourceFilter struct {
	Extra      []string
	DRADrivers []string
	Slices     DeviceUUIDs
}

// DeviceUUIDs maps a DRA device (driver, pool, device) to its GPU or MIG
// UUID; *Slices is one.
type DeviceUUIDs interface {
	DeviceUUID(driver, pool, device string) (string, bool)
}

// Match reports whether a resource name is a GPU resource.
func (f ResourceFilter) Match(name string) bool {
	return name == "nvidia.com/gpu" || strings.HasPrefix(name, "nvidia.com/mig-") || slices.Contains(f.Extra, name)
}

// BuildAllocations turns a PodResources List reply into Allocations:
// device plugin devices (ContainerResources.devices) and DRA devices
// (ContainerResources.dynamic_resources, on by default from Kubernetes
// 1.34).
func BuildAllocations(resp *podresourcesv1.ListPodResourcesResponse, filter ResourceFilter) *Allocations {
	a := &Allocations{byDev: map[devKey][]PodRef{}}
	add := func(k devKey, ref PodRef) {
		// Two containers, or two time-slice replicas, of one pod count once.
		if !slices.Contains(a.byDev[k], ref) {
			a.byDev[k] = append(a.byDev[k], ref)
		}
	}
	for _, pr := range resp.GetPodResources() {
		ref := PodRef{Namespace: pr.GetNamespace(), Pod: pr.GetName()}
		for _, c := range pr.GetContainers() {
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if !filter.isGPUDriver(cr.GetDriverName()) {
						continue
					}
					var k devKey
					uuid, ok := "", filter.Slices != nil
					if ok {
						uuid, ok = filter.Slices.DeviceUUID(cr.GetDriverName(), cr.GetPoolName(), cr.GetDeviceName())
					}
					if ok {
						k, ok = parseDeviceID(uuid)
					}
					if !ok {
						a.Unmapped++
						continue
					}
					add(k, ref)
				}
			}
			for _, d := range c.GetDevices() {
				if !filter.Match(d.GetResourceName()) {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					k, ok := parseDeviceID(id)
					if !ok {
						a.Skipped++
						continue
					}
					add(k, ref)
				}
			}
		}
	}
	return a
}

// PodResources is a client of the kubelet PodResources v1 API.
type PodResources struct {
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
	filter ResourceFilter
	// skipped counts device ids that were not understood; nil for none.
	skipped prometheus.Counter
	// Unmapped counts DRA GPUs no ResourceSlice maps to a UUID; nil for none.
	Unmapped prometheus.Counter
}

// DialPodResources prepares a client for the kubelet socket. It does not
// connect: gRPC dials on first use and redials after the kubelet restarts.
func DialPodResources(socket string, filter ResourceFilter, skipped prometheus.Counter) (*PodResources, error) {
	// A kubelet restart is routine: retry within seconds, not gRPC's
	// default of up to two minutes.
	bo := backoff.DefaultConfig
	bo.MaxDelay = 5 * time.Second
	conn, err := grpc.NewClient("unix:"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPodResourcesMsg)))
	if err != nil {
		return nil, fmt.Errorf("podresources client for %s: %w", socket, err)
	}
	return &PodResources{conn: conn, client: podresourcesv1.NewPodResourcesListerClient(conn), filter: filter, skipped: skipped}, nil
}

// Read lists the node's pods and their GPU devices.
func (p *PodResources) Read(ctx context.Context) (*Allocations, error) {
	resp, err := p.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("podresources List: %w", err)
	}
	a := BuildAllocations(resp, p.filter)
	if p.skipped != nil && a.Skipped > 0 {
		p.skipped.Add(float64(a.Skipped))
	}
	if p.Unmapped != nil && a.Unmapped > 0 {
		p.Unmapped.Add(float64(a.Unmapped))
	}
	return a, nil
}

// Close closes the connection.
func (p *PodResources) Close() error { return p.conn.Close() }
