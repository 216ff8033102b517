package analyze

import (
	"bytes"
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
