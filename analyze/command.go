package analyze

import (
	"fmt"
	"io"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/topology"
)

// AddCommand declares the analyze command and its flags on app and
// returns the function that runs it once app.Parse has chosen it. The
// function returns the exit code: 0 no job split, 1 some job split or
// blocked, 2 an input that cannot be read (bad usage fails app.Parse).
// jobRules is the --kube.job-rule flag, which the exporter declares once for
// every command.
func AddCommand(app *kingpin.Application, jobRules *[]string, stdout, stderr io.Writer) func() int {
	cmd := app.Command("analyze", "Diagnose captured files offline: which training jobs are split across zones, blocked by policy or paying for cross-zone traffic, and how to fix them.")
	nodes := cmd.Flag("nodes", "kubectl get nodes -o json (or -o yaml) output.").PlaceHolder("FILE").Required().String()
	pods := cmd.Flag("pods", "kubectl get pods -A -o json (or -o yaml) output; with owner objects in the List (kubectl get pods,jobs,jobsets,rayclusters) job_kind is the top owner.").PlaceHolder("FILE").Required().String()
	flows := cmd.Flag("flows", "hubble observe -o jsonpb (or -o json) output; repeatable, e.g. one file per node.").PlaceHolder("FILE").Strings()
	policies := cmd.Flag("policies", "kubectl get cnp,ccnp -A -o json, kubectl get networkpolicies -A -o json, or one file with all kinds (or -o yaml): names the fence behind default-deny drops, which Cilium names no policy of (from the flows' identity labels).").PlaceHolder("FILE").String()
	gpuPage := cmd.Flag("gpu", "A dcgm-exporter /metrics page (with its pod labels) for GPU utilization per job.").PlaceHolder("FILE").String()
	podGroups := cmd.Flag("podgroups", "Advise kube-scheduler's native gang + topology scheduling (scheduling.k8s.io/v1beta1 PodGroups; Kubernetes 1.37 with GenericWorkload and TopologyAwareWorkloadScheduling on): on, off (Kueue TAS instead), or auto (on when the pods dump holds such a PodGroup: kubectl get pods,podgroups.scheduling.k8s.io -A).").Default("auto").Enum("auto", "on", "off")
	output := cmd.Flag("output", "Output format: text or json.").Short('o').Default("text").Enum("text", "json")
	// Positional files join --flows, so that `--flows node-*.jsonl` works.
	moreFlows := cmd.Arg("flow-files", "More hubble observe output files.").Strings()
	return func() int {
		rules, err := topology.ParseRules(*jobRules)
		if err != nil {
			fmt.Fprintf(stderr, "zonewatch-exporter analyze: --kube.job-rule: %v\n", err)
			return 2
		}
		rep, err := Run(Input{Nodes: *nodes, Pods: *pods, Flows: append(*flows, *moreFlows...), GPU: *gpuPage, Policies: *policies, Rules: rules, PodGroups: PodGroups(*podGroups), Warn: stderr})
		if err != nil {
			fmt.Fprintf(stderr, "zonewatch-exporter analyze: %v\n", err)
			return 2
		}
		if *output == "json" {
			err = rep.WriteJSON(stdout)
		} else {
			err = rep.WriteText(stdout)
		}
		if err != nil {
			fmt.Fprintf(stderr, "zonewatch-exporter analyze: writing the report: %v\n", err)
			return 2
		}
		return rep.ExitCode()
	}
}
