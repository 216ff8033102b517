package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/ipcache"
	"github.com/zonewatch/zonewatch/internal/ciliumlab"
)

// TestCiliumLabV118 runs the hard block and the bytes of TestCiliumLab on
// a second Cilium version, v1.18.11 (.tools/bin/cilium-1.18), one lab, the
// same scenario and ground truth (the agents' drop counters, the
// datapath's conntrack entries), and checks that every node's ipcache
// names the node of every remote pod as collector/ipcache reads it.
func TestCiliumLabV118(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts four Cilium agents")
	}
	inLane(t)
	lab, api, _ := startCiliumLabWith(t, ciliumlab.Config{Nodes: labNodes, Cilium: "cilium-1.18"})
	if !strings.HasPrefix(lab.Version, "1.18.") {
		t.Fatalf("the lab runs Cilium %q, want 1.18", lab.Version)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t.Logf("lab start on Cilium %s: %s", lab.Version, lab.StartTime.Round(time.Millisecond))
	gpus := newLabGPUs(t, lab)
	addrs := startLabExporters(t, lab, api, gpus)
	sc := startLabScenario(ctx, t, lab)
	sc.simulateGPUs(gpus)
	run := runLabExchanges(ctx, t, lab, sc)
	t.Run("drops", func(t *testing.T) { checkLabDrops(t, addrs, sc, run.denied) })
	t.Run("bytes", func(t *testing.T) { checkLabBytes(t, lab, addrs, sc, run.results) })
	t.Run("conntrack layout", func(t *testing.T) {
		// 1.18 writes the combined ct_entry (one packets/bytes pair, both
		// directions), which the exporters take from the version Hubble
		// reports.
		if n := sumExporters(t, addrs, "zonewatch_conntrack_layout_info", map[string]string{"layout": "combined"}); n != float64(len(addrs)) {
			t.Errorf("%g of %d exporters read the combined layout: %v", n, len(addrs), seriesOf(t, addrs, "zonewatch_conntrack_layout_info", nil))
		}
	})
	t.Run("ipcache names every remote pod's node", func(t *testing.T) { checkIPCacheNodes(ctx, t, lab, sc.pods()) })
}

// labRun is what the scenario's traffic did: the blocked job's attempts,
// the open jobs' exchanges (slow, healthy) and the policy drops the
// agents' own counters added meanwhile.
type labRun struct {
	ex      ciliumlab.Exchange // the exchange both ran
	block   ciliumlab.Result
	results []ciliumlab.Result
	denied  float64
}

// runLabExchanges runs the hard block (each worker of llm-blocked tries
// the rendezvous 5 times) and 3 exchanges of each open job.
func runLabExchanges(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, sc *labScenario) labRun {
	t.Helper()
	dropsBefore := agentDrops(t, lab)
	const attempts = 5
	ex := ciliumlab.Exchange{Up: 64 << 10, Down: 16 << 10, Steps: 40, DialTimeout: 500 * time.Millisecond}
	if _, err := sc.blocked.coordinator.Serve(ex.Up, ex.Down); err != nil {
		t.Fatal(err)
	}
	run := labRun{ex: ex}
	run.block = ex.Run(ctx, sc.blocked.coordinator, sc.blocked.workers, attempts)
	t.Logf("hard block: %s", run.block)
	if run.block.Failed != run.block.Attempts || run.block.Attempts != attempts*len(sc.blocked.workers) {
		t.Errorf("hard block: %d of %d attempts failed, want all %d", run.block.Failed, run.block.Attempts, attempts*len(sc.blocked.workers))
	}
	for _, j := range []*labJob{sc.slow, sc.healthy} {
		if _, err := j.coordinator.Serve(ex.Up, ex.Down); err != nil {
			t.Fatal(err)
		}
		r := ex.Run(ctx, j.coordinator, j.workers, 3)
		t.Logf("%s/%s: %s", j.ns, j.name, r)
		if r.Failed != 0 {
			t.Errorf("%s/%s: %d connection attempts failed", j.ns, j.name, r.Failed)
		}
		run.results = append(run.results, r)
	}
	dropsAfter := agentDrops(t, lab)
	run.denied = dropsAfter["Policy denied by denylist"] - dropsBefore["Policy denied by denylist"]
	t.Logf("agents' own counters: %.0f packets dropped as \"Policy denied by denylist\" (%v)", run.denied, dropDelta(dropsBefore, dropsAfter))
	return run
}

