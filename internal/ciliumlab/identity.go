package ciliumlab

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MinClusterIdentity is the first identity Cilium allocates for a set of
// pod labels; those below are reserved (host 1, world 2, ..., init 5,
// remote-node 6). An endpoint can be "ready" with reserved:init until its
// agent has the pod's labels.
const MinClusterIdentity = 256

// nsLabel is the identity label Cilium gives every pod: its namespace.
const nsLabel = "k8s:io.kubernetes.pod.namespace="

// settleLimit is how long SettledIdentity waits. The agents have taken up
// to 31 s to move a pod to the identity with the labels set after its
// binding (SchedulePods); a cold machine carrying other load is slower.
const settleLimit = 2 * time.Minute

// SettledIdentity waits until the pod's security identity has settled and
// returns it. Settled means, at one look, all of:
//
//   - the agent on the pod's node has the pod's endpoint ready with a
//     cluster identity (not a reserved one: an endpoint is ready with
//     reserved:init, 5, until its agent has the pod's labels);
//   - that identity's labels carry the pod's namespace and, for each key in
//     keys, the pod's label with that key (k8s:key=value), so a policy that
//     selects on them (the zone fence's zone, an allow-list's job labels)
//     gives its verdict on the pod as it is: a pod labelled after its
//     binding (SchedulePods) starts with an identity without them;
//   - every agent of the lab maps the pod's IP to that identity in its
//     ipcache (GET /v1/ip) and knows the identity's labels (GET
//     /v1/identity/{id}): an agent enforces ingress policy with the
//     identity its ipcache gives the source, which trails the endpoint's
//     own agent.
//
// Every look reads all of it anew: a value read once goes stale when the
// identity changes. After two minutes it fails with what the last look saw.
// How long it took is logged (and kept for SlowestSettle) when it took more
// than one look.
func (p *Pod) SettledIdentity(ctx context.Context, keys ...string) (int64, error) {
	want := []string{nsLabel + p.Spec.Namespace}
	for _, k := range keys {
		v, ok := p.Spec.Labels[k]
		if !ok {
			return 0, fmt.Errorf("pod %s has no label %q to wait for in its identity", p.Ref(), k)
		}
		want = append(want, "k8s:"+k+"="+v)
	}
	began := time.Now()
	looks := 0
	var id int64
	var first string
	err := p.Node.poll(ctx, settleLimit, "settled identity of "+p.Ref()+" with "+strings.Join(want, ","), func() (bool, string) {
		looks++
		var why string
		id, why = p.settledOnce(ctx, want)
		if why != "" && first == "" {
			first = why
		}
		return why == "", why
	})
	if err != nil {
		return 0, err
	}
	if took := time.Since(began); looks > 1 {
		p.lab.noteSettle(p.Ref(), took)
		p.lab.Logf("pod %s on %s: identity %d settled on every node %s after the first look (%d looks); first look: %s",
			p.Ref(), p.Node.Name, id, took.Round(time.Millisecond), looks, first)
	}
	return id, nil
}

// settledOnce is one look of SettledIdentity: the identity, and why it is
// not settled yet ("" when it is).
func (p *Pod) settledOnce(ctx context.Context, want []string) (int64, string) {
	id, labels, why := p.CurrentIdentity(ctx)
	if why != "" {
		return 0, why
	}
	for _, l := range want {
		if !slices.Contains(labels, l) {
			return 0, fmt.Sprintf("identity %d on %s without %s: %v", id, p.Node.Name, l, labels)
		}
	}
	cidr := p.IP.String() + "/32"
	for _, n := range p.lab.Nodes {
		var entries []ipEntry
		if err := n.getJSON(ctx, "/v1/ip?cidr="+cidr, &entries); err != nil {
			return 0, fmt.Sprintf("ipcache of %s: %v", n.Name, err)
		}
		i := slices.IndexFunc(entries, func(e ipEntry) bool { return e.CIDR == cidr })
		if i < 0 || entries[i].Identity != id {
			return 0, fmt.Sprintf("ipcache of %s maps %s to %v, the endpoint has %d", n.Name, cidr, entries, id)
		}
		if n == p.Node {
			continue
		}
		var known struct {
			Labels []string `json:"labels"`
		}
		if err := n.getJSON(ctx, "/v1/identity/"+strconv.FormatInt(id, 10), &known); err != nil {
			return 0, fmt.Sprintf("identity %d on %s: %v", id, n.Name, err)
		}
		if !slices.Equal(slices.Sorted(slices.Values(known.Labels)), slices.Sorted(slices.Values(labels))) {
			return 0, fmt.Sprintf("identity %d on %s has %v, on %s %v", id, n.Name, known.Labels, p.Node.Name, labels)
		}
	}
	return id, ""
}

// ipEntry is what the lab reads of an agent's ipcache entry (GET /v1/ip).
type ipEntry struct {
	CIDR     string `json:"cidr"`
	Identity int64  `json:"identity"`
}

// CurrentIdentity reads, once, the identity of the pod's endpoint on its
// node and its labels, or why there is none to count on: no endpoint yet,
// not ready, or a reserved identity. Waits use SettledIdentity, or read this
// at each of their looks.
func (p *Pod) CurrentIdentity(ctx context.Context) (id int64, labels []string, why string) {
	ep, why := p.endpoint(ctx)
	if ep == nil {
		return 0, nil, why
	}
	id = ep.Identity.ID
	if ep.State != "ready" {
		return 0, nil, fmt.Sprintf("endpoint of %s on %s %s (identity %d)", p.Ref(), p.Node.Name, ep.State, id)
	}
	if id < MinClusterIdentity {
		return 0, nil, fmt.Sprintf("endpoint of %s on %s has reserved identity %d %v", p.Ref(), p.Node.Name, id, ep.Identity.Labels)
	}
	return id, ep.Identity.Labels, ""
}

// noteSettle keeps the slowest settle of the lab's pods.
func (l *Lab) noteSettle(pod string, took time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if took > l.slowestSettle.took {
		l.slowestSettle.pod, l.slowestSettle.took = pod, took
	}
}

// SlowestSettle is the pod whose identity took longest to settle
// (SettledIdentity, after its first look) and how long; "" and 0 when every
// one was settled at the first look.
func (l *Lab) SlowestSettle() (pod string, took time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.slowestSettle.pod, l.slowestSettle.took
}
