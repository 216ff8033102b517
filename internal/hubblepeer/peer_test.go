package hubblepeer

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	observerTypes "github.com/cilium/cilium/pkg/hubble/observer/types"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/zonewatch/zonewatch/collector/hubble"
)

// settle waits until cond holds, then a little longer so that a double
// count would show.
func settle(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(t, what, cond)
	time.Sleep(300 * time.Millisecond)
}

// traffic is the test's cluster traffic; the counts it must give are in
// TestCiliumPeerCounts.
func traffic(a, b *node) {
	// llm-train's workers are denied by the coordinator's ingress
	// policy: 2 workers x 5 SYNs (retransmissions a second apart are new
	// drops; here new source ports).
	for i := range 5 {
		deny(a, b, llmW0, llmC, uint16(41000+i), rendezvousPort)
		deny(a, b, llmW1, llmC, uint16(42000+i), rendezvousPort)
	}
	// bert: 4 connections worker -> coordinator, 3 coordinator -> worker.
	for i := range 4 {
		connect(a, b, bertW, bertC, uint16(43000+i), rendezvousPort)
	}
	for i := range 3 {
		connect(b, a, bertC, bertW, uint16(44000+i), collectivePort)
	}
	// Three HTTP requests refused by an L7 policy (403), at the receiver.
	for i := range 3 {
		l7Deny(b, bertW, bertC, uint16(45000+i))
	}
	// Two SYNs from a worker to an internet peer with a CIDR identity.
	toWorld(a, llmW0, 46000)
	toWorld(a, llmW0, 46001)
	a.flush()
	b.flush()
}

// What traffic must count, from the packets it sends.
const (
	deniedPackets = 2 * 5 // each seen as a policy verdict and a drop event
	// Forwarded events once on the sender, per direction of each
	// connection: the SYN and the data segment that are not replies.
	forwardedA = deniedPackets + 4*2 + 2 // the denied SYNs leave gpu-a1 too; 2 to the world
	forwardedB = 3 * 2
)

// recorder follows a node like `hubble observe --follow -o jsonpb` (no
// filter, no mask): the file analyze reads.
type recorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func record(t *testing.T, n *node) *recorder {
	n.streams++
	conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := observerpb.NewObserverClient(conn).GetFlows(ctx, &observerpb.GetFlowsRequest{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			b, _ := protojson.Marshal(resp)
			r.mu.Lock()
			r.buf.Write(b)
			r.buf.WriteByte('\n')
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; conn.Close() })
	return r
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf.Bytes())
}

