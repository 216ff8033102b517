// Package analyze diagnoses a cluster from captured files, before any
// exporter runs: `kubectl get nodes,pods` dumps, `hubble observe` output
// and a dcgm-exporter page go through the exporter's own topology index,
// flow classification and GPU join, and each training job gets a verdict
// (blocked, cross_zone_traffic, split, healthy) and a suggested fix.
package analyze

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/zonewatch/zonewatch/collector/fence"
	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/topology"
)

// Verdicts, worst first.
const (
	VerdictBlocked          = "blocked"
	VerdictCrossZoneTraffic = "cross_zone_traffic"
	VerdictSplit            = "split"
	VerdictHealthy          = "healthy"
)

// Input names the captured files.
type Input struct {
	Nodes string   // kubectl get nodes -o json (or -o yaml)
	Pods  string   // kubectl get pods -o json (or -o yaml)
	Flows []string // hubble observe -o jsonpb / -o json, e.g. one per node
	GPU   string   // a dcgm-exporter /metrics page; empty for none
	// Policies is `kubectl get cnp,ccnp -A -o json`, `kubectl get
	// networkpolicies -A -o json` or one file with all kinds (or -o yaml): the
	// fences a default-deny drop is named from (policy_source
	// "selected"); empty for none.
	Policies string
	Rules    []topology.Rule
	// PodGroups: advise native gang + topology PodGroups (on), never
	// (off), or when the pods dump shows the cluster serves them (auto,
	// the default: a scheduling.k8s.io/v1beta1 PodGroup with a topology
	// constraint in the dump).
	PodGroups PodGroups
	// Warn receives what is skipped (bad flow lines, GPU series without a
	// UUID); nil discards it.
	Warn io.Writer
}

// Report is the analysis: the `--output json` document.
type Report struct {
	Jobs            []Job `json:"jobs"`
	FlowsRead       int   `json:"flows_read"`
	BadLines        int   `json:"bad_lines"`
	UnresolvedFlows int   `json:"unresolved_flows"`
	// LostEvents is what the files' lost_events lines say Hubble lost
	// while capturing: when it is not 0 every count is a lower bound.
	LostEvents uint64 `json:"lost_events"`

	gpuPage bool // a GPU page was read
	gpuPods int  // GPU series the page attributed to a pod
}

// Job is one training job with at least one scheduled pod.
type Job struct {
	Namespace        string               `json:"namespace"`
	JobName          string               `json:"job_name"`
	JobKind          string               `json:"job_kind"`
	Zones            map[string]RoleCount `json:"zones"`
	SplitZone        bool                 `json:"split_zone"`
	CoordinatorZones []string             `json:"coordinator_zones"`
	PolicyDrops      ByLocality           `json:"policy_drops"`
	DenyingPolicies  []string             `json:"denying_policies"`
	// SelectedPolicies are those of DenyingPolicies that Cilium did not
	// name: default-deny drops, named by the policies that select the
	// denying pods and allow none of the peer (--policies).
	SelectedPolicies []string   `json:"selected_policies"`
	FlowEvents       ByLocality `json:"flow_events"`
	GPUUtilization   *float64   `json:"gpu_utilization"`
	Verdict          string     `json:"verdict"`
	SuggestedFix     string     `json:"suggested_fix"`

	// What the text output says besides the JSON fields.
	ownCrossDrops, ownCrossForwarded int
	gpus                             int
	workerZones                      []string
}

// RoleCount counts a job's scheduled pods in one zone.
type RoleCount struct {
	Coordinator int `json:"coordinator"`
	Worker      int `json:"worker"`
}

// ByLocality counts events by the exporter's locality label.
type ByLocality struct {
	Zone        int `json:"zone"`
	CrossZone   int `json:"cross_zone"`
	CrossRegion int `json:"cross_region"`
	Unknown     int `json:"unknown"`
}

func (b *ByLocality) add(locality string, n int) {
	switch locality {
	case topology.LocalitySameZone:
		b.Zone += n
	case topology.LocalityCrossZone:
		b.CrossZone += n
	case topology.LocalityCrossRegion:
		b.CrossRegion += n
	default:
		b.Unknown += n
	}
}

// ExitCode is the command's exit code for the report: 1 when some job is
// split across zones (blocked or not), else 0.
func (r *Report) ExitCode() int {
	for i := range r.Jobs {
		if r.Jobs[i].SplitZone {
			return 1
		}
	}
	return 0
}

type jobKey struct{ namespace, name string }

// ownTraffic is what the verdict needs beyond the exporter's counters:
// traffic between two pods of the same job in different zones.
type ownTraffic struct{ drops, forwarded int }

