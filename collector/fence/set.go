package fence

import (
	"slices"
	"strconv"
	"strings"
	"sync"
)

// MaxNamed is how many policies one label value names; further ones are
// counted in a "+N" suffix, so a value is bounded whatever the cluster
// holds: "a,ns/b,ns/c,+2".
const MaxNamed = 3

// Set holds the cluster's policies and the security identities' labels,
// and names the policies behind a default-deny drop. It is safe for
// concurrent use: informers update it while the flow stream asks.
type Set struct {
	mu       sync.RWMutex
	policies map[Ref]*Policy
	ids      map[uint32]Labels
	// names memoizes label values by drop; cleared on every change.
	names map[nameKey]string
	// reader (nil: none) reads identities not in ids by name
	// (OnDemandIdentities); its lock is taken under mu.
	reader *identityReader
}

type nameKey struct {
	egress        bool
	subject, peer uint32
	proto         uint8
	port          uint16
}

// maxMemo bounds the memo of label values.
const maxMemo = 4096

// NewSet returns an empty set.
func NewSet() *Set {
	return &Set{policies: map[Ref]*Policy{}, ids: map[uint32]Labels{}, names: map[nameKey]string{}}
}

// Put adds or replaces a policy.
func (s *Set) Put(p *Policy) {
	s.mu.Lock()
	s.policies[p.Ref] = p
	clear(s.names)
	s.mu.Unlock()
}

// Delete removes a policy.
func (s *Set) Delete(r Ref) {
	s.mu.Lock()
	delete(s.policies, r)
	clear(s.names)
	s.mu.Unlock()
}

// PutIdentity records the labels of a security identity.
func (s *Set) PutIdentity(id uint32, ls Labels) {
	s.mu.Lock()
	s.ids[id] = ls
	clear(s.names)
	s.mu.Unlock()
}

// DeleteIdentity forgets an identity.
func (s *Set) DeleteIdentity(id uint32) {
	s.mu.Lock()
	delete(s.ids, id)
	clear(s.names)
	s.mu.Unlock()
}

// setReader makes the set read the identities it does not hold.
func (s *Set) setReader(r *identityReader) {
	s.mu.Lock()
	s.reader = r
	s.mu.Unlock()
}

// changed clears the memo: an identity read by name came or went.
func (s *Set) changed() {
	s.mu.Lock()
	clear(s.names)
	s.mu.Unlock()
}

// Len returns the number of policies and identities held.
func (s *Set) Len() (policies, identities int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	identities = len(s.ids)
	if s.reader != nil {
		_, known := s.reader.len()
		identities += known
	}
	return len(s.policies), identities
}

// identityLocked gives an identity's recorded labels, or the reader's
// (asking it to read an unknown one); s.mu held.
func (s *Set) identityLocked(id uint32) (Labels, bool) {
	if ls, ok := s.ids[id]; ok {
		return ls, true
	}
	if s.reader != nil {
		return s.reader.lookup(id)
	}
	return nil, false
}

// Labels gives a cluster identity's namespace and pod labels (its k8s
// labels but Cilium's own: io.kubernetes.pod.namespace, io.cilium.*), as
// the per-node view names a remote pod's job from its identity
// (topology.Identities); false for an identity not known here or without
// a namespace (reserved, CIDR).
func (s *Set) Labels(id uint32) (namespace string, labels map[string]string, ok bool) {
	s.mu.RLock()
	ls, known := s.identityLocked(id)
	s.mu.RUnlock()
	if !known {
		return "", nil, false
	}
	namespace, ok = ls.lookup(SourceK8s, LabelNamespace)
	if !ok {
		return "", nil, false
	}
	labels = make(map[string]string, len(ls))
	for _, l := range ls {
		if l.Source == SourceK8s && l.Key != LabelNamespace && !strings.HasPrefix(l.Key, "io.cilium.") {
			labels[l.Key] = l.Value
		}
	}
	return namespace, labels, true
}

// HasIdentity reports whether the set knows an identity's labels; it
// asks for no read of an unknown one (a known one due is read again).
func (s *Set) HasIdentity(id uint32) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, ok := s.ids[id]; ok {
		return true
	}
	return s.reader != nil && s.reader.has(id)
}

// labelsOf returns an identity's labels: a reserved one's, else those
// recorded or read. Identities of the local scope (CIDR, FQDN: 1<<24 | n) are
// allocated by each agent and not known here.
func (s *Set) labelsOf(id uint32) (Labels, bool) {
	if ls, ok := reservedLabels[id]; ok {
		return ls, true
	}
	return s.identityLocked(id)
}

