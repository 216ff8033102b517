package hubble

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// realdata holds flows written by real Cilium/Hubble versions.
const realdata = "../../../shared/realdata/hubble"

func TestRealHubbleFilesParse(t *testing.T) {
	dir := testenv.RealData(t, "hubble")
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) == 0 {
		t.Fatalf("no Hubble capture in %s", dir)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			agg := NewAggregator(topology.NewIndex(), "", time.Minute, nil)
			st, err := ReadFlows(f, func(f *flowpb.Flow) { agg.Observe(f) })
			if err != nil {
				t.Fatal(err)
			}
			if st.Bad != 0 || st.Flows == 0 || st.Flows != st.Lines {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// The PR 40519 flow (Cilium ~1.18): a policy drop at egress, pod -> world,
// joined with an index that knows the pod as a job pod.
func TestRealPolicyDropJoined(t *testing.T) {
	path := filepath.Join(testenv.RealData(t, "hubble"), "cilium-pr-40519-dropped-policy-denied-kind.jsonl")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x := topology.NewIndex()
	x.UpsertNode(topology.Node{Name: "kind-worker2", Zone: "zone-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}})
	x.UpsertPod(0, topology.Pod{Namespace: "cilium-test-5", Name: "client-645b68dcf7-2jmrw", Node: "kind-worker2",
		IPs: []netip.Addr{netip.MustParseAddr("10.244.3.30")}, Identity: topology.Identity{Kind: "Job", Name: "client"}})
	agg := NewAggregator(x, "", time.Minute, nil)
	var r Result
	if _, err := ReadFlows(f, func(f *flowpb.Flow) { r = agg.Observe(f) }); err != nil {
		t.Fatal(err)
	}
	want := DropKey{Namespace: "cilium-test-5", Job: "client", Direction: DirectionEgress, SrcZone: "zone-1", DstZone: topology.UnknownZone,
		Locality: topology.LocalityUnknown, Peer: PeerWorld, Reason: ReasonPolicyDenied}
	if v := agg.Drops().Value(want); v != 1 {
		t.Errorf("drop %+v = %v, want 1 (result %+v)", want, v, r)
	}
	if r.DstUnresolved {
		t.Error("the world destination counted as unresolved")
	}
}

func TestReadFlowsLines(t *testing.T) {
	in := strings.Join([]string{
		`{"flow":{"time":"2026-03-01T12:00:00Z","verdict":"DROPPED","drop_reason_desc":"POLICY_DENIED","IP":{"source":"10.0.0.1","destination":"10.0.0.2"}},"node_name":"n1","time":"2026-03-01T12:00:00Z"}`,
		`{"time":"2026-03-01T12:00:01Z","verdict":"FORWARDED","IP":{"source":"10.0.0.1","destination":"10.0.0.2"},"node_name":"n1"}`,
		``,
		`{"lost_events":{"source":"PERF_EVENT_RING_BUFFER","num_events_lost":"12","cpu":3}}`,
		`{"node_status":{"state_change":"NODE_CONNECTED","node_names":["a","b"]}}`,
		`{"flow":{"verdict":"SOMETHING_NEWER","IP":{"source":"10.0.0.3","destination":"10.0.0.4"},"newer_field":{"x":1}}}`,
		`not json`,
		`{}`,
		`{"flow":{"time":"yesterday"}}`,
		`{"flow": {"verdict": "FORWARDED",`,
		"{\"verdict\":\"FORWARDED\",\"IP\":{\"source\":\"10.0.0.5\",\"destination\":\"10.0.0.6\"}}\r",
		`   `,
		`{"flow":{"verdict":"DROPPED","IP":{"source":"10.0.0.7","destination":"10.0.0.8"}}}`, // no newline at the end
	}, "\n")
	var verdicts []string
	st, err := ReadFlows(strings.NewReader(in), func(f *flowpb.Flow) { verdicts = append(verdicts, f.GetVerdict().String()) })
	if err != nil {
		t.Fatal(err)
	}
	if st.Lines != 11 || st.Flows != 5 || st.LostEvents != 12 || st.Other != 1 || st.Bad != 4 || len(st.Errors) != 4 {
		t.Errorf("stats %+v", st)
	}
	if got := strings.Join(verdicts, ","); got != "DROPPED,FORWARDED,VERDICT_UNKNOWN,FORWARDED,DROPPED" {
		t.Errorf("verdicts %s", got)
	}
	if st.Errors[0].Line != 7 {
		t.Errorf("first bad line %d, want 7: %v", st.Errors[0].Line, st.Errors[0])
	}
}

func TestReadFlowsLongLine(t *testing.T) {
	long := `{"flow":{"verdict":"FORWARDED","Summary":"` + strings.Repeat("x", maxLine) + `"}}`
	medium := `{"flow":{"verdict":"DROPPED","Summary":"` + strings.Repeat("y", 200<<10) + `"}}`
	in := long + "\n" + medium + "\n" + `{"flow":{"verdict":"FORWARDED"}}` + "\n"
	n := 0
	st, err := ReadFlows(strings.NewReader(in), func(*flowpb.Flow) { n++ })
	if err != nil {
		t.Fatal(err)
	}
	if st.Bad != 1 || st.Flows != 2 || n != 2 {
		t.Errorf("stats %+v", st)
	}
}
