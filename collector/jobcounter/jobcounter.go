// Package jobcounter aggregates per-job event counters (drops, flows,
// bytes) keyed by a small struct, and reaps the series of jobs that are
// gone: the last value is still scraped during a grace period, then the
// series disappears (the stale-series bug of cilium#23162).
package jobcounter

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Key is a counter key: a small comparable struct that names its job and
// renders its label values in the order of the Desc.
type Key interface {
	comparable
	JobKey() (namespace, name string)
	LabelValues() []string
}

// Jobs tells which jobs still exist (the topology index satisfies it).
type Jobs interface {
	JobExists(namespace, name string) bool
}

type entry struct {
	value     float64
	goneSince time.Time // zero while the job exists
}

// Vec is a set of counters of one metric. Add is safe for concurrent use
// and does not allocate once a key exists.
type Vec[K Key] struct {
	desc  *prometheus.Desc
	jobs  Jobs
	grace time.Duration
	now   func() time.Time

	mu sync.Mutex
	m  map[K]*entry
}

// New returns a counter vector. Series of a job that jobs no longer has
// stay for grace (at least one scrape) and are then removed.
func New[K Key](desc *prometheus.Desc, jobs Jobs, grace time.Duration) *Vec[K] {
	return &Vec[K]{desc: desc, jobs: jobs, grace: grace, now: time.Now, m: map[K]*entry{}}
}

// Add adds delta (>= 0) to the counter of k.
func (v *Vec[K]) Add(k K, delta float64) {
	v.mu.Lock()
	e := v.m[k]
	if e == nil {
		e = &entry{}
		v.m[k] = e
	}
	e.value += delta
	v.mu.Unlock()
}

// Value returns the counter of k (0 when absent), for tests and reports.
func (v *Vec[K]) Value(k K) float64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	if e := v.m[k]; e != nil {
		return e.value
	}
	return 0
}

// Each calls fn for every counter, in no particular order.
func (v *Vec[K]) Each(fn func(K, float64)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for k, e := range v.m {
		fn(k, e.value)
	}
}

// Len returns the number of series held.
func (v *Vec[K]) Len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.m)
}

// Describe sends the metric's description.
func (v *Vec[K]) Describe(ch chan<- *prometheus.Desc) { ch <- v.desc }

// Collect emits every counter and reaps the series of jobs gone for longer
// than the grace period. A job that comes back within the grace period
// keeps its counts.
func (v *Vec[K]) Collect(ch chan<- prometheus.Metric) {
	now := v.now()
	// Label values are rendered outside the lock; the copy is per scrape,
	// not per flow.
	type item struct {
		k K
		v float64
	}
	v.mu.Lock()
	items := make([]item, 0, len(v.m))
	for k, e := range v.m {
		ns, name := k.JobKey()
		if v.jobs == nil || v.jobs.JobExists(ns, name) {
			e.goneSince = time.Time{}
		} else if e.goneSince.IsZero() {
			e.goneSince = now
		} else if now.Sub(e.goneSince) >= v.grace {
			delete(v.m, k)
			continue
		}
		items = append(items, item{k, e.value})
	}
	v.mu.Unlock()
	for _, it := range items {
		ch <- prometheus.MustNewConstMetric(v.desc, prometheus.CounterValue, it.v, it.k.LabelValues()...)
	}
}
