// Command zonewatch-exporter exports where training-job pods run, what the
// network does between their zones, and how busy their GPUs are.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"
	"k8s.io/klog/v2"

	"github.com/zonewatch/zonewatch/collector"
	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/report"
	"github.com/zonewatch/zonewatch/topology"
)

// defaultPort is outside 9100-9999, which the Prometheus default port
// allocations list has fully handed out.
const defaultPort = "19420"

// part is one optional data source (hubble, gpu, conntrack). Each lives in
// its own file and registers itself, so main stays thin.
type part interface {
	flags(cmd *kingpin.CmdClause)
	// input fills in, from the part's flags, what it reads on a real node.
	input(in *inputs)
	start(ctx context.Context, w *wiring, in *inputs) error
}

type namedPart struct {
	name string
	part
}

var parts []namedPart

// register adds a part; name is its component key in the logs.
func register(name string, p part) { parts = append(parts, namedPart{name, p}) }

// wiring is what a part plugs itself into.
type wiring struct {
	logger   *slog.Logger
	index    *topology.Index
	exporter *collector.Exporter
	// self registers the exporter's own counters (flows processed,
	// reconnects, ...); the job metrics are served from the same registry.
	self     prometheus.Registerer
	nodeName string
	// shard is this replica's share of the nodes in Relay mode (one shard
	// of one: every node).
	shard hubble.Shard
}

// envOf is the environment variable that also sets a flag: ZONEWATCH_ and
// the name in upper case with . and - as _.
func envOf(name string) string {
	return "ZONEWATCH_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(name))
}

