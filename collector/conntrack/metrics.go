package conntrack

import (
	"github.com/prometheus/client_golang/prometheus"
)

var bytesDesc = prometheus.NewDesc("zonewatch_job_network_bytes_total",
	"Bytes of a training job's connections measured by Cilium conntrack accounting, counted once cluster-wide: by the sender (Cilium before 1.16) or, with Cilium 1.16 and later, both directions by the side that opened the connection.",
	[]string{"namespace", "job_name", "src_zone", "dst_zone", "locality"}, nil)

type bytesKey struct{ namespace, job, srcZone, dstZone, locality string }

func (k bytesKey) JobKey() (string, string) { return k.namespace, k.job }
func (k bytesKey) LabelValues() []string {
	return []string{k.namespace, k.job, k.srcZone, k.dstZone, k.locality}
}

type selfMetrics struct {
	errors        *prometheus.CounterVec
	entries       *prometheus.GaugeVec
	maxEntries    *prometheus.GaugeVec
	deleted       prometheus.Counter
	activeGone    prometheus.Counter
	resets        prometheus.Counter
	unattributed  *prometheus.CounterVec
	duration      prometheus.Gauge
	layout        *prometheus.GaugeVec
	layoutChanges *prometheus.CounterVec
}

// localMapLabel is the map label of the per-endpoint maps, summed: one
// series per endpoint would grow with the pods.
const localMapLabel = "per_endpoint"

func mapLabel(name string) string {
	if LocalMap(name) {
		return localMapLabel
	}
	return name
}

func newSelfMetrics() selfMetrics {
	m := selfMetrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_conntrack_errors_total",
			Help: "Conntrack map reads that failed, by reason: absent (no map at all), permission, open, layout (unknown ct_entry layout), read, implausible (a delta above 100 GB/s, skipped)."}, []string{"reason"}),
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_conntrack_entries",
			Help: "Entries read from each Cilium conntrack map in the last poll (map=\"per_endpoint\": all ConntrackLocal maps together)."}, []string{"map"}),
		maxEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_conntrack_map_max_entries",
			Help: "Size of each Cilium conntrack map (it follows node memory with bpf-map-dynamic-size-ratio); a full LRU map evicts entries, and their last bytes are not counted."}, []string{"map"}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_conntrack_deleted_entries_total",
			Help: "Conntrack entries that disappeared between two polls; bytes they moved after the earlier poll were not counted."}),
		activeGone: prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_conntrack_deleted_active_entries_total",
			Help: "Of the deleted entries, those whose counter had grown in the poll before they went: bytes they moved after it may be uncounted. The maps are read at once when a local job pod goes; these are mostly entries deleted without warning (a pod killed before its informer event, LRU eviction, a short connection collected between polls)."}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_conntrack_entry_resets_total",
			Help: "Conntrack entries whose byte counter went down between polls (entry recreated); their whole new counter was counted."}),
		unattributed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_conntrack_unattributed_bytes_total",
			Help: "Measured bytes not added to any job, by reason: no_job (local endpoint is no training-job pod), not_local (no endpoint of the entry on this node), opened_outside_cluster (connection opened from outside the cluster into a pod), service (the peer is a Service's cluster IP whose EndpointSlices name no single ready backend: the datapath left the VIP in the entry, as with kube-proxy)."}, []string{"reason"}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "zonewatch_conntrack_poll_duration_seconds",
			Help: "Time the last conntrack poll took."}),
		layout: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "zonewatch_conntrack_layout_info",
			Help: "The Cilium ct_entry layout in use (1): split (before 1.16), combined (1.16 and later) or auto (not decided yet)."}, []string{"layout"}),
		layoutChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_conntrack_layout_changes_total",
			Help: "Times a map's decided ct_entry layout was changed because the entries created since said otherwise (e.g. a Cilium upgrade from 1.15 to 1.16 that kept the map)."}, []string{"map"}),
	}
	for _, r := range errorReasons {
		m.errors.WithLabelValues(r)
	}
	for _, r := range []string{unattrNoJob, unattrNotLocal, unattrOutside, unattrService} {
		m.unattributed.WithLabelValues(r)
	}
	return m
}

func (m selfMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.errors, m.entries, m.maxEntries, m.deleted, m.activeGone, m.resets, m.unattributed, m.duration, m.layout, m.layoutChanges}
}

// reportLocal exports the per-endpoint maps' entries and logs once that
// they are read.
func (p *Poller) reportLocal(st pollStats) {
	if st.local == 0 {
		p.m.entries.DeleteLabelValues(localMapLabel)
		return
	}
	p.m.entries.WithLabelValues(localMapLabel).Set(float64(st.localN))
	if !p.localSeen {
		p.localSeen = true
		p.log.Info("per-endpoint conntrack maps found (Cilium ConntrackLocal, 1.14-1.17): reading them too", "maps", st.local)
	}
}
