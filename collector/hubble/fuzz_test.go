package hubble

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/proto"

	"github.com/zonewatch/zonewatch/topology"
)

// seedLines are real Hubble lines (when the shared data is there) and
// hand-made ones.
func seedLines(tb testing.TB) [][]byte {
	out := [][]byte{
		[]byte(`{"flow":{"time":"2026-03-01T12:00:00Z","verdict":"DROPPED","drop_reason_desc":"POLICY_DENIED","event_type":{"type":5},"traffic_direction":"INGRESS","IP":{"source":"10.244.2.3","destination":"10.244.4.2"},"source":{"namespace":"ml-team","pod_name":"llm-blocked-worker-0"},"destination":{"ID":7,"namespace":"ml-team","pod_name":"llm-blocked-master-0"},"node_name":"prod/gpu-b1","ingress_denied_by":[{"name":"zone-isolation","namespace":"ml-team"}]}}`),
		[]byte(`{"time":"2026-03-01T12:00:01Z","verdict":"FORWARDED","event_type":{"type":4},"trace_observation_point":"TO_OVERLAY","is_reply":false,"IP":{"source":"10.244.1.4","destination":"10.244.7.2"},"source":{"ID":3},"node_name":"gpu-a1"}`),
		[]byte(`{"lost_events":{"source":"HUBBLE_RING_BUFFER","num_events_lost":"3"}}`),
		[]byte("{}\n\n{\"flow\":null}\n"),
	}
	files, _ := filepath.Glob(filepath.Join(realdata, "*"))
	for _, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			out = append(out, append([]byte(nil), sc.Bytes()...))
		}
	}
	return out
}

var (
	localities = map[string]bool{topology.LocalitySameZone: true, topology.LocalityCrossZone: true, topology.LocalityCrossRegion: true, topology.LocalityUnknown: true}
	directions = map[string]bool{DirectionIngress: true, DirectionEgress: true, DirectionUnknown: true}
	reasons    = map[string]bool{"": true, ReasonPolicyDenied: true, ReasonPolicyDeny: true, ReasonAuthRequired: true}
)

// checkResult holds what every classification must satisfy.
func checkResult(t *testing.T, f *flowpb.Flow, r Result) {
	t.Helper()
	switch r.Count {
	case Forwarded:
		if f.GetVerdict() != flowpb.Verdict_FORWARDED || r.Verdict != VerdictForwarded || r.Reason != "" {
			t.Fatalf("forwarded count for %v: %+v", f.GetVerdict(), r)
		}
		if r.Local != SideSource {
			t.Fatalf("forwarded counted off the sending side: %+v", r)
		}
	case Dropped:
		if f.GetVerdict() != flowpb.Verdict_DROPPED || r.Verdict != VerdictDropped {
			t.Fatalf("drop count for %v: %+v", f.GetVerdict(), r)
		}
	case NotCounted:
		if r.Verdict != "" || r.Reason != "" {
			t.Fatalf("not counted, yet verdict/reason set: %+v", r)
		}
	default:
		t.Fatalf("count %d", r.Count)
	}
	if r.Job != nil && r.Job != r.Src.Job && r.Job != r.Dst.Job {
		t.Fatalf("job %v of neither side", r.Job)
	}
	if !localities[r.Locality] || !directions[r.Direction] || !reasons[r.Reason] {
		t.Fatalf("label value out of its set: %+v", r)
	}
	if r.Src.Zone == "" || r.Dst.Zone == "" {
		t.Fatalf("empty zone: %+v", r)
	}
	if strings.Contains(r.Node, "/") {
		t.Fatalf("node %q keeps its cluster prefix", r.Node)
	}
	if r.PolicyName == "" && r.PolicyNamespace != "" {
		t.Fatalf("policy namespace without name: %+v", r)
	}
}