// TestCiliumPeerCounts: per-node exporters with and without the field
// mask, and the offline path (the unmasked, unfiltered stream read back as
// a file, as analyze does), count what the packets say: every denied
// packet once as a policy drop, every forwarded connection direction once
// on its sender, no L7 denial, and the CIDR-identity internet peer as
// world (not unresolved) in all three.
func TestCiliumPeerCounts(t *testing.T) {
	a, b := startNode(t, nodeA), startNode(t, nodeB)
	ra, rb := record(t, a), record(t, b)
	ca, cb := follow(t, a, hubble.Config{}), follow(t, b, hubble.Config{})
	ua, ub := follow(t, a, hubble.Config{NoFieldMask: true}), follow(t, b, hubble.Config{NoFieldMask: true})
	live(t, a, ca, ua)
	live(t, b, cb, ub)

	traffic(a, b)
	wantA := totals{forwarded: forwardedA}
	wantB := totals{policyDrops: deniedPackets, dropped: deniedPackets, forwarded: forwardedB}
	reached := func(c *client, w totals) func() bool {
		return func() bool {
			s := c.totals(t)
			return s.forwarded >= w.forwarded && s.policyDrops >= w.policyDrops && s.dropped >= w.dropped
		}
	}
	settle(t, "the counts", func() bool {
		return reached(ca, wantA)() && reached(ua, wantA)() && reached(cb, wantB)() && reached(ub, wantB)()
	})
	check := func(name string, got, want totals) {
		t.Helper()
		got.processed, want.processed = 0, 0 // compared between masked and unmasked below
		if got != want {
			t.Errorf("%s counted %v\n  want %v", name, got, want)
		}
	}
	for _, x := range []struct {
		name string
		c    *client
		want totals
	}{{"gpu-a1 masked", ca, wantA}, {"gpu-a1 unmasked", ua, wantA}, {"gpu-b1 masked", cb, wantB}, {"gpu-b1 unmasked", ub, wantB}} {
		check(x.name, x.c.totals(t), x.want)
	}
	// Each drop names the policy Cilium correlated on the policy-verdict
	// event (the first of the pair, which counts).
	cb.agg.Drops().Each(func(k hubble.DropKey, v float64) {
		if k.PolicyNamespace != denyingPolicyNamespace || k.PolicyName != denyingPolicyName || k.Reason != hubble.ReasonPolicyDenied ||
			k.Direction != hubble.DirectionIngress || k.SrcZone != zoneA || k.DstZone != zoneB || k.Job != "llm-train" {
			t.Errorf("drop series %+v = %v", k, v)
		}
	})
	if pa, pu := ca.totals(t).processed, ua.totals(t).processed; pa != pu {
		t.Errorf("gpu-a1: the masked stream processed %v flows, the unmasked %v", pa, pu)
	}
	if pb, pu := cb.totals(t).processed, ub.totals(t).processed; pb != pu {
		t.Errorf("gpu-b1: the masked stream processed %v flows, the unmasked %v", pb, pu)
	}
	t.Logf("packets denied %d, counted gpu-b1 masked %v unmasked %v; forwarded connection directions %d, counted %v+%v (masked) %v+%v (unmasked)",
		deniedPackets, cb.totals(t).policyDrops, ub.totals(t).policyDrops, forwardedA+forwardedB,
		ca.totals(t).forwarded, cb.totals(t).forwarded, ua.totals(t).forwarded, ub.totals(t).forwarded)

	// Offline: both nodes' recordings through ReadFlows and one
	// aggregator for every node, as analyze reads them.
	off := hubble.NewAggregator(index(), "", time.Hour, nil)
	for _, r := range []*recorder{ra, rb} {
		if _, err := hubble.ReadFlows(bytes.NewReader(r.bytes()), func(f *flowpb.Flow) { off.Observe(f) }); err != nil {
			t.Fatal(err)
		}
	}
	offline := (&client{agg: off}).totals(t)
	offline.processed = 0
	want := totals{policyDrops: deniedPackets, dropped: deniedPackets, forwarded: forwardedA + forwardedB}
	if offline != want {
		t.Errorf("offline counted %v\n  want %v", offline, want)
	}
}

// TestCiliumRestartResume: the Hubble server goes away and comes back with
// its ring (flows and perf-ring/queue LostEvents stored in it); the client
// resumes with since and counts every flow and every lost event once.
func TestCiliumRestartResume(t *testing.T) {
	a := startNode(t, nodeA)
	c := follow(t, a, hubble.Config{})
	live(t, a, c)

	for i := range 5 {
		connect(a, a2(), bertW, bertC, uint16(43000+i), rendezvousPort)
	}
	lost(a, observerTypes.LostEventSourcePerfRingBuffer, 7)
	lost(a, observerTypes.LostEventSourceEventsQueue, 3)
	a.flush()
	settle(t, "the first flows and lost events", func() bool { s := c.totals(t); return s.forwarded >= 10 && s.lost >= 10 })
	before := c.totals(t)

	a.stop()
	waitFor(t, "the client to notice", func() bool { return !c.Up() })
	for i := range 3 { // during the gap: kept in the ring
		connect(a, a2(), bertW, bertC, uint16(44000+i), rendezvousPort)
	}
	lost(a, observerTypes.LostEventSourcePerfRingBuffer, 2)
	a.serve(t)
	waitFor(t, "the reconnect", c.Up)
	for i := range 2 {
		connect(a, a2(), bertW, bertC, uint16(45000+i), rendezvousPort)
	}
	a.flush()
	settle(t, "the resumed counts", func() bool { s := c.totals(t); return s.forwarded >= 20 && s.lost >= 12 })
	after := c.totals(t)
	t.Logf("before the restart: %v; after: %v", before, after)
	if before.forwarded != 10 || before.lost != 10 {
		t.Errorf("before the restart: forwarded %v lost %v, want 10 and 10", before.forwarded, before.lost)
	}
	if after.forwarded != 20 || after.lost != 12 {
		t.Errorf("after the restart: forwarded %v lost %v, want 20 (10+6 in the gap+4) and 12 (10+2 in the gap)", after.forwarded, after.lost)
	}
	if got := testutil.ToFloat64(c.agg.Metrics().Reconnects); got != 1 {
		t.Errorf("reconnects = %v, want 1", got)
	}
}

