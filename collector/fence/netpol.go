package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// KindNetworkPolicy is Ref.Kind of a Kubernetes NetworkPolicy
// (networking.k8s.io/v1); Cilium's policies have an empty Kind.
const KindNetworkPolicy = "NetworkPolicy"

// NetworkPolicy is the part of a Kubernetes NetworkPolicy
// (networking.k8s.io/v1) that zonewatch reads.
type NetworkPolicy struct {
	Metadata struct {
		Namespace string `json:"namespace,omitempty"`
		Name      string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		PodSelector LabelSelector `json:"podSelector"`
		Ingress     []NetpolRule  `json:"ingress,omitempty"`
		Egress      []NetpolRule  `json:"egress,omitempty"`
		PolicyTypes []string      `json:"policyTypes,omitempty"`
	} `json:"spec"`
}

// NetpolRule is one ingress (from) or egress (to) rule.
type NetpolRule struct {
	From  []NetpolPeer `json:"from,omitempty"`
	To    []NetpolPeer `json:"to,omitempty"`
	Ports []NetpolPort `json:"ports,omitempty"`
}

// NetpolPeer is one from or to entry.
type NetpolPeer struct {
	PodSelector       *LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`
	IPBlock           *struct {
		CIDR   string   `json:"cidr"`
		Except []string `json:"except,omitempty"`
	} `json:"ipBlock,omitempty"`
}

// NetpolPort is one ports entry; Port is a number or a named port.
type NetpolPort struct {
	Protocol *string         `json:"protocol,omitempty"`
	Port     json.RawMessage `json:"port,omitempty"`
	EndPort  *int32          `json:"endPort,omitempty"`
}

// ParseNetworkPolicy reads a NetworkPolicy object (JSON).
func ParseNetworkPolicy(data []byte) (*Policy, error) {
	var np NetworkPolicy
	if err := json.Unmarshal(data, &np); err != nil {
		return nil, err
	}
	return np.Parse()
}

// Parse turns a NetworkPolicy into a policy with the rules Cilium makes
// of it (its translation into allow entries with default deny, v1.20):
// the subject is podSelector in the policy's namespace ("default" when
// none); each from/to peer is an entry (an empty or missing list: every
// peer, reserved identities included), the rule's ports apply to each;
// a podSelector peer is in the policy's namespace, a namespaceSelector
// one in the namespaces with those labels (empty: every namespace), both
// in the local cluster unless they name one; an ipBlock is a CIDR
// selector with its except (cidr.go). Ingress is denied by default when
// there is no ingress rule and policyTypes has Ingress or lacks Egress,
// egress when there is no egress rule and policyTypes has Egress; rules
// are read whatever policyTypes says, as Cilium reads them. Label keys are
// Kubernetes labels (source k8s).
func (np *NetworkPolicy) Parse() (*Policy, error) {
	if np.Metadata.Name == "" {
		return nil, errors.New("network policy without a name")
	}
	ns := np.Metadata.Namespace
	if ns == "" {
		ns = "default"
	}
	p := &Policy{Ref: Ref{Namespace: ns, Name: np.Metadata.Name, Kind: KindNetworkPolicy}}
	var r rule
	var err error
	if r.subject, err = netpolPodSelector(&np.Spec.PodSelector, ns); err != nil {
		return nil, fmt.Errorf("network policy %s: podSelector: %w", p.Ref, err)
	}
	for dir, rules := range [2][]NetpolRule{np.Spec.Ingress, np.Spec.Egress} {
		for i := range rules {
			es, err := netpolEntries(&rules[i], dir, ns)
			if err != nil {
				return nil, fmt.Errorf("network policy %s: %w", p.Ref, err)
			}
			r.allow[dir] = append(r.allow[dir], es...)
		}
	}
	hasType := func(t string) bool { return slices.Contains(np.Spec.PolicyTypes, t) }
	// Cilium's default-deny entry: no peer, no port.
	if len(r.allow[0]) == 0 && (hasType("Ingress") || !hasType("Egress")) {
		r.allow[0] = []entry{{none: true}}
	}
	if len(r.allow[1]) == 0 && hasType("Egress") {
		r.allow[1] = []entry{{none: true}}
	}
	for dir := range 2 {
		r.defaultDeny[dir] = len(r.allow[dir]) > 0
	}
	p.rules = []rule{r}
	return p, nil
}

// k8sSelector reads a Kubernetes selector: keys without a source are
// Kubernetes labels (api.NewESFromK8sLabelSelector with the k8s prefix).
// prefix is put before every key (a namespace's labels).
func k8sSelector(ls *LabelSelector, prefix string) (selector, error) {
	if ls == nil {
		return selector{}, nil
	}
	key := func(k string) string {
		k = prefix + k
		if src, rest := splitSource(k); src != "" {
			return src + ":" + rest
		}
		return SourceK8s + ":" + k
	}
	out := &LabelSelector{MatchLabels: make(map[string]string, len(ls.MatchLabels))}
	for k, v := range ls.MatchLabels {
		out.MatchLabels[key(k)] = v
	}
	for _, e := range ls.MatchExpressions {
		e.Key = key(e.Key)
		out.MatchExpressions = append(out.MatchExpressions, e)
	}
	return newSelector(out)
}

// netpolPodSelector is a pod selector in namespace ns: the namespace
// replaces any the selector's matchLabels name (parsePodSelector).
func netpolPodSelector(ls *LabelSelector, ns string) (selector, error) {
	c := LabelSelector{MatchLabels: map[string]string{}, MatchExpressions: ls.MatchExpressions}
	for k, v := range ls.MatchLabels {
		if k != LabelNamespace {
			c.MatchLabels[k] = v
		}
	}
	s, err := k8sSelector(&c, "")
	if err != nil {
		return s, err
	}
	s.add(k8sNamespace, "In", []string{ns})
	return s, nil
}

func netpolEntries(nr *NetpolRule, dir int, ns string) ([]entry, error) {
	peers := nr.From
	if dir == 1 {
		peers = nr.To
	}
	var base entry
	base.anyPort = len(nr.Ports) == 0
	for _, p := range nr.Ports {
		pp, err := netpolPort(p)
		if err != nil {
			return nil, err
		}
		rs, ok := portRanges(pp)
		if !ok {
			base.otherPorts = true // a named port, or a protocol not decided here
			continue
		}
		base.ports = append(base.ports, rs...)
	}
	if len(peers) == 0 {
		// Every source or destination (types.WildcardSelectors).
		e := base
		e.all = true
		return []entry{e}, nil
	}
	out := make([]entry, 0, len(peers))
	for i := range peers {
		e := base
		e.ports = slices.Clone(base.ports)
		if b := peers[i].IPBlock; b != nil {
			// Cilium's CIDR selector (ipBlockToCIDRRule).
			c, err := newCIDRSelector(CIDRRule{CIDR: b.CIDR, Except: b.Except}, false)
			if err != nil {
				return nil, fmt.Errorf("ipBlock: %w", err)
			}
			e.cidrs = []cidrSelector{c}
			out = append(out, e)
			continue
		}
		s, err := netpolPeer(&peers[i], ns)
		if err != nil {
			return nil, err
		}
		e.peers = []selector{s}
		out = append(out, e)
	}
	return out, nil
}

// netpolPeer is the selector Cilium makes of a pod or namespace peer
// (parseNetworkPolicyPeer).
func netpolPeer(p *NetpolPeer, ns string) (s selector, err error) {
	pod := LabelSelector{MatchLabels: map[string]string{}}
	if p.PodSelector != nil {
		pod.MatchExpressions = p.PodSelector.MatchExpressions
		for k, v := range p.PodSelector.MatchLabels {
			pod.MatchLabels[k] = v
		}
	}
	// The local cluster unless the selector names a cluster
	// (isPodSelectorSelectingCluster: a non-empty value, or an expression).
	local := pod.MatchLabels[LabelCluster] == "" &&
		!slices.ContainsFunc(pod.MatchExpressions, func(e Expression) bool { return e.Key == LabelCluster })
	if local {
		delete(pod.MatchLabels, LabelCluster)
	}
	if p.NamespaceSelector != nil {
		if s, err = k8sSelector(&pod, ""); err != nil {
			return s, err
		}
		nsSel, err := k8sSelector(p.NamespaceSelector, LabelNamespaceLabels)
		if err != nil {
			return s, err
		}
		s.reqs = append(s.reqs, nsSel.reqs...)
		if len(p.NamespaceSelector.MatchLabels) == 0 && len(p.NamespaceSelector.MatchExpressions) == 0 {
			s.add(k8sNamespace, "Exists", nil) // every namespace
		}
	} else if s, err = netpolPodSelector(&pod, ns); err != nil {
		return s, err
	}
	if local {
		s.add(k8sCluster, opCluster, nil)
	}
	return s, nil
}

// netpolPort is a NetworkPolicy port as Cilium's parsePorts writes it:
// TCP unless a protocol is given, port "0" (every port) when none.
func netpolPort(p NetpolPort) (Port, error) {
	out := Port{Protocol: "TCP", Port: "0"}
	if p.Protocol != nil {
		proto := strings.ToUpper(*p.Protocol)
		switch proto {
		case "", "ANY", "TCP", "UDP", "SCTP", "VRRP", "IGMP", "GRE", "IPIP", "IPV6", "ESP", "AH":
		default:
			return out, fmt.Errorf("invalid protocol %q", *p.Protocol)
		}
		out.Protocol = proto
	}
	if len(p.Port) > 0 && string(p.Port) != "null" {
		var n int64
		var name string
		switch {
		case json.Unmarshal(p.Port, &n) == nil:
			out.Port = strconv.FormatInt(n, 10)
		case json.Unmarshal(p.Port, &name) == nil:
			out.Port = name
		default:
			return out, fmt.Errorf("port %s: neither a number nor a name", p.Port)
		}
	}
	if p.EndPort != nil {
		out.EndPort = *p.EndPort
	}
	return out, nil
}
