package hubblepeer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive/hivetest"

	"github.com/cilium/cilium/pkg/identity"
	"github.com/cilium/cilium/pkg/identity/identitymanager"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	"github.com/cilium/cilium/pkg/labels"
	"github.com/cilium/cilium/pkg/policy"
	"github.com/cilium/cilium/pkg/policy/api"
	policytypes "github.com/cilium/cilium/pkg/policy/types"
	policyutils "github.com/cilium/cilium/pkg/policy/utils"
	testidentity "github.com/cilium/cilium/pkg/testutils/identity"
	testpolicy "github.com/cilium/cilium/pkg/testutils/policy"
	"github.com/cilium/cilium/pkg/u8proto"

	"github.com/zonewatch/zonewatch/collector/fence"
)

// The differential test of collector/fence: on generated policies and
// endpoints, each policy alone is given to Cilium v1.20.2's own policy
// repository (pkg/policy: the rules parsed by the CRD types' Parse, the
// selector cache, the distilled endpoint policy, LookupFlow), and
// fence.Policy.Verdict must say Denied exactly where Cilium denies.

const fenceCluster = "zwlab"

// fenceIdentity is one generated identity: Cilium's and fence's forms of
// the same labels.
type fenceIdentity struct {
	id  *identity.Identity
	own fence.Labels
}

func podIdentity(nid identity.NumericIdentity, ns string, kv map[string]string) fenceIdentity {
	m := map[string]string{
		"k8s:" + fence.LabelNamespace:                                       ns,
		"k8s:" + fence.LabelCluster:                                         fenceCluster,
		"k8s:io.cilium.k8s.policy.serviceaccount":                           "default",
		"k8s:" + fence.LabelNamespaceLabels + "team":                        "team-" + ns,
		"k8s:" + fence.LabelNamespaceLabels + "kubernetes.io/metadata.name": ns,
	}
	for k, v := range kv {
		m["k8s:"+k] = v
	}
	var la labels.LabelArray
	for k, v := range m {
		src, key, _ := strings.Cut(k, ":")
		la = append(la, labels.NewLabel(key, v, src))
	}
	return fenceIdentity{id: identity.NewIdentityFromLabelArray(nid, la.Sort()), own: fence.ParseLabels(m)}
}

func reservedIdentity(t *testing.T, nid identity.NumericIdentity) fenceIdentity {
	t.Helper()
	id := identity.LookupReservedIdentity(nid)
	if id == nil {
		t.Fatalf("Cilium has no reserved identity %d", nid)
	}
	own, ok := fence.ReservedLabels(uint32(nid))
	if !ok {
		t.Fatalf("fence has no reserved identity %d", nid)
	}
	// fence's labels of a reserved identity are Cilium's.
	var theirs []string
	for _, l := range id.LabelArray {
		theirs = append(theirs, l.Source+":"+l.Key+"="+l.Value)
	}
	var mine []string
	for _, l := range own {
		mine = append(mine, l.Source+":"+l.Key+"="+l.Value)
	}
	slices.Sort(theirs)
	if !slices.Equal(theirs, mine) {
		t.Errorf("reserved identity %d: Cilium's labels %v, fence's %v", nid, theirs, mine)
	}
	return fenceIdentity{id: id, own: own}
}

// outsideIdentity is a local-scope identity of addresses outside the
// cluster, with the labels Cilium gives it: a CIDR's (GetCIDRLabelArray:
// its cidr label and its family's world label) or an FQDN's.
func outsideIdentity(nid identity.NumericIdentity, la labels.LabelArray) fenceIdentity {
	var strs []string
	for _, l := range la {
		s := l.Source + ":" + l.Key
		if l.Value != "" {
			s += "=" + l.Value
		}
		strs = append(strs, s)
	}
	return fenceIdentity{id: identity.NewIdentityFromLabelArray(nid, la.Sort()), own: fence.ParseLabelStrings(strs)}
}

