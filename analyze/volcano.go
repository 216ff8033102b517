package analyze

import (
	"fmt"
	"strings"

	"github.com/zonewatch/zonewatch/collector/kube"
)

// VolcanoRelease is the Volcano source the networkTopology advice is read
// from: volcano.sh/apis v1.14.0, pkg/apis/batch/v1alpha1/job.go
// (JobSpec.NetworkTopology: NetworkTopologySpec{Mode "hard"|"soft",
// HighestTierAllowed}) and pkg/apis/topology/v1alpha1/hypernode_types.go
// (HyperNode, topology.volcano.sh/v1alpha1: spec.tier, spec.members[] of
// type Node with selector.labelMatch). Volcano itself cannot be built
// from the module proxy (its go.mod replaces its own staging modules), so
// this advice has not run against Volcano's scheduler.
const VolcanoRelease = "volcano.sh/apis v1.14.0"

// volcanoLines: under Volcano's own scheduler a Volcano Job is a gang
// (minAvailable) and, with networkTopology mode hard and
// highestTierAllowed 1, is kept inside one tier-1 HyperNode; HyperNodes of
// one zone each make that one zone. spec is the job's part, hyperNode the
// administrator's (ZONE for each zone).
func volcanoLines(pods int) (l struct{ spec, hyperNode []string }) {
	l.spec = []string{
		"spec:",
		"  schedulerName: volcano",
		fmt.Sprintf("  minAvailable: %d", pods),
		"  networkTopology:",
		"    mode: hard",
		"    highestTierAllowed: 1",
	}
	l.hyperNode = []string{
		"apiVersion: topology.volcano.sh/v1alpha1",
		"kind: HyperNode",
		"metadata:",
		"  name: zone-ZONE",
		"spec:",
		"  tier: 1",
		"  members:",
		"  - type: Node",
		"    selector:",
		"      labelMatch:",
		"        matchLabels:",
		"          " + kube.LabelZone + ": ZONE",
	}
	return l
}

// volcanoAdvice is volcanoLines as comments, the alternative to a pin.
// Written as comments: it is untested.
func volcanoAdvice(pods int) string {
	l := volcanoLines(pods)
	lines := append([]string{
		fmt.Sprintf("Alternative under Volcano's own scheduler (UNTESTED: read from %s, not run here): a gang of all %d pods kept in one", VolcanoRelease, pods),
		"tier-1 HyperNode, with one HyperNode per zone (the administrator's, once per zone), instead of the pin above:",
	}, l.spec...)
	lines = append(append(lines, "---"), l.hyperNode...)
	var b strings.Builder
	for _, line := range lines {
		b.WriteString("# " + line + "\n")
	}
	return b.String()
}
