package hubble

import (
	"errors"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/jobcounter"
)

var (
	policyDropsDesc = prometheus.NewDesc("zonewatch_job_policy_drops_total",
		"Packets of a training job dropped by network policy (Hubble drop events), counted on the node where they were dropped. peer is the other side's relation to the job (job: its own pods, cluster, world, unknown); policy is namespace/name of the denying policy (name alone for a cluster-wide one); policy_source says who named it: cilium (Cilium named it), selected (a default-deny drop Cilium named no policy of: zonewatch names the policies that select the denying endpoint in that direction and allow none of the peer, at most 3 and +N, comma-separated), empty when none is named.",
		[]string{"namespace", "job_name", "direction", "src_zone", "dst_zone", "locality", "peer", "reason", "policy", "policy_source"}, nil)
	flowEventsDesc = prometheus.NewDesc("zonewatch_job_flow_events_total",
		"Hubble flow events of a training job: forwarded events once on the sending node (replies not counted), drops where they happen. peer is the other side's relation to the job (job, cluster, world, unknown). Events, not packets or bytes.",
		[]string{"namespace", "job_name", "src_zone", "dst_zone", "locality", "peer", "verdict"}, nil)
	heldDesc = prometheus.NewDesc("zonewatch_hubble_flows_held",
		"Flows held now because the view could not yet give them a job (a pod that has just started, a job whose pods are still being listed): classified again each second, counted once it can, else counted in zonewatch_hubble_flows_uncounted_total{reason=\"no_job\"} after the hold window.",
		nil, nil)
	peerDropsDesc = prometheus.NewDesc("zonewatch_job_peer_policy_drops_total",
		"Policy drops of a training job's traffic with peers outside the job, by the peer's workload: peer_namespace/peer_workload name another job or Hubble's workload of the peer, empty for a host, a world address, an unnamed peer, or beyond the first 8 named peers of the job on this node. policy and policy_source as in zonewatch_job_policy_drops_total.",
		[]string{"namespace", "job_name", "peer", "peer_namespace", "peer_workload", "locality", "policy", "policy_source"}, nil)
)

// MaxNamedPeers bounds zonewatch_job_peer_policy_drops_total: each job
// names at most this many peer workloads per exporter; drops toward
// further peers are counted unnamed. Series stay bounded by local jobs.
const MaxNamedPeers = 8

// DropKey is one zonewatch_job_policy_drops_total series. The policy is
// kept in two parts so that counting never formats a string.
type DropKey struct {
	Namespace, Job              string
	Direction, SrcZone, DstZone string
	Locality, Peer, Reason      string
	PolicyNamespace, PolicyName string
	PolicySource                string
}

// JobKey implements jobcounter.Key.
func (k DropKey) JobKey() (string, string) { return k.Namespace, k.Job }

// LabelValues implements jobcounter.Key.
func (k DropKey) LabelValues() []string {
	return []string{k.Namespace, k.Job, k.Direction, k.SrcZone, k.DstZone, k.Locality, k.Peer, k.Reason, policyLabel(k.PolicyNamespace, k.PolicyName), k.PolicySource}
}

// EventKey is one zonewatch_job_flow_events_total series.
type EventKey struct {
	Namespace, Job             string
	SrcZone, DstZone, Locality string
	Peer, Verdict              string
}

// JobKey implements jobcounter.Key.
func (k EventKey) JobKey() (string, string) { return k.Namespace, k.Job }

// LabelValues implements jobcounter.Key.
func (k EventKey) LabelValues() []string {
	return []string{k.Namespace, k.Job, k.SrcZone, k.DstZone, k.Locality, k.Peer, k.Verdict}
}

// PeerDropKey is one zonewatch_job_peer_policy_drops_total series.
type PeerDropKey struct {
	Namespace, Job              string
	Peer                        string
	PeerNamespace, PeerWorkload string
	Locality                    string
	PolicyNamespace, PolicyName string
	PolicySource                string
}

// JobKey implements jobcounter.Key.
func (k PeerDropKey) JobKey() (string, string) { return k.Namespace, k.Job }

// LabelValues implements jobcounter.Key.
func (k PeerDropKey) LabelValues() []string {
	return []string{k.Namespace, k.Job, k.Peer, k.PeerNamespace, k.PeerWorkload, k.Locality, policyLabel(k.PolicyNamespace, k.PolicyName), k.PolicySource}
}