// flowAccounting says, per exporter, where its Hubble flows went: counted
// for a job, uncounted (by reason), held, and the stream's state; what a
// failed count check needs to tell a lost flow from one never received.
func flowAccounting(t *testing.T, addrs map[string]string) string {
	t.Helper()
	var b strings.Builder
	for _, node := range slices.Sorted(maps.Keys(addrs)) {
		one := map[string]string{node: addrs[node]}
		fmt.Fprintf(&b, "  %s: processed %g, counted %g, uncounted kind %g no_job %g hold_full %g, held %g, reconnects %g, hubble up %g\n", node,
			sumExporters(t, one, "zonewatch_hubble_flows_processed_total", nil),
			sumExporters(t, one, "zonewatch_job_flow_events_total", nil),
			sumExporters(t, one, "zonewatch_hubble_flows_uncounted_total", map[string]string{"reason": "kind"}),
			sumExporters(t, one, "zonewatch_hubble_flows_uncounted_total", map[string]string{"reason": "no_job"}),
			sumExporters(t, one, "zonewatch_hubble_flows_uncounted_total", map[string]string{"reason": "hold_full"}),
			sumExporters(t, one, "zonewatch_hubble_flows_held", nil),
			sumExporters(t, one, "zonewatch_hubble_reconnects_total", nil),
			sumExporters(t, one, "zonewatch_source_up", map[string]string{"source": "hubble"}))
	}
	return b.String()
}

// checkLabDrops: the exporters count every policy drop of llm-blocked the
// agents counted, all with the fence's name, and none of the open jobs.
func checkLabDrops(t *testing.T, addrs map[string]string, sc *labScenario, denied float64) {
	blocked := sc.blocked
	match := map[string]string{"namespace": blocked.ns, "job_name": blocked.name}
	var got float64
	if !eventually(t, time.Minute, "the exporters count every drop the agents counted", func() (bool, string) {
		got = sumExporters(t, addrs, "zonewatch_job_policy_drops_total", match)
		return got == denied, fmt.Sprintf("exporters %g, agents %g", got, denied)
	}) {
		t.Logf("where each exporter's flows went:\n%s", flowAccounting(t, addrs))
	}
	t.Logf("drops of %s/%s: exporters %g, agents' drop counters %g", blocked.ns, blocked.name, got, denied)
	t.Logf("drop series: %v", seriesOf(t, addrs, "zonewatch_job_policy_drops_total", match))
	want := map[string]string{"namespace": blocked.ns, "job_name": blocked.name, "src_zone": zoneA, "dst_zone": zoneB,
		"locality": "cross_zone", "peer": "job", "policy": "ml-team/zone-isolation", "direction": "ingress"}
	if w := sumExporters(t, addrs, "zonewatch_job_policy_drops_total", want); w != denied || denied == 0 {
		t.Errorf("drops with %v: %g, want all %g (and some)", want, w, denied)
	}
	for _, j := range []*labJob{sc.slow, sc.healthy} {
		if d := sumExporters(t, addrs, "zonewatch_job_policy_drops_total", map[string]string{"namespace": j.ns, "job_name": j.name}); d != 0 {
			t.Errorf("%s/%s: %g drops, want none", j.ns, j.name, d)
		}
	}
}

// checkLabBytes: each open job's bytes are the payload plus the headers of
// every packet the datapath's conntrack entries counted (within 1%), in
// the right locality.
func checkLabBytes(t *testing.T, lab *ciliumlab.Lab, addrs map[string]string, sc *labScenario, results []ciliumlab.Result) {
	for i, j := range []*labJob{sc.slow, sc.healthy} {
		var payload int64
		for _, v := range results[i].Payload {
			payload += v
		}
		ct := conntrackOf(t, lab, j.coordinator.IP, ciliumlab.RendezvousPort, j.workers...)
		// Ethernet, IPv4 and TCP with timestamps per packet the datapath
		// counted (skb length at the tc hook).
		const hdr = 14 + 20 + 32
		want := float64(payload + ct.packets*hdr)
		locality := "cross_zone"
		if j == sc.healthy {
			locality = "zone"
		}
		match := map[string]string{"namespace": j.ns, "job_name": j.name}
		var got float64
		eventually(t, time.Minute, j.name+" bytes within 1% of payload plus headers", func() (bool, string) {
			got = sumExporters(t, addrs, "zonewatch_job_network_bytes_total", match)
			return got >= 0.99*want && got <= 1.01*want, fmt.Sprintf("exporters %g, want %g", got, want)
		})
		t.Logf("%s/%s bytes: exporters %g; payload %d B both ways; conntrack %d B in %d packets (%d entries); payload+%d B/packet %g; exporters/payload %.4f, exporters/conntrack %.4f",
			j.ns, j.name, got, payload, ct.bytes, ct.packets, ct.entries, hdr, want, got/float64(payload), got/float64(ct.bytes))
		if l := sumExporters(t, addrs, "zonewatch_job_network_bytes_total", mergeArgs(match, map[string]string{"locality": locality})); l != got {
			t.Errorf("%s/%s: %g of %g bytes with locality %s: %v", j.ns, j.name, l, got, locality, seriesOf(t, addrs, "zonewatch_job_network_bytes_total", match))
		}
	}
	if b := sumExporters(t, addrs, "zonewatch_job_network_bytes_total", map[string]string{"namespace": sc.healthy.ns, "job_name": sc.healthy.name, "locality": "cross_zone"}); b != 0 {
		t.Errorf("co-located job: %g cross-zone bytes, want 0", b)
	}
}

