package gpu

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestFeedCountsEveryFailureLogsOnceAndDropsValues(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "errs"})
	fail := false
	n := 0
	f := NewFeed("gpu", func(context.Context) (int, error) {
		n++
		if fail {
			return 0, errors.New("socket gone")
		}
		return n, nil
	}, time.Second, errs, logger)
	now := time.Unix(1000, 0)
	f.now = func() time.Time { return now }
	ctx := context.Background()

	f.Poll(ctx)
	if v, ok := f.Get(); !ok || v != 1 || !f.Up() {
		t.Fatalf("after a good poll: %v %v up=%v", v, ok, f.Up())
	}
	fail = true
	for range 3 {
		f.Poll(ctx)
	}
	if _, ok := f.Get(); ok || f.Up() {
		t.Fatal("a failed poll left a stale value")
	}
	if got := testutil.ToFloat64(errs); got != 3 {
		t.Errorf("errors counted = %v, want 3", got)
	}
	if c := strings.Count(logs.String(), "source down"); c != 1 {
		t.Errorf("logged %d times, want once:\n%s", c, logs.String())
	}
	fail = false
	f.Poll(ctx)
	if v, ok := f.Get(); !ok || v != 5 {
		t.Fatalf("after recovery: %v %v", v, ok)
	}
	if !strings.Contains(logs.String(), "source recovered") {
		t.Error("recovery not logged")
	}
	// A poll stuck in a library: the value goes stale and is dropped.
	now = now.Add(4 * time.Second)
	if f.Up() {
		t.Error("an overdue reading still counts as up")
	}
}

func TestFeedRunStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	polled := make(chan struct{}, 1)
	f := NewFeed("gpu", func(context.Context) (int, error) {
		select {
		case polled <- struct{}{}:
		default:
		}
		return 1, nil
	}, time.Hour, nil, slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	<-polled
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
	if !f.Up() {
		t.Error("first poll did not happen at start")
	}
}
