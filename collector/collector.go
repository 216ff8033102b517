// Package collector is the exporter's root Prometheus collector: it runs
// every part (placement, hubble, gpu, conntrack) at scrape time, times each
// one, and reports which data sources are up.
package collector

import (
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "zonewatch"

// Collector is one part of the exporter's metrics, computed at scrape time.
// Update returns an error when it cannot export what it should in this
// scrape (its input is down, so its series are withheld or stale): the
// scrape goes on and zonewatch_scrape_collector_success is 0 for it.
type Collector interface {
	Update(ch chan<- prometheus.Metric) error
}

// Source is a data source whose health is exported as zonewatch_source_up.
type Source interface {
	Up() bool
}

// The self families' names and help (Gatherer adds the placement's).
const (
	scrapeDurationName = namespace + "_scrape_collector_duration_seconds"
	scrapeDurationHelp = "Time a zonewatch collector took to produce its metrics in this scrape."
	scrapeSuccessName  = namespace + "_scrape_collector_success"
	scrapeSuccessHelp  = "Whether a zonewatch collector succeeded in this scrape (1) or failed (0)."
)

var (
	scrapeDurationDesc = prometheus.NewDesc(scrapeDurationName, scrapeDurationHelp, []string{"collector"}, nil)
	scrapeSuccessDesc  = prometheus.NewDesc(scrapeSuccessName, scrapeSuccessHelp, []string{"collector"}, nil)
	sourceUpDesc       = prometheus.NewDesc(namespace+"_source_up",
		"Whether a data source (kubernetes, hubble, gpu, podresources, conntrack, ipcache, probe) is connected and delivering (1) or not (0).", []string{"source"}, nil)
)

// Exporter is the root collector. It is unchecked: its series depend on the
// current topology, so a job that is gone has none.
type Exporter struct {
	logger     *slog.Logger
	mu         sync.Mutex
	collectors map[string]Collector
	sources    map[string]Source
	// failing names the collectors whose last Update failed, so a failure
	// is logged when it starts and when it ends, not on every scrape.
	failing map[string]bool
}

// New returns an empty root collector.
func New(logger *slog.Logger) *Exporter {
	return &Exporter{logger: logger, collectors: map[string]Collector{}, sources: map[string]Source{}, failing: map[string]bool{}}
}

// Add registers a named collector.
func (e *Exporter) Add(name string, c Collector) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.collectors[name] = c
}

// AddSource registers a data source for zonewatch_source_up.
func (e *Exporter) AddSource(name string, s Source) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sources[name] = s
}

// SourcesUp reports whether every registered source is up, and names the
// ones that are not (for /readyz).
func (e *Exporter) SourcesUp() (bool, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var down []string
	for name, s := range e.sources {
		if !s.Up() {
			down = append(down, name)
		}
	}
	sort.Strings(down)
	return len(down) == 0, down
}

// noteResult logs a collector's failure when it starts and its recovery.
func (e *Exporter) noteResult(name string, err error) {
	e.mu.Lock()
	was := e.failing[name]
	e.failing[name] = err != nil
	e.mu.Unlock()
	switch {
	case err != nil && !was:
		e.logger.Error("collector failed; zonewatch_scrape_collector_success is 0 until it recovers", "collector", name, "err", err)
	case err == nil && was:
		e.logger.Info("collector recovered", "collector", name)
	}
}

// Describe sends nothing: the collector is unchecked.
func (e *Exporter) Describe(chan<- *prometheus.Desc) {}

// Collect runs every collector concurrently and reports each one's
// duration and success.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	collectors := make(map[string]Collector, len(e.collectors))
	for k, v := range e.collectors {
		collectors[k] = v
	}
	sources := make(map[string]Source, len(e.sources))
	for k, v := range e.sources {
		sources[k] = v
	}
	e.mu.Unlock()

	var wg sync.WaitGroup
	for name, c := range collectors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := c.Update(ch)
			success := 1.0
			if err != nil {
				success = 0
			}
			e.noteResult(name, err)
			ch <- prometheus.MustNewConstMetric(scrapeDurationDesc, prometheus.GaugeValue, time.Since(start).Seconds(), name)
			ch <- prometheus.MustNewConstMetric(scrapeSuccessDesc, prometheus.GaugeValue, success, name)
		}()
	}
	for name, s := range sources {
		up := 0.0
		if s.Up() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(sourceUpDesc, prometheus.GaugeValue, up, name)
	}
	wg.Wait()
}