// Metrics are the exporter's own Hubble counters.
type Metrics struct {
	Processed     prometheus.Counter
	Reconnects    prometheus.Counter
	UnresolvedSrc prometheus.Counter
	UnresolvedDst prometheus.Counter
	lost          [4]prometheus.Counter // by flowpb.LostEventSource
	// FieldMaskRefused counts servers' refusals of the field mask
	// ("invalid fieldmask"); the client then asks for whole flows.
	FieldMaskRefused prometheus.Counter
	// Malformed and Unknown count the responses skipped: not a valid
	// message, or of a response type the client does not know.
	Malformed, Unknown prometheus.Counter
	// SkippedReplayed, SkippedLostReplayed and SkippedEarly count the
	// responses skipped as counted already: flows and lost events the
	// server replayed after a reconnect, and those stamped before the
	// client started (or --hubble.since).
	SkippedReplayed, SkippedLostReplayed, SkippedEarly prometheus.Counter
	// Uncounted counts the classified flows no counter took, by reason
	// (uncounted*); with the counted ones they make Processed.
	Uncounted map[string]prometheus.Counter
}

func (m *Metrics) uncounted(reason string) { m.Uncounted[reason].Inc() }

// NewMetrics creates the self metrics and registers them with reg (nil:
// unregistered, for tests and offline analysis). A metric another part has
// registered already (zonewatch_hubble_flows_unresolved_total) is shared.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	processed := prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_hubble_flows_processed_total",
		Help: "Flows received from Hubble and classified, counted or not: the flows the server-side filter passes (trace, drop and policy-verdict events), not every event Hubble saw (lost events are of every kind)."})
	reconnects := prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_hubble_reconnects_total",
		Help: "Times the Hubble flow stream was re-established after it broke."})
	lost := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_hubble_lost_events_total",
		Help: "Flow events Hubble reported lost (lost_events), by the buffer they were lost in."}, []string{"buffer"})
	unresolved := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_hubble_flows_unresolved_total",
		Help: "Counted flows with a side whose cluster address the topology index could not place (side=source|destination); internet, link-local and multicast addresses are not unresolved."}, []string{"side"})
	maskRefused := prometheus.NewCounter(prometheus.CounterOpts{Name: "zonewatch_hubble_field_mask_refused_total",
		Help: "Times a Hubble server refused the field mask (invalid fieldmask: it lacks a Flow field the mask names); the client then receives whole flows."})
	skipped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_hubble_responses_skipped_total",
		Help: "GetFlows responses received and skipped, by reason: malformed (not a valid message), unknown (a response type the client does not know), replayed (a flow counted before the stream broke, sent again on the resume), lost_events_replayed (a lost_events response counted before, sent again), before_start (stamped before the exporter started or --hubble.since). Their flows and losses are not counted."}, []string{"reason"})
	uncounted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zonewatch_hubble_flows_uncounted_total",
		Help: "Classified flows that no job counter counts, by reason: kind (an event counted from another event or node, or never: a reply, the receiving side of a forward, an intermediate observation point, the second event of a dropped packet, another node's flow, an L7 denial), no_job (a drop or a sending-side forward of which neither end is a pod of a job the view knows, after the hold window for the pod Hubble names), hold_full (as no_job, not held: too many flows held at once). With the flows counted in zonewatch_job_flow_events_total they make zonewatch_hubble_flows_processed_total, except the flows held at the time (zonewatch_hubble_flows_held)."}, []string{"reason"})
	if reg != nil {
		uncounted = register(reg, uncounted)
		skipped = register(reg, skipped)
		maskRefused = register(reg, maskRefused)
		processed = register(reg, processed)
		reconnects = register(reg, reconnects)
		lost = register(reg, lost)
		unresolved = register(reg, unresolved)
	}
	m := &Metrics{
		Processed: processed, Reconnects: reconnects,
		UnresolvedSrc: unresolved.WithLabelValues("source"),
		UnresolvedDst: unresolved.WithLabelValues("destination"),
	}
	m.FieldMaskRefused = maskRefused
	m.Malformed, m.Unknown = skipped.WithLabelValues("malformed"), skipped.WithLabelValues("unknown")
	m.SkippedReplayed, m.SkippedLostReplayed = skipped.WithLabelValues("replayed"), skipped.WithLabelValues("lost_events_replayed")
	m.SkippedEarly = skipped.WithLabelValues("before_start")
	m.Uncounted = map[string]prometheus.Counter{}
	for _, r := range []string{uncountedKind, uncountedNoJob, uncountedHoldFull} {
		m.Uncounted[r] = uncounted.WithLabelValues(r)
	}
	for i := range m.lost {
		m.lost[i] = lost.WithLabelValues(lostSourceLabel(flowpb.LostEventSource(i)))
	}
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err) // a programming error: two metrics of one name and different shapes
	}
	return c
}

