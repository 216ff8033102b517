package topology

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// placementsByScan is Placements as it was before the per-node view: every
// job's pods scanned. The per-node view must agree with it.
func placementsByScan(x *Index, node string) []JobPlacement {
	var out []JobPlacement
	for _, jp := range x.Placements("") {
		if node == "" || slices.ContainsFunc(jp.Pods, func(p PodPlacement) bool { return p.Node == node }) {
			out = append(out, jp)
		}
	}
	return out
}

// TestPlacementsPerNodeView churns pods and nodes at random (moves,
// finishes, terminations, kind changes, zone changes, deletions, two feeds)
// and checks that every node's view matches a full scan, and that a cached
// placement never outlives a change.
func TestPlacementsPerNodeView(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := NewIndex()
	const nodes, jobs, pods = 8, 6, 40
	node := func() string { return fmt.Sprintf("n%d", r.IntN(nodes)) }
	for i := 0; i < nodes; i++ {
		x.UpsertNode(Node{Name: fmt.Sprintf("n%d", i), Zone: fmt.Sprintf("z%d", i%3)})
	}
	for step := 0; step < 3000; step++ {
		p := Pod{Namespace: "ns", Name: fmt.Sprintf("p%d", r.IntN(pods))}
		j := r.IntN(jobs)
		p.Identity = Identity{Name: fmt.Sprintf("job%d", j), Kind: []string{"", "PyTorchJob"}[r.IntN(2)], Role: RoleWorker}
		if r.IntN(5) == 0 {
			p.Identity.Role = RoleCoordinator
		}
		switch r.IntN(10) {
		case 0:
			x.DeletePod(r.IntN(2), p.Namespace, p.Name)
		case 1:
			x.UpsertNode(Node{Name: node(), Zone: fmt.Sprintf("z%d", r.IntN(4))})
		case 2:
			x.DeleteNode(node())
		default:
			if r.IntN(4) > 0 {
				p.Node = node()
			}
			p.Finished = r.IntN(8) == 0
			p.Terminating = r.IntN(8) == 0
			x.UpsertPod(r.IntN(2), p)
		}
		if step%7 != 0 {
			continue
		}
		got := map[string][]JobPlacement{}
		for i := -1; i < nodes; i++ {
			n := ""
			if i >= 0 {
				n = fmt.Sprintf("n%d", i)
			}
			got[n] = x.Placements(n) // from the per-node view and the cache
		}
		// Drop the cache: the full scan builds every placement afresh.
		x.mu.Lock()
		for _, jr := range x.jobs {
			jr.placement.Store(nil)
		}
		x.mu.Unlock()
		for n, g := range got {
			want := placementsByScan(x, n)
			for i := range want {
				want[i].Version = 0
			}
			for i := range g {
				g[i].Version = 0
			}
			if (len(g) > 0 || len(want) > 0) && !reflect.DeepEqual(g, want) {
				t.Fatalf("step %d node %q:\n got %+v\nwant %+v", step, n, g, want)
			}
		}
	}
}

// TestPlacementsCachedUntilChange: a placement is built once and handed out
// again until a pod of the job or the zone of its node changes; a node
// heartbeat that changes nothing keeps it and the generation.
func TestPlacementsCachedUntilChange(t *testing.T) {
	x := NewIndex()
	x.UpsertNode(Node{Name: "a", Zone: "z1"})
	x.UpsertNode(Node{Name: "b", Zone: "z2"})
	for i, n := range []string{"a", "b"} {
		x.UpsertPod(0, Pod{Namespace: "ns", Name: fmt.Sprintf("p%d", i), Node: n, Identity: Identity{Name: "j", Kind: "PyTorchJob", Role: RoleWorker}})
	}
	v := x.Placements("")[0].Version
	gen := x.Generation()
	x.UpsertNode(Node{Name: "a", Zone: "z1"})
	x.UpsertPod(1, Pod{Namespace: "ns", Name: "p0", Node: "a", Identity: Identity{Name: "j", Kind: "PyTorchJob", Role: RoleWorker}})
	if got := x.Placements("a")[0].Version; got != v || x.Generation() != gen {
		t.Fatalf("unchanged updates rebuilt the placement (version %d -> %d, generation %d -> %d)", v, got, gen, x.Generation())
	}
	x.UpsertNode(Node{Name: "a", Zone: "z2"})
	jp := x.Placements("b")[0]
	if jp.Version == v || jp.Split() {
		t.Fatalf("zone change not seen: %+v", jp)
	}
	x.DeletePod(0, "ns", "p0") // feed 1 still holds it
	if len(x.Placements("a")) != 1 {
		t.Fatal("pod held by another feed left the node view")
	}
	x.DeletePod(1, "ns", "p0")
	if len(x.Placements("a")) != 0 || len(x.Placements("b")[0].Pods) != 1 {
		t.Fatalf("deleted pod still placed: %+v", x.Placements(""))
	}
}

// BenchmarkPlacementsNode is the DaemonSet scrape's index read: one node's
// jobs at 200 and 2,000 jobs of 10 pods, 10 pods per node in both.
func BenchmarkPlacementsNode(b *testing.B) {
	for _, jobs := range []int{200, 2000} {
		x := bigIndex(jobs, jobs, 10) // a node per job: 10 pods a node
		b.Run(fmt.Sprintf("%d-jobs", jobs), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				x.Placements("node-00007")
			}
		})
	}
	x := bigIndex(2000, 2000, 10)
	b.Run("all-nodes-2000-jobs", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			x.Placements("")
		}
	})
}
