package main

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/collector/hubble"
	"github.com/zonewatch/zonewatch/sim"
	"github.com/zonewatch/zonewatch/topology"
)

type flagSource struct{ up atomic.Bool }

func (s *flagSource) Up() bool { return s.up.Load() }

// TestConntrackWaitsForInformers: nodes come in before the job pods; until
// the informers have synced the conntrack poller holds the growth instead
// of sending the job's bytes to no_job, then counts them for the job.
func TestConntrackWaitsForInformers(t *testing.T) {
	// kube stands for the Kubernetes feed, which startKube hands to the
	// parts as w.synced.
	kube := &flagSource{}
	w := &wiring{nodeName: "n1", synced: kube.Up}
	cfg := conntrackConfig(w, conntrack.LayoutCombined, "")
	ready := cfg.Ready

	idx := topology.NewIndex()
	idx.UpsertNode(topology.Node{Name: "n1", Zone: "z-a", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}})
	idx.UpsertNode(topology.Node{Name: "n2", Zone: "z-b", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/24")}})
	if ready() {
		t.Fatal("ready with nodes in the index but the informers not synced")
	}
	mem := conntrack.NewMemSource()
	p, err := conntrack.New(mem, idx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	worker, master := netip.MustParseAddr("10.1.0.10"), netip.MustParseAddr("10.2.0.10")
	entry := func(bytes uint64) *conntrack.MemTable {
		tab := conntrack.NewMemTable(conntrack.KeySize4)
		tab.Put(conntrack.Tuple{Src: worker, Dst: master, SrcPort: 40000, DstPort: 29500, Proto: 6},
			conntrack.Value{Packets: 1 + bytes/1000, Bytes: bytes, TxFlagsSeen: 0x12, RxFlagsSeen: 0x12})
		return tab
	}
	t0 := time.Now()
	mem.Set(conntrack.MapTCP4, entry(1000))
	p.Poll(t0)
	mem.Set(conntrack.MapTCP4, entry(5000))
	p.Poll(t0.Add(10 * time.Second)) // nodes known, pods not yet: held
	for _, n := range []struct {
		name string
		ip   netip.Addr
		node string
	}{{"w-0", worker, "n1"}, {"m-0", master, "n2"}} {
		idx.UpsertPod(0, topology.Pod{Namespace: "ml", Name: n.name, Node: n.node, IPs: []netip.Addr{n.ip},
			Identity: topology.Identity{Kind: "PyTorchJob", Name: "train"}})
	}
	kube.up.Store(true)
	if !ready() {
		t.Fatal("not ready after the informers synced")
	}
	p.Poll(t0.Add(20 * time.Second))
	if got := p.Bytes("ml", "train", "z-a", "z-b", topology.LocalityCrossZone); got != 4000 {
		t.Fatalf("job bytes = %v, want 4000 (the growth while the pods were unknown)", got)
	}
}

// TestCiliumVersionDecidesLayout: the exporter asks the node's agent its
// version over the Hubble socket (ServerStatus, here the simulation's
// fake Observer, a real gRPC server) and the conntrack layout is decided
// from it before any entry exists.
func TestCiliumVersionDecidesLayout(t *testing.T) {
	h := sim.NewHubble(sim.Default(), "", 0)
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	if err := h.Start(sock); err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v, err := ciliumVersion(ctx, "unix://"+sock)
	if err != nil || v != sim.HubbleVersion {
		t.Fatalf("version %q, %v; want %q", v, err, sim.HubbleVersion)
	}
	reg := prometheus.NewRegistry()
	p, err := conntrack.New(conntrack.NewMemSource(), topology.NewIndex(), conntrack.Config{Self: reg})
	if err != nil {
		t.Fatal(err)
	}
	go followCiliumVersion(ctx, hubble.Config{Address: "unix://" + sock}, p, slog.New(slog.DiscardHandler))
	layout := func() string {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "zonewatch_conntrack_layout_info" {
				for _, m := range mf.GetMetric() {
					if m.GetGauge().GetValue() == 1 {
						return m.GetLabel()[0].GetValue()
					}
				}
			}
		}
		return ""
	}
	for deadline := time.Now().Add(30 * time.Second); layout() != "combined"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("layout %q, want combined (from %q)", layout(), sim.HubbleVersion)
		}
	}
}
