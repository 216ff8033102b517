package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/topology"
)

// handlers is the ghost tests' hook into the per-node view: it holds the
// handlers (and job-feed list/watch calls) that match a hold until the
// test opens it, and logs every call that ran.
type handlers struct {
	ctx   context.Context
	mu    sync.Mutex
	holds []*hold
	done  []kube.HandlerEvent
	wake  chan struct{}
}

type hold struct {
	match func(kube.HandlerEvent) bool
	open  chan struct{}
}

func newHandlers(ctx context.Context) *handlers {
	return &handlers{ctx: ctx, wake: make(chan struct{})}
}

func (h *handlers) hook(ev kube.HandlerEvent, call func()) {
	h.mu.Lock()
	var waits []chan struct{}
	for _, x := range h.holds {
		if x.match(ev) {
			waits = append(waits, x.open)
		}
	}
	h.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-h.ctx.Done():
		}
	}
	call()
	h.mu.Lock()
	h.done = append(h.done, ev)
	close(h.wake)
	h.wake = make(chan struct{})
	h.mu.Unlock()
}

// hold holds every call that matches from now until release.
func (h *handlers) hold(match func(kube.HandlerEvent) bool) *hold {
	x := &hold{match: match, open: make(chan struct{})}
	h.mu.Lock()
	h.holds = append(h.holds, x)
	h.mu.Unlock()
	return x
}

func (h *handlers) release(x *hold) {
	h.mu.Lock()
	h.holds = slices.DeleteFunc(h.holds, func(y *hold) bool { return y == x })
	h.mu.Unlock()
	close(x.open)
}

// mark is the position in the log of calls that ran; waitRan looks after it.
func (h *handlers) mark() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.done)
}

// waitRan waits until a call that matches has run since mark.
func (h *handlers) waitRan(t *testing.T, since int, what string, match func(kube.HandlerEvent) bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		h.mu.Lock()
		found := slices.ContainsFunc(h.done[since:], match)
		wake := h.wake
		h.mu.Unlock()
		if found {
			return
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("%s: the handler never ran", what)
		}
	}
}

func on(feed, op, name string) func(kube.HandlerEvent) bool {
	return func(ev kube.HandlerEvent) bool {
		return ev.Feed == feed && ev.Op == op && (name == "" || ev.Name == name)
	}
}

// ghostShape is a training controller's labelling of its pods, as in
// pernode_test.go's jobPods (the controllers' sources are cited in
// identity_test.go).
type ghostShape struct {
	label string // the rule's name label: the job feed selects on it
	pod   func(job string, i int, local bool) (string, map[string]string)
}

var ghostShapes = []ghostShape{
	{"training.kubeflow.org/job-name", func(job string, i int, local bool) (string, map[string]string) {
		l := map[string]string{"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": "worker",
			"training.kubeflow.org/replica-index": fmt.Sprint(i), "training.kubeflow.org/operator-name": "pytorchjob-controller"}
		if local {
			l["training.kubeflow.org/replica-type"], l["training.kubeflow.org/job-role"] = "master", "master"
			return job + "-master-0", l
		}
		return fmt.Sprintf("%s-worker-%d", job, i), l
	}},
	{"volcano.sh/job-name", func(job string, i int, local bool) (string, map[string]string) {
		task := "worker"
		if local {
			task = "master"
		}
		return fmt.Sprintf("%s-%s-%d", job, task, i), map[string]string{"volcano.sh/job-name": job, "volcano.sh/task-spec": task}
	}},
	{"jobset.sigs.k8s.io/jobset-name", func(job string, i int, _ bool) (string, map[string]string) {
		return fmt.Sprintf("%s-node-0-%d-%s", job, i, randSuffix()), map[string]string{"jobset.sigs.k8s.io/jobset-name": job,
			"jobset.sigs.k8s.io/replicatedjob-name": "node", "jobset.sigs.k8s.io/job-index": "0",
			"batch.kubernetes.io/job-name": job + "-node-0", topology.LabelCompletionIndex: fmt.Sprint(i)}
	}},
}

func randSuffix() string {
	const chars = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, 5)
	for i := range b {
		b[i] = chars[rand.IntN(len(chars))]
	}
	return string(b)
}

