package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/zonewatch/zonewatch/collector"
)

// serveHTTP serves metrics, /healthz, /readyz and the landing page until
// ctx is done (a graceful shutdown, nil) or the server fails.
func serveHTTP(ctx context.Context, o *options, logger *slog.Logger, g prometheus.Gatherer, synced func() bool, e *collector.Exporter) error {
	mux := http.NewServeMux()
	mux.Handle(*o.metricsURL, promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelError), ErrorHandling: promhttp.ContinueOnError,
		MaxRequestsInFlight: *o.maxRequests,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	// Ready once the topology is synced. A source that is down (Cilium
	// without ctAccounting, Hubble restarting) is reported in the body and
	// as zonewatch_source_up 0, but does not make the pod unready: an
	// unready pod drops out of a ServiceMonitor's endpoints, and the alert
	// that should say why would lose its data.
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !synced() {
			http.Error(rw, "kubernetes informers not synced, or the ipcache not read yet", http.StatusServiceUnavailable)
			return
		}
		if ok, down := e.SourcesUp(); !ok {
			fmt.Fprintln(rw, "ready; sources down: "+strings.Join(down, ", "))
			return
		}
		fmt.Fprintln(rw, "ready")
	})
	if *o.metricsURL != "/" {
		landing, err := web.NewLandingPage(web.LandingConfig{
			Name: "zonewatch exporter", Description: "Training jobs split across availability zones", Version: version.Info(),
			Links: []web.LandingLinks{{Address: *o.metricsURL, Text: "Metrics"}, {Address: "/readyz", Text: "Readiness"}},
		})
		if err != nil {
			return fmt.Errorf("landing page: %w", err)
		}
		mux.Handle("/", landing)
	}

	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- web.ListenAndServe(srv, o.web, logger) }()
	for _, a := range *o.web.WebListenAddresses {
		host, port, _ := net.SplitHostPort(a)
		if host == "" {
			host = "localhost"
		}
		logger.Info("serving metrics", "url", "http://"+net.JoinHostPort(host, port)+*o.metricsURL)
	}

	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
	case <-ctx.Done():
		logger.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			logger.Error("http shutdown", "err", err)
		}
	}
	return nil
}
