package collector

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/zonewatch/zonewatch/topology"
)

// The placement families: name and help, for the Desc and for Gatherer.
const (
	jobPodInfoName   = namespace + "_job_pod_info"
	jobPodInfoHelp   = "A training-job pod scheduled on this exporter's node (1). role is coordinator or worker."
	jobZonesName     = namespace + "_job_zones"
	jobZonesHelp     = "Distinct zones of the job's scheduled pods, cluster-wide; emitted by every exporter that hosts a pod of the job (take max)."
	jobSplitName     = namespace + "_job_split_zone"
	jobSplitHelp     = "1 when the job's scheduled pods span more than one zone, else 0."
	jobMultiZoneName = namespace + "_job_multi_zone_info"
	jobMultiZoneHelp = "A job whose pods carry the zonewatch.io/multi-zone label or annotation (1), with its value; \"intentional\" leaves the job out of the job alerts."
)

var (
	jobPodInfoDesc = prometheus.NewDesc(jobPodInfoName, jobPodInfoHelp,
		[]string{"namespace", "job_name", "job_kind", "pod", "role", "node", "zone"}, nil)
	jobZonesDesc     = prometheus.NewDesc(jobZonesName, jobZonesHelp, []string{"namespace", "job_name"}, nil)
	jobSplitDesc     = prometheus.NewDesc(jobSplitName, jobSplitHelp, []string{"namespace", "job_name"}, nil)
	jobMultiZoneDesc = prometheus.NewDesc(jobMultiZoneName, jobMultiZoneHelp, []string{"namespace", "job_name", "multi_zone"}, nil)
)

// Placements is the topology view the placement collector reads. Each
// JobPlacement's Version changes when the job's placement does.
type Placements interface {
	Placements(node string) []topology.JobPlacement
}

// Placement exports where job pods run, computed from the index at scrape
// time: a deleted job has no series. The series of a job are rendered once
// per change of its placement (kube-state-metrics' store is the model) and
// sent again as they are while it stays, so a scrape does no formatting
// and no label validation for unchanged jobs.
type Placement struct {
	index Placements
	node  string // this exporter's node; empty exports every job
	// owns, when set (a Relay shard), keeps the pods on the nodes it owns
	// and the jobs with such a pod, as each DaemonSet exporter keeps its
	// node's.
	owns func(node string) bool

	mu     sync.Mutex
	scrape uint64
	jobs   map[topology.Job]*renderedJob
	order  []*renderedJob // this scrape's jobs, reused
	// pairs and values intern the label pairs and values series share
	// (namespace, kind, node, zone, role; 0, 1, zone counts), so 24,000
	// cached series at 2,000 jobs hold little more than their pod names.
	pairs  map[pairKey]*dto.LabelPair
	values map[float64]*dto.Gauge
}

type renderedJob struct {
	job     topology.Job
	version uint64
	scrape  uint64 // the last scrape that saw the job
	podInfo []gauge
	zones   *gauge // nil: no series (a shard holding none of its pods)
	split   *gauge
	multi   *gauge // nil: no zonewatch.io/multi-zone on its pods
}

// NewPlacement returns the placement collector for node.
func NewPlacement(index Placements, node string) *Placement {
	return &Placement{index: index, node: node, jobs: map[topology.Job]*renderedJob{}, pairs: map[pairKey]*dto.LabelPair{}, values: map[float64]*dto.Gauge{}}
}

// NewShardPlacement returns the placement collector of a Relay shard: the
// job pods on the nodes owns accepts, and their jobs.
func NewShardPlacement(index Placements, owns func(node string) bool) *Placement {
	p := NewPlacement(index, "")
	p.owns = owns
	return p
}

// Update implements Collector: the job series through the registry (the
// golden tests' and DaemonSet path). Gatherer serves the same series
// without the registry's per-series work.
func (p *Placement) Update(ch chan<- prometheus.Metric) error {
	p.each(func(g *gauge) { ch <- g })
	return nil
}

