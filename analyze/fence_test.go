package analyze

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// An allow-list fence's default-deny drops (POLICY_DENIED, no denied-by)
// name the policies that select the chief and allow none of the workers,
// from --policies and the flows' identity labels, with one that allows the
// workers on another port only (alone it denies this port too); one
// without default deny, one of another namespace and one that cannot be
// read are not named.
func TestAllowListFenceNamed(t *testing.T) {
	var warn bytes.Buffer
	in := Input{Nodes: td("nodes.json"), Pods: td("allow-list-fence", "pods.json"), Flows: []string{td("allow-list-fence", "gpu-b1.jsonl")},
		Policies: td("allow-list-fence", "policies.json"), Warn: &warn}
	rep, err := Run(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Jobs) != 1 {
		t.Fatalf("jobs %+v", rep.Jobs)
	}
	j := rep.Jobs[0]
	want := []string{"ml-team/chief-fence", "ml-team/workers-allowed-on-other-port", "zone-fence"}
	if !reflect.DeepEqual(j.DenyingPolicies, want) || !reflect.DeepEqual(j.SelectedPolicies, want) {
		t.Errorf("denying %v, selected %v, want both %v", j.DenyingPolicies, j.SelectedPolicies, want)
	}
	if j.Verdict != VerdictBlocked || j.PolicyDrops.CrossZone != 2 {
		t.Errorf("verdict %s, drops %+v", j.Verdict, j.PolicyDrops)
	}
	if !strings.Contains(warn.String(), "broken") {
		t.Errorf("the unreadable policy is not reported: %q", warn.String())
	}
	// Without --policies the same drops name nothing.
	in.Policies = ""
	rep, err = Run(in)
	if err != nil {
		t.Fatal(err)
	}
	if j := rep.Jobs[0]; len(j.DenyingPolicies) != 0 || len(j.SelectedPolicies) != 0 {
		t.Errorf("without --policies: denying %v, selected %v", j.DenyingPolicies, j.SelectedPolicies)
	}
}

// A drop that more than fence.MaxNamed policies each deny: the exporter's
// label names three and "+N" for the rest, but "+N" is no policy, and
// analyze (whose output is not a label) names every one of them.
func TestSelectedPoliciesNeverPlusN(t *testing.T) {
	raw, err := os.ReadFile(td("allow-list-fence", "policies.json"))
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		APIVersion string           `json:"apiVersion"`
		Kind       string           `json:"kind"`
		Items      []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		t.Fatal(err)
	}
	// Two more copies of chief-fence: five policies each deny the drops.
	for _, it := range list.Items {
		md := it["metadata"].(map[string]any)
		if md["name"] != "chief-fence" {
			continue
		}
		for _, name := range []string{"chief-fence-2", "chief-fence-3"} {
			b, _ := json.Marshal(it)
			var cp map[string]any
			if err := json.Unmarshal(b, &cp); err != nil {
				t.Fatal(err)
			}
			cp["metadata"].(map[string]any)["name"] = name
			list.Items = append(list.Items, cp)
		}
		break
	}
	out, _ := json.Marshal(list)
	path := filepath.Join(t.TempDir(), "policies.json")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	var warn bytes.Buffer
	rep, err := Run(Input{Nodes: td("nodes.json"), Pods: td("allow-list-fence", "pods.json"),
		Flows: []string{td("allow-list-fence", "gpu-b1.jsonl")}, Policies: path, Warn: &warn})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ml-team/chief-fence", "ml-team/chief-fence-2", "ml-team/chief-fence-3",
		"ml-team/workers-allowed-on-other-port", "zone-fence"}
	j := rep.Jobs[0]
	if !reflect.DeepEqual(j.SelectedPolicies, want) || !reflect.DeepEqual(j.DenyingPolicies, want) {
		t.Errorf("selected %v, denying %v, want both %v", j.SelectedPolicies, j.DenyingPolicies, want)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text.String(), "+2") {
		t.Errorf("the text output names +2:\n%s", text.String())
	}
}

// `kubectl get networkpolicies -A -o json`: a Kubernetes NetworkPolicy
// that selects the chief and allows none of the workers names the drops,
// and so does one that allows only an ipBlock of the pod CIDR (Cilium's
// CIDR selectors never select a pod); one that allows them (a
// namespaceSelector and a port range), an egress-only one and one that
// cannot be read name nothing. One file with every kind names both kinds.
func TestNetworkPoliciesNamed(t *testing.T) {
	var warn bytes.Buffer
	in := Input{Nodes: td("nodes.json"), Pods: td("allow-list-fence", "pods.json"), Flows: []string{td("allow-list-fence", "gpu-b1.jsonl")},
		Policies: td("allow-list-fence", "networkpolicies.json"), Warn: &warn}
	rep, err := Run(in)
	if err != nil {
		t.Fatal(err)
	}
	if j := rep.Jobs[0]; !reflect.DeepEqual(j.SelectedPolicies, []string{"ml-team/chief-netpol", "ml-team/ipblock"}) {
		t.Errorf("selected %v, want the NetworkPolicies chief-netpol and ipblock", j.SelectedPolicies)
	}
	if !strings.Contains(warn.String(), "broken-netpol") {
		t.Errorf("the unreadable NetworkPolicy is not reported: %q", warn.String())
	}

	// One file with all kinds.
	var all struct {
		Items []json.RawMessage `json:"items"`
	}
	for _, f := range []string{"policies.json", "networkpolicies.json"} {
		var l struct {
			Items []json.RawMessage `json:"items"`
		}
		b, err := os.ReadFile(td("allow-list-fence", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		all.Items = append(all.Items, l.Items...)
	}
	b, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": all.Items})
	in.Policies = filepath.Join(t.TempDir(), "all.json")
	if err := os.WriteFile(in.Policies, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if rep, err = Run(in); err != nil {
		t.Fatal(err)
	}
	want := []string{"ml-team/chief-fence", "ml-team/chief-netpol", "ml-team/ipblock", "ml-team/workers-allowed-on-other-port", "zone-fence"}
	if j := rep.Jobs[0]; !reflect.DeepEqual(j.SelectedPolicies, want) {
		t.Errorf("one file with every kind: selected %v, want %v", j.SelectedPolicies, want)
	}
}
