package deploy

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestChartRelayShards: hubble.relay.shards: 3 renders one Deployment per
// shard, each selecting only its own pod and running it with --shard i
// --total-shards 3 and the cluster name for the node_name filter.
func TestChartRelayShards(t *testing.T) {
	objs := render(t, "hubble:\n  relay:\n    enabled: true\n    shards: 3\n    clusterName: prod-eu\n")
	deps := ofKind(objs, "Deployment")
	if len(deps) != 3 {
		t.Fatalf("%d Deployments, want 3", len(deps))
	}
	names := map[string]bool{}
	for _, o := range deps {
		d := typed[appsv1.Deployment](t, o)
		names[d.Name] = true
		shard := d.Spec.Selector.MatchLabels["zonewatch.io/shard"]
		if shard == "" || d.Spec.Template.Labels["zonewatch.io/shard"] != shard {
			t.Errorf("%s: selector %v, pod labels %v", d.Name, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
		}
		if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("%s: %d replicas, strategy %s", d.Name, *d.Spec.Replicas, d.Spec.Strategy.Type)
		}
		c := &d.Spec.Template.Spec.Containers[0]
		wantArgs(t, c, "--node-name=", "--shard="+shard, "--total-shards=3", "--hubble.cluster-name=prod-eu")
	}
	if len(names) != 3 {
		t.Errorf("Deployment names %v", names)
	}
	// One shard (the default) is the single Relay replica it always was.
	one := ofKind(render(t, "hubble:\n  relay:\n    enabled: true\n"), "Deployment")
	if len(one) != 1 {
		t.Fatalf("%d Deployments", len(one))
	}
	d := typed[appsv1.Deployment](t, one[0])
	if _, ok := d.Spec.Selector.MatchLabels["zonewatch.io/shard"]; ok {
		t.Error("one shard has a shard label")
	}
	noArgPrefix(t, &d.Spec.Template.Spec.Containers[0], "--shard")
}
