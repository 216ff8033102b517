package sim

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/topology"
)

func scenarioIndex(s *Scenario) *topology.Index {
	idx := topology.NewIndex()
	nodes, pods := s.KubeObjects()
	for _, n := range nodes {
		idx.UpsertNode(kube.NodeFrom(n))
	}
	for _, p := range pods {
		idx.UpsertPod(0, kube.PodFrom(topology.DefaultRules(), p))
	}
	return idx
}

// jobBytes reads zonewatch_job_network_bytes_total by
// "namespace/job src_zone>dst_zone locality".
func jobBytes(t *testing.T, ps ...*conntrack.Poller) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, p := range ps {
		ch := make(chan prometheus.Metric, 100)
		// Update fails exactly while the source is down.
		if err := p.Update(ch); (err != nil) == p.Up() {
			t.Fatalf("Update error %v with the source up %v", err, p.Up())
		}
		close(ch)
		for m := range ch {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				t.Fatal(err)
			}
			l := map[string]string{}
			for _, lp := range pb.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out[l["namespace"]+"/"+l["job_name"]+" "+l["src_zone"]+">"+l["dst_zone"]+" "+l["locality"]] += pb.GetCounter().GetValue()
		}
	}
	return out
}

// TestConntrackThroughPoller runs the generated maps through the real
// poller, one exporter per node and one for the whole cluster, in both
// Cilium layouts with the layout auto-detected.
func TestConntrackThroughPoller(t *testing.T) {
	s := Default()
	idx := scenarioIndex(s)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const step = 10 * time.Second

	// Bytes a worker's entry grows by in one step: payload plus headers;
	// combined also holds the coordinator's ACKs.
	sentPerStep := func(rate float64, at time.Duration) float64 {
		sent := func(d time.Duration) float64 {
			payload := uint64(rate * d.Seconds())
			segs := (payload + ctMSS - 1) / ctMSS
			return float64(payload + (segs+1)*ctHeaders)
		}
		return sent(at) - sent(at-step)
	}
	acksPerStep := func(rate float64, at time.Duration) float64 {
		acks := func(d time.Duration) float64 {
			segs := (uint64(rate*d.Seconds()) + ctMSS - 1) / ctMSS
			return float64(((segs+1)/2 + 1) * ctHeaders)
		}
		return acks(at) - acks(at-step)
	}

	for _, layout := range []conntrack.Layout{conntrack.LayoutCombined, conntrack.LayoutSplit} {
		t.Run(layout.String(), func(t *testing.T) {
			now := start
			mk := func(node string) *conntrack.Poller {
				src := s.ConntrackSource(node, layout, start).(*ctSource)
				src.now = func() time.Time { return now }
				p, err := conntrack.New(src, idx, conntrack.Config{Node: node})
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			var perNode []*conntrack.Poller
			for _, n := range s.Nodes {
				perNode = append(perNode, mk(n.Name))
			}
			all := mk("")
			polls := 4
			for i := 1; i <= polls; i++ {
				now = start.Add(time.Duration(i) * step)
				for _, p := range append(perNode, all) {
					p.Poll(now)
				}
			}
			for i, p := range perNode {
				if !p.Up() {
					t.Errorf("node %s: source down", s.Nodes[i].Name)
				}
			}
			if !all.Up() {
				t.Fatal("cluster exporter: source down")
			}
			// Polls 2..4 counted (poll 1 is the baseline).
			at := func(i int) time.Duration { return time.Duration(i) * step }
			want := func(rate float64, workers int, withAcks bool) float64 {
				var sum float64
				for i := 2; i <= polls; i++ {
					sum += sentPerStep(rate, at(i))
					if withAcks {
						sum += acksPerStep(rate, at(i))
					}
				}
				return sum * float64(workers)
			}
			combined := layout == conntrack.LayoutCombined
			// Expected from the scenario: every worker's connection to its
			// coordinator; combined counts both directions at the worker
			// (the opener), split each direction at its sender.
			exp := map[string]float64{}
			for ji := range s.Jobs {
				j := &s.Jobs[ji]
				b, c := j.Behaviour, j.Coordinator()
				for wi := range j.Pods {
					w := &j.Pods[wi]
					if w == c || b.BytesPerSecond <= 0 || (b.BlockedBy != "" && s.zoneOf(w) != s.zoneOf(c)) {
						continue
					}
					wz, cz := s.zoneOf(w), s.zoneOf(c)
					loc := topology.LocalityCrossZone
					if wz == cz {
						loc = topology.LocalitySameZone
					}
					name := j.Namespace + "/" + j.Name
					exp[name+" "+wz+">"+cz+" "+loc] += want(b.BytesPerSecond, 1, combined)
					if !combined {
						exp[name+" "+cz+">"+wz+" "+loc] += acksSum(acksPerStep, b.BytesPerSecond, polls, at)
					}
				}
				// The coordinator's node's host network opened a connection
				// to it: only the coordinator's ingress entry has it, both
				// directions, in either layout.
				if b.BytesPerSecond > 0 && b.BlockedBy == "" {
					cz := s.zoneOf(c)
					exp[j.Namespace+"/"+j.Name+" "+cz+">"+cz+" "+topology.LocalitySameZone] += want(HostOpenerRate, 1, true)
				}
			}
			// What the simulation is for: the costly split job's bytes cross
			// zones, the healthy job's stay in its zone.
			for _, k := range []string{
				"research/mpi-costly us-east-1c>us-east-1b cross_zone",
				"ml-team/resnet-healthy us-east-1a>us-east-1a zone",
			} {
				if exp[k] == 0 {
					t.Fatalf("scenario changed: no %s", k)
				}
			}
			for name, got := range map[string]map[string]float64{"per-node": jobBytes(t, perNode...), "cluster": jobBytes(t, all)} {
				if len(got) != len(exp) {
					t.Errorf("%s: series %v, want %v", name, got, exp)
				}
				for k, w := range exp {
					if got[k] != w {
						t.Errorf("%s: %s = %v, want %v", name, k, got[k], w)
					}
				}
				for k := range got {
					if strings.Contains(k, "llm-blocked") {
						t.Errorf("%s: the blocked job moved bytes: %s", name, k)
					}
				}
			}
		})
	}
}

func acksSum(acks func(float64, time.Duration) float64, rate float64, polls int, at func(int) time.Duration) float64 {
	var sum float64
	for i := 2; i <= polls; i++ {
		sum += acks(rate, at(i))
	}
	return sum
}

func TestConntrackEntriesGrow(t *testing.T) {
	s := Default()
	a := s.ConntrackEntries("", 10*time.Second)
	b := s.ConntrackEntries("", 20*time.Second)
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("entry counts %d, %d", len(a), len(b))
	}
	for i := range a {
		if b[i].SentBytes <= a[i].SentBytes && !a[i].Service && !a[i].Related {
			t.Errorf("entry %d did not grow: %d -> %d", i, a[i].SentBytes, b[i].SentBytes)
		}
	}
	// A node holds only its own entries.
	for _, e := range s.ConntrackEntries("gpu-b2", time.Second) {
		if e.Node != "gpu-b2" {
			t.Errorf("gpu-b2 got an entry of %s", e.Node)
		}
	}
}

