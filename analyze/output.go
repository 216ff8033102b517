package analyze

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// WriteJSON writes the report as the documented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

var severity = map[string]int{VerdictBlocked: 0, VerdictCrossZoneTraffic: 1, VerdictSplit: 2, VerdictHealthy: 3}

// WriteText writes the report for a person: one block per job, worst
// first, saying what was seen and what to do.
func (r *Report) WriteText(w io.Writer) error {
	jobs := make([]*Job, len(r.Jobs))
	for i := range r.Jobs {
		jobs[i] = &r.Jobs[i]
	}
	// Stable: within a verdict, the JSON order (namespace, name).
	sort.SliceStable(jobs, func(a, b int) bool { return severity[jobs[a].Verdict] < severity[jobs[b].Verdict] })
	var b strings.Builder
	for _, j := range jobs {
		j.writeText(&b, r)
		b.WriteByte('\n')
	}
	if len(jobs) == 0 {
		b.WriteString("No pod of a training job is scheduled in the pod dump (jobs are recognised by their labels: see --kube.job-rule).\n")
	}
	count := map[string]int{}
	for _, j := range jobs {
		count[j.Verdict]++
	}
	fmt.Fprintf(&b, "%s: %d blocked, %d with cross-zone traffic, %d split, %d healthy. %s read, %s, %d with an address no dump places.\n",
		plural(len(jobs), "training job"), count[VerdictBlocked], count[VerdictCrossZoneTraffic], count[VerdictSplit], count[VerdictHealthy],
		plural(r.FlowsRead, "flow"), plural(r.BadLines, "bad line"), r.UnresolvedFlows)
	if r.LostEvents > 0 {
		fmt.Fprintf(&b, "Hubble reported %d events lost while capturing: the counts are lower bounds.\n", r.LostEvents)
	}
	if r.gpuPage && r.gpuPods == 0 {
		b.WriteString("The GPU page attributes no GPU to a pod (dcgm-exporter runs without its Kubernetes mapping): no GPU utilization per job.\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (j *Job) writeText(b *strings.Builder, r *Report) {
	fmt.Fprintf(b, "%s  %s/%s (%s)\n", strings.ToUpper(strings.ReplaceAll(j.Verdict, "_", " ")), j.Namespace, j.JobName, j.JobKind)
	zones := make([]string, 0, len(j.Zones))
	for z := range j.Zones {
		zones = append(zones, z)
	}
	sort.Strings(zones)
	var parts []string
	for _, z := range zones {
		c := j.Zones[z]
		var roles []string
		if c.Coordinator > 0 {
			roles = append(roles, plural(c.Coordinator, "coordinator"))
		}
		if c.Worker > 0 {
			roles = append(roles, plural(c.Worker, "worker"))
		}
		parts = append(parts, z+": "+strings.Join(roles, ", "))
	}
	fmt.Fprintf(b, "  pods  %s\n", strings.Join(parts, "; "))
	if j.SplitZone && len(j.CoordinatorZones) > 0 && len(j.workerZones) > 0 && !overlap(j.CoordinatorZones, j.workerZones) {
		fmt.Fprintf(b, "  The coordinator runs in %s, away from its workers in %s.\n", strings.Join(j.CoordinatorZones, ", "), strings.Join(j.workerZones, ", "))
	}
	switch j.Verdict {
	case VerdictBlocked:
		by := "by a policy the capture does not name (default deny, or Cilium older than 1.16; --policies names the fence of a default deny)"
		if len(j.DenyingPolicies) > 0 {
			by = "by " + strings.Join(j.DenyingPolicies, ", ")
		}
		if len(j.SelectedPolicies) > 0 {
			by += " (" + strings.Join(j.SelectedPolicies, ", ") + ": default deny, which Cilium names no policy of; named by zonewatch: selects the denying pods and allows none of the peer)"
		}
		fmt.Fprintf(b, "  %s between its own pods in different zones dropped %s: rendezvous cannot complete and the GPUs wait.\n",
			plural(j.ownCrossDrops, "packet"), by)
	case VerdictCrossZoneTraffic:
		fmt.Fprintf(b, "  %s between its own pods crossed zones: every collective pays the inter-zone round trip, and the bytes are billed as inter-AZ transfer.\n",
			plural(j.ownCrossForwarded, "flow event"))
	case VerdictSplit:
		b.WriteString("  No traffic between its pods in different zones was captured. A zone policy between them blocks the job; without one it runs slower and pays for inter-AZ bytes.\n")
	case VerdictHealthy:
		fmt.Fprintf(b, "  Every scheduled pod runs in one zone.\n")
	}
	drops := j.PolicyDrops.total()
	if other := drops - j.ownCrossDrops; other > 0 {
		policy := ""
		if len(j.DenyingPolicies) > 0 && j.Verdict != VerdictBlocked {
			policy = " (" + strings.Join(j.DenyingPolicies, ", ") + ")"
		}
		fmt.Fprintf(b, "  %s%s with peers outside the job or in one zone: they do not block its own cross-zone traffic.\n", plural(other, "other policy drop"), policy)
	}
	if ev := j.FlowEvents.total(); ev > 0 {
		fmt.Fprintf(b, "  Flow events (forwarded and dropped): %d same zone, %d cross zone, %d cross region, %d unknown.\n",
			j.FlowEvents.Zone, j.FlowEvents.CrossZone, j.FlowEvents.CrossRegion, j.FlowEvents.Unknown)
	}
	if j.GPUUtilization != nil {
		fmt.Fprintf(b, "  GPU utilization %.1f%% on %s.\n", *j.GPUUtilization*100, plural(j.gpus, "GPU"))
	}
	if j.SuggestedFix != "" {
		b.WriteString("  Fix:\n")
		for _, line := range strings.Split(strings.TrimRight(j.SuggestedFix, "\n"), "\n") {
			b.WriteString("    " + line + "\n")
		}
	}
}

func (b ByLocality) total() int { return b.Zone + b.CrossZone + b.CrossRegion + b.Unknown }

func overlap(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
