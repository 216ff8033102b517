package collector

import (
	"github.com/prometheus/client_golang/prometheus"

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

// Placements is the topology view the placement collector reads.
type Placements interface {
	Placements(node string) []topology.JobPlacement
}

// Placement exports where job pods run, computed from the index at scrape
// time: a deleted job has no series.
type Placement struct {
	index Placements
	node  string // this exporter's node; empty exports every job
}

// NewPlacement returns the placement collector for node.
func NewPlacement(index Placements, node string) *Placement {
	return &Placement{index: index, node: node}
}

// Update implements Collector.
func (p *Placement) Update(ch chan<- prometheus.Metric) error {
	for _, j := range p.index.Placements(p.node) {
		for _, pod := range j.Pods {
			if p.node != "" && pod.Node != p.node {
				continue
			}
			ch <- prometheus.MustNewConstMetric(jobPodInfoDesc, prometheus.GaugeValue, 1,
				j.Job.Namespace, j.Job.Name, j.Job.Kind, pod.Pod, pod.Role, pod.Node, pod.Zone)
		}
		ch <- prometheus.MustNewConstMetric(jobZonesDesc, prometheus.GaugeValue, float64(len(j.Zones)), j.Job.Namespace, j.Job.Name)
		split := 0.0
		if j.Split() {
			split = 1
		}
		ch <- prometheus.MustNewConstMetric(jobSplitDesc, prometheus.GaugeValue, split, j.Job.Namespace, j.Job.Name)
	}
	return nil
}
