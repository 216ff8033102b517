// Package fence names the network policies behind a default-deny drop.
//
// Cilium names the policy of a drop by a deny rule (ingress_denied_by,
// egress_denied_by), but not of a default-deny drop (reason 133
// POLICY_DENIED with no denied-by: an allow-list fence that selects the
// endpoint and allows none of the peer; cilium#48588). For those drops
// zonewatch names, itself, the CiliumNetworkPolicies and
// CiliumClusterwideNetworkPolicies that select the denying endpoint in the
// drop's direction and allow none of the peer on the drop's port: each of
// them alone would deny the packet. Kubernetes NetworkPolicies are read
// as the rules Cilium translates them into (netpol.go).
//
// Selectors are evaluated on the security identities' labels with
// Cilium's semantics (label sources, the "any" source, reserved entities,
// the namespace Cilium adds to a namespaced policy's selectors, the
// namespace requirement of a cluster-wide policy's peers), checked
// against Cilium v1.20.2's own policy repository (internal/hubblepeer,
// TestFenceAgreesWithCilium). CIDR-style peers are evaluated as Cilium
// does, on the identity's labels (cidr.go): a CIDR, CIDRSet (with except)
// or ipBlock selects world and CIDR identities by their cidr labels, a
// node or pod only in the CIDR match modes that give them such labels;
// an FQDN selects the identities labelled with it. A policy Cilium
// refuses is refused (validate.go). What zonewatch does not evaluate
// (Services, groups, CIDR groups, named ports, ICMP types, host policies
// (nodeSelector), a zero-length CIDR on an identity of unknown address
// family) makes its policy undecided: such a policy is never named.
package fence

import (
	"sort"
	"strings"
)

// Label sources (pkg/labels, Cilium v1.20).
const (
	SourceAny      = "any"
	SourceK8s      = "k8s"
	SourceReserved = "reserved"
)

// Label keys Cilium puts on pods' identities.
const (
	// LabelNamespace is the pod's namespace (source k8s).
	LabelNamespace = "io.kubernetes.pod.namespace"
	// LabelNamespaceLabels prefixes the namespace's own labels.
	LabelNamespaceLabels = "io.cilium.k8s.namespace.labels."
	// LabelCluster is the cluster name (io.cilium.k8s.policy.cluster).
	LabelCluster = "io.cilium.k8s.policy.cluster"
	// DefaultCluster is Cilium's default --cluster-name.
	DefaultCluster = "default"
)

// Label is one label of a security identity.
type Label struct{ Source, Key, Value string }

// Labels are a security identity's labels, sorted by source then key.
type Labels []Label

// ParseLabels reads labels written "source:key" -> value (a CiliumIdentity's
// security-labels) or "source:key=value" strings (a flow's labels, with
// values empty for keys alone).
func ParseLabels(m map[string]string) Labels {
	ls := make(Labels, 0, len(m))
	for k, v := range m {
		src, key := splitSource(k)
		if src == "" {
			src = "unspec"
		}
		ls = append(ls, Label{Source: src, Key: key, Value: v})
	}
	ls.sort()
	return ls
}

// ParseLabelStrings reads a flow's labels ("k8s:app=x", "reserved:world").
func ParseLabelStrings(list []string) Labels {
	ls := make(Labels, 0, len(list))
	for _, s := range list {
		src, rest := splitSource(s)
		if src == "" {
			src = "unspec"
		}
		key, value, _ := strings.Cut(rest, "=")
		ls = append(ls, Label{Source: src, Key: key, Value: value})
	}
	ls.sort()
	return ls
}

func (ls Labels) sort() {
	sort.Slice(ls, func(i, j int) bool {
		if ls[i].Source != ls[j].Source {
			return ls[i].Source < ls[j].Source
		}
		return ls[i].Key < ls[j].Key
	})
}

// lookup finds the first label with the key from source (any source for
// SourceAny), as Cilium's LabelArray.LookupLabel.
func (ls Labels) lookup(source, key string) (string, bool) {
	for _, l := range ls {
		if (source == SourceAny || l.Source == source) && l.Key == key {
			return l.Value, true
		}
	}
	return "", false
}

// Get returns the value of a label written "source:key" (no source: any).
func (ls Labels) Get(k string) (string, bool) {
	src, key := splitSource(k)
	if src == "" {
		src = SourceAny
	}
	return ls.lookup(src, key)
}

// Has reports whether a reserved label (e.g. "host", "world") is present.
func (ls Labels) reserved(name string) bool {
	_, ok := ls.lookup(SourceReserved, name)
	return ok
}

// splitSource splits "source:key" at the first colon; "$key" is reserved
// (Cilium's parseSource).
func splitSource(s string) (source, rest string) {
	if s == "" {
		return "", ""
	}
	if s[0] == '$' {
		return SourceReserved, s[1:]
	}
	if i := strings.IndexByte(s, ':'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "", s
}

// Reserved identities (pkg/identity/numericidentity.go, v1.20).
const (
	IdentityHost          = 1
	IdentityWorld         = 2
	IdentityUnmanaged     = 3
	IdentityHealth        = 4
	IdentityInit          = 5
	IdentityRemoteNode    = 6
	IdentityKubeAPIServer = 7
	IdentityIngress       = 8
	IdentityWorldIPv4     = 9
	IdentityWorldIPv6     = 10
)

// reservedLabels are the labels of Cilium's fixed reserved identities.
var reservedLabels = map[uint32]Labels{
	IdentityHost:          {{SourceReserved, "host", ""}},
	IdentityWorld:         {{SourceReserved, "world", ""}},
	IdentityUnmanaged:     {{SourceReserved, "unmanaged", ""}},
	IdentityHealth:        {{SourceReserved, "health", ""}},
	IdentityInit:          {{SourceReserved, "init", ""}},
	IdentityRemoteNode:    {{SourceReserved, "remote-node", ""}},
	IdentityKubeAPIServer: {{SourceReserved, "kube-apiserver", ""}, {SourceReserved, "remote-node", ""}},
	IdentityIngress:       {{SourceReserved, "ingress", ""}},
	IdentityWorldIPv4:     {{SourceReserved, "world-ipv4", ""}},
	IdentityWorldIPv6:     {{SourceReserved, "world-ipv6", ""}},
}

// ReservedLabels returns the labels of a fixed reserved identity.
func ReservedLabels(id uint32) (Labels, bool) {
	ls, ok := reservedLabels[id]
	return ls, ok
}
