package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Ref names a policy: Namespace is empty for a cluster-wide one; Kind is
// empty for Cilium's policies, KindNetworkPolicy for a Kubernetes
// NetworkPolicy (which may share a CiliumNetworkPolicy's name).
type Ref struct{ Namespace, Name, Kind string }

// String is "namespace/name", or "name" for a cluster-wide policy (the
// policy label's form).
func (r Ref) String() string {
	if r.Namespace == "" {
		return r.Name
	}
	return r.Namespace + "/" + r.Name
}

func (r Ref) less(o Ref) bool {
	if r.Namespace != o.Namespace {
		return r.Namespace < o.Namespace
	}
	if r.Name != o.Name {
		return r.Name < o.Name
	}
	return r.Kind < o.Kind
}

// Object is the part of a CiliumNetworkPolicy or
// CiliumClusterwideNetworkPolicy that zonewatch reads.
type Object struct {
	Kind     string `json:"kind,omitempty"`
	Metadata struct {
		Namespace string `json:"namespace,omitempty"`
		Name      string `json:"name"`
	} `json:"metadata"`
	Spec  *Rule  `json:"spec,omitempty"`
	Specs []Rule `json:"specs,omitempty"`
}

// Rule is one rule of a policy (a spec or an entry of specs).
type Rule struct {
	EndpointSelector  *LabelSelector `json:"endpointSelector,omitempty"`
	NodeSelector      *LabelSelector `json:"nodeSelector,omitempty"`
	Ingress           []PeerRule     `json:"ingress,omitempty"`
	IngressDeny       []PeerRule     `json:"ingressDeny,omitempty"`
	Egress            []PeerRule     `json:"egress,omitempty"`
	EgressDeny        []PeerRule     `json:"egressDeny,omitempty"`
	EnableDefaultDeny struct {
		Ingress *bool `json:"ingress,omitempty"`
		Egress  *bool `json:"egress,omitempty"`
	} `json:"enableDefaultDeny,omitzero"`
}

// PeerRule is one entry of ingress, ingressDeny, egress or egressDeny.
// Groups and Services are not evaluated (the cloud's and the cluster's
// Services' addresses decide them); requirements have no effect in Cilium
// v1.20 (the CRD allows none, its rules ignore them).
type PeerRule struct {
	FromEndpoints []LabelSelector `json:"fromEndpoints,omitempty"`
	ToEndpoints   []LabelSelector `json:"toEndpoints,omitempty"`
	FromEntities  []string        `json:"fromEntities,omitempty"`
	ToEntities    []string        `json:"toEntities,omitempty"`
	ToPorts       []PortRule      `json:"toPorts,omitempty"`
	ICMPs         []ICMPRule      `json:"icmps,omitempty"`

	FromCIDR     []string          `json:"fromCIDR,omitempty"`
	FromCIDRSet  []CIDRRule        `json:"fromCIDRSet,omitempty"`
	FromNodes    []LabelSelector   `json:"fromNodes,omitempty"`
	FromGroups   []json.RawMessage `json:"fromGroups,omitempty"`
	FromRequires []string          `json:"fromRequires,omitempty"`
	ToCIDR       []string          `json:"toCIDR,omitempty"`
	ToCIDRSet    []CIDRRule        `json:"toCIDRSet,omitempty"`
	ToNodes      []LabelSelector   `json:"toNodes,omitempty"`
	ToGroups     []json.RawMessage `json:"toGroups,omitempty"`
	ToRequires   []string          `json:"toRequires,omitempty"`
	ToFQDNs      []FQDNSelector    `json:"toFQDNs,omitempty"`
	ToServices   []json.RawMessage `json:"toServices,omitempty"`
}

// CIDRRule is one fromCIDRSet or toCIDRSet entry.
type CIDRRule struct {
	CIDR              string         `json:"cidr,omitempty"`
	CIDRGroupRef      string         `json:"cidrGroupRef,omitempty"`
	CIDRGroupSelector *LabelSelector `json:"cidrGroupSelector,omitempty"`
	Except            []string       `json:"except,omitempty"`
}

