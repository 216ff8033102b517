package analyze

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The JSON report carries the lost-events count of the flow files (the
// text report says the counts are lower bounds), and a peer with a
// local-scope identity (a CIDR policy's internet peer, 1<<24|n) is the
// world even where the file has no labels (a masked export), as live.
func TestJSONLostEventsAndCIDRWorld(t *testing.T) {
	b, err := os.ReadFile(td("world-drops", "flows.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	cidr := strings.Replace(first, `"destination":{"identity":9,"labels":["reserved:world-ipv4"]}`, `"destination":{"identity":16777221}`, 1)
	cidr = strings.Replace(cidr, `"1.1.1.1"`, `"198.51.100.77"`, 1)
	if cidr == first {
		t.Fatal("the fixture's first flow changed; adapt the test")
	}
	lines := []string{
		`{"lost_events":{"source":"PERF_EVENT_RING_BUFFER","num_events_lost":"7","cpu":1},"node_name":"gpu-a1","time":"2026-03-01T12:00:01Z"}`,
		first, cidr,
		`{"lost_events":{"source":"OBSERVER_EVENTS_QUEUE","num_events_lost":"2"},"node_name":"gpu-a1","time":"2026-03-01T12:00:09Z"}`,
	}
	flows := filepath.Join(t.TempDir(), "flows.jsonl")
	if err := os.WriteFile(flows, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stdout, stderr := command(t, "--nodes", td("nodes.json"), "--pods", td("world-drops", "pods.json"), "--flows", flows, "-o", "json")
	var doc struct {
		FlowsRead       int    `json:"flows_read"`
		UnresolvedFlows int    `json:"unresolved_flows"`
		LostEvents      uint64 `json:"lost_events"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("%v: %s %s", err, stdout, stderr)
	}
	if doc.LostEvents != 9 || doc.FlowsRead != 2 || doc.UnresolvedFlows != 0 {
		t.Errorf("lost_events %d flows_read %d unresolved_flows %d, want 9, 2 and 0", doc.LostEvents, doc.FlowsRead, doc.UnresolvedFlows)
	}
}
