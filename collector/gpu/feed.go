package gpu

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Feed polls one input (the GPU source, PodResources) every interval and
// holds the latest good reading. A failed or overdue poll drops the reading,
// so a scrape never sees stale values; the failure is counted every time and
// logged once, when the feed goes down.
type Feed[T any] struct {
	name     string
	read     func(context.Context) (T, error)
	interval time.Duration
	logger   *slog.Logger
	errors   prometheus.Counter
	now      func() time.Time

	mu   sync.Mutex
	val  T
	ok   bool
	at   time.Time
	down bool // a failure was logged and no success since
}

// NewFeed returns a feed named name (gpu, podresources) that calls read
// every interval once Run starts. errors counts failed reads; nil for none.
func NewFeed[T any](name string, read func(context.Context) (T, error), interval time.Duration, errors prometheus.Counter, logger *slog.Logger) *Feed[T] {
	return &Feed[T]{name: name, read: read, interval: interval, logger: logger, errors: errors, now: time.Now}
}

// Run polls until ctx ends.
func (f *Feed[T]) Run(ctx context.Context) {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		f.Poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll reads once, bounded by the interval.
func (f *Feed[T]) Poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, f.interval)
	defer cancel()
	v, err := f.read(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil && ctx.Err() != context.DeadlineExceeded {
			return // shutting down
		}
		var zero T
		f.val, f.ok = zero, false
		if f.errors != nil {
			f.errors.Inc()
		}
		if !f.down {
			f.down = true
			f.logger.Warn("source down; its metrics are dropped until it recovers", "feed", f.name, "err", err)
		}
		return
	}
	f.val, f.ok, f.at = v, true, f.now()
	if f.down {
		f.down = false
		f.logger.Info("source recovered", "feed", f.name)
	}
}

// Get returns the latest reading, or false when the last poll failed or
// is overdue (a read stuck in a C library cannot be cancelled).
func (f *Feed[T]) Get() (T, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ok || f.now().Sub(f.at) > 3*f.interval {
		var zero T
		return zero, false
	}
	return f.val, true
}

// Up reports whether the feed has a current reading (zonewatch_source_up).
func (f *Feed[T]) Up() bool {
	_, ok := f.Get()
	return ok
}
