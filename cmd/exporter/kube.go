package main

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/zonewatch/zonewatch/collector"
	"github.com/zonewatch/zonewatch/collector/fence"
	"github.com/zonewatch/zonewatch/collector/ipcache"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/topology"
)

// startKube starts the Kubernetes feed: the node, job-pod and owner
// informers that fill the index, and the Service and EndpointSlice
// informers that place ClusterIPs (zonewatch_source_up{source="kubernetes"},
// w.synced: all of them), and returns the placement series drawn from that
// index. A DaemonSet exporter with the node's ipcache
// (--kube.pod-view=node) keeps the per-node view: its node's pods and its
// jobs' pods; Relay mode, and --kube.pod-view=cluster, every job pod.
func startKube(ctx context.Context, w *wiring, in *inputs, rules []topology.Rule, resync time.Duration) (*collector.Placement, error) {
	logger := w.logger.With("component", "kubernetes")
	var live *kube.Live
	var factories kubeapi.Informers
	var err error
	var reader *ipcache.Reader
	if w.nodeName != "" && in.ipcache != nil {
		var ipc topology.IPCache
		ipc, reader, err = startIPCache(ctx, w, in)
		if err != nil {
			return nil, err
		}
		in.identities = &fenceIdentities{}
		w.index.SetRemote(w.nodeName, ipc, in.identities, rules)
		live, factories, err = kube.NewLocal(in.kube, w.index, rules, w.nodeName, resync, logger, in.localOptions...)
		if err != nil {
			return nil, fmt.Errorf("setting up informers: %w", err)
		}
		w.self.MustRegister(remoteJobs{live})
		if live.ReadsPeerNodes() {
			w.self.MustRegister(peerNodeReads{live})
		}
		logger.Info("per-node view: watching this node's pods and its jobs' pods", "node", w.nodeName)
	} else {
		live, factories, err = kube.NewLive(in.kube, w.index, rules, resync, logger)
	}
	if err != nil {
		return nil, fmt.Errorf("setting up informers: %w", err)
	}
	live.WithOwners(in.meta, in.kube)
	// Until the Services are known, a connection to a ClusterIP would be
	// counted to an unknown zone: the conntrack growth is held until then
	// as it is for the pods.
	var svcs *kube.Services
	var svcFactory kubeapi.Informers
	if !in.noServices {
		if svcs, svcFactory, err = kube.NewServices(in.kube, w.index, resync, logger); err != nil {
			return nil, fmt.Errorf("setting up service informers: %w", err)
		}
		w.self.MustRegister(skippedAddresses{svcs})
	}
	feed := kubeFeed{live, svcs}
	w.exporter.AddSource("kubernetes", feed)
	// Ready (and the conntrack growth released) once the informers have
	// synced and, in the per-node view, the ipcache has been read once
	// (read or failed: a node whose map cannot be read still serves, with
	// zonewatch_source_up{source="ipcache"} 0): before that a remote
	// pod's address would be placed by the pod CIDRs alone.
	w.synced = feed.Up
	if reader != nil {
		w.synced = func() bool { return feed.Up() && reader.Tried() }
	}
	// The placement series are served beside the registry
	// (collector.Gatherer), not through it: at 2,000 jobs a Relay scrape
	// takes 16 ms and 208 allocations instead of 46 ms and 48k
	// (docs/performance.md).
	placement := collector.NewPlacement(w.index, w.nodeName)
	if w.shard.Sharded() {
		placement = collector.NewShardPlacement(w.index, w.shard.Owns)
		w.logger.Info("relay shard", "shard", w.shard.Index, "total_shards", w.shard.Total)
	}
	if svcs != nil {
		go func() {
			if err := svcs.Run(ctx, svcFactory); err != nil && ctx.Err() == nil {
				w.logger.Error("kubernetes feed", "err", err)
			}
		}()
	}
	go func() {
		if err := live.Run(ctx, factories); err != nil {
			if ctx.Err() == nil {
				w.logger.Error("kubernetes feed", "err", err)
			}
			return
		}
		// The first lists are garbage once the informers hold their
		// stripped objects: return those pages now, not at the
		// scavenger's pace (docs/performance.md, Memory).
		debug.FreeOSMemory()
	}()
	return placement, nil
}

// fenceIdentities gives the per-node view the labels of security
// identities, from the fence part's set once it has started (none before,
// none with --no-fence.enabled), which reads an identity it does not know
// by name (fence.OnDemandIdentities): a remote pod of a
// job with no pod on this node is then named by its identity's job, so its
// drops here count for that job as in the cluster-wide view.
type fenceIdentities struct{ set atomic.Pointer[fence.Set] }

func (f *fenceIdentities) Labels(id uint32) (string, map[string]string, bool) {
	if s := f.set.Load(); s != nil {
		return s.Labels(id)
	}
	return "", nil, false
}

func (f *fenceIdentities) HasIdentity(id uint32) bool {
	s := f.set.Load()
	return s != nil && s.HasIdentity(id)
}

