package fence

import (
	"fmt"
	"net/netip"
	"strings"
)

// Label sources of the identities Cilium gives addresses outside the
// cluster (pkg/labels, v1.20).
const (
	SourceCIDR = "cidr"
	SourceFQDN = "fqdn"
)

// cidrSelector is a CIDR selector (fromCIDR, a CIDRSet entry, an ipBlock)
// as Cilium's types.CIDRSelector evaluates it on an identity's labels:
// the prefix's label must be present (cidr labels match by containment, a
// zero-length prefix is its family's world label) and no except's.
type cidrSelector struct {
	prefix netip.Prefix
	// group: a cidrGroupRef or cidrGroupSelector, whose CiliumCIDRGroups
	// zonewatch does not read.
	group  bool
	except []netip.Prefix
}

// newCIDRSelector reads a CIDR rule, refusing what Cilium's sanitize
// refuses; addr: a bare address is a full-length prefix (fromCIDR and
// toCIDR, not CIDRSet).
func newCIDRSelector(r CIDRRule, addr bool) (cidrSelector, error) {
	var c cidrSelector
	n := 0
	for _, set := range []bool{r.CIDR != "", r.CIDRGroupRef != "", r.CIDRGroupSelector != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return c, fmt.Errorf("a CIDR rule needs exactly one of cidr, cidrGroupRef and cidrGroupSelector")
	}
	if r.CIDR == "" {
		c.group = true
		if r.CIDRGroupSelector != nil {
			if _, err := newSelector(r.CIDRGroupSelector); err != nil {
				return c, fmt.Errorf("cidrGroupSelector: %w", err)
			}
		}
	} else {
		p, err := netip.ParsePrefix(r.CIDR)
		if err != nil {
			a, aerr := netip.ParseAddr(r.CIDR)
			if !addr || aerr != nil {
				return c, fmt.Errorf("CIDR %q: %w", r.CIDR, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		c.prefix = p.Masked()
	}
	for _, x := range r.Except {
		p, err := netip.ParsePrefix(x)
		if err != nil {
			return c, fmt.Errorf("except %q: %w", x, err)
		}
		if !c.group && (c.prefix.Bits() > p.Bits() || !c.prefix.Contains(p.Addr())) {
			return c, fmt.Errorf("CIDR %s does not contain except %s", r.CIDR, x)
		}
		c.except = append(c.except, p.Masked())
	}
	return c, nil
}

// cidrLabels are the prefixes of an identity's cidr labels (IPv6 written
// with '-' for ':').
func cidrLabels(ls Labels) []netip.Prefix {
	var out []netip.Prefix
	for _, l := range ls {
		if l.Source != SourceCIDR {
			continue
		}
		if p, err := netip.ParsePrefix(strings.ReplaceAll(l.Key, "-", ":")); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func containsAny(p netip.Prefix, in []netip.Prefix) bool {
	for _, q := range in {
		if p.Bits() <= q.Bits() && p.Contains(q.Addr()) {
			return true
		}
	}
	return false
}

// match evaluates the selector on a peer identity's labels. Cilium lets a
// CIDR selector select world identities, nodes only with
// --policy-cidr-match-mode=nodes and pods only with =pods; in those modes
// (only) the nodes' and pods' identities carry cidr labels, so an
// identity without world or cidr labels is never selected. What is left
// undecided: a zero-length prefix on reserved:world alone (its label is
// "world" or "world-ipv4" by the cluster's address families) and on a
// node or pod (the match modes' wildcard), and CIDR groups.
func (c *cidrSelector) match(peer Labels) match {
	w, w4, w6 := peer.reserved("world"), peer.reserved("world-ipv4"), peer.reserved("world-ipv6")
	world := w || w4 || w6
	cidrs := cidrLabels(peer)
	if !world && len(cidrs) == 0 {
		return matchNo
	}
	for _, x := range c.except {
		if x.Bits() == 0 {
			return matchMaybe
		}
		if containsAny(x, cidrs) {
			return matchNo
		}
	}
	switch {
	case c.group:
		return matchMaybe
	case c.prefix.Bits() > 0:
		if containsAny(c.prefix, cidrs) {
			return matchYes
		}
		return matchNo
	case !world:
		return matchMaybe
	}
	// A zero-length prefix selects its family's world label: "world-ipv4"
	// (or "-ipv6") where the other family is enabled, else "world", which
	// an identity carries in a single-stack cluster of that family.
	v4 := c.prefix.Addr().Is4()
	if v4 && w4 || !v4 && w6 {
		return matchYes
	}
	if !w {
		return matchNo
	}
	if len(cidrs) == 0 {
		return matchMaybe // reserved:world alone: which family is unknown
	}
	if cidrs[0].Addr().Is4() == v4 {
		return matchYes
	}
	return matchNo
}

// identityLabel is the fqdn label Cilium gives the identities of the
// addresses its DNS proxy saw resolved for the selector
// (api.FQDNSelector.IdentityLabel).
func (s FQDNSelector) identityLabel() string {
	if s.MatchName != "" {
		return s.MatchName
	}
	return s.MatchPattern
}
