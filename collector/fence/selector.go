package fence

import (
	"fmt"
	"slices"
	"strings"
)

// LabelSelector is a Kubernetes label selector as a policy writes it.
type LabelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []Expression      `json:"matchExpressions,omitempty"`
}

// Expression is one matchExpressions entry.
type Expression struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// selector is a parsed endpoint selector: every requirement must hold.
// Keys keep the form Cilium gives them ("source:key", "any:" where the
// policy wrote none), because Cilium's namespace and cluster defaults test
// keys by their exact strings.
type selector struct {
	reqs []requirement
}

type requirement struct {
	raw    string // the key with its source ("any:app", "k8s:app")
	source string // SourceAny when written without one
	key    string
	op     string // In, NotIn, Exists, DoesNotExist; opCluster: the local cluster
	values []string
}

func newSelector(ls *LabelSelector) (selector, error) {
	var s selector
	if ls == nil {
		return s, nil
	}
	keys := make([]string, 0, len(ls.MatchLabels))
	for k := range ls.MatchLabels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s.add(k, "In", []string{ls.MatchLabels[k]})
	}
	for _, e := range ls.MatchExpressions {
		switch e.Operator {
		case "In", "NotIn":
			if len(e.Values) == 0 {
				return s, fmt.Errorf("selector %q %s with no values", e.Key, e.Operator)
			}
		case "Exists", "DoesNotExist":
			if len(e.Values) != 0 {
				return s, fmt.Errorf("selector %q %s with values", e.Key, e.Operator)
			}
		default:
			return s, fmt.Errorf("selector %q: operator %q", e.Key, e.Operator)
		}
		s.add(e.Key, e.Operator, e.Values)
	}
	return s, nil
}

// add appends a requirement. A key written without a source gets "any:",
// as Cilium's Sanitize gives it (NewESFromK8sLabelSelector with the any
// prefix) before it tests keys for a namespace or a cluster.
func (s *selector) add(raw, op string, values []string) {
	src, key := splitSource(raw)
	if src == "" {
		src = SourceAny
	}
	s.reqs = append(s.reqs, requirement{raw: src + ":" + key, source: src, key: key, op: op, values: values})
}

// hasKey reports whether a requirement's key is written exactly k
// (api.EndpointSelector.HasKey).
func (s *selector) hasKey(k string) bool {
	for _, r := range s.reqs {
		if r.raw == k {
			return true
		}
	}
	return false
}

func (s *selector) hasKeyPrefix(p string) bool {
	for _, r := range s.reqs {
		if strings.HasPrefix(r.raw, p) {
			return true
		}
	}
	return false
}

// opCluster requires the label to hold the local cluster's name, which
// the flow brings (Flow.Cluster).
const opCluster = "InLocalCluster"

// matches evaluates the selector on an identity's labels in cluster.
func (s *selector) matches(ls Labels, cluster string) bool {
	for _, r := range s.reqs {
		v, ok := ls.lookup(r.source, r.key)
		var hold bool
		switch r.op {
		case "In":
			hold = ok && slices.Contains(r.values, v)
		case "NotIn":
			hold = !ok || !slices.Contains(r.values, v)
		case "Exists":
			hold = ok
		case "DoesNotExist":
			hold = !ok
		case opCluster:
			hold = ok && v == cluster
		}
		if !hold {
			return false
		}
	}
	return true
}

// reservedSel selects identities with one reserved label.
func reservedSel(name string) selector {
	var s selector
	s.add(SourceReserved+":"+name, "In", []string{""})
	return s
}

// entitySelectors are the selectors of a policy entity
// (pkg/policy/api/entity.go, EntitySelectorMapping); "cluster" also
// selects the local cluster's endpoints by their cluster label,
// "cluster-mesh" every cluster's. An entity Cilium does not know is
// refused before (sanitizeEntry).
func entitySelectors(entity string) []selector {
	var names []string
	switch entity {
	case "all":
		return []selector{{}}
	case "world":
		names = []string{"world", "world-ipv4", "world-ipv6", "aggregate-world"}
	case "remote-node":
		names = []string{"remote-node", "aggregate-remote-node"}
	case "cluster", "cluster-mesh":
		names = []string{"host", "remote-node", "init", "ingress", "health", "unmanaged", "kube-apiserver", "aggregate-cluster"}
	default:
		names = []string{entity}
	}
	out := make([]selector, 0, len(names)+2)
	for _, n := range names {
		out = append(out, reservedSel(n))
	}
	var c selector
	switch entity {
	case "cluster":
		c.add(SourceK8s+":"+LabelCluster, opCluster, nil)
	case "cluster-mesh":
		out = append(out, reservedSel("aggregate-cluster-mesh"))
		c.add(LabelCluster, "Exists", nil)
	default:
		return out
	}
	return append(out, c)
}
