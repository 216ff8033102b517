package hubblepeer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
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

var genEntities = []string{"all", "world", "cluster", "host", "remote-node", "kube-apiserver", "health", "unmanaged", "ingress", "world-ipv4"}

func (g policyGen) entry(egress bool) map[string]any {
	e := map[string]any{}
	eps, ents := "fromEndpoints", "fromEntities"
	if egress {
		eps, ents = "toEndpoints", "toEntities"
	}
	switch g.r.IntN(6) {
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
		e[ents] = es
	case 4:
		if g.r.IntN(3) == 0 {
			e[eps] = []any{} // explicitly nobody
		}
		// else no L3 part: ports alone, or {} (nobody)
	case 5:
		e[eps] = []any{map[string]any{}}
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
	return e
}

func (g policyGen) rule() map[string]any {
	r := map[string]any{"endpointSelector": g.selector(false)}
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
			list = append(list, g.entry(strings.HasPrefix(dir, "egress")))
		}
		if n > 0 {
			r[dir] = list
		}
	}
	if g.r.IntN(6) == 0 {
		r["enableDefaultDeny"] = map[string]any{g.pick([]string{"ingress", "egress"}): false}
	}
	return r
}

func (g policyGen) policy(i int) ([]byte, bool) {
	o := map[string]any{"apiVersion": "cilium.io/v2"}
	ccnp := g.r.IntN(3) == 0
	md := map[string]any{"name": fmt.Sprintf("p%d", i)}
	if ccnp {
		o["kind"] = "CiliumClusterwideNetworkPolicy"
	} else {
		o["kind"] = "CiliumNetworkPolicy"
		md["namespace"] = g.pick(genNS)
	}
	o["metadata"] = md
	if g.r.IntN(4) == 0 {
		o["specs"] = []any{g.rule(), g.rule()}
	} else {
		o["spec"] = g.rule()
	}
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	return b, ccnp
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
	all := append(slices.Clone(pods), reserved...)
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
	set := fence.NewSet()
	// namesAny: 1 when fence reads a policy Cilium refuses and would name
	// it for a generated flow (it would name a policy not enforced).
	namesAny := func(data []byte, netpol bool) int {
		var own *fence.Policy
		var err error
		if netpol {
			own, err = fence.ParseNetworkPolicy(data)
		} else {
			own, err = fence.Parse(data)
		}
		if err != nil {
			return 0
		}
		for _, pr := range probes {
			if own.Verdict(&fence.Flow{Egress: pr.egress, Subject: pr.subject.own, Peer: pr.peer.own, Proto: uint8(pr.proto), Port: pr.port}) == fence.Denied {
				return 1
			}
		}
		return 0
	}
	for i := range 2 * policies {
		var data []byte
		var repo *policy.Repository
		var idm identitymanager.IDManager
		var own *fence.Policy
		var err error
		if i < policies {
			var ccnp bool
			data, ccnp = g.policy(i)
			if repo, idm, err = ciliumRepo(t, all, data, ccnp); err != nil {
				rejected++ // Cilium refuses it (Sanitize): nothing to compare
				refusedNamed += namesAny(data, false)
				continue
			}
			own, err = fence.Parse(data)
		} else {
			var cidr int
			data, cidr = g.netpol(i)
			netpols++
			entries, perr := ciliumNetpolEntries(t, data)
			if perr != nil {
				rejected++
				refusedNamed += namesAny(data, true)
				continue
			}
			cidrRules += cidr
			repo, idm = ciliumRepoOf(t, all, entries)
			own, err = fence.ParseNetworkPolicy(data)
		}
		if err != nil {
			t.Fatalf("fence refuses a policy Cilium takes: %v\n%s", err, data)
		}
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
			if mine == fence.Undecided {
				// Only rules fence does not evaluate (an ipBlock, a named
				// port) leave a verdict undecided: never named.
				if i < policies || !strings.Contains(string(data), "ipBlock") && !strings.Contains(string(data), `"http"`) {
					t.Errorf("policy %s: undecided on a generated flow", data)
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
	t.Logf("%d policies (%d Kubernetes NetworkPolicies; %d refused by Cilium), %d flows each: %d verdicts compared, %d denied by Cilium, %d undecided (never named), %d disagreements",
		2*policies, netpols, rejected, len(probes), compared, denied, undecided, disagree)
	// cidr_rules: NetworkPolicy rules with an ipBlock peer (Cilium's CIDR
	// selectors); refused_named: policies Cilium refuses that fence names.
	t.Logf("fence-agreement: policies=%d netpol=%d cidr_rules=%d refused=%d refused_named=%d verdicts=%d disagreements=%d",
		2*policies, netpols, cidrRules, rejected, refusedNamed, compared, disagree)
}