// FuzzReadFlows feeds arbitrary bytes to the JSON flow reader and
// classifies what it yields: no input may fail the read or panic.
func FuzzReadFlows(f *testing.F) {
	for _, l := range seedLines(f) {
		f.Add(l)
	}
	agg := NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ReadFlows(bytes.NewReader(data), func(fl *flowpb.Flow) { checkResult(t, fl, agg.Observe(fl)) })
		if err != nil {
			t.Fatalf("read error on an in-memory reader: %v", err)
		}
		if st.Flows+st.Bad+st.Other > st.Lines || st.Lines > bytes.Count(data, []byte("\n"))+1 {
			t.Fatalf("stats do not add up: %+v", st)
		}
		if len(st.Errors) != min(st.Bad, maxLineErrors) {
			t.Fatalf("%d errors kept for %d bad lines", len(st.Errors), st.Bad)
		}
	})
}

// FuzzClassify classifies arbitrary wire-format flows against the test
// topology and checks the result's invariants.
func FuzzClassify(f *testing.F) {
	d := flowOf("gpu-b1", llmWorker, llmMaster, flowpb.Verdict_DROPPED, eventPolicyVerdict)
	d.DropReasonDesc, d.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
	d.IngressDeniedBy = []*flowpb.Policy{{Namespace: "ml-team", Name: "zone-isolation"}}
	for _, fl := range []*flowpb.Flow{typicalFlow(), heavyFlow(), maskedFlow(f), d,
		trace("gpu-a1", resWorker, resMaster, flowpb.TraceObservationPoint_TO_ENDPOINT, false),
		trace("cpu-a1", frontend, resMaster, flowpb.TraceObservationPoint_TO_STACK, false)} {
		data, err := proto.Marshal(fl)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, "")
		f.Add(data, "gpu-a1")
	}
	x := indexOf(testScenario())
	classifiers := map[string]*Classifier{}
	f.Fuzz(func(t *testing.T, data []byte, node string) {
		fl := &flowpb.Flow{}
		if proto.Unmarshal(data, fl) != nil {
			return
		}
		c := classifiers[node]
		if c == nil {
			if len(classifiers) > 64 {
				clear(classifiers)
			}
			c = NewClassifier(x, node)
			classifiers[node] = c
		}
		r := c.Classify(fl)
		checkResult(t, fl, r)
		if node != "" && r.Count != NotCounted && r.Node != node {
			t.Fatalf("counted a flow of node %q on %q", r.Node, node)
		}
	})
}

// FuzzWireDecode decodes arbitrary bytes as a GetFlowsResponse with the
// stream's wire decoder and with the generated one: where the generated
// decoder takes the message, the wire decoder takes it too, agrees on
// whether it is a flow, and reads every field zonewatch uses alike; the
// classification of the two is the same. Whatever the generated decoder
// refuses, the wire decoder must not panic on.
func FuzzWireDecode(f *testing.F) {
	for _, fl := range testFlows(f) {
		data, err := proto.Marshal(responseOf(fl))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, l := range seedLines(f) {
		resp := &observerpb.GetFlowsResponse{}
		if jsonOpts.Unmarshal(l, resp) != nil {
			continue
		}
		if data, err := proto.Marshal(resp); err == nil {
			f.Add(data)
		}
	}
	x := indexOf(testScenario())
	f.Fuzz(func(t *testing.T, data []byte) {
		generatedOK, diff := agree(data)
		if diff != "" {
			t.Fatal(diff)
		}
		if !generatedOK {
			return
		}
		got, ok, _ := DecodeResponse(data)
		if !ok {
			return
		}
		var resp observerpb.GetFlowsResponse
		_ = proto.Unmarshal(data, &resp)
		want := NewClassifier(x, "").Classify(resp.GetFlow())
		if r := NewClassifier(x, "").ClassifyFields(&got); r != want {
			t.Fatalf("classified differently:\n  wire      %+v\n  generated %+v", r, want)
		}
	})
}
