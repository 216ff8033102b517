package hubblepeer

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/cilium/hive/hivetest"

	ciliumk8s "github.com/cilium/cilium/pkg/k8s"
	slim_networkingv1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/api/networking/v1"
	policytypes "github.com/cilium/cilium/pkg/policy/types"

	"github.com/zonewatch/zonewatch/collector/fence"
)

// Kubernetes NetworkPolicies as users write them (keys without a source:
// the API refuses a ':' in a label key), over the same vocabulary as the
// Cilium policies, so that selectors often match.

func (g policyGen) k8sSelector(peer bool) map[string]any {
	s := map[string]any{}
	if g.r.IntN(4) == 0 {
		return s // {}
	}
	ml := map[string]string{}
	var me []map[string]any
	for range 1 + g.r.IntN(2) {
		k := g.pick(genKeys)
		switch g.r.IntN(6) {
		case 0, 1:
			ml[k] = g.pick(genValues[k])
		case 2:
			vs := slices.Compact(slices.Sorted(slices.Values([]string{g.pick(genValues[k]), g.pick(genValues[k])})))
			me = append(me, map[string]any{"key": k, "operator": g.pick([]string{"In", "NotIn"}), "values": vs})
		case 3:
			me = append(me, map[string]any{"key": k, "operator": g.pick([]string{"Exists", "DoesNotExist"})})
		case 4:
			// the namespace written into the selector: Cilium replaces it
			ml[fence.LabelNamespace] = g.pick(genNS)
		case 5:
			if peer {
				// a cluster: this one, another, or an expression on it
				switch g.r.IntN(3) {
				case 0:
					ml[fence.LabelCluster] = fenceCluster
				case 1:
					ml[fence.LabelCluster] = "other"
				case 2:
					me = append(me, map[string]any{"key": fence.LabelCluster, "operator": "Exists"})
				}
			}
		}
	}
	if len(ml) > 0 {
		s["matchLabels"] = ml
	}
	if len(me) > 0 {
		s["matchExpressions"] = me
	}
	return s
}

func (g policyGen) nsSelector() map[string]any {
	switch g.r.IntN(4) {
	case 0:
		return map[string]any{}
	case 1:
		return map[string]any{"matchLabels": map[string]string{"team": "team-" + g.pick(genNS)}}
	case 2:
		return map[string]any{"matchLabels": map[string]string{"kubernetes.io/metadata.name": g.pick(genNS)}}
	}
	return map[string]any{"matchExpressions": []map[string]any{{"key": "team", "operator": "NotIn", "values": []string{"team-" + g.pick(genNS)}}}}
}

// netpolPeer returns a from/to entry and whether it is an ipBlock.
func (g policyGen) netpolPeer() (map[string]any, bool) {
	switch g.r.IntN(8) {
	case 0, 1, 2:
		return map[string]any{"podSelector": g.k8sSelector(true)}, false
	case 3, 4:
		return map[string]any{"namespaceSelector": g.nsSelector()}, false
	case 5, 6:
		return map[string]any{"namespaceSelector": g.nsSelector(), "podSelector": g.k8sSelector(true)}, false
	}
	b := map[string]any{"cidr": g.pick([]string{"10.0.0.0/8", "0.0.0.0/0", "192.168.0.0/16"})}
	if g.r.IntN(2) == 0 {
		b["except"] = []string{"10.1.0.0/16"}
		if b["cidr"] == "192.168.0.0/16" {
			b["except"] = []string{"192.168.1.0/24"}
		}
	}
	return map[string]any{"ipBlock": b}, true
}

// netpolRule generates a rule; 1 when it has an ipBlock peer.
func (g policyGen) netpolRule(egress bool) (map[string]any, int) {
	r := map[string]any{}
	cidr := 0
	field := "from"
	if egress {
		field = "to"
	}
	switch g.r.IntN(5) {
	case 0: // no from/to: every peer
	case 1:
		r[field] = []any{}
	default:
		var peers []any
		for range 1 + g.r.IntN(2) {
			p, isCIDR := g.netpolPeer()
			if isCIDR {
				cidr = 1
			}
			peers = append(peers, p)
		}
		r[field] = peers
	}
	if g.r.IntN(2) == 0 {
		var ports []any
		for range 1 + g.r.IntN(2) {
			p := map[string]any{}
			switch g.r.IntN(6) {
			case 0:
				p["port"] = 80
			case 1:
				p["port"], p["endPort"] = 8080, 8090
			case 2:
				p["port"] = 29500
			case 3:
				p["port"] = "443" // a number written as a string
			case 4:
				p["port"] = "http" // a named port
			case 5: // every port of the protocol
			}
			if proto := g.pick([]string{"", "TCP", "UDP", "SCTP"}); proto != "" {
				p["protocol"] = proto
			}
			ports = append(ports, p)
		}
		r["ports"] = ports
	}
	return r, cidr
}

// netpol generates a NetworkPolicy; cidr counts its rules with an ipBlock
// peer.
func (g policyGen) netpol(i int) (data []byte, cidr int) {
	spec := map[string]any{"podSelector": g.k8sSelector(false)}
	for _, dir := range []string{"ingress", "egress"} {
		switch g.r.IntN(4) {
		case 0: // none
		case 1:
			spec[dir] = []any{}
		default:
			var rules []any
			for range 1 + g.r.IntN(2) {
				r, c := g.netpolRule(dir == "egress")
				cidr += c
				rules = append(rules, r)
			}
			spec[dir] = rules
		}
	}
	switch g.r.IntN(4) {
	case 1:
		spec["policyTypes"] = []string{"Ingress"}
	case 2:
		spec["policyTypes"] = []string{"Egress"}
	case 3:
		spec["policyTypes"] = []string{"Ingress", "Egress"}
	}
	o := map[string]any{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
		"metadata": map[string]any{"name": fmt.Sprintf("np%d", i), "namespace": g.pick(genNS)}, "spec": spec}
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	return b, cidr
}

// ciliumNetpolEntries is Cilium's own translation of a NetworkPolicy into
// its policy entries (what its policy watcher adds to the repository).
func ciliumNetpolEntries(t *testing.T, data []byte) (policytypes.PolicyEntries, error) {
	var np slim_networkingv1.NetworkPolicy
	if err := json.Unmarshal(data, &np); err != nil {
		return nil, err
	}
	return ciliumk8s.ParseNetworkPolicy(hivetest.Logger(t), fenceCluster, &np)
}