var skippedAddressesDesc = prometheus.NewDesc("zonewatch_kube_addresses_skipped_total",
	"Addresses of Services (cluster IPs, resource=services) and EndpointSlices (ready endpoints, resource=endpointslices) that do not parse: skipped, never placed.",
	[]string{"resource"}, nil)

// skippedAddresses exports the Service informers' skipped addresses.
type skippedAddresses struct{ s *kube.Services }

func (c skippedAddresses) Describe(ch chan<- *prometheus.Desc) { ch <- skippedAddressesDesc }

func (c skippedAddresses) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(skippedAddressesDesc, prometheus.CounterValue, float64(c.s.SkippedServices.Load()), "services")
	ch <- prometheus.MustNewConstMetric(skippedAddressesDesc, prometheus.CounterValue, float64(c.s.SkippedSlices.Load()), "endpointslices")
}

var (
	remoteJobsDesc = prometheus.NewDesc("zonewatch_kube_remote_jobs",
		"Jobs with no pod on this node that the per-node view lists now, on demand: a flow's far end whose identity selects a job but cannot name it (a RayJob's submitter, an Indexed Job); at most 64.",
		nil, nil)
	remoteDemandsDesc = prometheus.NewDesc("zonewatch_kube_remote_job_demands_total",
		"Demands for such a job's pods, by result: started (its feeds were started), deferred (a second it waited: 64 listed, or 8 started that second), dropped (let go unserved after 10 minutes without a lookup).",
		[]string{"result"}, nil)
)

// remoteJobs exports the per-node view's remote jobs (collector/kube's
// remote.go).
type remoteJobs struct{ l *kube.Live }

func (c remoteJobs) Describe(ch chan<- *prometheus.Desc) {
	ch <- remoteJobsDesc
	ch <- remoteDemandsDesc
}

func (c remoteJobs) Collect(ch chan<- prometheus.Metric) {
	n, st := c.l.RemoteJobs()
	ch <- prometheus.MustNewConstMetric(remoteJobsDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(remoteDemandsDesc, prometheus.CounterValue, float64(st.Started), "started")
	ch <- prometheus.MustNewConstMetric(remoteDemandsDesc, prometheus.CounterValue, float64(st.Deferred), "deferred")
	ch <- prometheus.MustNewConstMetric(remoteDemandsDesc, prometheus.CounterValue, float64(st.Dropped), "dropped")
}

var (
	nodeReadsDesc = prometheus.NewDesc("zonewatch_kube_node_reads_total",
		"LISTs of the lean node view (--kube.node-view=peers), by what they read: a node by name (name), host-network pods by a tunnel endpoint's address (tunnel_endpoint), the pod with an address being placed (pod_address).",
		[]string{"by"}, nil)
	nodeLookupsDesc = prometheus.NewDesc("zonewatch_kube_node_lookups_total",
		"Lookups of the node behind a tunnel endpoint the ipcache names, or behind a remote node's own address (--kube.node-view=peers), by result: found, unresolved (no host-network pod has the endpoint's address and no pod the address), failed (asked again at the next miss), dropped (256 waiting: asked again at the next miss).",
		[]string{"result"}, nil)
)

// peerNodeReads exports the lean node view's reads and lookups
// (collector/kube's nodes.go).
type peerNodeReads struct{ l *kube.Live }

func (c peerNodeReads) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeReadsDesc
	ch <- nodeLookupsDesc
}

func (c peerNodeReads) Collect(ch chan<- prometheus.Metric) {
	st := c.l.PeerNodeReads()
	for _, v := range []struct {
		by string
		n  int64
	}{{"name", st.ByName}, {"tunnel_endpoint", st.ByEndpoint}, {"pod_address", st.ByPodAddress}} {
		ch <- prometheus.MustNewConstMetric(nodeReadsDesc, prometheus.CounterValue, float64(v.n), v.by)
	}
	for _, v := range []struct {
		result string
		n      int64
	}{{"found", st.Found}, {"unresolved", st.Unresolved}, {"failed", st.Failed}, {"dropped", st.Dropped}} {
		ch <- prometheus.MustNewConstMetric(nodeLookupsDesc, prometheus.CounterValue, float64(v.n), v.result)
	}
}

// kubeFeed is the Kubernetes source: up once every informer has synced
// (svcs nil: --no-kube.services.enabled).
type kubeFeed struct {
	live *kube.Live
	svcs *kube.Services
}

func (f kubeFeed) Up() bool { return f.live.Up() && (f.svcs == nil || f.svcs.Up()) }

// kubeClient builds a client from a kubeconfig or the in-cluster config,
// the metadata-only client that resolves job pods' top owners, and the
// dynamic client of the Cilium policy and identity informers (fence.go).
func kubeClient(kubeconfig string) (kubeapi.Interface, metadata.Interface, dynamic.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
	} else {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, nil, nil, errors.New("not in a cluster and no --kubeconfig given (use --simulate for the built-in simulated cluster)")
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("in-cluster config: %w", err)
		}
	}
	cfg.UserAgent = "zonewatch-exporter"
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("metadata client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dynamic client: %w", err)
	}
	// Protobuf halves the size of pod lists on the wire.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubeapi.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	return client, meta, dyn, nil
}
