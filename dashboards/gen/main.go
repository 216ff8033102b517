// Command gen writes zonewatch's Grafana dashboards: the JSON under
// dashboards/json, a ConfigMap per dashboard under dashboards/configmaps, and
// the Helm chart's copy under deploy/helm/zonewatch/dashboards.
//
// Run from the repository root: go run ./dashboards/gen
package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/zonewatch/zonewatch/dashboards"
)

func main() {
	def := dashboards.DefaultOptions()
	opts := def
	root := flag.String("root", ".", "repository root to write into")
	flag.StringVar(&opts.ClusterLabel, "cluster-label", def.ClusterLabel, "label that names the cluster (the cluster_label constant); non-empty shows the cluster variable")
	flag.StringVar(&opts.ScrapeJob, "scrape-job", def.ScrapeJob, "default of the scrape_job variable: the Prometheus job label of the exporter targets")
	flag.StringVar(&opts.RunbookBaseURL, "runbook-base-url", def.RunbookBaseURL, "runbook document the panels link to (<url>#<section>); match the rules config")
	flag.Float64Var(&opts.CrossZoneUSDPerGB, "cross-zone-usd-per-gb", def.CrossZoneUSDPerGB, "price of one GB (1e9 bytes) sent across zones; match the rules config")
	flag.Float64Var(&opts.GPUUSDPerHour, "gpu-usd-per-hour", def.GPUUSDPerHour, "price of one GPU-hour; match the rules config")
	flag.Float64Var(&opts.IdleGPUUtilization, "idle-gpu-utilization", def.IdleGPUUtilization, "utilization ratio below which a GPU counts as idle; match the idle alert")
	flag.StringVar(&opts.Folder, "folder", def.Folder, "Grafana folder for the sidecar (grafana_folder annotation)")
	flag.Parse()

	if err := run(*root, opts); err != nil {
		fmt.Fprintln(os.Stderr, "dashboards/gen:", err)
		os.Exit(1)
	}
}

func run(root string, opts dashboards.Options) error {
	files, err := dashboards.Files(opts)
	if err != nil {
		return err
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		dst := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("creating directory for %s: %w", p, err)
		}
		if err := os.WriteFile(dst, files[p], 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
	}
	fmt.Printf("dashboards/gen: wrote %d files\n", len(files))
	return nil
}