// Denying returns the policies that alone deny f, in a stable order
// (namespace, then name; cluster-wide policies first).
func (s *Set) Denying(f *Flow) []Ref {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.denying(f)
}

func (s *Set) denying(f *Flow) []Ref {
	var out []Ref
	for _, p := range s.policies {
		if p.Verdict(f) == Denied {
			out = append(out, p.Ref)
		}
	}
	slices.SortFunc(out, func(a, b Ref) int {
		switch {
		case a.less(b):
			return -1
		case b.less(a):
			return 1
		}
		return 0
	})
	return out
}

// Name returns the policy label value for a default-deny drop between
// the subject's and the peer's identities (the subject is the denying
// endpoint), or "" when no policy is known to deny it (an identity
// without labels here, or no policy that alone denies). It does not
// allocate once a drop's value is memoized.
func (s *Set) Name(egress bool, subject, peer uint32, proto uint8, port uint16) string {
	k := nameKey{egress, subject, peer, proto, port}
	s.mu.RLock()
	v, ok := s.names[k]
	s.mu.RUnlock()
	if ok {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sl, ok1 := s.labelsOf(subject)
	pl, ok2 := s.labelsOf(peer)
	switch {
	case s.reader != nil && (!ok1 && cluster(subject) || !ok2 && cluster(peer)):
		// Not memoized: the identity is being read by name (the next
		// drop asks again, and again after a dropped read).
		return ""
	case ok1 && ok2:
		if refs := s.denying(&Flow{Egress: egress, Subject: sl, Peer: pl, Proto: proto, Port: port}); refs != nil {
			v = Join(refs)
		}
	}
	if len(s.names) >= maxMemo {
		clear(s.names)
	}
	s.names[k] = v
	return v
}

// NamePending reports whether naming a drop between the identities waits
// on a read by name that is queued or running (Name names nothing until
// it lands; it asks for the read when the identity is not known): the
// caller may hold the drop and name it once the read is in. A known-absent
// identity (404) or a dropped read is not pending.
func (s *Set) NamePending(subject, peer uint32) bool {
	s.mu.RLock() // as Labels: the reader has a lock of its own
	defer s.mu.RUnlock()
	if s.reader == nil {
		return false
	}
	pending := false
	for _, id := range []uint32{subject, peer} {
		if _, ok := s.labelsOf(id); !ok && cluster(id) && s.reader.inFlight(id) {
			pending = true
		}
	}
	return pending
}

// DenyingIDs returns every policy that alone denies a default-deny drop
// between the identities, uncapped (Name's value names MaxNamed and
// counts the rest); nil when an identity's labels are not known.
func (s *Set) DenyingIDs(egress bool, subject, peer uint32, proto uint8, port uint16) []Ref {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.denyingIDsLocked(egress, subject, peer, proto, port)
}

// denyingIDsLocked is DenyingIDs with s.mu held (read or write).
func (s *Set) denyingIDsLocked(egress bool, subject, peer uint32, proto uint8, port uint16) []Ref {
	sl, ok1 := s.labelsOf(subject)
	pl, ok2 := s.labelsOf(peer)
	if !ok1 || !ok2 {
		return nil
	}
	return s.denying(&Flow{Egress: egress, Subject: sl, Peer: pl, Proto: proto, Port: port})
}

// NameLabels is Name for labels at hand (a flow file's whole flows carry
// them).
func (s *Set) NameLabels(f *Flow) string {
	return Join(s.Denying(f))
}

// Join renders policies as a label value: at most MaxNamed names joined
// by commas, then "+N" for the rest.
func Join(refs []Ref) string {
	// A NetworkPolicy and a CiliumNetworkPolicy of one name are one name.
	refs = slices.CompactFunc(slices.Clone(refs), func(a, b Ref) bool { return a.String() == b.String() })
	var b strings.Builder
	for i, r := range refs {
		if i == MaxNamed {
			b.WriteString(",+" + strconv.Itoa(len(refs)-MaxNamed))
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(r.String())
	}
	return b.String()
}

// LearnIdentity records an identity's labels as a flow gives them
// ("k8s:app=x", "reserved:world"), once: an identity's labels do not
// change. Reserved identities and empty lists are ignored.
func (s *Set) LearnIdentity(id uint32, labels []string) {
	if id == 0 || len(labels) == 0 {
		return
	}
	if _, ok := reservedLabels[id]; ok {
		return
	}
	s.mu.RLock()
	_, known := s.ids[id]
	s.mu.RUnlock()
	if !known {
		s.PutIdentity(id, ParseLabelStrings(labels))
	}
}
