package conntrack_test

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

// TestPodEndedBetweenPollsCounted (issue 33, item 4): a job pod that
// starts, moves its bytes and ends between two polls, ended the two ways
// that take its address out of the index in the same event that wakes the
// poller: its phase turns Succeeded (a worker that finished: the usual end
// of a training pod) or its object goes without a deletionTimestamp first
// (kubectl delete --force --grace-period=0, or a watch that missed the
// update). A graceful deletion, as the lab's "pod deleted right after a
// transfer" does, marks the pod terminating first, and the index keeps a
// terminating pod's address until its object goes: that case is
// TestReadWhenShortLivedPodGoes. The read the pod's end triggers must
// still find its job, so its bytes land in it and not in not_local.
func TestPodEndedBetweenPollsCounted(t *testing.T) {
	for _, end := range []string{"finished", "force deleted"} {
		t.Run(end, func(t *testing.T) {
			idx := newIndex()
			src := conntrack.NewMemSource()
			reg := prometheus.NewRegistry()
			p, err := conntrack.New(src, idx, conntrack.Config{Node: "n1", Layout: conntrack.LayoutCombined, Self: reg, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			running := conn{from: worker0, to: master, fromNode: "n1", toNode: "n2", sport: 40000, dport: 29500, sent: 74, reply: 74, sentPkts: 1, replyPkts: 1}
			src.Set(conntrack.MapTCP4, table(running.entries("n1", 0)...))
			runHourly(t, p)
			waitFor(t, func() bool { return p.Up() }) // the first read: baselines

			w2 := netip.MustParseAddr("10.1.0.12")
			pod := topology.Pod{Namespace: "ml", Name: "train-worker-2", Node: "n1", IPs: []netip.Addr{w2},
				Identity: topology.Identity{Kind: "PyTorchJob", Name: "train", Role: topology.RoleWorker}}
			idx.UpsertPod(0, pod)
			short := conn{from: w2, to: master, fromNode: "n1", toNode: "n2", sport: 40001, dport: 29500,
				sent: 13_107_200, reply: 3_276_800, sentPkts: 900, replyPkts: 300}
			src.Set(conntrack.MapTCP4, table(append(running.entries("n1", 0), short.entries("n1", 0)...)...))
			if end == "finished" {
				pod.Finished = true
				idx.UpsertPod(0, pod)
			} else {
				idx.DeletePod(0, "ml", "train-worker-2")
			}

			cross := key("z-a", "z-b", "cross_zone")
			want := float64(short.sent + short.reply)
			unattributed := func() float64 { return selfValue(t, reg, "zonewatch_conntrack_unattributed_bytes_total") }
			waitFor(t, func() bool { return series(t, p)[cross] == want || unattributed() > 0 })
			if got, u := series(t, p)[cross], unattributed(); got != want || u != 0 {
				t.Fatalf("pod %s between two polls: %v bytes in its job, %v unattributed (no_job %v, not_local %v), want %v and 0", end, got, u,
					selfValue(t, reg, "zonewatch_conntrack_unattributed_bytes_total", "reason", "no_job"),
					selfValue(t, reg, "zonewatch_conntrack_unattributed_bytes_total", "reason", "not_local"), want)
			}
			// Cilium scrubs the endpoint's entries; nothing is counted twice.
			src.Set(conntrack.MapTCP4, table(running.entries("n1", 0)...))
			p.Poll(time.Now())
			if got := series(t, p)[cross]; got != want {
				t.Errorf("after the CNI DEL: %v bytes, want %v", got, want)
			}
		})
	}
}