// Lost counts n events lost at source.
func (m *Metrics) Lost(source flowpb.LostEventSource, n uint64) {
	if int(source) < 0 || int(source) >= len(m.lost) {
		source = flowpb.LostEventSource_UNKNOWN_LOST_EVENT_SOURCE
	}
	m.lost[source].Add(float64(n))
}

func lostSourceLabel(s flowpb.LostEventSource) string {
	switch s {
	case flowpb.LostEventSource_PERF_EVENT_RING_BUFFER:
		return "perf_event_ring_buffer"
	case flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE:
		return "observer_events_queue"
	case flowpb.LostEventSource_HUBBLE_RING_BUFFER:
		return "hubble_ring_buffer"
	}
	return "unknown"
}

// Aggregator classifies flows and keeps the per-job counters. Observe is
// called from one goroutine (the stream or the file reader); Update may run
// concurrently (scrapes).
type Aggregator struct {
	cls       *Classifier
	topo      Topology
	m         *Metrics
	drops     *jobcounter.Vec[DropKey]
	events    *jobcounter.Vec[EventKey]
	peerDrops *jobcounter.Vec[PeerDropKey]

	// fences names the policies of default-deny drops (nil: none).
	fences Fences

	// obs serializes classification (the Classifier's pairing cache) and
	// the held flows between the stream and Run's retries.
	obs  sync.Mutex
	held *holder

	// named holds the peer workloads each job names in peerDrops: a
	// peer holds one slot whatever its series (a fence named once the
	// informers sync makes a second one).
	mu    sync.Mutex
	named map[jobRef]map[peerRef]struct{}
}

type jobRef struct{ namespace, name string }

// peerRef is a named peer: its namespace and workload.
type peerRef struct{ namespace, workload string }

// NewAggregator returns an aggregator for flows observed on node (empty:
// any node). Counters of a job gone from topo stay for grace, then go.
func NewAggregator(topo Topology, node string, grace time.Duration, m *Metrics) *Aggregator {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Aggregator{
		cls:       NewClassifier(topo, node),
		topo:      topo,
		m:         m,
		drops:     jobcounter.New[DropKey](policyDropsDesc, topo, grace),
		events:    jobcounter.New[EventKey](flowEventsDesc, topo, grace),
		peerDrops: jobcounter.New[PeerDropKey](peerDropsDesc, topo, grace),
		named:     map[jobRef]map[peerRef]struct{}{},
	}
}

// Observe classifies f and counts it. It does not allocate once the
// series exist.
func (a *Aggregator) Observe(f *flowpb.Flow) Result {
	x := FieldsOf(f)
	return a.ObserveFields(&x)
}

// ObserveFields classifies a flow's Fields and counts them. A flow the
// view cannot yet give a job may be held and counted later (SetHold);
// its Result is then the one of its arrival.
func (a *Aggregator) ObserveFields(f *Fields) Result {
	a.obs.Lock()
	defer a.obs.Unlock()
	r := a.cls.ClassifyFields(f)
	a.m.Processed.Inc()
	if a.held != nil && len(a.held.flows) > 0 {
		a.retryLocked(a.held.now())
	}
	switch {
	case r.Count == NotCounted:
		a.m.uncounted(uncountedKind)
	case r.Job != nil:
		if held, _ := a.holdLocked(f, &r); !held {
			a.countLocked(&r, f)
		}
	default:
		if held, reason := a.holdLocked(f, &r); !held {
			a.finishUncountedLocked(&r, reason)
		}
	}
	return r
}

