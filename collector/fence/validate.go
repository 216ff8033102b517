package fence

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// sanitizeRule refuses a rule as Cilium v1.20's Rule.Sanitize does with
// the agent's default configuration (--enable-node-selector-labels off,
// --enable-icmp-rules and --enable-l7-proxy on, extended IP protocols
// off), so that a policy Cilium does not enforce is never named.
func sanitizeRule(r *Rule) error {
	if len(r.Ingress) == 0 && len(r.IngressDeny) == 0 && len(r.Egress) == 0 && len(r.EgressDeny) == 0 {
		return errors.New("rule must have at least one of ingress, ingressDeny, egress, egressDeny")
	}
	switch {
	case r.EndpointSelector == nil && r.NodeSelector == nil:
		return errors.New("rule must have one of endpointSelector or nodeSelector")
	case r.EndpointSelector != nil && r.NodeSelector != nil:
		return errors.New("rule cannot have both endpointSelector and nodeSelector")
	}
	host := r.NodeSelector != nil
	for dir, lists := range [2][2][]PeerRule{{r.Ingress, r.IngressDeny}, {r.Egress, r.EgressDeny}} {
		for kind, list := range lists {
			for i := range list {
				if err := sanitizeEntry(&list[i], dir == 1, kind == 1, host); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func sanitizeEntry(pr *PeerRule, egress, deny, host bool) error {
	type member struct {
		name string
		n    int
	}
	l3 := []member{{"fromEndpoints", len(pr.FromEndpoints)}, {"fromCIDR", len(pr.FromCIDR)}, {"fromCIDRSet", len(pr.FromCIDRSet)},
		{"fromEntities", len(pr.FromEntities)}, {"fromNodes", len(pr.FromNodes)}, {"fromGroups", len(pr.FromGroups)}}
	entities, nodes := pr.FromEntities, len(pr.FromNodes)
	if egress {
		l3 = []member{{"toEndpoints", len(pr.ToEndpoints)}, {"toCIDR", len(pr.ToCIDR)}, {"toCIDRSet", len(pr.ToCIDRSet)},
			{"toEntities", len(pr.ToEntities)}, {"toServices", len(pr.ToServices)}, {"toGroups", len(pr.ToGroups)}, {"toNodes", len(pr.ToNodes)}}
		if !deny {
			l3 = append(l3, member{"toFQDNs", len(pr.ToFQDNs)})
		}
		entities, nodes = pr.ToEntities, len(pr.ToNodes)
	}
	var set []string
	for _, m := range l3 {
		if m.n > 0 {
			set = append(set, m.name)
		}
	}
	if len(set) > 1 {
		return fmt.Errorf("combining %s and %s is not supported", set[0], set[1])
	}
	if nodes > 0 {
		return errors.New("fromNodes/toNodes need --enable-node-selector-labels (off by default)")
	}
	for _, ent := range entities {
		if !knownEntity(ent) {
			return fmt.Errorf("unsupported entity: %s", ent)
		}
	}
	if egress && !deny {
		for _, f := range pr.ToFQDNs {
			if err := f.sanitize(); err != nil {
				return err
			}
		}
	}
	if len(pr.ICMPs) > 0 && len(pr.ToPorts) > 0 {
		return errors.New("icmps may only be present without toPorts")
	}
	for _, ic := range pr.ICMPs {
		if len(ic.Fields) > 40 {
			return errors.New("too many ICMP types, the max is 40")
		}
		for _, f := range ic.Fields {
			if f.Family != "" && f.Family != "IPv4" && f.Family != "IPv6" {
				return fmt.Errorf("wrong ICMP family: %s", f.Family)
			}
		}
	}
	for i := range pr.ToPorts {
		if err := pr.ToPorts[i].sanitize(!egress, deny, host); err != nil {
			return err
		}
	}
	return nil
}

// sanitize is PortRule.sanitize (PortDenyRule's for a deny entry, which
// has no L7 rules).
func (pr *PortRule) sanitize(ingress, deny, host bool) error {
	if len(pr.Ports) > 40 {
		return errors.New("too many ports, the max is 40")
	}
	l7 := !deny && !pr.Rules.empty()
	dns := l7 && len(pr.Rules.DNS) > 0
	zero := false
	for _, p := range pr.Ports {
		z, err := p.sanitize(dns)
		if err != nil {
			return err
		}
		zero = zero || z
		if l7 && !dns && strings.ToUpper(p.Protocol) != "TCP" {
			return fmt.Errorf("L7 rules can only apply to TCP (not %q) except for DNS rules", p.Protocol)
		}
	}
	if !l7 {
		return nil
	}
	switch {
	case ingress && dns:
		return errors.New("DNS rules are not allowed on ingress")
	case host && (ingress || len(pr.Rules.HTTP) > 0):
		return errors.New("L7 rules are not supported on host policies")
	case zero:
		return errors.New("L7 rules can not be used when a port is 0")
	case pr.Rules.DNS != nil && len(pr.Ports) == 0:
		return errors.New("port 53 must be specified for DNS rules")
	}
	types := 0
	for _, set := range []bool{pr.Rules.HTTP != nil, pr.Rules.DNS != nil} {
		if set {
			types++
		}
	}
	if types > 1 {
		return errors.New("multiple L7 protocol rule types specified in a single rule")
	}
	return nil
}

// sanitize is PortProtocol.sanitize: a port is required, an IANA service
// name or a number; the protocol one Cilium knows.
func (p Port) sanitize(dns bool) (zero bool, err error) {
	if p.Port == "" {
		return false, errors.New("port must be specified")
	}
	proto := strings.ToUpper(p.Protocol)
	switch proto {
	case "", "ANY", "TCP", "UDP", "SCTP", "ICMP", "ICMPV6":
	case "VRRP", "IGMP", "GRE", "IPIP", "IPV6", "ESP", "AH":
		if p.Port != "0" && !isSvcName(p.Port) {
			return false, errors.New("port must be empty or 0")
		}
	default:
		return false, fmt.Errorf("invalid protocol %q", p.Protocol)
	}
	if isSvcName(p.Port) {
		return false, nil
	}
	n, err := strconv.ParseUint(p.Port, 0, 16)
	if err != nil {
		return false, fmt.Errorf("unable to parse port %q: %w", p.Port, err)
	}
	if dns && p.EndPort > int32(n) {
		return false, errors.New("DNS rules do not support port ranges")
	}
	return n == 0, nil
}

// isSvcName: an IANA service name (RFC 6335 5.1, pkg/iana): 1 to 15
// letters, digits and single inner hyphens, at least one letter.
func isSvcName(s string) bool {
	if len(s) == 0 || len(s) > 15 || s[0] == '-' || s[len(s)-1] == '-' || strings.Contains(s, "--") {
		return false
	}
	letter := false
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letter = true
		case c >= '0' && c <= '9', c == '-':
		default:
			return false
		}
	}
	return letter
}

var fqdnName = regexp.MustCompile(`^[-a-zA-Z0-9_.]+$`)
var fqdnPattern = regexp.MustCompile(`^[-a-zA-Z0-9_.*]+$`)

func (s FQDNSelector) sanitize() error {
	switch {
	case s.MatchName != "" && s.MatchPattern != "":
		return errors.New("only one of matchName or matchPattern is allowed in an FQDN selector")
	case s.MatchName != "" && !fqdnName.MatchString(s.MatchName):
		return fmt.Errorf("invalid characters in matchName %q", s.MatchName)
	case s.MatchPattern != "" && !fqdnPattern.MatchString(s.MatchPattern):
		return fmt.Errorf("invalid characters in matchPattern %q", s.MatchPattern)
	}
	return nil
}

// knownEntity: an entity of Cilium v1.20's EntitySelectorMapping.
func knownEntity(e string) bool {
	switch e {
	case "all", "world", "world-ipv4", "world-ipv6", "host", "init", "ingress", "remote-node", "health",
		"unmanaged", "none", "kube-apiserver", "cluster", "cluster-mesh":
		return true
	}
	return false
}
