package main

import (
	"context"
	"time"

	"github.com/cilium/ebpf"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/collector/fence"
	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/collector/ipcache"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/collector/probe"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
)

// inputs are the systems the exporter reads. They are built once, from the
// flags on a real cluster (each part's input method and kubeClient) or by
// simulate, and every part reads them the same way: no part knows which.
type inputs struct {
	kube kubeapi.Interface
	// meta reads owner objects' metadata (top-owner resolution); nil: the
	// pods' own owner references only.
	meta metadata.Interface
	// dyn reads Cilium's policies and identities (fence.go); nil: the
	// fence of a default-deny drop is not named.
	dyn dynamic.Interface
	// fences is the fence part's policy set, which the hubble part names
	// default-deny drops from; nil when off.
	fences *fence.Set
	// identities names remote pods' jobs in the per-node view from the
	// fence part's identities (set by startKube, filled by the fence part).
	identities *fenceIdentities
	// hubble is the Observer's address and TLS; the part adds the rest.
	hubble hubble.Config
	gpu    gpuInput
	// loadPin opens a pinned map read-only for the BPF sources: the
	// confined child's opener (confine.go); nil opens it in this process.
	loadPin func(path string) (*ebpf.Map, error)
	// conntrack opens Cilium's global CT maps.
	conntrack conntrack.Source
	// ipcache opens the node's Cilium ipcache; nil: a DaemonSet exporter
	// watches every job pod (--kube.pod-view=cluster).
	ipcache         ipcache.Source
	ipcacheInterval time.Duration
	// localOptions are the per-node view's (--kube.node-view).
	localOptions []kube.LocalOption
	// noServices: no Service and EndpointSlice informers
	// (--no-kube.services.enabled).
	noServices bool
	// probe says whom the prober measures; zero: this node's exporter
	// probing the exporter pods the API lists.
	probe probeInput
}

// probeInput is what the probe part measures from and to.
type probeInput struct {
	// node measures; empty: --node-name.
	node string
	// peers lists the exporters to probe; nil: the exporter pods by label.
	peers probe.Peers
}

// gpuInput is how the GPU part finds its source and the kubelet.
type gpuInput struct {
	// source is the --gpu.source value: none turns the part off; auto with
	// no open finds the source through the API once the node has GPUs.
	source string
	// open returns the GPU source to read and its name: the one named on
	// the command line, or the simulation's fake.
	open func(context.Context, gpu.Options) (gpu.Source, string, error)
	// podResources is the kubelet PodResources socket; empty exports GPUs
	// without job labels.
	podResources string
}

// realInputs builds the inputs of a real cluster from the flags.
func realInputs(o *options, loadPin func(string) (*ebpf.Map, error)) (*inputs, error) {
	in := &inputs{loadPin: loadPin}
	for _, p := range parts {
		p.input(in)
	}
	client, meta, dyn, err := kubeClient(*o.kubeconfig)
	if err != nil {
		return nil, err
	}
	in.kube, in.meta, in.dyn = client, meta, dyn
	return in, nil
}