// Run reads the files and analyzes them. An error means an input could
// not be read; it names the file and, where it can, the line.
func Run(in Input) (*Report, error) {
	warn := in.Warn
	if warn == nil {
		warn = io.Discard
	}
	rules := in.Rules
	if rules == nil {
		rules = topology.DefaultRules()
	}
	index := topology.NewIndex()
	nodes, err := loadNodes(index, in.Nodes)
	if err != nil {
		return nil, err
	}
	pods, err := loadPods(index, rules, in.Pods)
	if err != nil {
		return nil, err
	}

	rep := &Report{Jobs: []Job{}}
	// One aggregator for every file: the exporter's classification and
	// counters, accepting every node's flows (its Relay mode), so a
	// connection captured on both of its nodes counts once.
	agg := hubble.NewAggregator(index, "", time.Hour, nil)
	fences, err := loadPolicies(in.Policies, warn)
	if err != nil {
		return nil, err
	}
	// every label value a drop got -> every policy behind it: the label
	// names fence.MaxNamed and "+N", the report names them all.
	named := &allNamed{set: fences, full: map[string][]string{}}
	if fences != nil {
		agg.SetFences(named)
	}
	own := map[jobKey]*ownTraffic{}
	for _, path := range in.Flows {
		if err := readFlows(path, agg, fences, own, rep, warn); err != nil {
			return nil, err
		}
	}
	util, gpus, err := readGPU(in.GPU, index, rep, warn)
	if err != nil {
		return nil, err
	}

	events := map[jobKey]*ByLocality{}
	agg.Events().Each(func(k hubble.EventKey, v float64) {
		jk := jobKey{k.Namespace, k.Job}
		if events[jk] == nil {
			events[jk] = &ByLocality{}
		}
		events[jk].add(k.Locality, int(v))
	})
	drops := map[jobKey]*ByLocality{}
	policies := map[jobKey][]string{}
	selected := map[jobKey][]string{}
	agg.Drops().Each(func(k hubble.DropKey, v float64) {
		jk := jobKey{k.Namespace, k.Job}
		if drops[jk] == nil {
			drops[jk] = &ByLocality{}
		}
		drops[jk].add(k.Locality, int(v))
		if k.PolicyName != "" {
			p := k.PolicyName
			if k.PolicyNamespace != "" {
				p = k.PolicyNamespace + "/" + p
			}
			names := []string{p}
			if k.PolicySource == hubble.PolicySourceSelected {
				names = named.full[p] // several that each deny
			}
			for _, p := range names {
				if !slices.Contains(policies[jk], p) {
					policies[jk] = append(policies[jk], p)
				}
				if k.PolicySource == hubble.PolicySourceSelected && !slices.Contains(selected[jk], p) {
					selected[jk] = append(selected[jk], p)
				}
			}
		}
	})

	for _, jp := range index.Placements("") {
		jk := jobKey{jp.Job.Namespace, jp.Job.Name}
		j := Job{
			Namespace: jp.Job.Namespace, JobName: jp.Job.Name, JobKind: jp.Job.Kind,
			Zones: map[string]RoleCount{}, SplitZone: jp.Split(),
			CoordinatorZones: []string{}, DenyingPolicies: []string{}, SelectedPolicies: []string{},
		}
		for _, p := range jp.Pods {
			c := j.Zones[p.Zone]
			if p.Role == topology.RoleCoordinator {
				c.Coordinator++
				if !slices.Contains(j.CoordinatorZones, p.Zone) {
					j.CoordinatorZones = append(j.CoordinatorZones, p.Zone)
				}
			} else {
				c.Worker++
				if !slices.Contains(j.workerZones, p.Zone) {
					j.workerZones = append(j.workerZones, p.Zone)
				}
			}
			j.Zones[p.Zone] = c
		}
		sort.Strings(j.CoordinatorZones)
		sort.Strings(j.workerZones)
		if d := drops[jk]; d != nil {
			j.PolicyDrops = *d
		}
		if e := events[jk]; e != nil {
			j.FlowEvents = *e
		}
		if p := policies[jk]; p != nil {
			sort.Strings(p)
			j.DenyingPolicies = p
		}
		if p := selected[jk]; p != nil {
			sort.Strings(p)
			j.SelectedPolicies = p
		}
		if o := own[jk]; o != nil {
			j.ownCrossDrops, j.ownCrossForwarded = o.drops, o.forwarded
		}
		if u, ok := util[jk]; ok {
			j.GPUUtilization = &u
			j.gpus = gpus[jk]
		}
		switch {
		case !j.SplitZone:
			j.Verdict = VerdictHealthy
		case j.ownCrossDrops > 0:
			j.Verdict = VerdictBlocked
		case j.ownCrossForwarded > 0:
			j.Verdict = VerdictCrossZoneTraffic
		default:
			j.Verdict = VerdictSplit
		}
		if j.SplitZone {
			j.SuggestedFix = suggestedFix(&j, pods.jobs[jk], nodes, pods.used,
				in.PodGroups == PodGroupsOn || ((in.PodGroups == PodGroupsAuto || in.PodGroups == "") && pods.podGroups))
		}
		rep.Jobs = append(rep.Jobs, j)
	}
	return rep, nil
}