// ghostCluster is the apiserver side of the ghost tests: nodes node-0 (the
// view's) to node-3, and jobs whose pods it creates, runs and deletes as
// the kubelet, the controllers and PodGC would.
type ghostCluster struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	r      *rand.Rand
	nodes  int
	ipSeq  int
	ips    map[string]bool // every pod address handed out (none is reused)
	// submitted counts the submissions of each job name.
	submitted map[string]int
}

const ghostNS, ghostNode = "ml", "node-0"

func (c *ghostCluster) createNode(i int) {
	zone := []string{"zone-a", "zone-b"}[i%2]
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: map[string]string{kube.LabelZone: zone}}}
	if _, err := c.client.CoreV1().Nodes().Create(c.ctx, n, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// pod creates a job pod on node and runs it (or lets it finish).
func (c *ghostCluster) pod(name, node string, labels map[string]string) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ghostNS, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}}
	created, err := c.client.CoreV1().Pods(ghostNS).Create(c.ctx, p, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// A pod moved here from another job by its labels keeps its name.
		p.Name += "-" + randSuffix()
		created, err = c.client.CoreV1().Pods(ghostNS).Create(c.ctx, p, metav1.CreateOptions{})
	}
	if err != nil {
		c.t.Fatalf("create pod %s: %v", name, err)
	}
	c.ipSeq++
	node, _ = strings.CutPrefix(node, "node-")
	ip := fmt.Sprintf("10.%s.%d.%d", node, c.ipSeq/250, 1+c.ipSeq%250)
	c.ips[ip] = true
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if c.r.IntN(15) == 0 {
		created.Status.Phase = corev1.PodSucceeded
	}
	if _, err := c.client.CoreV1().Pods(ghostNS).UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("pod %s status: %v", name, err)
	}
}

// submit creates a job of shape s: one pod on the view's node when local,
// and remote pods on the other nodes. It returns the local pod's name.
// The local pod's name is the same in every submission of the job; the
// remote pods' indexes alternate between 1-4 and 5-8, so that a pod of
// the last submission left in the index is not hidden by a new pod of its
// name.
func (c *ghostCluster) submit(s ghostShape, job string, local bool, remote int) string {
	var localName string
	if local {
		name, labels := s.pod(job, 0, true)
		c.pod(name, ghostNode, labels)
		localName = name
	}
	c.submitted[job]++
	first := 1 + 4*(c.submitted[job]%2)
	for i := range remote {
		name, labels := s.pod(job, first+i, false)
		c.pod(name, fmt.Sprintf("node-%d", 1+c.r.IntN(c.nodes-1)), labels)
	}
	return localName
}

func (c *ghostCluster) list(selector string) []corev1.Pod {
	pl, err := c.client.CoreV1().Pods(ghostNS).List(c.ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		c.t.Fatal(err)
	}
	return pl.Items
}

func (c *ghostCluster) del(name string, grace *int64) {
	err := c.client.CoreV1().Pods(ghostNS).Delete(c.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: grace})
	if err != nil && !apierrors.IsNotFound(err) {
		c.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// Ways a job's pods go.
const (
	together = iota // deletecollection: graceful, then confirmed (grace 0) in one call
	oneByOne        // each pod deleted gracefully, then confirmed as its kubelet does
	forced          // each pod deleted with grace 0
	podGC           // their nodes deleted; PodGC fails and force-deletes every pod bound there
	ways
)

var wayNames = []string{"deletecollection", "one by one", "force-deleted", "PodGC"}

// remove deletes the pods (all of one job, by selector, or as listed).
func (c *ghostCluster) remove(way int, selector string, pods []corev1.Pod) {
	zero := new(int64)
	switch way {
	case together:
		for _, grace := range []*int64{nil, zero} {
			err := c.client.CoreV1().Pods(ghostNS).DeleteCollection(c.ctx, metav1.DeleteOptions{GracePeriodSeconds: grace}, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				c.t.Fatal(err)
			}
		}
	case oneByOne:
		for _, p := range pods {
			c.del(p.Name, nil)
			c.del(p.Name, zero)
		}
	case forced:
		for _, p := range pods {
			c.del(p.Name, zero)
		}
	case podGC:
		// PodGC (k8s.io/kubernetes v1.37.2 pkg/controller/podgc,
		// gcOrphaned): every pod bound to a node that is gone is marked
		// Failed with a DisruptionTarget condition, then deleted with
		// grace 0. The view's own node stays: its pods are force-deleted.
		gone := map[string]bool{}
		for _, p := range pods {
			if p.Spec.NodeName == ghostNode {
				c.del(p.Name, zero)
			} else {
				gone[p.Spec.NodeName] = true
			}
		}
		for n := range gone {
			if err := c.client.CoreV1().Nodes().Delete(c.ctx, n, metav1.DeleteOptions{}); err != nil {
				c.t.Fatal(err)
			}
		}
		for _, p := range c.list("") {
			if !gone[p.Spec.NodeName] {
				continue
			}
			p.Status.Phase = corev1.PodFailed
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
				Reason: "DeletionByPodGC", Message: "PodGC: node no longer exists"})
			if _, err := c.client.CoreV1().Pods(ghostNS).UpdateStatus(c.ctx, &p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
				c.t.Fatal(err)
			}
			c.del(p.Name, zero)
		}
		for n := range gone {
			i, _ := strconv.Atoi(strings.TrimPrefix(n, "node-"))
			c.createNode(i)
		}
	}
}