func outsideIdentities() []fenceIdentity {
	var out []fenceIdentity
	nid := identity.IdentityScopeLocal
	for _, c := range []string{"10.1.2.0/24", "10.9.0.7/32", "192.168.1.7/32", "8.8.8.0/24", "2001:db8::/64"} {
		nid++
		out = append(out, outsideIdentity(nid, labels.GetCIDRLabelArray(netip.MustParsePrefix(c))))
	}
	for _, name := range []string{"api.example.com", "*.example.com"} {
		nid++
		out = append(out, outsideIdentity(nid, labels.LabelArray{labels.NewLabel(name, "", labels.LabelSourceFQDN), labels.WorldLabelV4}))
	}
	return out
}

// policyGen generates policies over a small vocabulary so that selectors
// often match.
type policyGen struct{ r *rand.Rand }

var (
	genKeys   = []string{"app", "zone", "role"}
	genValues = map[string][]string{"app": {"a", "b"}, "zone": {"z1", "z2", "z3"}, "role": {"m", "w"}}
	genNS     = []string{"ns1", "ns2"}
)

func (g policyGen) pick(list []string) string { return list[g.r.IntN(len(list))] }

// key writes a label key as users do: bare, "k8s:" or "any:".
func (g policyGen) key(k string) string {
	switch g.r.IntN(4) {
	case 0:
		return "k8s:" + k
	case 1:
		return "any:" + k
	}
	return k
}

