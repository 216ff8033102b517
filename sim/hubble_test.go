package sim

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

func observerClient(t *testing.T, s *Scenario, node string) (*Hubble, observerpb.ObserverClient) {
	t.Helper()
	dir, err := os.MkdirTemp("", "zws")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := NewHubble(s, node, 0)
	sock := filepath.Join(dir, "h.sock")
	if err := h.Start(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return h, observerpb.NewObserverClient(conn)
}

func allFlows(t *testing.T, c observerpb.ObserverClient, req *observerpb.GetFlowsRequest) ([]*flowpb.Flow, error) {
	t.Helper()
	stream, err := c.GetFlows(context.Background(), req)
	if err != nil {
		return nil, err
	}
	var out []*flowpb.Flow
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if f := r.GetFlow(); f != nil {
			out = append(out, f)
		}
	}
}

// The default scenario's blocked job is denied at its coordinator's node:
// a policy verdict naming the policy, then the drop, for every SYN.
func TestDefaultScenarioBlockedJobOnCoordinatorNode(t *testing.T) {
	s := Default()
	var job *Job
	for i := range s.Jobs {
		if s.Jobs[i].Behaviour.BlockedBy != "" {
			job = &s.Jobs[i]
		}
	}
	coord := job.Coordinator()
	h, c := observerClient(t, s, coord.Node)
	from := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	h.Generate(from, 10*time.Second)
	flows, err := allFlows(t, c, &observerpb.GetFlowsRequest{Whitelist: []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}}})
	if err != nil {
		t.Fatal(err)
	}
	workers := len(job.Pods) - 1
	want := 2 * workers * int(10*job.Behaviour.FlowsPerSecond)
	if len(flows) != want {
		t.Fatalf("%d drop events on %s, want %d", len(flows), coord.Node, want)
	}
	named := 0
	for i, f := range flows {
		if f.GetDestination().GetPodName() != coord.Name || f.GetDestination().GetID() == 0 || f.GetSource().GetID() != 0 {
			t.Fatalf("drop %d not into the local coordinator from a remote worker: %v", i, f)
		}
		if f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED || f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS {
			t.Fatalf("drop %d: %v %v", i, f.GetDropReasonDesc(), f.GetTrafficDirection())
		}
		if p := f.GetIngressDeniedBy(); len(p) == 1 && p[0].GetNamespace()+"/"+p[0].GetName() == job.Behaviour.BlockedBy {
			named++
			if f.GetEventType().GetType() != 5 {
				t.Errorf("policy named on a non-verdict event")
			}
		}
		if i > 0 && !flows[i-1].GetTime().AsTime().Before(f.GetTime().AsTime()) {
			t.Fatalf("flow times not increasing at %d", i)
		}
		if f.GetNodeName() != "zonewatch-sim/"+coord.Node {
			t.Fatalf("node name %q", f.GetNodeName())
		}
	}
	if named != want/2 {
		t.Errorf("%d events name the policy, want %d", named, want/2)
	}
}

// Streams counts what the streams sent: a stream that ended is no longer
// open, and a following one is caught up once it sent what the ring holds.
func TestStreamsCountFlowsSent(t *testing.T) {
	s := Default()
	h, c := observerClient(t, s, "")
	h.Generate(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), time.Second)
	flows, err := allFlows(t, c, &observerpb.GetFlowsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st := h.Streams(); st != (StreamStats{Started: 1, Flows: uint64(len(flows)), CaughtUp: true}) || len(flows) == 0 {
		t.Fatalf("after %d flows: %+v", len(flows), st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.GetFlows(ctx, &observerpb.GetFlowsRequest{Follow: true, First: true})
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(flows); {
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.GetFlow() != nil {
			n++
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := h.Streams(); st != (StreamStats{Started: 2, Open: 1, Flows: 2 * uint64(len(flows)), CaughtUp: true}); st = h.Streams() {
		if time.Now().After(deadline) {
			t.Fatalf("following stream: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	h.Publish(&flowpb.Flow{NodeName: "gpu-a1"})
	if st := h.Streams(); st.CaughtUp {
		t.Fatalf("caught up before sending the new flow: %+v", st)
	}
}

func TestGetFlowsMaskFiltersAndErrors(t *testing.T) {
	s := Default()
	h, c := observerClient(t, s, "")
	h.Generate(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), 2*time.Second)

	flows, err := allFlows(t, c, &observerpb.GetFlowsRequest{
		Whitelist: []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_FORWARDED}, EventType: []*flowpb.EventTypeFilter{{Type: 4}}, Reply: []bool{false}}},
		FieldMask: &fieldmaskpb.FieldMask{Paths: []string{"IP.source", "source.pod_name", "is_reply", "event_type"}},
	})
	if err != nil || len(flows) == 0 {
		t.Fatalf("%d flows, err %v", len(flows), err)
	}
	for _, f := range flows {
		if f.GetIsReply().GetValue() || f.GetEventType().GetType() != 4 {
			t.Fatalf("filter let through %v", f)
		}
		if f.GetIP().GetSource() == "" || f.GetIP().GetDestination() != "" || f.GetTime() != nil || f.GetEthernet() != nil || len(f.GetSource().GetLabels()) != 0 {
			t.Fatalf("mask not applied: %v", f)
		}
	}

	for name, req := range map[string]*observerpb.GetFlowsRequest{
		"unsupported filter": {Whitelist: []*flowpb.FlowFilter{{SourceIp: []string{"10.0.0.1"}}}},
	} {
		if _, err := allFlows(t, c, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: err %v, want InvalidArgument", name, err)
		}
	}
	// A mask path the Flow lacks fails the call as Cilium's fieldmask.New
	// does (v1.20.2 returns a plain error: code Unknown).
	for name, paths := range map[string][]string{"bad mask path": {"IP.nope"}, "mask through list": {"node_labels.x"}, "empty path": {""}} {
		_, err := allFlows(t, c, &observerpb.GetFlowsRequest{FieldMask: &fieldmaskpb.FieldMask{Paths: paths}})
		if st := status.Convert(err); st.Code() != codes.Unknown || st.Message() != "invalid fieldmask" {
			t.Errorf("%s: err %v, want Unknown: invalid fieldmask", name, err)
		}
	}

	st, err := c.ServerStatus(context.Background(), &observerpb.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetVersion() != HubbleVersion || st.GetMaxFlows() != 4096 || st.GetSeenFlows() != h.Seen() || st.GetNumConnectedNodes().GetValue() != uint32(len(s.Nodes)) {
		t.Errorf("server status %v", st)
	}
}

func TestMaskFlow(t *testing.T) {
	f := &flowpb.Flow{NodeName: "n", IP: &flowpb.IP{Source: "a", Destination: "b"}, Source: &flowpb.Endpoint{ID: 1, Labels: []string{"x"}}}
	m, err := MaskFlow(f, []string{"IP", "IP.source", "source.ID"})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetNodeName() != "" || m.GetIP().GetDestination() != "b" || m.GetSource().GetID() != 1 || len(m.GetSource().GetLabels()) != 0 {
		t.Errorf("masked %v", m)
	}
	if f.GetSource().GetLabels()[0] != "x" {
		t.Error("masking changed the original")
	}
}
