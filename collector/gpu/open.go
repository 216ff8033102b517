package gpu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Source names for --gpu.source.
const (
	SourceAuto         = "auto"
	SourceNVML         = "nvml"
	SourceDCGMExporter = "dcgm-exporter"
	SourceNone         = "none"
)

// Sources lists the --gpu.source values. DCGM is read through
// dcgm-exporter's page: no build links the DCGM library (go-dcgm).
var Sources = []string{SourceAuto, SourceNVML, SourceDCGMExporter, SourceNone}

// Options configure the sources.
type Options struct {
	DCGMExporterURL string
	// Skipped counts input the sources could not place on a GPU.
	Skipped prometheus.Counter
	Logger  *slog.Logger
}

// Open returns the named source. A library source that cannot start yet
// (driver not loaded) retries on every read, reporting the error, so the
// feed shows it down instead of the exporter exiting.
func Open(name string, o Options) (Source, error) {
	switch name {
	case SourceNVML:
		if !NVMLBuiltIn {
			return nil, fmt.Errorf("--gpu.source=nvml: %w", errNVMLNotBuilt)
		}
		return &lazy{open: func() (Source, error) { return openNVML(o.Logger) }}, nil
	case SourceDCGMExporter:
		if o.DCGMExporterURL == "" {
			return nil, errors.New("--gpu.source=dcgm-exporter needs --gpu.dcgm-exporter-url, or a node name to find this node's dcgm-exporter pod")
		}
		return NewDCGMExporter(o.DCGMExporterURL, o.Skipped), nil
	}
	return nil, fmt.Errorf("unknown GPU source %q", name)
}

const probeTimeout = 5 * time.Second

var errNVMLNotBuilt = errors.New("nvml: not built into this binary (build with -tags nvml and CGO_ENABLED=1)")

// AutoSource is --gpu.source=auto on a node the API says has GPUs: NVML
// where this binary has it and it reads, else the dcgm-exporter page at
// o.DCGMExporterURL when set, else this node's dcgm-exporter pod as d finds
// it. The dcgm-exporter sources fail their reads, saying what to change,
// until there is a page to read.
func AutoSource(ctx context.Context, d *Discovery, o Options) (Source, string) {
	if NVMLBuiltIn {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		if s, err := openNVML(o.Logger); err == nil {
			if _, err = s.Read(ctx); err == nil {
				return s, SourceNVML
			}
			closeSource(s)
		}
	}
	if o.DCGMExporterURL != "" {
		return NewDCGMExporter(o.DCGMExporterURL, o.Skipped), SourceDCGMExporter
	}
	return NewDiscoveredDCGMExporter(d, o), SourceDCGMExporter + " pod"
}

// Probe is --gpu.source=auto without a node to look up: it tries NVML,
// then the dcgm-exporter page at o.DCGMExporterURL, and returns
// the first that reads. err joins every attempt's error when none does (a
// node without GPUs).
func Probe(ctx context.Context, o Options) (Source, string, error) {
	// The exporter's start waits for this: a dcgm-exporter address that
	// drops packets must not hang it.
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var errs []error
	if NVMLBuiltIn {
		s, err := openNVML(o.Logger)
		if err == nil {
			if _, err = s.Read(ctx); err == nil {
				return s, SourceNVML, nil
			}
			closeSource(s)
		}
		errs = append(errs, err)
	}
	if o.DCGMExporterURL == "" {
		return nil, "", errors.Join(append(errs, errors.New("no --gpu.dcgm-exporter-url"))...)
	}
	d := NewDCGMExporter(o.DCGMExporterURL, o.Skipped)
	ss, err := d.Read(ctx)
	if err == nil && len(ss) > 0 {
		return d, SourceDCGMExporter, nil
	}
	if err == nil {
		err = fmt.Errorf("dcgm-exporter at %s reports no GPUs", o.DCGMExporterURL)
	}
	return nil, "", errors.Join(append(errs, err)...)
}

func closeSource(s Source) {
	if c, ok := s.(io.Closer); ok {
		_ = c.Close()
	}
}

// lazy opens a library source on first use and retries until it opens.
type lazy struct {
	open func() (Source, error)
	mu   sync.Mutex
	src  Source
}

func (l *lazy) Read(ctx context.Context) ([]Sample, error) {
	l.mu.Lock()
	if l.src == nil {
		s, err := l.open()
		if err != nil {
			l.mu.Unlock()
			return nil, err
		}
		l.src = s
	}
	s := l.src
	l.mu.Unlock()
	return s.Read(ctx)
}

// Close closes the source if it was opened.
func (l *lazy) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.src == nil {
		return nil
	}
	c, ok := l.src.(io.Closer)
	if !ok {
		return nil
	}
	return c.Close()
}