// podWatches is the apiserver's own count of the namespaced pod watches
// it serves (apiserver_longrunning_requests): the job feeds' watches.
func (c *ghostCluster) podWatches() int {
	raw, err := c.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(c.ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_longrunning_requests{") || !strings.Contains(line, `resource="pods"`) ||
			!strings.Contains(line, `scope="namespace"`) || !strings.Contains(line, `verb="WATCH"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			c.t.Fatalf("%q: %v", line, err)
		}
		n += int(v)
	}
	return n
}

// jobOf is the job a pod's labels name (its shape's name label).
func jobOf(p *corev1.Pod) (label, job string) {
	for _, s := range ghostShapes {
		if v := p.Labels[s.label]; v != "" {
			return s.label, v
		}
	}
	return "", ""
}

// viewDiff compares the per-node view with the apiserver: the index holds
// exactly the pods of the jobs with a pod on the view's node (each on its
// node, its address naming it and its job), no other address (a gone
// pod's, a pod's of a job not followed) names a pod or a job, and one job
// feed with one watch runs per such job. Empty when they agree.
func viewDiff(c *ghostCluster, l *kube.Live, index *topology.Index, baseWatches int) string {
	pods := c.list("")
	followed := map[string]bool{}
	for _, p := range pods {
		if _, job := jobOf(&p); job != "" && p.Spec.NodeName == ghostNode {
			followed[job] = true
		}
	}
	var d []string
	want, held := 0, map[string]bool{}
	for _, p := range pods {
		_, job := jobOf(&p)
		running := p.Status.PodIP != "" && p.Status.Phase == corev1.PodRunning
		if !followed[job] {
			continue
		}
		want++
		if e, ok := index.LookupPod(p.Namespace, p.Name); !ok || e.Node != p.Spec.NodeName {
			d = append(d, fmt.Sprintf("pod %s (job %s) on %s: index %+v %v", p.Name, job, p.Spec.NodeName, e, ok))
			continue
		}
		if running {
			held[p.Status.PodIP] = true
			e, _ := index.LookupIP(netip.MustParseAddr(p.Status.PodIP))
			if e.Pod != p.Name || e.Job == nil || e.Job.Name != job {
				d = append(d, fmt.Sprintf("address %s of pod %s (job %s) resolves to %+v", p.Status.PodIP, p.Name, job, e))
			}
		}
	}
	if _, n, j := index.Counts(); n != want || j != len(followed) {
		d = append(d, fmt.Sprintf("index holds %d pods of %d jobs, the apiserver %d pods of %d jobs with a pod on %s", n, j, want, len(followed), ghostNode))
	}
	for ip := range c.ips {
		if held[ip] {
			continue
		}
		if e, _ := index.LookupIP(netip.MustParseAddr(ip)); e.Pod != "" || e.Job != nil {
			d = append(d, fmt.Sprintf("address %s of no followed running pod resolves to pod %q job %+v", ip, e.Pod, e.Job))
		}
	}
	if n := l.Feeds(); n != len(followed) {
		d = append(d, fmt.Sprintf("%d job feeds run for %d followed jobs", n, len(followed)))
	}
	if len(d) > 0 {
		slices.Sort(d)
		return strings.Join(d, "\n")
	}
	if n := c.podWatches(); n != baseWatches+len(followed) {
		d = append(d, fmt.Sprintf("the apiserver serves %d namespaced pod watches, %d at the start + %d followed jobs", n, baseWatches, len(followed)))
	}
	slices.Sort(d)
	return strings.Join(d, "\n")
}

// waitView waits until the view agrees with the apiserver.
func waitView(t *testing.T, what string, c *ghostCluster, l *kube.Live, index *topology.Index, baseWatches int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		d := viewDiff(c, l, index, baseWatches)
		if d == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the per-node view of %s differs from the apiserver:\n%s", what, ghostNode, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitStored waits until the job feed's store holds none of the pods: its
// watch delivered their deletion, whether or not its handler ran.
func waitStored(t *testing.T, l *kube.Live, label, job string, pods []corev1.Pod) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		stored := kube.FeedStored(l, ghostNS, label, job)
		if !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return slices.Contains(stored, ghostNS+"/"+p.Name) }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: the feed's store still holds %v", job, stored)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGhostPods is item 1 of issue 45 on the real kube-apiserver: the
// per-node view (NewLocal) keeps no pod that is gone and drops none that is
// there, whatever order the node's pod informer, the job feeds and their
// stores see a deletion in. Each round one of three jobs (a PyTorchJob, a
// Volcano job, a JobSet, each with a pod on the view's node) has its pods
// deleted together (deletecollection), one by one, force-deleted or
// PodGC'd, with the handlers held so that the windows a ghost needs are
// open every time: the node's handler releases the job while the feed's
// deletions are in its store but not handled, or the feed's first handled
// deletion finds the store empty with more queued. The job is resubmitted
// under the same name at once. Each round also moves a remote pod from one
// job to another by its labels (the old feed's deletion held until the new
// feed has added it), starts a job whose only pod leaves before its feed
// has listed (the feed's list/watch held), and churns jobs that are not
// followed. After each round the index holds exactly the apiserver's pods
// of the followed jobs, no other address resolves, and the job feeds and
// the apiserver's namespaced pod watches are one per followed job; at the
// end, with every pod gone, none is left. 200 rounds (another count:
// ZONEWATCH_GHOST_ROUNDS); it needs etcd and kube-apiserver, so -short
// skips it (the unit tier).
func TestGhostPods(t *testing.T) {
	testenv.Integration(t)
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	client := kubernetes.NewForConfigOrDie(api.Config)
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ghostNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	c := &ghostCluster{t: t, ctx: ctx, client: client, r: rand.New(rand.NewPCG(seed, 45)), nodes: 4, ips: map[string]bool{}, submitted: map[string]int{}}
	for i := range c.nodes {
		c.createNode(i)
	}
	baseWatches := c.podWatches()

	index := topology.NewIndex()
	rules := topology.DefaultRules()
	l, fs, err := kube.NewLocal(kubeapi.NewForConfigOrDie(api.Config), index, rules, ghostNode, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h := newHandlers(ctx)
	kube.SetHook(l, h.hook)
	viewCtx, stopView := context.WithCancel(ctx)
	defer stopView()
	if err := l.Run(viewCtx, fs); err != nil {
		t.Fatal(err)
	}

	// The three followed jobs, each with a pod on the view's node.
	mains := []string{"pt", "vc", "js"}
	feedOf := func(s ghostShape, job string) string { return ghostNS + "/" + s.label + "=" + job }
	for i, job := range mains {
		c.submit(ghostShapes[i], job, true, 2+c.r.IntN(3))
	}
	waitView(t, "start", c, l, index, baseWatches)

	rounds := costEnv("ZONEWATCH_GHOST_ROUNDS", 200)
	churn, moved, presync := 0, 0, 0
	deleted := make([]int, ways)
	for round := range rounds {
		what := fmt.Sprintf("round %d", round)
		// A job whose only pod leaves before its feed has listed.
		churn++
		k := fmt.Sprintf("k%d", churn)
		open := h.hold(func(ev kube.HandlerEvent) bool {
			return ev.Feed == feedOf(ghostShapes[0], k) && (ev.Op == "list" || ev.Op == "watch")
		})
		m := h.mark()
		name := c.submit(ghostShapes[0], k, true, 0)
		h.waitRan(t, m, what+": the node's handler adds "+name, on("", "add", name))
		m = h.mark()
		c.del(name, new(int64))
		h.waitRan(t, m, what+": the node's handler deletes "+name, on("", "delete", name))
		h.release(open)
		presync++

		// Jobs that are not followed come and go, some with a pod here.
		switch c.r.IntN(3) {
		case 0:
			churn++
			c.submit(ghostShapes[c.r.IntN(len(ghostShapes))], fmt.Sprintf("c%d", churn), c.r.IntN(2) == 0, 1+c.r.IntN(3))
		case 1:
			for _, p := range c.list("") {
				if label, job := jobOf(&p); job != "" && !slices.Contains(mains, job) {
					c.remove(together, label+"="+job, nil)
					break
				}
			}
		}

		j := round % len(mains)
		s, job := ghostShapes[j], mains[j]
		// A remote pod moves from one of the other jobs to the third by
		// its labels; its old feed's deletion waits for the new feed's add.
		from, to := (j+1)%len(mains), (j+2)%len(mains)
		if c.r.IntN(2) == 0 {
			from, to = to, from
		}
		for _, p := range c.list(ghostShapes[from].label + "=" + mains[from]) {
			if p.Spec.NodeName == ghostNode || p.DeletionTimestamp != nil {
				continue
			}
			held := h.hold(on(feedOf(ghostShapes[from], mains[from]), "delete", p.Name))
			m := h.mark()
			_, p.Labels = ghostShapes[to].pod(mains[to], 9, false)
			if _, err := client.CoreV1().Pods(ghostNS).Update(ctx, &p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			h.waitRan(t, m, what+": the new job's feed adds the moved pod "+p.Name, func(ev kube.HandlerEvent) bool {
				return ev.Feed == feedOf(ghostShapes[to], mains[to]) && ev.Name == p.Name && ev.Op != "delete"
			})
			h.release(held)
			h.waitRan(t, m, what+": the old job's feed deletes the moved pod "+p.Name, on(feedOf(ghostShapes[from], mains[from]), "delete", p.Name))
			moved++
			break
		}

		// The job's pods go, the windows held open.
		way := (round / len(mains)) % ways
		selector := s.label + "=" + job
		pods := c.list(selector)
		var local string
		var locals, remote []corev1.Pod
		for _, p := range pods {
			if p.Spec.NodeName == ghostNode {
				local = p.Name
				locals = append(locals, p)
			} else {
				remote = append(remote, p)
			}
		}
		feed := feedOf(s, job)
		if local == "" {
			t.Fatalf("%s: job %s has no pod on %s", what, job, ghostNode)
		}
		if (round/(len(mains)*ways))%2 == 0 {
			// The node's handler first: it releases the job while the
			// feed's deletions are stored but not handled.
			feedHeld := h.hold(on(feed, "delete", ""))
			nodeHeld := h.hold(on("", "delete", local))
			m := h.mark()
			c.remove(way, selector, pods)
			waitStored(t, l, s.label, job, pods)
			h.release(nodeHeld)
			h.waitRan(t, m, what+": the node's handler deletes "+local, on("", "delete", local))
			h.release(feedHeld)
		} else {
			// The local pod first, then the remote ones, their
			// deletions all stored before the feed's first is handled.
			m := h.mark()
			c.del(local, new(int64))
			h.waitRan(t, m, what+": the node's handler deletes "+local, on("", "delete", local))
			waitStored(t, l, s.label, job, locals)
			feedHeld := h.hold(on(feed, "delete", ""))
			if way == together {
				c.remove(together, selector, nil)
			} else {
				c.remove(way, selector, remote)
			}
			waitStored(t, l, s.label, job, remote)
			h.release(feedHeld)
		}
		deleted[way] += len(pods)
		// Resubmitted under the same name at once.
		c.submit(s, job, true, 2+c.r.IntN(3))
		waitView(t, fmt.Sprintf("%s (%s, %s)", what, job, wayNames[way]), c, l, index, baseWatches)
	}
	for _, s := range ghostShapes {
		c.remove(together, s.label, nil)
	}
	waitView(t, "every pod deleted", c, l, index, baseWatches)
	if n := l.Feeds(); n != 0 {
		t.Errorf("%d job feeds left", n)
	}
	var ws []string
	for w, n := range deleted {
		ws = append(ws, fmt.Sprintf("%s %d", wayNames[w], n))
	}
	t.Logf("%d rounds: pods deleted with the handlers held: %s; %d pods moved between jobs; %d feeds whose pod left before they listed; %d job pod addresses handed out; job feeds and namespaced pod watches back to %d",
		rounds, strings.Join(ws, ", "), moved, presync, len(c.ips), baseWatches)
}