// FQDNSelector is one toFQDNs entry.
type FQDNSelector struct {
	MatchName    string `json:"matchName,omitempty"`
	MatchPattern string `json:"matchPattern,omitempty"`
}

// ICMPRule is one icmps entry; its types decide ICMP packets only.
type ICMPRule struct {
	Fields []struct {
		Family string `json:"family,omitempty"`
	} `json:"fields,omitempty"`
}

// PortRule is one toPorts entry; its L7 rules allow the port at L4.
type PortRule struct {
	Ports []Port   `json:"ports,omitempty"`
	Rules *L7Rules `json:"rules,omitempty"`
}

// L7Rules are a toPorts entry's L7 rules, read only to refuse what Cilium
// refuses.
type L7Rules struct {
	HTTP  []json.RawMessage `json:"http,omitempty"`
	Kafka []json.RawMessage `json:"kafka,omitempty"`
	DNS   []json.RawMessage `json:"dns,omitempty"`
	L7    []json.RawMessage `json:"l7,omitempty"`
}

func (r *L7Rules) empty() bool {
	return r == nil || r.HTTP == nil && r.Kafka == nil && r.DNS == nil && r.L7 == nil
}

// Port is one port of a toPorts entry.
type Port struct {
	Port     string `json:"port,omitempty"`
	EndPort  int32  `json:"endPort,omitempty"`
	Protocol string `json:"protocol,omitempty"`
}

// Policy is a parsed policy.
type Policy struct {
	Ref   Ref
	rules []rule
}

type rule struct {
	node    bool // a nodeSelector rule: selects nodes (the host), not pods
	subject selector
	// by direction: 0 ingress, 1 egress
	allow, deny [2][]entry
	defaultDeny [2]bool
}

// entry is one allow or deny entry.
type entry struct {
	none bool // an explicitly empty peer list: selects nobody
	all  bool // every peer (a NetworkPolicy rule without from or to)
	// peers are the label selectors, cidrs the CIDR selectors and fqdns
	// the FQDN selectors' identity labels; otherPeers: the entry has
	// peers zonewatch does not evaluate (Services, groups).
	peers      []selector
	cidrs      []cidrSelector
	fqdns      []string
	otherPeers bool
	ports      []portRange
	// anyPort: no L4 part (an L3-only entry allows every port and protocol)
	anyPort bool
	// icmp: ICMP types, not evaluated (they decide ICMP packets only);
	// otherPorts: named ports or a toPorts entry without ports.
	icmp, otherPorts bool
}

func (e *entry) hasL3() bool {
	return len(e.peers) > 0 || len(e.cidrs) > 0 || len(e.fqdns) > 0 || e.otherPeers
}

type portRange struct {
	proto    uint8 // 0: TCP, UDP and SCTP
	from, to uint16
}

// IP protocols.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
	ProtoSCTP   = 132
)

// Parse reads a policy object (JSON, as the API server serves it).
func Parse(data []byte) (*Policy, error) {
	var o Object
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, err
	}
	return o.Parse()
}