// each calls fn for every series, in the order the registry sorts them
// into (label values by label name: job_kind, job_name, namespace, node,
// pod for the pod series; job_name, namespace for the job series): the
// pod series, then job_zones, then job_split_zone. It renders the jobs
// whose placement changed since the last call.
func (p *Placement) each(fn func(*gauge)) {
	placements := p.index.Placements(p.node)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scrape++
	p.order = p.order[:0]
	for i := range placements {
		j := &placements[i]
		r := p.jobs[j.Job]
		if r == nil || r.version != j.Version || j.Version == 0 {
			r = p.render(j)
			p.jobs[j.Job] = r
		}
		r.scrape = p.scrape
		if r.zones != nil {
			p.order = append(p.order, r)
		}
	}
	if len(p.jobs) > len(placements) {
		for k, r := range p.jobs {
			if r.scrape != p.scrape {
				delete(p.jobs, k)
			}
		}
	}
	slices.SortFunc(p.order, func(a, b *renderedJob) int {
		return cmp.Or(strings.Compare(a.job.Kind, b.job.Kind), strings.Compare(a.job.Name, b.job.Name), strings.Compare(a.job.Namespace, b.job.Namespace))
	})
	for _, r := range p.order {
		for i := range r.podInfo {
			fn(&r.podInfo[i])
		}
	}
	slices.SortFunc(p.order, func(a, b *renderedJob) int {
		return cmp.Or(strings.Compare(a.job.Name, b.job.Name), strings.Compare(a.job.Namespace, b.job.Namespace))
	})
	for _, r := range p.order {
		fn(r.zones)
	}
	for _, r := range p.order {
		fn(r.split)
	}
	for _, r := range p.order {
		if r.multi != nil {
			fn(r.multi)
		}
	}
	if cap(p.order) > 2*len(p.order)+64 {
		p.order = nil // the cluster shrank
	}
}

// Label names, shared by every series.
var (
	nameNamespace = proto.String("namespace")
	nameJobName   = proto.String("job_name")
	nameJobKind   = proto.String("job_kind")
	namePod       = proto.String("pod")
	nameRole      = proto.String("role")
	nameNode      = proto.String("node")
	nameZone      = proto.String("zone")
	nameMultiZone = proto.String("multi_zone")
)

type pairKey struct {
	name  *string
	value string
}

// pair returns the label pair name=value, interned.
func (p *Placement) pair(name *string, value string) *dto.LabelPair {
	k := pairKey{name, value}
	if lp := p.pairs[k]; lp != nil {
		return lp
	}
	if len(p.pairs) > 1<<17 {
		clear(p.pairs) // nodes and namespaces came and went; the cached series keep theirs
	}
	lp := &dto.LabelPair{Name: name, Value: proto.String(value)}
	p.pairs[k] = lp
	return lp
}

// value returns a gauge value, interned.
func (p *Placement) value(v float64) *dto.Gauge {
	if g := p.values[v]; g != nil {
		return g
	}
	g := &dto.Gauge{Value: proto.Float64(v)}
	p.values[v] = g
	return g
}

// render builds a job's series: their label pairs sorted by name, as the
// registry wants them (job_kind, job_name, namespace, node, pod, role, zone).
func (p *Placement) render(j *topology.JobPlacement) *renderedJob {
	r := &renderedJob{job: j.Job, version: j.Version}
	pods := slices.Clone(j.Pods)
	slices.SortFunc(pods, func(a, b topology.PodPlacement) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Pod, b.Pod))
	})
	ns := p.pair(nameNamespace, j.Job.Namespace)
	name := &dto.LabelPair{Name: nameJobName, Value: proto.String(j.Job.Name)}
	kind := p.pair(nameJobKind, j.Job.Kind)
	one := p.value(1)
	for _, pod := range pods {
		if p.node != "" && pod.Node != p.node || p.owns != nil && !p.owns(pod.Node) {
			continue
		}
		r.podInfo = append(r.podInfo, gauge{desc: jobPodInfoDesc, m: dto.Metric{Gauge: one, Label: []*dto.LabelPair{
			kind, name, ns, p.pair(nameNode, pod.Node), {Name: namePod, Value: proto.String(pod.Pod)},
			p.pair(nameRole, pod.Role), p.pair(nameZone, pod.Zone)}}})
	}
	if p.owns != nil && len(r.podInfo) == 0 {
		return r // none of the job's pods is on this shard's nodes: no series
	}
	job := []*dto.LabelPair{name, ns}
	r.zones = &gauge{desc: jobZonesDesc, m: dto.Metric{Gauge: p.value(float64(len(j.Zones))), Label: job}}
	split := 0.0
	if j.Split() {
		split = 1
	}
	r.split = &gauge{desc: jobSplitDesc, m: dto.Metric{Gauge: p.value(split), Label: job}}
	if j.MultiZone != "" {
		r.multi = &gauge{desc: jobMultiZoneDesc, m: dto.Metric{Gauge: one, Label: []*dto.LabelPair{
			name, {Name: nameMultiZone, Value: proto.String(j.MultiZone)}, ns}}}
	}
	return r
}

// gauge is a series rendered once: its Write hands out the same read-only
// label pairs and value on every scrape, without allocating, and Gatherer
// hands out m itself.
type gauge struct {
	desc *prometheus.Desc
	m    dto.Metric
}

func (g *gauge) Desc() *prometheus.Desc { return g.desc }

func (g *gauge) Write(out *dto.Metric) error {
	out.Label, out.Gauge = g.m.Label, g.m.Gauge
	return nil
}
