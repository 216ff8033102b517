package collector

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/zonewatch/zonewatch/topology"
)

var (
	jobPodInfoDesc = prometheus.NewDesc(namespace+"_job_pod_info",
		"A training-job pod scheduled on this exporter's node (1). role is coordinator or worker.",
		[]string{"namespace", "job_name", "job_kind", "pod", "role", "node", "zone"}, nil)
	jobZonesDesc = prometheus.NewDesc(namespace+"_job_zones",
		"Distinct zones of the job's scheduled pods, cluster-wide; emitted by every exporter that hosts a pod of the job (take max).",
		[]string{"namespace", "job_name"}, nil)
	jobSplitDesc = prometheus.NewDesc(namespace+"_job_split_zone",
		"1 when the job's scheduled pods span more than one zone, else 0.",
		[]string{"namespace", "job_name"}, nil)
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
}

type renderedJob struct {
	job     topology.Job
	version uint64
	scrape  uint64 // the last scrape that saw the job
	podInfo []prometheus.Metric
	zones   prometheus.Metric
	split   prometheus.Metric
}

// NewPlacement returns the placement collector for node.
func NewPlacement(index Placements, node string) *Placement {
	return &Placement{index: index, node: node, jobs: map[topology.Job]*renderedJob{}}
}

// NewShardPlacement returns the placement collector of a Relay shard: the
// job pods on the nodes owns accepts, and their jobs.
func NewShardPlacement(index Placements, owns func(node string) bool) *Placement {
	p := NewPlacement(index, "")
	p.owns = owns
	return p
}

// Update implements Collector. The series go out in the order the registry
// sorts them into (label values by label name: job_kind, job_name,
// namespace, node, pod for the pod series; job_name, namespace for the
// job series), so its sort finds them sorted.
func (p *Placement) Update(ch chan<- prometheus.Metric) error {
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
		for _, m := range r.podInfo {
			ch <- m
		}
	}
	slices.SortFunc(p.order, func(a, b *renderedJob) int {
		return cmp.Or(strings.Compare(a.job.Name, b.job.Name), strings.Compare(a.job.Namespace, b.job.Namespace))
	})
	for _, r := range p.order {
		ch <- r.zones
	}
	for _, r := range p.order {
		ch <- r.split
	}
	if cap(p.order) > 2*len(p.order)+64 {
		p.order = nil // the cluster shrank
	}
	return nil
}

// render builds a job's series.
func (p *Placement) render(j *topology.JobPlacement) *renderedJob {
	r := &renderedJob{job: j.Job, version: j.Version}
	pods := slices.Clone(j.Pods)
	slices.SortFunc(pods, func(a, b topology.PodPlacement) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Pod, b.Pod))
	})
	for _, pod := range pods {
		if p.node != "" && pod.Node != p.node || p.owns != nil && !p.owns(pod.Node) {
			continue
		}
		r.podInfo = append(r.podInfo, frozen(prometheus.MustNewConstMetric(jobPodInfoDesc, prometheus.GaugeValue, 1,
			j.Job.Namespace, j.Job.Name, j.Job.Kind, pod.Pod, pod.Role, pod.Node, pod.Zone)))
	}
	if p.owns != nil && len(r.podInfo) == 0 {
		return r // none of the job's pods is on this shard's nodes: no series
	}
	r.zones = frozen(prometheus.MustNewConstMetric(jobZonesDesc, prometheus.GaugeValue, float64(len(j.Zones)), j.Job.Namespace, j.Job.Name))
	split := 0.0
	if j.Split() {
		split = 1
	}
	r.split = frozen(prometheus.MustNewConstMetric(jobSplitDesc, prometheus.GaugeValue, split, j.Job.Namespace, j.Job.Name))
	return r
}

// frozenMetric is a metric written once: its Write hands out the same
// (read-only) label pairs and value on every scrape without allocating.
type frozenMetric struct {
	desc *prometheus.Desc
	dto  dto.Metric
}

func frozen(m prometheus.Metric) prometheus.Metric {
	f := &frozenMetric{desc: m.Desc()}
	if err := m.Write(&f.dto); err != nil {
		panic(err) // a const metric's Write does not fail
	}
	return f
}

func (f *frozenMetric) Desc() *prometheus.Desc { return f.desc }

func (f *frozenMetric) Write(out *dto.Metric) error {
	out.Label, out.Gauge, out.Counter, out.Untyped = f.dto.Label, f.dto.Gauge, f.dto.Counter, f.dto.Untyped
	return nil
}
