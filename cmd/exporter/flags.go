package main

import (
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/zonewatch/zonewatch/topology"
)

// defaultPort is outside 9100-9999, which the Prometheus default port
// allocations list has fully handed out.
const defaultPort = "19420"

// envOf is the environment variable that also sets a flag: ZONEWATCH_ and
// the name in upper case with . and - as _.
func envOf(name string) string {
	return "ZONEWATCH_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(name))
}

// flagOf declares a flag that can also be set by its environment variable.
func flagOf(c *kingpin.CmdClause, name, help string) *kingpin.FlagClause {
	return c.Flag(name, help).Envar(envOf(name))
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
	confine     *bool
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
	o.confine = flagOf(serve, "bpf.confine", "Before reading any input, split in two processes so that the exporter cannot change Cilium's BPF maps: a child does all the work under a seccomp filter that allows bpf() only to read open maps, and this process only opens pinned maps for it, read-only (SECURITY.md). Off (--no-bpf.confine), root with CAP_BPF, as the chart runs it, can open the pins for writing and change the node's policy, conntrack and ipcache maps (a read-only bpffs mount does not stop it).").Default("true").Bool()
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