// flagOf declares a flag that can also be set by its environment variable.
func flagOf(c *kingpin.CmdClause, name, help string) *kingpin.FlagClause {
	return c.Flag(name, help).Envar(envOf(name))
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// options are the command line's own flags; parts declare theirs.
type options struct {
	web         *web.FlagConfig
	log         promslog.Config
	metricsURL  *string
	maxRequests *int
	nodeName    *string
	shard       *int
	totalShards *int
	kubeconfig  *string
	jobRules    *[]string
	resync      *time.Duration
	simulate    *bool
}

// newApp declares the command line: the log flags and --kube.job-rule for
// every command (serve and analyze), the rest for serve.
func newApp() (*kingpin.Application, *kingpin.CmdClause, *options) {
	app := kingpin.New("zonewatch-exporter", "Finds GPU training jobs split across availability zones and exports what it costs.")
	app.Version(version.Print("zonewatch-exporter"))
	app.HelpFlag.Short('h')
	o := &options{}
	promslogflag.AddFlags(app, &o.log)
	o.jobRules = app.Flag("kube.job-rule", "Job identity rule \""+topology.RuleSyntax+"\"; repeatable; replaces the built-in rules (docs/topology.md).").PlaceHolder("RULE").Strings()
	for _, f := range app.Model().Flags {
		if f.Name != "help" && f.Name != "version" {
			app.GetFlag(f.Name).Envar(envOf(f.Name))
		}
	}

	serve := app.Command("serve", "Run the exporter (default).").Default()
	o.web = kingpinflag.AddFlags(serve, ":"+defaultPort)
	o.metricsURL = flagOf(serve, "web.telemetry-path", "Path under which to expose metrics; /healthz and /readyz sit beside it.").Default("/metrics").String()
	o.maxRequests = flagOf(serve, "web.max-requests", "Maximum number of parallel scrape requests. Use 0 to disable.").Default("40").Int()
	o.nodeName = flagOf(serve, "node-name", "This exporter's node: only job pods on it are exported (DaemonSet). Defaults to $NODE_NAME; empty exports every node's jobs (one replica, e.g. with Hubble Relay).").Default(os.Getenv("NODE_NAME")).String()
	o.shard = flagOf(serve, "shard", "This replica's shard, 0 to --total-shards - 1 (Relay mode, empty --node-name): it follows the flows and exports the job pods of the nodes whose name hashes to it (docs/performance.md).").Default("0").Int()
	o.totalShards = flagOf(serve, "total-shards", "Number of Relay replicas sharing the nodes; 1 follows every node.").Default("1").Int()
	o.kubeconfig = flagOf(serve, "kubeconfig", "Path to a kubeconfig; empty uses the in-cluster config. Defaults to $KUBECONFIG.").Default(os.Getenv("KUBECONFIG")).String()
	o.resync = flagOf(serve, "kube.resync", "Informer resync period (0 disables).").Default("0s").Duration()
	o.simulate = flagOf(serve, "simulate", "Run on the built-in simulated cluster (every source fed by fakes speaking the real protocols).").Bool()
	for _, p := range parts {
		p.flags(serve)
	}
	for _, f := range serve.Model().Flags {
		if f.Envar == "" { // the exporter-toolkit's web flags
			serve.GetFlag(f.Name).Envar(envOf(f.Name))
		}
	}
	return app, serve, o
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
	}
	if cmd != serve.FullCommand() {
		return 2
	}

	logger := promslog.New(&o.log)
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

	w := &wiring{logger: logger, index: topology.NewIndex(), nodeName: *o.nodeName,
		shard: hubble.Shard{Index: *o.shard, Total: *o.totalShards, Cluster: "default"}}
	if err := w.shard.Validate(); err != nil {
		logger.Error("bad --shard/--total-shards", "err", err)
		return 2
	}
	if w.shard.Sharded() && w.nodeName != "" {
		logger.Error("--total-shards shards Relay mode: --node-name must be empty", "node", w.nodeName)
		return 2
	}
	w.exporter = collector.New(logger)
	selfReg := prometheus.NewRegistry()
	selfReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector("zonewatch"))
	w.self = selfReg
	// One registry serves the job metrics and the exporter's own: merged
	// through prometheus.Gatherers every series would be checked a second
	// time (24k allocations more per Relay scrape at 2,000 jobs,
	// docs/performance.md).
	reg := selfReg
	reg.MustRegister(w.exporter)

	var in *inputs
	if *o.simulate {
		var stop func()
		in, stop, err = simulate(ctx, o, logger)
		if err != nil {
			logger.Error("starting the simulated cluster", "err", err)
			return 1
		}
		defer stop()
	} else if in, err = realInputs(o); err != nil {
		logger.Error("no Kubernetes cluster to watch", "err", err)
		return 2
	}

	live, factories, err := kube.NewLive(in.kube, w.index, rules, *o.resync, logger.With("component", "kubernetes"))
	if err != nil {
		logger.Error("setting up informers", "err", err)
		return 1
	}
	live.WithOwners(in.meta, in.kube.Discovery())
	w.exporter.AddSource("kubernetes", live)
	// The placement series are served beside the registry
	// (collector.Gatherer), not through it: at 2,000 jobs a Relay scrape
	// takes 16 ms and 208 allocations instead of 46 ms and 48k
	// (docs/performance.md).
	var placement *collector.Placement
	if w.shard.Sharded() {
		placement = collector.NewShardPlacement(w.index, w.shard.Owns)
		logger.Info("relay shard", "shard", w.shard.Index, "total_shards", w.shard.Total)
	} else {
		placement = collector.NewPlacement(w.index, w.nodeName)
	}
	go func() {
		if err := live.Run(ctx, factories); err != nil {
			if ctx.Err() == nil {
				logger.Error("kubernetes feed", "err", err)
			}
			return
		}
		// The first lists are garbage once the informers hold their
		// stripped objects: return those pages now, not at the
		// scavenger's pace (docs/performance.md, Memory).
		debug.FreeOSMemory()
	}()

	for _, p := range parts {
		pw := *w
		pw.logger = logger.With("component", p.name)
		if err := p.start(ctx, &pw, in); err != nil {
			logger.Error("starting source", "component", p.name, "err", err)
			return 1
		}
	}

	mux := http.NewServeMux()
	mux.Handle(*o.metricsURL, promhttp.HandlerFor(collector.Gatherer(reg, placement), promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelError), ErrorHandling: promhttp.ContinueOnError,
		MaxRequestsInFlight: *o.maxRequests,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	// Ready once the topology is synced. A source that is down (Cilium
	// without ctAccounting, Hubble restarting) is reported in the body and
	// as zonewatch_source_up 0, but does not make the pod unready: an
	// unready pod drops out of a ServiceMonitor's endpoints, and the alert
	// that should say why would lose its data.
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !live.Up() {
			http.Error(rw, "kubernetes informers not synced", http.StatusServiceUnavailable)
			return
		}
		if ok, down := w.exporter.SourcesUp(); !ok {
			fmt.Fprintln(rw, "ready; sources down: "+strings.Join(down, ", "))
			return
		}
		fmt.Fprintln(rw, "ready")
	})
	if *o.metricsURL != "/" {
		landing, err := web.NewLandingPage(web.LandingConfig{
			Name: "zonewatch exporter", Description: "Training jobs split across availability zones", Version: version.Info(),
			Links: []web.LandingLinks{{Address: *o.metricsURL, Text: "Metrics"}, {Address: "/readyz", Text: "Readiness"}},
		})
		if err != nil {
			logger.Error("landing page", "err", err)
			return 1
		}
		mux.Handle("/", landing)
	}

	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- web.ListenAndServe(srv, o.web, logger) }()
	for _, a := range *o.web.WebListenAddresses {
		host, port, _ := net.SplitHostPort(a)
		if host == "" {
			host = "localhost"
		}
		logger.Info("serving metrics", "url", "http://"+net.JoinHostPort(host, port)+*o.metricsURL)
	}

	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server", "err", err)
			return 1
		}
	case <-ctx.Done():
		logger.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			logger.Error("http shutdown", "err", err)
		}
	}
	return 0
}
