package fence

import "testing"

func mustNetpol(t *testing.T, s string) *Policy {
	t.Helper()
	p, err := ParseNetworkPolicy([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type netpolCase struct {
	name string
	f    Flow
	want Verdict
}

func checkVerdicts(t *testing.T, p *Policy, cases []netpolCase) {
	t.Helper()
	for _, c := range cases {
		if got := p.Verdict(&c.f); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// nsPod is a pod whose namespace carries labels (Cilium adds them to the
// identity as io.cilium.k8s.namespace.labels.*).
func nsPod(ns string, nsLabels map[string]string, kv ...string) Labels {
	m := map[string]string{"k8s:" + LabelNamespace: ns, "k8s:" + LabelCluster: "default"}
	for k, v := range nsLabels {
		m["k8s:"+LabelNamespaceLabels+k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m["k8s:"+kv[i]] = kv[i+1]
	}
	return ParseLabels(m)
}

// The lab's allow-list fence written as a Kubernetes NetworkPolicy: the
// coordinator accepts its namespace's pods of zones b and c only.
func TestNetworkPolicyAllowList(t *testing.T) {
	p := mustNetpol(t, `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy",
	 "metadata":{"namespace":"ml-team","name":"coordinator-fence"},
	 "spec":{"podSelector":{"matchLabels":{"training.kubeflow.org/replica-type":"master"}},"policyTypes":["Ingress"],
	  "ingress":[{"from":[{"podSelector":{"matchExpressions":[{"key":"zone","operator":"In","values":["zone-b","zone-c"]}]}}]}]}}`)
	if p.Ref != (Ref{Namespace: "ml-team", Name: "coordinator-fence", Kind: KindNetworkPolicy}) || p.Ref.String() != "ml-team/coordinator-fence" {
		t.Errorf("ref %+v %q", p.Ref, p.Ref.String())
	}
	master := pod("ml-team", "training.kubeflow.org/replica-type", "master", "zone", "zone-b")
	checkVerdicts(t, p, []netpolCase{
		{"worker in zone a", Flow{Subject: master, Peer: pod("ml-team", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Denied},
		{"worker in zone c", Flow{Subject: master, Peer: pod("ml-team", "zone", "zone-c"), Proto: ProtoTCP, Port: 29500}, Allowed},
		{"zone b of another namespace", Flow{Subject: master, Peer: pod("other", "zone", "zone-b"), Proto: ProtoTCP, Port: 29500}, Denied},
		{"zone b of another cluster", Flow{Subject: master, Peer: ParseLabels(map[string]string{"k8s:" + LabelNamespace: "ml-team", "k8s:" + LabelCluster: "east", "k8s:zone": "zone-b"}), Proto: ProtoTCP, Port: 29500}, Denied},
		// A NetworkPolicy selects Kubernetes labels only.
		{"zone b as a label of another source", Flow{Subject: master, Peer: ParseLabels(map[string]string{"k8s:" + LabelNamespace: "ml-team", "k8s:" + LabelCluster: "default", "container:zone": "zone-b"}), Proto: ProtoTCP, Port: 29500}, Denied},
		{"world", Flow{Subject: master, Peer: reservedLabels[IdentityWorld], Proto: ProtoTCP, Port: 29500}, Denied},
		{"the node itself (allow-localhost)", Flow{Subject: master, Peer: reservedLabels[IdentityHost], Proto: ProtoTCP, Port: 29500}, Allowed},
		{"egress is not fenced (policyTypes Ingress)", Flow{Egress: true, Subject: master, Peer: pod("ml-team", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Allowed},
		{"a worker is not selected", Flow{Subject: pod("ml-team", "zone", "zone-b"), Peer: pod("ml-team", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Allowed},
		{"another namespace's master is not selected", Flow{Subject: pod("other", "training.kubeflow.org/replica-type", "master"), Peer: pod("other", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Allowed},
		{"a master labelled by another source is not selected", Flow{Subject: ParseLabels(map[string]string{"k8s:" + LabelNamespace: "ml-team", "container:training.kubeflow.org/replica-type": "master"}), Peer: pod("ml-team", "zone", "zone-a"), Proto: ProtoTCP, Port: 29500}, Allowed},
	})
}

func TestNetworkPolicyNamespaceSelector(t *testing.T) {
	team := map[string]string{"team": "ml"}
	p := mustNetpol(t, `{"metadata":{"namespace":"ml-team","name":"from-team"},"spec":{"podSelector":{},
	  "ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"ml"}}},
	                      {"namespaceSelector":{"matchLabels":{"team":"data"}},"podSelector":{"matchLabels":{"app":"loader"}}}]}]}}`)
	sub := nsPod("ml-team", team)
	checkVerdicts(t, p, []netpolCase{
		{"a pod of a team=ml namespace", Flow{Subject: sub, Peer: nsPod("ml-infer", team), Proto: ProtoTCP, Port: 80}, Allowed},
		{"a pod of an unlabelled namespace", Flow{Subject: sub, Peer: nsPod("shop", nil), Proto: ProtoTCP, Port: 80}, Denied},
		{"a loader of a team=data namespace", Flow{Subject: sub, Peer: nsPod("etl", map[string]string{"team": "data"}, "app", "loader"), Proto: ProtoTCP, Port: 80}, Allowed},
		{"another pod of a team=data namespace", Flow{Subject: sub, Peer: nsPod("etl", map[string]string{"team": "data"}, "app", "web"), Proto: ProtoTCP, Port: 80}, Denied},
		{"a loader of an unlabelled namespace", Flow{Subject: sub, Peer: nsPod("shop", nil, "app", "loader"), Proto: ProtoTCP, Port: 80}, Denied},
		{"world", Flow{Subject: sub, Peer: reservedLabels[IdentityWorld], Proto: ProtoTCP, Port: 80}, Denied},
	})
	// An empty namespaceSelector: every namespace's pods, no reserved
	// identity.
	all := mustNetpol(t, `{"metadata":{"namespace":"ml-team","name":"any-ns"},"spec":{"podSelector":{},
	  "ingress":[{"from":[{"namespaceSelector":{}}]}]}}`)
	checkVerdicts(t, all, []netpolCase{
		{"a pod of any namespace", Flow{Subject: sub, Peer: nsPod("shop", nil), Proto: ProtoTCP, Port: 80}, Allowed},
		{"world", Flow{Subject: sub, Peer: reservedLabels[IdentityWorld], Proto: ProtoTCP, Port: 80}, Denied},
		{"remote node", Flow{Subject: sub, Peer: reservedLabels[IdentityRemoteNode], Proto: ProtoTCP, Port: 80}, Denied},
	})
}

func TestNetworkPolicyPorts(t *testing.T) {
	p := mustNetpol(t, `{"metadata":{"namespace":"ml-team","name":"ports"},"spec":{"podSelector":{},
	  "ingress":[{"from":[{"podSelector":{}}],"ports":[{"port":29500,"endPort":29510},{"protocol":"UDP"},{"port":"8080"}]}]}}`)
	sub, peer := pod("ml-team"), pod("ml-team")
	checkVerdicts(t, p, []netpolCase{
		{"TCP in the range", Flow{Subject: sub, Peer: peer, Proto: ProtoTCP, Port: 29505}, Allowed},
		{"TCP past endPort", Flow{Subject: sub, Peer: peer, Proto: ProtoTCP, Port: 29511}, Denied},
		{"TCP 8080 (a number written as a string)", Flow{Subject: sub, Peer: peer, Proto: ProtoTCP, Port: 8080}, Allowed},
		{"SCTP in the range (the protocol is TCP when none is given)", Flow{Subject: sub, Peer: peer, Proto: ProtoSCTP, Port: 29505}, Denied},
		{"any UDP port", Flow{Subject: sub, Peer: peer, Proto: ProtoUDP, Port: 53}, Allowed},
		{"another namespace on an allowed port", Flow{Subject: sub, Peer: pod("other"), Proto: ProtoTCP, Port: 29505}, Denied},
	})
	named := mustNetpol(t, `{"metadata":{"namespace":"ml-team","name":"named"},"spec":{"podSelector":{},
	  "ingress":[{"ports":[{"port":"http"}]}]}}`)
	checkVerdicts(t, named, []netpolCase{
		{"a named port: the pod's container ports decide", Flow{Subject: sub, Peer: peer, Proto: ProtoTCP, Port: 80}, Undecided},
		{"a named port allows TCP only", Flow{Subject: sub, Peer: peer, Proto: ProtoUDP, Port: 80}, Undecided},
	})
}

func TestNetworkPolicyTypesAndEmptyRules(t *testing.T) {
	sub, peer := pod("ml-team"), pod("ml-team")
	in := func(egress bool) Flow {
		return Flow{Egress: egress, Subject: sub, Peer: peer, Proto: ProtoTCP, Port: 80}
	}
	for _, c := range []struct {
		name, spec           string
		ingress, egress      Verdict
		worldIn, worldEgress Verdict
	}{
		{"no policyTypes, no rules: ingress denied", `"podSelector":{}`, Denied, Allowed, Denied, Allowed},
		{"an empty ingress list", `"podSelector":{},"policyTypes":["Ingress"],"ingress":[]`, Denied, Allowed, Denied, Allowed},
		{"ingress [{}]: every source", `"podSelector":{},"ingress":[{}]`, Allowed, Allowed, Allowed, Allowed},
		{"policyTypes Egress only: egress denied, ingress open", `"podSelector":{},"policyTypes":["Egress"]`, Allowed, Denied, Allowed, Denied},
		{"both types, no rules", `"podSelector":{},"policyTypes":["Ingress","Egress"]`, Denied, Denied, Denied, Denied},
		{"egress [{}]: every destination", `"podSelector":{},"policyTypes":["Ingress","Egress"],"egress":[{}]`, Denied, Allowed, Denied, Allowed},
		{"egress to the namespace", `"podSelector":{},"policyTypes":["Egress"],"egress":[{"to":[{"podSelector":{}}]}]`, Allowed, Allowed, Allowed, Denied},
		// Cilium reads the rules whatever policyTypes says.
		{"egress rules with policyTypes Ingress", `"podSelector":{},"policyTypes":["Ingress"],"ingress":[{}],"egress":[{"to":[{"podSelector":{"matchLabels":{"app":"x"}}}]}]`, Allowed, Denied, Allowed, Denied},
	} {
		p := mustNetpol(t, `{"metadata":{"namespace":"ml-team","name":"p"},"spec":{`+c.spec+`}}`)
		wi, we := in(false), in(true)
		wi.Peer, we.Peer = reservedLabels[IdentityWorld], reservedLabels[IdentityWorld]
		for _, v := range []struct {
			what string
			f    Flow
			want Verdict
		}{{"ingress", in(false), c.ingress}, {"egress", in(true), c.egress}, {"world ingress", wi, c.worldIn}, {"egress to world", we, c.worldEgress}} {
			if got := p.Verdict(&v.f); got != v.want {
				t.Errorf("%s: %s %v, want %v", c.name, v.what, got, v.want)
			}
		}
	}
}

func TestNetworkPolicyIPBlockAndCluster(t *testing.T) {
	sub := pod("ml-team")
	// An ipBlock is a CIDR selector: it never selects a pod (Cilium's
	// default CIDR match mode), selects a CIDR identity inside it and
	// outside its except.
	p := mustNetpol(t, `{"metadata":{"namespace":"ml-team","name":"cidr"},"spec":{"podSelector":{},"policyTypes":["Egress"],
	  "egress":[{"to":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}},{"podSelector":{"matchLabels":{"app":"db"}}}]}]}}`)
	checkVerdicts(t, p, []netpolCase{
		{"a pod inside the ipBlock", Flow{Egress: true, Subject: sub, Peer: pod("ml-team", "app", "web"), Proto: ProtoTCP, Port: 80}, Denied},
		{"a CIDR identity inside", Flow{Egress: true, Subject: sub, Peer: ParseLabelStrings([]string{"cidr:10.2.0.0/16", "reserved:world-ipv4"}), Proto: ProtoTCP, Port: 80}, Allowed},
		{"a CIDR identity in the except", Flow{Egress: true, Subject: sub, Peer: ParseLabelStrings([]string{"cidr:10.1.2.3/32", "reserved:world-ipv4"}), Proto: ProtoTCP, Port: 80}, Denied},
		{"the allowed db", Flow{Egress: true, Subject: sub, Peer: pod("ml-team", "app", "db"), Proto: ProtoTCP, Port: 80}, Allowed},
	})
	// A peer selector that names a cluster selects that cluster's pods.
	mesh := mustNetpol(t, `{"metadata":{"namespace":"ml-team","name":"mesh"},"spec":{"podSelector":{},
	  "ingress":[{"from":[{"podSelector":{"matchLabels":{"io.cilium.k8s.policy.cluster":"east"}}}]}]}}`)
	east := ParseLabels(map[string]string{"k8s:" + LabelNamespace: "ml-team", "k8s:" + LabelCluster: "east"})
	checkVerdicts(t, mesh, []netpolCase{
		{"a pod of cluster east", Flow{Subject: sub, Peer: east, Proto: ProtoTCP, Port: 80}, Allowed},
		{"a pod of the local cluster", Flow{Subject: sub, Peer: pod("ml-team"), Proto: ProtoTCP, Port: 80}, Denied},
	})
	// A policy without a namespace is in "default".
	def := mustNetpol(t, `{"metadata":{"name":"d"},"spec":{"podSelector":{}}}`)
	if def.Ref.Namespace != "default" {
		t.Errorf("namespace %q", def.Ref.Namespace)
	}
	for _, bad := range []string{
		`{"metadata":{"name":"p"},"spec":{"podSelector":{},"ingress":[{"ports":[{"protocol":"ICMPX"}]}]}}`,
		`{"metadata":{"name":"p"},"spec":{"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":"10.0.0.0"}}]}]}}`,
		`{"metadata":{"name":"p"},"spec":{"podSelector":{"matchExpressions":[{"key":"a","operator":"In"}]}}}`,
		`{"metadata":{},"spec":{"podSelector":{}}}`,
	} {
		if _, err := ParseNetworkPolicy([]byte(bad)); err == nil {
			t.Errorf("read: %s", bad)
		}
	}
}

// A NetworkPolicy and a CiliumNetworkPolicy of one name are two policies
// (deleting one leaves the other), and one name in the label.
func TestNetworkPolicyBesideCiliumPolicyOfTheSameName(t *testing.T) {
	s := NewSet()
	cnp := mustParse(t, `{"metadata":{"namespace":"ml-team","name":"fence"},"spec":{"endpointSelector":{"matchLabels":{"app":"m"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"nobody"}}]}]}}`)
	knp := mustNetpol(t, `{"metadata":{"namespace":"ml-team","name":"fence"},"spec":{"podSelector":{"matchLabels":{"app":"m"}}}}`)
	s.Put(cnp)
	s.Put(knp)
	s.PutIdentity(1001, pod("ml-team", "app", "m"))
	s.PutIdentity(1002, pod("ml-team", "app", "w"))
	if got := s.Name(false, 1001, 1002, ProtoTCP, 80); got != "ml-team/fence" {
		t.Errorf("named %q", got)
	}
	s.Delete(knp.Ref)
	if n, _ := s.Len(); n != 1 {
		t.Errorf("%d policies after deleting the NetworkPolicy", n)
	}
	if got := s.Name(false, 1001, 1002, ProtoTCP, 80); got != "ml-team/fence" {
		t.Errorf("the CiliumNetworkPolicy no longer named: %q", got)
	}
}