// countLocked counts a classified flow of a job.
func (a *Aggregator) countLocked(r *Result, f *Fields) {
	a.countUnresolved(r)
	a.events.Add(EventKey{Namespace: r.Job.Namespace, Job: r.Job.Name,
		SrcZone: r.Src.Zone, DstZone: r.Dst.Zone, Locality: r.Locality, Peer: r.Peer, Verdict: r.Verdict}, 1)
	if r.PolicyDrop() {
		a.nameFence(r, f)
		a.drops.Add(DropKey{Namespace: r.Job.Namespace, Job: r.Job.Name, Direction: r.Direction,
			SrcZone: r.Src.Zone, DstZone: r.Dst.Zone, Locality: r.Locality, Peer: r.Peer, Reason: r.Reason,
			PolicyNamespace: r.PolicyNamespace, PolicyName: r.PolicyName, PolicySource: r.PolicySource}, 1)
		if r.Peer != PeerJob {
			a.addPeerDrop(r)
		}
	}
}

// finishUncountedLocked counts a flow of no job as uncounted.
func (a *Aggregator) finishUncountedLocked(r *Result, reason string) {
	a.countUnresolved(r)
	a.m.uncounted(reason)
}

func (a *Aggregator) countUnresolved(r *Result) {
	if r.SrcUnresolved {
		a.m.UnresolvedSrc.Inc()
	}
	if r.DstUnresolved {
		a.m.UnresolvedDst.Inc()
	}
}

// addPeerDrop counts a policy drop toward a peer outside the job, naming
// the peer's workload unless the job names MaxNamedPeers already.
func (a *Aggregator) addPeerDrop(r *Result) {
	k := PeerDropKey{Namespace: r.Job.Namespace, Job: r.Job.Name, Peer: r.Peer,
		PeerNamespace: r.PeerNamespace, PeerWorkload: r.PeerWorkload, Locality: r.Locality,
		PolicyNamespace: r.PolicyNamespace, PolicyName: r.PolicyName, PolicySource: r.PolicySource}
	if k.PeerWorkload != "" && a.peerDrops.Value(k) == 0 {
		j, p := jobRef{k.Namespace, k.Job}, peerRef{k.PeerNamespace, k.PeerWorkload}
		a.mu.Lock()
		peers := a.named[j]
		if _, ok := peers[p]; !ok {
			switch {
			case peers == nil:
				a.named[j] = map[peerRef]struct{}{p: {}}
			case len(peers) < MaxNamedPeers:
				peers[p] = struct{}{}
			default:
				k.PeerNamespace, k.PeerWorkload = "", ""
			}
		}
		a.mu.Unlock()
	}
	a.peerDrops.Add(k, 1)
}

// Drops returns the policy-drop counters (for tests and reports).
func (a *Aggregator) Drops() *jobcounter.Vec[DropKey] { return a.drops }

// Events returns the flow-event counters.
func (a *Aggregator) Events() *jobcounter.Vec[EventKey] { return a.events }

// PeerDrops returns the policy-drop counters by peer workload.
func (a *Aggregator) PeerDrops() *jobcounter.Vec[PeerDropKey] { return a.peerDrops }

// Metrics returns the self metrics the aggregator counts into.
func (a *Aggregator) Metrics() *Metrics { return a.m }

// Update implements collector.Collector.
func (a *Aggregator) Update(ch chan<- prometheus.Metric) error {
	a.drops.Collect(ch)
	a.events.Collect(ch)
	a.peerDrops.Collect(ch)
	ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(a.Held()))
	// A job that is gone names its peers afresh if it comes back, once
	// the series its budget bounds are gone too (reaped after the grace
	// period): a job back within it keeps them, and its budget.
	a.mu.Lock()
	budgets := len(a.named)
	a.mu.Unlock()
	if budgets == 0 || a.topo == nil {
		return nil
	}
	held := map[jobRef]bool{}
	a.peerDrops.Each(func(k PeerDropKey, _ float64) {
		if k.PeerWorkload != "" {
			held[jobRef{k.Namespace, k.Job}] = true
		}
	})
	a.mu.Lock()
	for j := range a.named {
		if !held[j] && !a.topo.JobExists(j.namespace, j.name) {
			delete(a.named, j)
		}
	}
	a.mu.Unlock()
	return nil
}
