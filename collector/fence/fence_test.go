package fence

import (
	"strings"
	"testing"
)

// The lab's allow-list fence (issue 32): the coordinator accepts
// connections from zones b and c only, with no ingressDeny.
const allowList = `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy",
 "metadata":{"namespace":"ml-team","name":"coordinator-fence"},
 "spec":{"endpointSelector":{"matchLabels":{"training.kubeflow.org/replica-type":"master"}},
  "ingress":[{"fromEndpoints":[{"matchExpressions":[{"key":"zone","operator":"In","values":["zone-b","zone-c"]}]}]}]}}`

func pod(ns string, kv ...string) Labels {
	m := map[string]string{"k8s:" + LabelNamespace: ns, "k8s:" + LabelCluster: "default"}
	for i := 0; i+1 < len(kv); i += 2 {
		m["k8s:"+kv[i]] = kv[i+1]
	}
	return ParseLabels(m)
}

func mustParse(t *testing.T, s string) *Policy {
	t.Helper()
	p, err := Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAllowListFence(t *testing.T) {
	p := mustParse(t, allowList)
	master := pod("ml-team", "training.kubeflow.org/replica-type", "master", "zone", "zone-b")
	for _, c := range []struct {
		name string
		f    Flow
		want Verdict
	}{
		{"worker in zone a", Flow{Subject: master, Peer: pod("ml-team", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Denied},
		{"worker in zone c", Flow{Subject: master, Peer: pod("ml-team", "zone", "zone-c"), Proto: ProtoTCP, Port: 29500}, Allowed},
		// A namespaced policy's peers are its namespace's pods.
		{"zone b of another namespace", Flow{Subject: master, Peer: pod("other", "zone", "zone-b"), Proto: ProtoTCP, Port: 29500}, Denied},
		{"world", Flow{Subject: master, Peer: reservedLabels[IdentityWorld], Proto: ProtoTCP, Port: 29500}, Denied},
		{"the node itself (allow-localhost)", Flow{Subject: master, Peer: reservedLabels[IdentityHost], Proto: ProtoTCP, Port: 29500}, Allowed},
		{"egress: not selected in that direction", Flow{Egress: true, Subject: master, Peer: pod("ml-team", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Allowed},
		{"a worker is not selected", Flow{Subject: pod("ml-team", "zone", "zone-b"), Peer: pod("ml-team", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Allowed},
		{"another namespace's master is not selected", Flow{Subject: pod("other", "training.kubeflow.org/replica-type", "master"), Peer: pod("other", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Allowed},
	} {
		if got := p.Verdict(&c.f); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestUndecidedNeverNamed(t *testing.T) {
	f := Flow{Subject: pod("ml-team"), Peer: pod("ml-team"), Proto: ProtoTCP, Port: 80}
	p := mustParse(t, `{"metadata":{"namespace":"ml-team","name":"svc"},"spec":{"endpointSelector":{},
	  "egress":[{"toServices":[{"k8sService":{"serviceName":"db","namespace":"ml-team"}}]}]}}`)
	f.Egress = true
	if v := p.Verdict(&f); v != Undecided {
		t.Errorf("a toServices rule: %v, want undecided", v)
	}
	s := NewSet()
	s.Put(p)
	s.PutIdentity(1001, f.Subject)
	if n := s.Name(true, 1001, 1001, ProtoTCP, 80); n != "" {
		t.Errorf("an undecided policy named: %q", n)
	}
	f.Egress = false
	named := mustParse(t, `{"metadata":{"namespace":"ml-team","name":"ports"},"spec":{"endpointSelector":{},
	  "ingress":[{"fromEndpoints":[{}],"toPorts":[{"ports":[{"port":"http"}]}]}]}}`)
	if v := named.Verdict(&f); v != Undecided {
		t.Errorf("a named port: %v, want undecided", v)
	}
}

// The common egress allow-list, the namespace's pods plus a CIDR, is
// decided for pods, CIDR and world identities as Cilium decides it.
func TestCIDRStyleEntries(t *testing.T) {
	allow := mustParse(t, `{"metadata":{"namespace":"ml-team","name":"egress"},"spec":{"endpointSelector":{},
	  "egress":[{"toEndpoints":[{}]},{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.9.0.0/16"]}]},
	   {"toCIDR":["0.0.0.0/0"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]},
	   {"toFQDNs":[{"matchName":"api.example.com"}]},{"toEntities":["kube-apiserver"]}]}}`)
	cidr := func(ls ...string) Labels { return ParseLabelStrings(ls) }
	for _, c := range []struct {
		name string
		peer Labels
		port uint16
		want Verdict
	}{
		{"a pod of the namespace", pod("ml-team"), 80, Allowed},
		{"a pod of another namespace: no CIDR selects a pod", pod("other"), 80, Denied},
		{"the node: no CIDR selects a node", reservedLabels[IdentityRemoteNode], 80, Denied},
		{"the API server", reservedLabels[IdentityKubeAPIServer], 80, Allowed},
		{"inside 10/8", cidr("cidr:10.1.0.0/16", "reserved:world-ipv4"), 80, Allowed},
		{"in the except", cidr("cidr:10.9.1.0/24", "reserved:world-ipv4"), 80, Denied},
		{"outside, port 443: 0.0.0.0/0", cidr("cidr:192.0.2.0/24", "reserved:world-ipv4"), 443, Allowed},
		{"outside, port 80", cidr("cidr:192.0.2.0/24", "reserved:world-ipv4"), 80, Denied},
		{"IPv6 world, port 443: not 0.0.0.0/0", cidr("cidr:2001-db8--/32", "reserved:world-ipv6"), 443, Denied},
		{"single-stack IPv4 world, port 443", cidr("cidr:192.0.2.0/24", "reserved:world"), 443, Allowed},
		{"reserved:world alone, port 443: its family is unknown", reservedLabels[IdentityWorld], 443, Undecided},
		{"the FQDN's identity", cidr("fqdn:api.example.com", "reserved:world-ipv4"), 80, Allowed},
		{"world, not the FQDN's", reservedLabels[IdentityWorldIPv4], 80, Denied},
	} {
		f := Flow{Egress: true, Subject: pod("ml-team"), Peer: c.peer, Proto: ProtoTCP, Port: c.port}
		if got := allow.Verdict(&f); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// The exporter names it by identities: a pod of another namespace and
	// the IPv4 world on port 80; the agent's own CIDR identities it has
	// no labels of name nothing.
	set := NewSet()
	set.Put(allow)
	set.PutIdentity(1001, pod("ml-team"))
	set.PutIdentity(1002, pod("other"))
	for _, c := range []struct {
		peer uint32
		want string
	}{{1002, "ml-team/egress"}, {IdentityWorldIPv4, "ml-team/egress"}, {1001, ""}, {IdentityKubeAPIServer, ""}, {1<<24 | 7, ""}} {
		if got := set.Name(true, 1001, c.peer, ProtoTCP, 80); got != c.want {
			t.Errorf("egress drop to identity %d: named %q, want %q", c.peer, got, c.want)
		}
	}
}

// A policy Cilium's Sanitize refuses is refused: Cilium does not enforce
// it, so it must never be named.
func TestRefusedAsCiliumRefuses(t *testing.T) {
	for _, spec := range []string{
		`{"endpointSelector":{}}`,
		`{"endpointSelector":{},"ingress":[]}`,
		`{"ingress":[{}]}`,
		`{"endpointSelector":{},"nodeSelector":{},"ingress":[{}]}`,
		`{"endpointSelector":{},"ingress":[{"fromEndpoints":[{}],"fromCIDR":["10.0.0.0/8"]}]}`,
		`{"endpointSelector":{},"egress":[{"toFQDNs":[{"matchName":"a.example"}],"toEntities":["world"]}]}`,
		`{"endpointSelector":{},"ingress":[{"fromNodes":[{}]}]}`,
		`{"endpointSelector":{},"ingress":[{"fromEntities":["galaxy"]}]}`,
		`{"endpointSelector":{},"ingress":[{"fromCIDR":["10.0.0.0/33"]}]}`,
		`{"endpointSelector":{},"ingress":[{"fromCIDRSet":[{"cidr":"10.0.0.1"}]}]}`,
		`{"endpointSelector":{},"ingress":[{"fromCIDRSet":[{"cidr":"10.0.0.0/8","except":["192.168.0.0/16"]}]}]}`,
		`{"endpointSelector":{},"ingress":[{"fromCIDRSet":[{"cidr":"10.0.0.0/8","cidrGroupRef":"g"}]}]}`,
		`{"endpointSelector":{},"egress":[{"toFQDNs":[{"matchName":"a b"}]}]}`,
		`{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"70000"}]}]}]}`,
		`{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"80","protocol":"XTP"}]}]}]}`,
		`{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"53","protocol":"UDP"}],"rules":{"dns":[{"matchPattern":"*"}]}}]}]}`,
		`{"endpointSelector":{},"egress":[{"toPorts":[{"ports":[{"port":"0"}],"rules":{"http":[{}]}}]}]}`,
		`{"endpointSelector":{},"egress":[{"toEndpoints":[{}],"icmps":[{"fields":[{"type":8}]}],"toPorts":[{"ports":[{"port":"80"}]}]}]}`,
	} {
		data := `{"metadata":{"name":"p"},"spec":` + spec + `}`
		if _, err := Parse([]byte(data)); err == nil {
			t.Errorf("accepted a policy Cilium refuses: %s", spec)
		}
	}
	// A CiliumNetworkPolicy may not have a nodeSelector.
	if _, err := Parse([]byte(`{"metadata":{"namespace":"n","name":"p"},"spec":{"nodeSelector":{},"ingress":[{}]}}`)); err == nil {
		t.Error("accepted a namespaced host policy")
	}
	// Requirements have no effect (Cilium v1.20 ignores them): a rule
	// with ports and a requirement allows every peer on the ports.
	req := mustParse(t, `{"metadata":{"namespace":"ml-team","name":"req"},"spec":{"endpointSelector":{},
	  "ingress":[{"fromRequires":["k8s:zone=a"],"toPorts":[{"ports":[{"port":"80"}]}]}]}}`)
	f := Flow{Subject: pod("ml-team"), Peer: pod("other"), Proto: ProtoTCP, Port: 80}
	if v := req.Verdict(&f); v != Allowed {
		t.Errorf("fromRequires with ports: %v, want allowed", v)
	}
}

func TestSetNamesInStableBoundedOrder(t *testing.T) {
	s := NewSet()
	mk := func(ns, name string) string {
		meta := `"name":"` + name + `"`
		kind := `"kind":"CiliumClusterwideNetworkPolicy",`
		if ns != "" {
			meta += `,"namespace":"` + ns + `"`
			kind = ""
		}
		return `{` + kind + `"metadata":{` + meta + `},"spec":{"endpointSelector":{"matchLabels":{"app":"m"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"nobody"}}]}]}}`
	}
	for _, r := range []Ref{{"ml-team", "b", ""}, {"", "zz", ""}, {"ml-team", "a", ""}, {"", "c", ""}, {"ml-team", "c", ""}} {
		s.Put(mustParse(t, mk(r.Namespace, r.Name)))
	}
	s.PutIdentity(1001, pod("ml-team", "app", "m"))
	s.PutIdentity(1002, pod("ml-team", "app", "w"))
	got := s.Name(false, 1001, 1002, ProtoTCP, 29500)
	if want := "c,zz,ml-team/a,+2"; got != want {
		t.Errorf("named %q, want %q", got, want)
	}
	if got := s.Name(false, 1001, 9999, ProtoTCP, 29500); got != "" {
		t.Errorf("a peer identity without labels named %q", got)
	}
	// The memo forgets on change.
	s.Delete(Ref{Name: "c"})
	s.Delete(Ref{Name: "zz"})
	if got := s.Name(false, 1001, 1002, ProtoTCP, 29500); got != "ml-team/a,ml-team/b,ml-team/c" {
		t.Errorf("after deletes: %q", got)
	}
	if a := testing.AllocsPerRun(100, func() { s.Name(false, 1001, 1002, ProtoTCP, 29500) }); a != 0 {
		t.Errorf("a memoized name allocates %v times", a)
	}
}

func TestIdentityFrom(t *testing.T) {
	id, ls, err := IdentityFrom(map[string]any{"metadata": map[string]any{"name": "41227"},
		"security-labels": map[string]any{"k8s:app": "x", "k8s:io.kubernetes.pod.namespace": "ml-team"}})
	if err != nil || id != 41227 {
		t.Fatal(id, err)
	}
	if v, ok := ls.Get("app"); !ok || v != "x" {
		t.Errorf("app = %q %v", v, ok)
	}
	if _, ok := ls.Get("reserved:app"); ok {
		t.Error("a k8s label matched the reserved source")
	}
	if _, _, err := IdentityFrom(map[string]any{"metadata": map[string]any{"name": "x"}}); err == nil || !strings.Contains(err.Error(), "not a number") {
		t.Errorf("a bad name: %v", err)
	}
}

// BenchmarkNameMiss evaluates 50 policies for one drop (the memo cleared
// each time, as after an informer update); BenchmarkNameHit is a drop
// whose value is memoized (the steady state of a repeated SYN).
func BenchmarkNameMiss(b *testing.B) {
	s := benchSet(b)
	b.ReportAllocs()
	for b.Loop() {
		s.PutIdentity(1002, pod("ml-team", "app", "w")) // clears the memo
		s.Name(false, 1001, 1002, ProtoTCP, 29500)
	}
}

func BenchmarkNameHit(b *testing.B) {
	s := benchSet(b)
	s.Name(false, 1001, 1002, ProtoTCP, 29500)
	b.ReportAllocs()
	for b.Loop() {
		s.Name(false, 1001, 1002, ProtoTCP, 29500)
	}
}

func benchSet(b testing.TB) *Set {
	s := NewSet()
	for i := range 50 {
		p, err := Parse([]byte(`{"metadata":{"namespace":"ml-team","name":"p` + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `"},
		  "spec":{"endpointSelector":{"matchLabels":{"app":"m"}},"ingress":[{"fromEndpoints":[{"matchExpressions":[{"key":"zone","operator":"In","values":["b","c"]}]}]}]}}`))
		if err != nil {
			b.Fatal(err)
		}
		s.Put(p)
	}
	s.PutIdentity(1001, pod("ml-team", "app", "m", "zone", "b"))
	return s
}
