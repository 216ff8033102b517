package sim

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// GPUResource is the extended resource NVIDIA's device plugin advertises.
const GPUResource = "nvidia.com/gpu"

// PodResourcesServer is a fake kubelet PodResources v1 server on a unix
// socket. Device ids are what the NVIDIA device plugin reports with its
// default id strategy: the GPU UUID.
type PodResourcesServer struct {
	podresourcesv1.UnimplementedPodResourcesListerServer

	mu          sync.Mutex
	pods        []*podresourcesv1.PodResources
	allocatable []*podresourcesv1.ContainerDevices

	srv    *grpc.Server
	socket string
	done   chan struct{}
}

// PodResourcesOf renders what the kubelet of node reports ("" for every
// node, as one kubelet serving the whole simulated cluster): every pod on
// it, with its GPUs, and the node's allocatable GPUs.
func PodResourcesOf(s *Scenario, node string) (pods []*podresourcesv1.PodResources, allocatable []*podresourcesv1.ContainerDevices) {
	for _, p := range s.AllPods() {
		if node != "" && p.Node != node {
			continue
		}
		c := &podresourcesv1.ContainerResources{Name: "main"}
		if len(p.GPUs) > 0 {
			c.Devices = []*podresourcesv1.ContainerDevices{gpuDevices(p.GPUs)}
		}
		pods = append(pods, &podresourcesv1.PodResources{Name: p.Name, Namespace: p.Namespace, Containers: []*podresourcesv1.ContainerResources{c}})
	}
	var all []string
	for _, n := range s.Nodes {
		if node != "" && n.Name != node {
			continue
		}
		for _, g := range n.GPUs {
			all = append(all, g.UUID)
		}
	}
	if len(all) > 0 {
		allocatable = []*podresourcesv1.ContainerDevices{gpuDevices(all)}
	}
	return pods, allocatable
}

func gpuDevices(ids []string) *podresourcesv1.ContainerDevices {
	return &podresourcesv1.ContainerDevices{
		ResourceName: GPUResource,
		DeviceIds:    append([]string(nil), ids...),
		Topology:     &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: 0}}},
	}
}

// StartPodResources serves the scenario's pods for node ("" for all) on
// a unix socket at path until Close.
func StartPodResources(s *Scenario, node, path string) (*PodResourcesServer, error) {
	p := &PodResourcesServer{}
	p.pods, p.allocatable = PodResourcesOf(s, node)
	return p, p.listen(path)
}

func (p *PodResourcesServer) listen(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("fake podresources: listening on %s: %w", path, err)
	}
	p.srv = grpc.NewServer()
	p.socket = path
	p.done = make(chan struct{})
	podresourcesv1.RegisterPodResourcesListerServer(p.srv, p)
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(lis)
	}()
	return nil
}

// SetPods replaces what List reports (tests: MIG, index and time-slicing
// device ids).
func (p *PodResourcesServer) SetPods(pods []*podresourcesv1.PodResources) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods = pods
}

// Socket returns the socket path.
func (p *PodResourcesServer) Socket() string { return p.socket }

// Close stops serving and removes the socket: clients see a dead socket.
func (p *PodResourcesServer) Close() {
	p.srv.Stop()
	<-p.done
	_ = os.Remove(p.socket)
}

// List implements the PodResources API.
func (p *PodResourcesServer) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &podresourcesv1.ListPodResourcesResponse{PodResources: p.pods}, nil
}

// GetAllocatableResources implements the PodResources API.
func (p *PodResourcesServer) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &podresourcesv1.AllocatableResourcesResponse{Devices: p.allocatable}, nil
}

// Get implements the PodResources API (kubelet 1.27+).
func (p *PodResourcesServer) Get(_ context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.pods {
		if pr.GetNamespace() == req.GetPodNamespace() && pr.GetName() == req.GetPodName() {
			return &podresourcesv1.GetPodResourcesResponse{PodResources: pr}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s/%s not found", req.GetPodNamespace(), req.GetPodName())
}