func (g policyGen) selector(peer bool) map[string]any {
	s := map[string]any{}
	if g.r.IntN(4) == 0 {
		return s // {}
	}
	ml := map[string]string{}
	var me []map[string]any
	// "zone" and "any:zone" are one key to Cilium (Sanitize): which of
	// two such matchLabels entries it keeps depends on map order, so a
	// selector names each key once.
	used := map[string]bool{}
	for range 1 + g.r.IntN(2) {
		k := g.pick(genKeys)
		switch g.r.IntN(5) {
		case 0, 1:
			if !used[k] {
				used[k] = true
				ml[g.key(k)] = g.pick(genValues[k])
			}
		case 2:
			vs := []string{g.pick(genValues[k])}
			if g.r.IntN(2) == 0 {
				vs = append(vs, g.pick(genValues[k]))
			}
			me = append(me, map[string]any{"key": g.key(k), "operator": g.pick([]string{"In", "NotIn"}), "values": slices.Compact(slices.Sorted(slices.Values(vs)))})
		case 3:
			me = append(me, map[string]any{"key": g.key(k), "operator": g.pick([]string{"Exists", "DoesNotExist"})})
		case 4:
			if peer {
				// a namespace or a namespace label, as written in policies
				switch g.r.IntN(3) {
				case 0:
					ml["k8s:"+fence.LabelNamespace] = g.pick(genNS)
				case 1:
					ml[fence.LabelNamespace] = g.pick(genNS) // bare: Cilium still adds the policy's
				case 2:
					ml["k8s:"+fence.LabelNamespaceLabels+"team"] = "team-" + g.pick(genNS)
				}
			} else if !used[k] {
				used[k] = true
				ml[g.key(k)] = g.pick(genValues[k])
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

var (
	genEntities = []string{"all", "world", "cluster", "host", "remote-node", "kube-apiserver", "health", "unmanaged",
		"ingress", "world-ipv4", "cluster-mesh", "init"}
	genCIDRs = []string{"10.0.0.0/8", "10.1.2.0/24", "192.168.1.7", "192.168.0.0/16", "0.0.0.0/0", "::/0", "2001:db8::/32"}
)

// cidrRule is a CIDRSet entry, sometimes one Cilium refuses (an except
// outside its CIDR, a bare address) or one of a CIDR group.
func (g policyGen) cidrRule() map[string]any {
	switch g.r.IntN(12) {
	case 0:
		return map[string]any{"cidrGroupRef": "office"}
	case 1:
		return map[string]any{"cidr": "10.0.0.0/8", "except": []string{"192.168.0.0/16"}}
	case 2:
		return map[string]any{"cidr": "192.168.1.7"}
	}
	c := map[string]any{"cidr": g.pick([]string{"10.0.0.0/8", "192.168.0.0/16", "0.0.0.0/0", "2001:db8::/32"})}
	if g.r.IntN(2) == 0 {
		c["except"] = map[string][]string{"10.0.0.0/8": {"10.9.0.0/16"}, "192.168.0.0/16": {"192.168.1.0/24"},
			"0.0.0.0/0": {"10.0.0.0/8", "8.8.8.8/32"}, "2001:db8::/32": {"2001:db8::/64"}}[c["cidr"].(string)]
	}
	return c
}

// entry generates an ingress or egress entry; cidr: it has a CIDR-style,
// entity, FQDN, node, service or requires peer.
func (g policyGen) entry(egress bool) (e map[string]any, cidr bool) {
	e = map[string]any{}
	from := func(f string) string {
		if egress {
			return "to" + f
		}
		return "from" + f
	}
	eps := from("Endpoints")
	switch g.r.IntN(12) {
	case 0, 1, 2:
		var sels []any
		for range 1 + g.r.IntN(2) {
			sels = append(sels, g.selector(true))
		}
		e[eps] = sels
	case 3:
		var es []string
		for range 1 + g.r.IntN(2) {
			es = append(es, g.pick(genEntities))
		}
		if g.r.IntN(20) == 0 {
			es = append(es, "galaxy") // refused
		}
		e[from("Entities")] = es
		cidr = true
	case 4:
		if g.r.IntN(3) == 0 {
			e[eps] = []any{} // explicitly nobody
		}
		// else no L3 part: ports alone, or {} (nobody)
	case 5:
		e[eps] = []any{map[string]any{}}
	case 6:
		var cs []string
		for range 1 + g.r.IntN(2) {
			cs = append(cs, g.pick(genCIDRs))
		}
		if g.r.IntN(15) == 0 {
			cs = []string{"10.0.0.0/33"} // refused
		}
		e[from("CIDR")] = cs
		cidr = true
	case 7:
		var cs []any
		for range 1 + g.r.IntN(2) {
			cs = append(cs, g.cidrRule())
		}
		e[from("CIDRSet")] = cs
		cidr = true
	case 8:
		if egress {
			fq := map[string]any{"matchName": "api.example.com"}
			if g.r.IntN(2) == 0 {
				fq = map[string]any{"matchPattern": "*.example.com"}
			}
			e["toFQDNs"] = []any{fq}
		} else {
			e[from("CIDR")] = []string{g.pick(genCIDRs)}
		}
		cidr = true
	case 9:
		if g.r.IntN(4) == 0 {
			e[from("Nodes")] = []any{g.selector(false)} // refused: node selector labels are off
		} else {
			e[from("Requires")] = []string{"k8s:zone=" + g.pick(genValues["zone"])}
		}
		cidr = true
	case 10:
		if egress {
			e["toServices"] = []any{map[string]any{"k8sService": map[string]any{"serviceName": "db", "namespace": g.pick(genNS)}}}
		} else {
			e[from("CIDR")] = []string{"10.0.0.0/8"}
			if g.r.IntN(4) == 0 {
				e[eps] = []any{g.selector(true)} // two kinds of peers in one entry: refused
			}
		}
		cidr = true
	case 11:
		e[eps] = []any{g.selector(true)}
		if g.r.IntN(4) == 0 {
			e[from("Requires")] = []string{"k8s:role=m"} // no effect in v1.20
			cidr = true
		}
	}
	if g.r.IntN(2) == 0 {
		var ports []any
		for range 1 + g.r.IntN(2) {
			p := map[string]any{}
			switch g.r.IntN(4) {
			case 0:
				p["port"] = "80"
			case 1:
				p["port"], p["endPort"] = "8080", 8090
			case 2:
				p["port"] = "29500"
			case 3:
				p["port"] = "0"
			}
			if proto := g.pick([]string{"", "TCP", "UDP", "ANY"}); proto != "" {
				p["protocol"] = proto
			}
			ports = append(ports, p)
		}
		e["toPorts"] = []any{map[string]any{"ports": ports}}
	}
	return e, cidr
}

// rule generates a rule; cidr counts its entries with a CIDR-style,
// entity, FQDN, node, service or requires peer.
func (g policyGen) rule() (r map[string]any, cidr int) {
	r = map[string]any{"endpointSelector": g.selector(false)}
	for _, dir := range []string{"ingress", "ingressDeny", "egress", "egressDeny"} {
		n := 0
		switch {
		case dir == "ingress" || dir == "egress":
			n = g.r.IntN(3)
		case g.r.IntN(4) == 0:
			n = 1
		}
		var list []any
		for range n {
			e, c := g.entry(strings.HasPrefix(dir, "egress"))
			if c {
				cidr++
			}
			list = append(list, e)
		}
		if n > 0 {
			r[dir] = list
		}
	}
	if g.r.IntN(6) == 0 {
		r["enableDefaultDeny"] = map[string]any{g.pick([]string{"ingress", "egress"}): false}
	}
	return r, cidr
}

func (g policyGen) policy(i int) (data []byte, ccnp bool, cidr int) {
	o := map[string]any{"apiVersion": "cilium.io/v2"}
	ccnp = g.r.IntN(3) == 0
	md := map[string]any{"name": fmt.Sprintf("p%d", i)}
	if ccnp {
		o["kind"] = "CiliumClusterwideNetworkPolicy"
	} else {
		o["kind"] = "CiliumNetworkPolicy"
		md["namespace"] = g.pick(genNS)
	}
	o["metadata"] = md
	if g.r.IntN(4) == 0 {
		r1, c1 := g.rule()
		r2, c2 := g.rule()
		o["specs"], cidr = []any{r1, r2}, c1+c2
	} else {
		o["spec"], cidr = g.rule()
	}
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	return b, ccnp, cidr
}

// ciliumRepo is Cilium's policy repository holding one policy.
func ciliumRepo(t *testing.T, ids []fenceIdentity, data []byte, ccnp bool) (*policy.Repository, identitymanager.IDManager, error) {
	t.Helper()
	logger := hivetest.Logger(t)
	var rules api.Rules
	var err error
	if ccnp {
		var p ciliumv2.CiliumClusterwideNetworkPolicy
		if err := json.Unmarshal(data, &p); err != nil {
			return nil, nil, err
		}
		rules, err = p.Parse(logger, fenceCluster)
	} else {
		var p ciliumv2.CiliumNetworkPolicy
		if err := json.Unmarshal(data, &p); err != nil {
			return nil, nil, err
		}
		rules, err = p.Parse(logger, fenceCluster)
	}
	if err != nil {
		return nil, nil, err
	}
	repo, idm := ciliumRepoOf(t, ids, policyutils.RulesToPolicyEntries(rules))
	return repo, idm, nil
}

// ciliumRepoOf is Cilium's policy repository holding the entries of one
// policy.
func ciliumRepoOf(t *testing.T, ids []fenceIdentity, entries policytypes.PolicyEntries) (*policy.Repository, identitymanager.IDManager) {
	t.Helper()
	logger := hivetest.Logger(t)
	idmap := identity.IdentityMap{}
	for _, id := range ids {
		idmap[id.id.ID] = id.id.LabelArray
	}
	idManager := identitymanager.NewIDManager(logger)
	repo := policy.NewPolicyRepository(logger, idmap, nil, nil, idManager, testpolicy.NewPolicyMetricsNoop())
	repo.GetSelectorCache().SetLocalIdentityNotifier(testidentity.NewDummyIdentityNotifier())
	idManager.Subscribe(testpolicy.SelectorCacheObserver{Cache: repo.GetSubjectSelectorCache()})
	repo.MustAddPolicyEntries(entries)
	return repo, idManager
}

// TestFenceAgreesWithCilium: fence's verdict of each generated policy
// alone on each generated flow is Cilium's.
func TestFenceAgreesWithCilium(t *testing.T) {
	api.InitEntities(fenceCluster)
	g := policyGen{r: rand.New(rand.NewPCG(32, 4))}
	var pods []fenceIdentity
	nid := identity.NumericIdentity(1000)
	for _, ns := range genNS {
		for range 6 {
			kv := map[string]string{}
			for _, k := range genKeys {
				if g.r.IntN(4) != 0 {
					kv[k] = g.pick(genValues[k])
				}
			}
			nid++
			pods = append(pods, podIdentity(nid, ns, kv))
		}
	}
	var reserved []fenceIdentity
	for _, id := range []identity.NumericIdentity{fence.IdentityHost, fence.IdentityWorld, fence.IdentityUnmanaged, fence.IdentityHealth,
		fence.IdentityRemoteNode, fence.IdentityKubeAPIServer, fence.IdentityIngress, fence.IdentityWorldIPv4, fence.IdentityWorldIPv6} {
		reserved = append(reserved, reservedIdentity(t, id))
	}
	all := append(append(slices.Clone(pods), reserved...), outsideIdentities()...)
	type probe struct {
		egress        bool
		subject, peer fenceIdentity
		proto         u8proto.U8proto
		port          uint16
	}
	var probes []probe
	for range 60 {
		pr := probe{egress: g.r.IntN(2) == 0, subject: pods[g.r.IntN(len(pods))], proto: u8proto.TCP,
			port: []uint16{80, 8085, 29500, 443}[g.r.IntN(4)]}
		if g.r.IntN(4) == 0 {
			pr.proto = u8proto.UDP
		}
		pr.peer = all[g.r.IntN(len(all))]
		if !pr.egress && pr.peer.id.ID == fence.IdentityHost {
			pr.peer = pods[g.r.IntN(len(pods))] // Cilium allows the host in (allow-localhost)
		}
		probes = append(probes, pr)
	}
	// Cilium's policies, then Kubernetes NetworkPolicies through Cilium's
	// own translation, as many of each.
	const policies = 250
	var compared, denied, rejected, disagree, netpols, cidrRules, undecided, refusedNamed int
	// outside: verdicts on CIDR and FQDN identities, allowed by Cilium
	outside, outsideAllowed, rejectedNetpol := 0, 0, 0
	set := fence.NewSet()
	// named: fence reads a policy and names it for a generated flow.
	named := func(own *fence.Policy) bool {
		for _, pr := range probes {
			if own.Verdict(&fence.Flow{Egress: pr.egress, Subject: pr.subject.own, Peer: pr.peer.own, Proto: uint8(pr.proto), Port: pr.port}) == fence.Denied {
				return true
			}
		}
		return false
	}
	for i := range 2 * policies {
		var data []byte
		var repo *policy.Repository
		var idm identitymanager.IDManager
		var own *fence.Policy
		var err error
		var cidr int
		var ciliumErr error
		if i < policies {
			var ccnp bool
			data, ccnp, cidr = g.policy(i)
			repo, idm, ciliumErr = ciliumRepo(t, all, data, ccnp)
			own, err = fence.Parse(data)
		} else {
			data, cidr = g.netpol(i)
			netpols++
			var entries policytypes.PolicyEntries
			if entries, ciliumErr = ciliumNetpolEntries(t, data); ciliumErr == nil {
				repo, idm = ciliumRepoOf(t, all, entries)
			}
			own, err = fence.ParseNetworkPolicy(data)
		}
		if ciliumErr != nil {
			// Cilium refuses it (Sanitize, its NetworkPolicy
			// translation): fence must refuse it too.
			rejected++
			if i >= policies {
				rejectedNetpol++
			}
			if err == nil {
				t.Errorf("fence reads a policy Cilium refuses (%v):\n%s", ciliumErr, data)
				if named(own) {
					refusedNamed++
				}
			}
			continue
		}
		if err != nil {
			t.Fatalf("fence refuses a policy Cilium takes: %v\n%s", err, data)
		}
		cidrRules += cidr
		set.Put(own)
		for _, pr := range probes {
			f := policytypes.Flow{From: pr.peer.id, To: pr.subject.id, Proto: pr.proto, Dport: pr.port}
			if pr.egress {
				f.From, f.To = pr.subject.id, pr.peer.id
			}
			v, _, _, err := policy.LookupFlow(hivetest.Logger(t), repo, idm, f)
			if err != nil {
				t.Fatal(err)
			}
			theirs := v.Ingress
			if pr.egress {
				theirs = v.Egress
			}
			ciliumDenied := theirs == policytypes.DecisionDenied
			mine := own.Verdict(&fence.Flow{Egress: pr.egress, Subject: pr.subject.own, Peer: pr.peer.own, Proto: uint8(pr.proto), Port: pr.port})
			compared++
			if ciliumDenied {
				denied++
			}
			if pr.peer.id.ID.HasLocalScope() {
				outside++
				if !ciliumDenied {
					outsideAllowed++
				}
			}
			if mine == fence.Undecided {
				// Only what zonewatch cannot see leaves a verdict
				// undecided (never named): the cluster's Services, CIDR
				// groups, a named port's pods, the address family of
				// reserved:world for a zero-length CIDR.
				if !undecidable(data, pr.peer.id.ID) {
					t.Errorf("policy %s: undecided for peer %v", data, pr.peer.id.LabelArray)
				}
				undecided++
				continue
			}
			if (mine == fence.Denied) != ciliumDenied {
				disagree++
				dir := "ingress"
				if pr.egress {
					dir = "egress"
				}
				t.Errorf("%s %s/%d, subject %v, peer %v: Cilium denied=%v, fence %v\npolicy %s",
					dir, pr.proto, pr.port, pr.subject.id.LabelArray, pr.peer.id.LabelArray, ciliumDenied, mine, data)
			}
		}
		if t.Failed() && i > 20 {
			break
		}
	}
	if denied == 0 || denied == compared {
		t.Fatalf("the generator is useless: %d of %d flows denied", denied, compared)
	}
	t.Logf("%d policies (%d Kubernetes NetworkPolicies; %d refused by Cilium, %d of them NetworkPolicies, each refused by fence), %d flows each: %d verdicts compared, %d denied by Cilium, %d undecided (never named), %d disagreements; %d verdicts on CIDR and FQDN identities, %d of them allowed",
		2*policies, netpols, rejected, rejectedNetpol, len(probes), compared, denied, undecided, disagree, outside, outsideAllowed)
	// cidr_rules: rules of the compared policies with a CIDR-style,
	// entity, FQDN, node, service or requires peer (a NetworkPolicy's
	// ipBlock); refused_named: policies Cilium refuses that fence reads
	// and names for a generated flow.
	t.Logf("fence-agreement: policies=%d netpol=%d cidr_rules=%d refused=%d refused_named=%d verdicts=%d disagreements=%d",
		2*policies, netpols, cidrRules, rejected, refusedNamed, compared, disagree)
}

// undecidable: the policy has a peer or port whose answer depends on what
// zonewatch cannot see for this peer: Services, CIDR groups, named ports,
// ICMP types, or a zero-length CIDR with reserved:world (whose label is
// "world" or "world-ipv4" by the cluster's address families).
func undecidable(data []byte, peer identity.NumericIdentity) bool {
	d := string(data)
	for _, s := range []string{"toServices", "cidrGroupRef", `"http"`, "icmps"} {
		if strings.Contains(d, s) {
			return true
		}
	}
	return peer == fence.IdentityWorld && (strings.Contains(d, `"0.0.0.0/0"`) || strings.Contains(d, `"::/0"`))
}