// Parse turns an object into a policy. A namespace makes it a
// CiliumNetworkPolicy, none a cluster-wide one. Peer selectors that name
// no cluster select the local cluster's endpoints, as Cilium's default
// --policy-default-local-cluster has it; the local cluster is the one of
// the flow's subject (Flow.Cluster).
func (o *Object) Parse() (*Policy, error) {
	if o.Metadata.Name == "" {
		return nil, errors.New("policy without a name")
	}
	ns := o.Metadata.Namespace
	if o.Kind == "CiliumClusterwideNetworkPolicy" {
		ns = ""
	}
	p := &Policy{Ref: Ref{Namespace: ns, Name: o.Metadata.Name}}
	specs := o.Specs
	if o.Spec != nil {
		specs = append([]Rule{*o.Spec}, specs...)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("policy %s has no spec", p.Ref)
	}
	for i := range specs {
		if ns != "" && specs[i].NodeSelector != nil {
			return nil, fmt.Errorf("policy %s: a CiliumNetworkPolicy rule cannot have a nodeSelector", p.Ref)
		}
		r, err := parseRule(&specs[i], ns)
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", p.Ref, err)
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

const (
	k8sNamespace = SourceK8s + ":" + LabelNamespace
	anyNamespace = SourceAny + ":" + LabelNamespace
	k8sCluster   = SourceK8s + ":" + LabelCluster
	anyCluster   = SourceAny + ":" + LabelCluster
)

// parseRule reads one rule; it refuses what Cilium's Sanitize refuses
// (with its default agent configuration).
func parseRule(r *Rule, ns string) (rule, error) {
	var out rule
	if err := sanitizeRule(r); err != nil {
		return out, err
	}
	var err error
	if r.EndpointSelector != nil {
		if out.subject, err = newSelector(r.EndpointSelector); err != nil {
			return out, err
		}
		if ns != "" {
			// The policy applies in its namespace only.
			out.subject.add(k8sNamespace, "In", []string{ns})
		}
	} else {
		out.node = true
		if out.subject, err = newSelector(r.NodeSelector); err != nil {
			return out, err
		}
	}
	// An initializing endpoint's subject selector leaves peers without
	// the namespace requirement (utils.matchesPodInit).
	matchesInit := !out.node && out.subject.hasKey(SourceReserved+":init")
	dd := [2]*bool{r.EnableDefaultDeny.Ingress, r.EnableDefaultDeny.Egress}
	lists := [2][2][]PeerRule{{r.Ingress, r.IngressDeny}, {r.Egress, r.EgressDeny}}
	for dir := range 2 {
		for kind, list := range lists[dir] {
			for i := range list {
				e, err := parseEntry(&list[i], dir, kind == 1, ns, matchesInit)
				if err != nil {
					return out, err
				}
				if kind == 0 {
					out.allow[dir] = append(out.allow[dir], e)
				} else {
					out.deny[dir] = append(out.deny[dir], e)
				}
				out.defaultDeny[dir] = out.defaultDeny[dir] || dd[dir] == nil || *dd[dir]
			}
		}
	}
	return out, nil
}

// parseEntry reads an entry as Cilium's RulesToPolicyEntries does: the
// requirements are ignored, toFQDNs only in an egress allow entry, and
// Services (which Cilium's policy watcher turns into endpoints or CIDRs
// by the cluster's Services) are not evaluated.
func parseEntry(pr *PeerRule, dir int, deny bool, ns string, matchesInit bool) (entry, error) {
	var e entry
	endpoints, entities, nodes, cidrs, cidrSet := pr.FromEndpoints, pr.FromEntities, pr.FromNodes, pr.FromCIDR, pr.FromCIDRSet
	groups := pr.FromGroups
	if dir == 1 {
		endpoints, entities, nodes, cidrs, cidrSet = pr.ToEndpoints, pr.ToEntities, pr.ToNodes, pr.ToCIDR, pr.ToCIDRSet
		groups = pr.ToGroups
		e.otherPeers = len(pr.ToServices) > 0
		if !deny {
			for _, f := range pr.ToFQDNs {
				e.fqdns = append(e.fqdns, f.identityLabel())
			}
		}
	}
	// An explicitly empty peer list selects nobody
	// (utils.mergeEndpointSelectors).
	if (endpoints != nil && len(endpoints) == 0) || (entities != nil && len(entities) == 0) ||
		(nodes != nil && len(nodes) == 0) || (cidrs != nil && len(cidrs) == 0) || (cidrSet != nil && len(cidrSet) == 0) {
		return entry{none: true}, nil
	}
	e.otherPeers = e.otherPeers || len(groups) > 0
	for i := range endpoints {
		s, err := newSelector(&endpoints[i])
		if err != nil {
			return e, err
		}
		e.peers = append(e.peers, peerSelector(s, ns, matchesInit))
	}
	for _, ent := range entities {
		e.peers = append(e.peers, entitySelectors(ent)...)
	}
	for _, c := range cidrs {
		cs, err := newCIDRSelector(CIDRRule{CIDR: c}, true)
		if err != nil {
			return e, err
		}
		e.cidrs = append(e.cidrs, cs)
	}
	for _, c := range cidrSet {
		cs, err := newCIDRSelector(c, false)
		if err != nil {
			return e, err
		}
		e.cidrs = append(e.cidrs, cs)
	}
	e.icmp = len(pr.ICMPs) > 0
	e.anyPort = len(pr.ToPorts) == 0 && !e.icmp
	for _, tp := range pr.ToPorts {
		if len(tp.Ports) == 0 {
			e.otherPorts = true
		}
		for _, p := range tp.Ports {
			rs, ok := portRanges(p)
			if !ok {
				e.otherPorts = true
				continue
			}
			e.ports = append(e.ports, rs...)
		}
	}
	return e, nil
}

// peerSelector adds what Cilium adds to a peer selector
// (utils.getEndpointSelector): nothing to a reserved one; the policy's
// namespace unless the selector names a namespace (or, namespaced, a
// namespace label); for a cluster-wide policy that names none, that the
// peer has a namespace at all; and the local cluster unless it names one.
func peerSelector(s selector, ns string, matchesInit bool) selector {
	if s.hasKeyPrefix(SourceReserved + ":") {
		return s
	}
	if !s.hasKey(k8sNamespace) && !s.hasKey(anyNamespace) {
		if ns == "" {
			if !matchesInit {
				s.add(k8sNamespace, "Exists", nil)
			}
		} else if !s.hasKeyPrefix(SourceK8s+":"+LabelNamespaceLabels) && !s.hasKeyPrefix(SourceAny+":"+LabelNamespaceLabels) {
			s.add(k8sNamespace, "In", []string{ns})
		}
	}
	if !s.hasKey(k8sCluster) && !s.hasKey(anyCluster) {
		s.add(k8sCluster, opCluster, nil)
	}
	return s
}

func portRanges(p Port) ([]portRange, bool) {
	var protos []uint8
	switch strings.ToUpper(p.Protocol) {
	case "", "ANY":
		protos = []uint8{ProtoTCP, ProtoUDP, ProtoSCTP}
	case "TCP":
		protos = []uint8{ProtoTCP}
	case "UDP":
		protos = []uint8{ProtoUDP}
	case "SCTP":
		protos = []uint8{ProtoSCTP}
	default:
		return nil, false
	}
	from, to := uint16(0), uint16(65535)
	if p.Port != "" && p.Port != "0" {
		n, err := strconv.ParseUint(p.Port, 10, 16)
		if err != nil {
			return nil, false // a named port: the pod's container ports decide
		}
		from, to = uint16(n), uint16(n)
		if p.EndPort > int32(n) && p.EndPort <= 65535 {
			to = uint16(p.EndPort)
		}
	}
	out := make([]portRange, 0, len(protos))
	for _, pr := range protos {
		out = append(out, portRange{proto: pr, from: from, to: to})
	}
	return out, true
}

// Verdict is what one policy alone makes of a packet.
type Verdict uint8

const (
	// Allowed: the policy does not deny the packet (it does not select
	// the endpoint in that direction, or allows the peer).
	Allowed Verdict = iota
	// Denied: it selects the endpoint in that direction and allows none
	// of the peer on that port, or a deny rule of it matches.
	Denied
	// Undecided: it has a rule zonewatch does not evaluate that could
	// decide.
	Undecided
)

// Flow is the packet of a drop: the denying endpoint (the subject: the
// destination of an ingress drop, the source of an egress one), the peer,
// and the destination port and protocol.
type Flow struct {
	Egress  bool
	Subject Labels
	Peer    Labels
	Proto   uint8
	Port    uint16
	// Cluster is the local cluster's name; empty: the subject's cluster
	// label, else DefaultCluster.
	Cluster string
}

func (f *Flow) cluster() string {
	if f.Cluster != "" {
		return f.Cluster
	}
	if v, ok := f.Subject.lookup(SourceK8s, LabelCluster); ok {
		return v
	}
	return DefaultCluster
}

// Verdict evaluates the policy alone on f.
func (p *Policy) Verdict(f *Flow) Verdict {
	dir := 0
	if f.Egress {
		dir = 1
	}
	if dir == 0 && f.Peer.reserved("host") {
		// Cilium allows the local host into its endpoints
		// (AlwaysAllowLocalhost, the default in Kubernetes).
		return Allowed
	}
	subjectHost := f.Subject.reserved("host")
	cluster := f.cluster()
	enforced, undecided := false, false
	var allows []*entry
	for i := range p.rules {
		r := &p.rules[i]
		if r.node || subjectHost {
			// Host policies (nodeSelector) select by the node's labels,
			// which zonewatch does not read; endpoint selectors never
			// select the host.
			undecided = undecided || (r.node && subjectHost)
			continue
		}
		if !r.subject.matches(f.Subject, cluster) {
			continue
		}
		for j := range r.deny[dir] {
			switch r.deny[dir][j].match(f, cluster) {
			case matchYes:
				return Denied
			case matchMaybe:
				undecided = true
			}
		}
		if len(r.allow[dir])+len(r.deny[dir]) > 0 && r.defaultDeny[dir] {
			enforced = true
		}
		for j := range r.allow[dir] {
			allows = append(allows, &r.allow[dir][j])
		}
	}
	if !enforced {
		if undecided {
			return Undecided
		}
		return Allowed
	}
	for _, e := range allows {
		switch e.match(f, cluster) {
		case matchYes:
			return Allowed
		case matchMaybe:
			undecided = true
		}
	}
	if undecided {
		return Undecided
	}
	return Denied
}

type match uint8

const (
	matchNo match = iota
	matchYes
	matchMaybe
)

func (e *entry) match(f *Flow, cluster string) match {
	if e.none {
		return matchNo
	}
	peer := matchNo
	switch {
	case e.all:
		peer = matchYes
	case !e.hasL3():
		// No L3 part: every peer on the entry's ports; nobody without.
		if !e.anyPort {
			peer = matchYes
		}
	default:
		peer = e.matchPeer(f.Peer, cluster)
	}
	port := matchNo
	if e.anyPort {
		port = matchYes
	}
	for _, r := range e.ports {
		if r.proto == f.Proto && f.Port >= r.from && f.Port <= r.to {
			port = matchYes
			break
		}
	}
	if port == matchNo && (e.otherPorts || (e.icmp && (f.Proto == ProtoICMP || f.Proto == ProtoICMPv6))) {
		port = matchMaybe
	}
	switch {
	case peer == matchNo || port == matchNo:
		return matchNo
	case peer == matchYes && port == matchYes:
		return matchYes
	}
	return matchMaybe
}

// matchPeer: any of the entry's selectors selects the peer's identity.
func (e *entry) matchPeer(peer Labels, cluster string) match {
	for i := range e.peers {
		if e.peers[i].matches(peer, cluster) {
			return matchYes
		}
	}
	for _, name := range e.fqdns {
		if _, ok := peer.lookup(SourceFQDN, name); ok {
			return matchYes
		}
	}
	out := matchNo
	if e.otherPeers {
		out = matchMaybe
	}
	for i := range e.cidrs {
		switch e.cidrs[i].match(peer) {
		case matchYes:
			return matchYes
		case matchMaybe:
			out = matchMaybe
		}
	}
	return out
}
