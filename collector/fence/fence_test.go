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
	p := mustParse(t, `{"metadata":{"namespace":"ml-team","name":"cidr"},"spec":{"endpointSelector":{},
	  "ingress":[{"fromCIDR":["10.0.0.0/8"]}]}}`)
	f := Flow{Subject: pod("ml-team"), Peer: pod("ml-team"), Proto: ProtoTCP, Port: 80}
	if v := p.Verdict(&f); v != Undecided {
		t.Errorf("a CIDR rule: %v, want undecided", v)
	}
	s := NewSet()
	s.Put(p)
	s.PutIdentity(1001, f.Subject)
	if n := s.Name(false, 1001, 1001, ProtoTCP, 80); n != "" {
		t.Errorf("an undecided policy named: %q", n)
	}
	named := mustParse(t, `{"metadata":{"namespace":"ml-team","name":"ports"},"spec":{"endpointSelector":{},
	  "ingress":[{"fromEndpoints":[{}],"toPorts":[{"ports":[{"port":"http"}]}]}]}}`)
	if v := named.Verdict(&f); v != Undecided {
		t.Errorf("a named port: %v, want undecided", v)
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

func benchSet(b *testing.B) *Set {
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
