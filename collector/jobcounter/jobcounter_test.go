package jobcounter

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type key struct{ ns, job, zone string }

func (k key) JobKey() (string, string) { return k.ns, k.job }
func (k key) LabelValues() []string    { return []string{k.ns, k.job, k.zone} }

type jobs map[string]bool

func (j jobs) JobExists(ns, name string) bool { return j[ns+"/"+name] }

var desc = prometheus.NewDesc("zonewatch_test_total", "test", []string{"namespace", "job_name", "zone"}, nil)

func TestReapAfterGrace(t *testing.T) {
	live := jobs{"ml/a": true, "ml/b": true}
	v := New[key](desc, live, time.Minute)
	now := time.Unix(1000, 0)
	v.now = func() time.Time { return now }
	v.Add(key{"ml", "a", "z1"}, 2)
	v.Add(key{"ml", "a", "z1"}, 3)
	v.Add(key{"ml", "b", "z2"}, 7)
	if got := testutil.CollectAndCount(v); got != 2 {
		t.Fatalf("series = %d, want 2", got)
	}
	if v.Value(key{"ml", "a", "z1"}) != 5 {
		t.Fatalf("value = %v", v.Value(key{"ml", "a", "z1"}))
	}

	// Job b goes away: its last value is still scraped within the grace period...
	delete(live, "ml/b")
	if got := testutil.CollectAndCount(v); got != 2 {
		t.Fatalf("series right after the job left = %d, want 2", got)
	}
	now = now.Add(30 * time.Second)
	if got := testutil.CollectAndCount(v); got != 2 {
		t.Fatalf("series within grace = %d, want 2", got)
	}
	// ...and then disappears.
	now = now.Add(31 * time.Second)
	if got := testutil.CollectAndCount(v); got != 1 {
		t.Fatalf("series after grace = %d, want 1", got)
	}

	// A job that comes back within grace keeps its count.
	delete(live, "ml/a")
	_ = testutil.CollectAndCount(v)
	live["ml/a"] = true
	now = now.Add(2 * time.Minute)
	v.Add(key{"ml", "a", "z1"}, 1)
	if got := testutil.CollectAndCount(v); got != 1 || v.Value(key{"ml", "a", "z1"}) != 6 {
		t.Fatalf("returning job: series %d value %v", got, v.Value(key{"ml", "a", "z1"}))
	}
}

func TestAddDoesNotAllocate(t *testing.T) {
	v := New[key](desc, nil, time.Minute)
	k := key{"ml", "a", "z1"}
	v.Add(k, 1)
	if n := testing.AllocsPerRun(1000, func() { v.Add(k, 1) }); n != 0 {
		t.Fatalf("Add allocates %v times", n)
	}
}

func BenchmarkAdd(b *testing.B) {
	v := New[key](desc, nil, time.Minute)
	k := key{"ml-team", "llm-blocked", "us-east-1a"}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		v.Add(k, 1)
	}
}
