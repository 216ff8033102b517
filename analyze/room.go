package analyze

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/zonewatch/zonewatch/collector/gpu"
)

// podDemand is what one unfinished pod of a job asks of a node.
type podDemand struct {
	replicaType  string
	requests     corev1.ResourceList
	gpus         int64
	tolerations  []corev1.Toleration
	nodeSelector map[string]string
	required     *corev1.NodeSelector // required node affinity
	node         string               // bound node; empty while pending
}

// podRequests is the pod's effective request as the scheduler computes it
// (NodeResourcesFit): the sum of its containers, at least each init
// container, plus the pod overhead; one pod slot.
func podRequests(p *corev1.Pod) corev1.ResourceList {
	out := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}
	for _, c := range p.Spec.Containers {
		for name, q := range effective(c.Resources) {
			sum := out[name]
			sum.Add(q)
			out[name] = sum
		}
	}
	for _, c := range p.Spec.InitContainers {
		for name, q := range effective(c.Resources) {
			if have := out[name]; have.Cmp(q) < 0 {
				out[name] = q
			}
		}
	}
	for name, q := range p.Spec.Overhead {
		sum := out[name]
		sum.Add(q)
		out[name] = sum
	}
	return out
}

// effective: requests, else limits (the apiserver defaults requests of
// extended resources to their limits; a hand-written dump may not have).
func effective(r corev1.ResourceRequirements) corev1.ResourceList {
	out := corev1.ResourceList{}
	for name, q := range r.Limits {
		out[name] = q
	}
	for name, q := range r.Requests {
		out[name] = q
	}
	return out
}

// gpuCount sums the GPU resources (whole and MIG) of a resource list.
func gpuCount(l corev1.ResourceList) int64 {
	var n int64
	for name, q := range l {
		if (gpu.ResourceFilter{}).Match(string(name)) {
			n += q.Value()
		}
	}
	return n
}

// zoneRoom is one zone's answer to "can it hold the whole job now".
type zoneRoom struct {
	zone     string
	fits     bool
	freeGPUs int64 // free GPUs on the nodes the job may use, its own pods' freed
}

// roomByZone tries every zone: can the job's unfinished pods, all of them
// re-created, fit on the zone's ready, schedulable nodes they may use,
// given what the other pods there request? It packs the pods largest
// first (GPUs, then CPU) on the first node with room, as a feasibility
// check: the scheduler itself spreads (least allocated), so pods of
// different sizes may still fragment a zone that fits here. Pods without
// GPUs may use tainted GPU nodes (the fix makes them tolerate the taint).
// Zones come sorted: those that fit first, most free GPUs first.
func roomByZone(demand []podDemand, nodes map[string]nodeInfo, used map[string]corev1.ResourceList) []zoneRoom {
	byZone := map[string][]string{}
	for name, n := range nodes {
		if n.zone != "" && n.zone != "unknown" && n.ready && !n.unschedulable {
			byZone[n.zone] = append(byZone[n.zone], name)
		}
	}
	// The job's own pods are re-created: what they use is free.
	own := map[string]corev1.ResourceList{}
	for _, d := range demand {
		if d.node != "" {
			own[d.node] = addList(own[d.node], d.requests)
		}
	}
	pods := slices.Clone(demand)
	sort.SliceStable(pods, func(a, b int) bool {
		if pods[a].gpus != pods[b].gpus {
			return pods[a].gpus > pods[b].gpus
		}
		return pods[a].requests.Cpu().Cmp(*pods[b].requests.Cpu()) > 0
	})
	var out []zoneRoom
	for zone, names := range byZone {
		sort.Strings(names)
		free := map[string]corev1.ResourceList{}
		zr := zoneRoom{zone: zone, fits: true}
		for _, name := range names {
			f := corev1.ResourceList{}
			for res, q := range nodes[name].allocatable {
				q = q.DeepCopy()
				if u, ok := used[name][res]; ok {
					q.Sub(u)
				}
				if o, ok := own[name][res]; ok {
					q.Add(o)
				}
				f[res] = q
			}
			free[name] = f
			if usable(pods, nodes[name]) {
				zr.freeGPUs += gpuCount(f)
			}
		}
		for i := range pods {
			placed := false
			for _, name := range names {
				if !mayRun(&pods[i], nodes[name]) || !fitsIn(pods[i].requests, free[name]) {
					continue
				}
				for res, q := range pods[i].requests {
					f := free[name][res]
					f.Sub(q)
					free[name][res] = f
				}
				placed = true
				break
			}
			if !placed {
				zr.fits = false
				break
			}
		}
		out = append(out, zr)
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].fits != out[b].fits {
			return out[a].fits
		}
		if out[a].freeGPUs != out[b].freeGPUs {
			return out[a].freeGPUs > out[b].freeGPUs
		}
		return out[a].zone < out[b].zone
	})
	return out
}

// usable: some pod of the job may run on the node.
func usable(pods []podDemand, n nodeInfo) bool {
	for i := range pods {
		if mayRun(&pods[i], n) {
			return true
		}
	}
	return false
}

func addList(a, b corev1.ResourceList) corev1.ResourceList {
	if a == nil {
		a = corev1.ResourceList{}
	}
	for name, q := range b {
		s := a[name]
		s.Add(q)
		a[name] = s
	}
	return a
}

// fitsIn: every request is at most what is free; a resource the node
// does not list has none free.
func fitsIn(req, free corev1.ResourceList) bool {
	for name, q := range req {
		if q.IsZero() {
			continue
		}
		f, ok := free[name]
		if !ok || f.Cmp(q) < 0 {
			return false
		}
	}
	return true
}

// mayRun: the node's taints, labels and the pod's node selector and
// required node affinity allow the pod there. A pod without GPUs
// tolerates the taints of GPU nodes (the fix adds the tolerations).
func mayRun(p *podDemand, n nodeInfo) bool {
	if !(p.gpus == 0 && n.gpu) {
		for i := range n.taints {
			if !tolerated(p.tolerations, &n.taints[i]) {
				return false
			}
		}
	}
	for k, v := range p.nodeSelector {
		if n.labels[k] != v {
			return false
		}
	}
	if p.required == nil || len(p.required.NodeSelectorTerms) == 0 {
		return true
	}
	for _, term := range p.required.NodeSelectorTerms {
		if termMatches(term, n.labels) {
			return true
		}
	}
	return false
}

// termMatches evaluates a node selector term's label expressions (fields
// are not kept: a term on metadata.name is taken as matching).
func termMatches(term corev1.NodeSelectorTerm, labels map[string]string) bool {
	for _, e := range term.MatchExpressions {
		v, has := labels[e.Key]
		switch e.Operator {
		case corev1.NodeSelectorOpIn:
			if !has || !slices.Contains(e.Values, v) {
				return false
			}
		case corev1.NodeSelectorOpNotIn:
			if has && slices.Contains(e.Values, v) {
				return false
			}
		case corev1.NodeSelectorOpExists:
			if !has {
				return false
			}
		case corev1.NodeSelectorOpDoesNotExist:
			if has {
				return false
			}
		}
	}
	return true
}

// roomSummary renders the zones' free GPUs: "us-east-1a 16, us-east-1b 4".
func roomSummary(rooms []zoneRoom) string {
	parts := make([]string, 0, len(rooms))
	sorted := slices.Clone(rooms)
	sort.Slice(sorted, func(a, b int) bool { return sorted[a].zone < sorted[b].zone })
	for _, r := range sorted {
		parts = append(parts, fmt.Sprintf("%s %d", r.zone, r.freeGPUs))
	}
	return strings.Join(parts, ", ")
}
