// Command zonewatch-exporter exports where training-job pods run, what the
// network does between their zones, and how busy their GPUs are.
//
// main.go is the wiring only: flags.go declares the command line, parts.go
// the part registry (where a new source or informer is wired: see the
// comment there), kube.go the Kubernetes feed, server.go the HTTP server,
// and each source (hubble.go, gpu.go, conntrack.go, probe.go) registers
// itself from its own file.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/common/promslog"
	"github.com/prometheus/common/version"
	"k8s.io/klog/v2"

	"github.com/zonewatch/zonewatch/collector"
	"github.com/zonewatch/zonewatch/report"
	"github.com/zonewatch/zonewatch/topology"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// run is the whole program; it returns the exit code when ctx is done or
// the server fails.
func run(ctx context.Context, args []string) int {
	app, serve, o := newApp()
	analyze := addAnalyze(app, o.jobRules)
	costReport := report.AddCommand(app, os.Stdout, os.Stderr)
	cmd, err := app.Parse(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "zonewatch-exporter: %v (try --help)\n", err)
		return 2
	}
	switch cmd {
	case "analyze":
		return analyze()
	case "report":
		return costReport()
	case serve.FullCommand():
	default:
		return 2
	}

	logger := promslog.New(&o.log)
	// Before any input is read: the first process only opens pins from
	// here on, its child does the rest (confine.go).
	loadPin, code, exit := confineSelf(o, logger)
	if exit {
		return code
	}
	// client-go's informers and RBAC errors log through klog: follow
	// --log.level and --log.format too.
	klog.SetSlogLogger(logger.With("component", "kubernetes"))
	logger.Info("starting zonewatch-exporter", "version", version.Info())
	logger.Info("build context", "build_context", version.BuildContext())

	rules, err := topology.ParseRules(*o.jobRules)
	if err != nil {
		logger.Error("bad --kube.job-rule", "err", err)
		return 2
	}
	w, reg, err := newWiring(o, logger)
	if err != nil {
		logger.Error("bad flags", "err", err)
		return 2
	}

	// The inputs: the simulated cluster's fakes or a real node's systems;
	// nothing after this line knows which.
	var in *inputs
	if *o.simulate {
		var stop func()
		if in, stop, err = simulate(ctx, o, logger); err != nil {
			logger.Error("starting the simulated cluster", "err", err)
			return 1
		}
		defer stop()
	} else if in, err = realInputs(o, loadPin); err != nil {
		logger.Error("no Kubernetes cluster to watch", "err", err)
		return 2
	}

	placement, err := startKube(ctx, w, in, rules, *o.resync)
	if err != nil {
		logger.Error("kubernetes feed", "err", err)
		return 1
	}
	if err := startParts(ctx, w, in); err != nil {
		logger.Error("starting a source", "err", err)
		return 1
	}
	if err := serveHTTP(ctx, o, logger, collector.Gatherer(reg, placement), w.synced, w.exporter); err != nil {
		logger.Error("serving", "err", err)
		return 1
	}
	return 0
}