// allNamed names a drop's fences as the exporter does, and keeps every
// policy behind each label value, which names at most fence.MaxNamed of
// them and then "+N" (not a policy).
type allNamed struct {
	set  *fence.Set
	full map[string][]string
}

func (a *allNamed) Name(egress bool, subject, peer uint32, proto uint8, port uint16) string {
	v := a.set.Name(egress, subject, peer, proto, port)
	if v == "" {
		return v
	}
	for _, r := range a.set.DenyingIDs(egress, subject, peer, proto, port) {
		if n := r.String(); !slices.Contains(a.full[v], n) {
			a.full[v] = append(a.full[v], n)
		}
	}
	return v
}

// readFlows feeds one flow file through the aggregator. Bad lines are
// counted and reported, as the exporter skips malformed flows; a file with
// no flow at all is not hubble output and fails.
func readFlows(path string, agg *hubble.Aggregator, fences *fence.Set, own map[jobKey]*ownTraffic, rep *Report, warn io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading flows: %w", err)
	}
	defer f.Close()
	st, err := hubble.ReadFlows(f, func(fl *flowpb.Flow) {
		if fences != nil {
			// Whole flows carry their identities' labels: the fence of a
			// default deny is evaluated on them.
			for _, ep := range []*flowpb.Endpoint{fl.GetSource(), fl.GetDestination()} {
				fences.LearnIdentity(ep.GetIdentity(), ep.GetLabels())
			}
		}
		r := agg.Observe(fl)
		if r.Count == hubble.NotCounted {
			return
		}
		if r.SrcUnresolved || r.DstUnresolved {
			rep.UnresolvedFlows++
		}
		// Traffic between two pods of one job in different zones: what
		// makes a split job blocked (dropped) or slow (forwarded). The
		// peer relation is the exporter's own (the peer label).
		if r.Job == nil || r.Peer != hubble.PeerJob ||
			(r.Locality != topology.LocalityCrossZone && r.Locality != topology.LocalityCrossRegion) {
			return
		}
		k := jobKey{r.Job.Namespace, r.Job.Name}
		o := own[k]
		if o == nil {
			o = &ownTraffic{}
			own[k] = o
		}
		switch {
		case r.PolicyDrop():
			o.drops++
		case r.Count == hubble.Forwarded:
			o.forwarded++
		}
	})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if st.Flows == 0 && st.Bad > 0 {
		e := st.Errors[0]
		return fmt.Errorf("%s:%d: not hubble observe output (no line holds a flow): %v", path, e.Line, e.Err)
	}
	for _, e := range st.Errors {
		fmt.Fprintf(warn, "%s:%d: skipped: %v\n", path, e.Line, e.Err)
	}
	if n := st.Bad - len(st.Errors); n > 0 {
		fmt.Fprintf(warn, "%s: %d more bad lines skipped\n", path, n)
	}
	rep.FlowsRead += st.Flows
	rep.BadLines += st.Bad
	rep.LostEvents += st.LostEvents
	return nil
}

// page is a GPU reading that is always current (gpu.Getter).
type page []gpu.Sample

func (p page) Get() ([]gpu.Sample, bool) { return p, true }

// readGPU joins a dcgm-exporter page with the index the way the exporter
// does (its pod labels; there is no PodResources socket offline) and
// returns each job's mean GPU utilization and its number of GPUs.
func readGPU(path string, index *topology.Index, rep *Report, warn io.Writer) (map[jobKey]float64, map[jobKey]int, error) {
	if path == "" {
		return nil, nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the GPU page: %w", err)
	}
	defer f.Close()
	samples, skipped, err := gpu.ParseDCGMExporter(f, time.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if skipped > 0 {
		fmt.Fprintf(warn, "%s: %d series without a GPU UUID skipped\n", path, skipped)
	}
	rep.gpuPage = true
	rows, _ := gpu.NewCollector(page(samples), nil, index, "").Join(nil)
	sum, n := map[jobKey]float64{}, map[jobKey]int{}
	for _, r := range rows {
		if r.Pod != "" {
			rep.gpuPods++
		}
		if r.JobName == "" || math.IsNaN(r.Util) {
			continue
		}
		k := jobKey{r.Namespace, r.JobName}
		sum[k] += r.Util
		n[k]++
	}
	for k := range sum {
		sum[k] /= float64(n[k])
	}
	return sum, n, nil
}