// TestCiliumFirstConnectionNewFlowsOnly: a follow without since starts two
// ring entries back (container.Ring.LastWriteParallel); a restarted
// exporter must not count them again.
func TestCiliumFirstConnectionNewFlowsOnly(t *testing.T) {
	a := startNode(t, nodeA)
	b := a2()
	// Before the exporter starts: whitelisted, countable SYNs last in the
	// ring.
	for i := range 3 {
		send(a, b, bertW, bertC, uint16(43000+i), rendezvousPort, false, "S")
	}
	c := follow(t, a, hubble.Config{})
	live(t, a, c)
	for i := range 2 {
		connect(a, b, bertW, bertC, uint16(44000+i), rendezvousPort)
	}
	a.flush()
	settle(t, "the new flows", func() bool { return c.totals(t).forwarded >= 4 })
	if got := c.totals(t).forwarded; got != 4 {
		t.Errorf("forwarded %v, want 4: the ring's two newest entries from before the start were counted", got)
	}
}

// TestCiliumEmptyRingFollowed: an exporter that connects to a freshly
// started agent, whose Hubble ring is still empty, counts the node's
// flows. Cilium's ring reader starts a follow on an empty ring at
// LastWriteParallel() = 0-2 and delivers nothing until the ring has
// wrapped (seen on the lab's real agents: num_flows=0 at connect, then
// none of the node's flows); the client waits for the ring's first event
// before it asks for the stream, and its since replays that event on.
func TestCiliumEmptyRingFollowed(t *testing.T) {
	a := startNodeRing(t, nodeA, false)
	b := a2()
	c := follow(t, a, hubble.Config{})
	// The client has looked at the empty ring: it either asked for the
	// stream already or is waiting (an open source, up after 5 s).
	waitFor(t, "the client at the empty ring", func() bool { return a.getFlows.Load() > 0 || c.Up() })
	for i := range 3 {
		connect(a, b, bertW, bertC, uint16(45000+i), rendezvousPort)
	}
	a.flush()
	settle(t, "the flows", func() bool { return c.totals(t).forwarded >= 6 })
	if got := c.totals(t).forwarded; got != 6 {
		t.Errorf("forwarded %v, want 6 (the SYN and data segment of 3 connections): a follow started on the empty ring", got)
	}
}

// TestCiliumRefusesUnknownMaskPath: Cilium's server fails GetFlows when the
// mask names a field its Flow lacks (an older server); the client falls
// back to whole flows, counts the refusal once, and counts the flows.
func TestCiliumRefusesUnknownMaskPath(t *testing.T) {
	a := startNode(t, nodeA)
	c := follow(t, a, hubble.Config{FieldMask: append([]string{"no_such_field"}, hubble.FieldMaskPaths...)})
	live(t, a, c)
	for i := range 3 {
		connect(a, a2(), bertW, bertC, uint16(43000+i), rendezvousPort)
	}
	a.flush()
	settle(t, "the flows", func() bool { return c.totals(t).forwarded >= 6 })
	if got := c.totals(t).forwarded; got != 6 {
		t.Errorf("forwarded %v, want 6", got)
	}
	if got := testutil.ToFloat64(c.agg.Metrics().FieldMaskRefused); got != 1 {
		t.Errorf("field mask refusals = %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.agg.Metrics().Reconnects); got != 0 {
		t.Errorf("reconnects = %v, want 0 (the refusal is not a broken stream)", got)
	}
}