// TestConntrackEntriesLikeTheDatapath checks the generated entries
// against what Cilium v1.20.2 agents hold (issue 26's lab, bpf/lib/common.h
// and conntrack.h): the key stores the opener's address first for both
// directions (the fields are named for the reply direction) and the
// acceptor's port first (named for the original direction), flags 0/1 =
// OUT/IN, src_sec_id (value offset 44) is the opener's identity on both
// entries, and the host network opens connections with an ingress entry
// only.
func TestConntrackEntriesLikeTheDatapath(t *testing.T) {
	s := Default()
	routers := map[netip.Addr]bool{}
	for i := range s.Nodes {
		routers[RouterIP(&s.Nodes[i])] = true
	}
	type conn struct {
		src, dst netip.Addr
		sport    uint16
	}
	ids := map[conn][]uint32{}
	hostOpened := 0
	for _, e := range s.ConntrackEntries("", 30*time.Second) {
		if e.Service {
			continue
		}
		if e.Related {
			if e.SrcIdentity == 0 {
				t.Errorf("%v: a related entry without the connection's src_sec_id", e)
			}
			continue
		}
		tu, v := e.Encode(conntrack.LayoutCombined)
		key, val := conntrack.AppendKey(nil, tu), conntrack.AppendValue(nil, v)
		if len(key) != conntrack.KeySize4 || len(val) != conntrack.ValueSize {
			t.Fatalf("sizes %d/%d", len(key), len(val))
		}
		if got := netip.AddrFrom4([4]byte(key[0:4])); got != e.Src {
			t.Errorf("%v: first address %v, want the opener %v", e, got, e.Src)
		}
		if got := binary.BigEndian.Uint16(key[8:10]); got != e.DstPort {
			t.Errorf("%v: first port %d, want the acceptor's %d", e, got, e.DstPort)
		}
		if wantFlags := map[bool]byte{false: 0, true: 1}[e.Ingress]; key[13] != wantFlags {
			t.Errorf("%v: flags %d, want %d", e, key[13], wantFlags)
		}
		if got := binary.NativeEndian.Uint32(val[44:48]); got != e.SrcIdentity || got == 0 {
			t.Errorf("%v: src_sec_id %d, want the opener's %d (not 0)", e, got, e.SrcIdentity)
		}
		if routers[e.Src] {
			hostOpened++
			if !e.Ingress {
				t.Errorf("%v: an egress entry of the host network (Cilium has none without its host firewall)", e)
			}
			if e.SrcIdentity >= 256 {
				t.Errorf("%v: host network opener with a pod identity", e)
			}
		}
		c := conn{e.Src, e.Dst, e.SrcPort}
		ids[c] = append(ids[c], e.SrcIdentity)
	}
	if hostOpened == 0 {
		t.Fatal("no connection opened by a node's host network")
	}
	for c, l := range ids {
		if len(l) == 2 && l[0] != l[1] {
			t.Errorf("%v: entries carry identities %v, want the opener's on both", c, l)
		}
	}
}
