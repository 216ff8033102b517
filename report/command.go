package report

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
)

// AddCommand declares the report command and its flags on app and returns
// the function that runs it once app.Parse has chosen it; the function
// returns the exit code (0 written, 2 cannot be built).
func AddCommand(app *kingpin.Application, stdout, stderr io.Writer) func() int {
	cmd := app.Command("report", "Write a cost report for a period from a Prometheus (or Thanos, Mimir) that scrapes zonewatch and runs its rule pack: cross-zone GB and dollars and idle GPU-hours of split jobs, per namespace and job.")
	url := cmd.Flag("prometheus.url", "Prometheus HTTP API base URL, e.g. http://prometheus-operated.monitoring:9090.").PlaceHolder("URL").Required().String()
	last := cmd.Flag("last", "Report on the period ending --to (default now) of this length, e.g. 30d, 1w, 12h.").Default("30d").String()
	from := cmd.Flag("from", "Start of the period (RFC 3339, e.g. 2026-11-01T00:00:00Z); overrides --last.").PlaceHolder("TIME").String()
	to := cmd.Flag("to", "End of the period (RFC 3339); default now.").PlaceHolder("TIME").String()
	output := cmd.Flag("output", "Output format: text, csv, json or markdown.").Short('o').Default("text").Enum(Formats...)
	selector := cmd.Flag("selector", "Label matchers (no braces) selecting zonewatch's series, as the rules config's selector.").Default(`job="zonewatch"`).String()
	timeout := cmd.Flag("timeout", "Timeout of each query.").Default("2m").Duration()
	// The same client options promtool and amtool take: an HTTP client
	// config file, or the common ones as flags.
	httpConfig := cmd.Flag("http.config.file", "HTTP client configuration file (Prometheus' format: bearer token, basic auth, TLS, OAuth2), as promtool takes it.").PlaceHolder("FILE").ExistingFile()
	bearer := cmd.Flag("bearer-token-file", "File holding a bearer token for the Prometheus API.").PlaceHolder("FILE").ExistingFile()
	user := cmd.Flag("basic-auth.username", "Basic auth user name.").String()
	passFile := cmd.Flag("basic-auth.password-file", "File holding the basic auth password.").PlaceHolder("FILE").ExistingFile()
	caFile := cmd.Flag("tls.ca-file", "CA bundle to verify the Prometheus server.").PlaceHolder("FILE").ExistingFile()
	certFile := cmd.Flag("tls.cert-file", "Client certificate (mutual TLS).").PlaceHolder("FILE").ExistingFile()
	keyFile := cmd.Flag("tls.key-file", "Client key (mutual TLS).").PlaceHolder("FILE").ExistingFile()
	serverName := cmd.Flag("tls.server-name", "Server name to verify.").String()
	insecure := cmd.Flag("tls.insecure-skip-verify", "Do not verify the server's certificate.").Bool()

	return func() int {
		fail := func(err error) int {
			fmt.Fprintf(stderr, "zonewatch-exporter report: %v\n", err)
			return 2
		}
		o := Options{Selector: *selector}
		var err error
		if o.From, o.To, err = period(*from, *to, *last, time.Now()); err != nil {
			return fail(err)
		}
		cfg := config.DefaultHTTPClientConfig
		if *httpConfig != "" {
			c, _, err := config.LoadHTTPConfigFile(*httpConfig)
			if err != nil {
				return fail(fmt.Errorf("--http.config.file: %w", err))
			}
			cfg = *c
		}
		if *bearer != "" {
			cfg.BearerTokenFile = *bearer
		}
		if *user != "" || *passFile != "" {
			cfg.BasicAuth = &config.BasicAuth{Username: *user, PasswordFile: *passFile}
		}
		for dst, v := range map[*string]string{&cfg.TLSConfig.CAFile: *caFile, &cfg.TLSConfig.CertFile: *certFile, &cfg.TLSConfig.KeyFile: *keyFile, &cfg.TLSConfig.ServerName: *serverName} {
			if v != "" {
				*dst = v
			}
		}
		if *insecure {
			cfg.TLSConfig.InsecureSkipVerify = true
		}
		if err := cfg.Validate(); err != nil {
			return fail(fmt.Errorf("HTTP client options: %w", err))
		}
		rt, err := config.NewRoundTripperFromConfig(cfg, "zonewatch-report")
		if err != nil {
			return fail(fmt.Errorf("HTTP client options: %w", err))
		}
		client, err := api.NewClient(api.Config{Address: *url, RoundTripper: rt})
		if err != nil {
			return fail(fmt.Errorf("--prometheus.url: %w", err))
		}
		r, err := Build(context.Background(), QueryAPI{API: v1.NewAPI(client), Timeout: *timeout, Warn: stderr}, o)
		if err != nil {
			return fail(err)
		}
		if err := r.Write(stdout, *output); err != nil {
			return fail(fmt.Errorf("writing the report: %w", err))
		}
		return 0
	}
}

// period resolves the command's time flags.
func period(from, to, last string, now time.Time) (time.Time, time.Time, error) {
	end := now
	if to != "" {
		t, err := time.Parse(time.RFC3339, to)
		if err != nil {
			return time.Time{}, time.Time{}, fmt.Errorf("--to: %w", err)
		}
		end = t
	}
	if from != "" {
		t, err := time.Parse(time.RFC3339, from)
		if err != nil {
			return time.Time{}, time.Time{}, fmt.Errorf("--from: %w", err)
		}
		return t, end, nil
	}
	d, err := model.ParseDuration(last)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("--last: %w", err)
	}
	return end.Add(-time.Duration(d)), end, nil
}

// QueryAPI adapts client_golang's v1.API to Querier: instant queries that
// must return a vector, warnings passed on to Warn.
type QueryAPI struct {
	API     v1.API
	Timeout time.Duration
	Warn    io.Writer
}

// Query runs one instant query.
func (a QueryAPI) Query(ctx context.Context, query string, ts time.Time) (model.Vector, error) {
	v, warnings, _, err := a.API.Query(ctx, query, ts, v1.WithTimeout(a.Timeout))
	var apiErr *v1.Error
	if errors.As(err, &apiErr) && apiErr.Type == v1.ErrClient && apiErr.Detail != "" {
		err = fmt.Errorf("%w (%s)", err, apiErr.Detail)
	}
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		if a.Warn != nil {
			fmt.Fprintf(a.Warn, "zonewatch-exporter report: warning from Prometheus: %s\n", w)
		}
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("got a %s, want a vector", v.Type())
	}
	return vec, nil
}