// checkIPCacheNodes reads every node's own ipcache (its pinned
// cilium_ipcache_v2, through collector/ipcache) and requires, for every
// pod given, its identity and: on another node, that node's IP
// as the entry's node; on this node, none. Node addresses carry identity
// remote-node (others) and host (itself).
func checkIPCacheNodes(ctx context.Context, t *testing.T, lab *ciliumlab.Lab, pods []*ciliumlab.Pod) {
	for _, n := range lab.Nodes {
		reg := prometheus.NewRegistry()
		r, err := ipcache.New(ipcache.BPFSource{Dir: n.Path("/sys/fs/bpf/tc/globals")}, ipcache.Config{Self: reg})
		if err != nil {
			t.Fatal(err)
		}
		var remote, local int
		var wrong []string
		// The agents write the ipcache as they learn endpoints; the pods are
		// ready, so the entries are there or come within seconds.
		eventually(t, 30*time.Second, "every pod's entry on "+n.Name, func() (bool, string) {
			remote, local, wrong = 0, 0, nil
			if err := r.Refresh(); err != nil {
				return false, err.Error()
			}
			// Read each look: an endpoint can be ready with reserved:init
			// (5) until its agent has the pod's labels.
			ids := map[*ciliumlab.Pod]uint32{}
			for _, p := range pods {
				id, _, why := p.CurrentIdentity(ctx)
				if why != "" {
					return false, why
				}
				ids[p] = uint32(id)
			}
			for _, p := range pods {
				e, ok := r.Lookup(p.IP)
				want := ipcache.Entry{Identity: ids[p], Bits: 32}
				if p.Node != n {
					want.NodeIP, want.Flags = p.Node.IP, ipcache.FlagHasTunnelEndpoint
				}
				if !ok || e != want {
					wrong = append(wrong, fmt.Sprintf("%s on %s (%s): %+v, want %+v", p.Ref(), p.Node.Name, p.IP, e, want))
				} else if p.Node != n {
					remote++
				} else {
					local++
				}
			}
			for _, m := range lab.Nodes {
				want := ipcache.IdentityRemoteNode
				if m == n {
					want = ipcache.IdentityHost
				}
				if e, ok := r.Lookup(m.IP); !ok || e.Identity != want || e.NodeIP.IsValid() {
					wrong = append(wrong, fmt.Sprintf("node %s (%s): %+v, want identity %d", m.Name, m.IP, e, want))
				}
			}
			return len(wrong) == 0, strings.Join(wrong, "; ")
		})
		mapName := ""
		if mfs, err := reg.Gather(); err == nil {
			for _, mf := range mfs {
				if mf.GetName() == "zonewatch_ipcache_entries" && len(mf.GetMetric()) == 1 {
					mapName = mf.GetMetric()[0].GetLabel()[0].GetValue()
				}
			}
		}
		if mapName != ipcache.MapV2 {
			t.Errorf("%s: read %q, want %s", n.Name, mapName, ipcache.MapV2)
		}
		world, _ := r.Lookup(netip.MustParseAddr("192.0.2.1"))
		t.Logf("ipcache of %s (%s, %s routing, %d entries): %d remote pods name their node, %d local pods none, %d nodes as remote-node/host; 192.0.2.1 -> %+v",
			n.Name, mapName, lab.Routing(), r.Len(), remote, local, len(lab.Nodes), world)
	}
}
