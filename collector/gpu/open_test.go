package gpu

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestOpen(t *testing.T) {
	o := Options{DCGMExporterURL: "http://127.0.0.1:1/metrics", Logger: slog.New(slog.DiscardHandler)}
	if _, err := Open("dcgm", o); err == nil {
		t.Error("dcgm opened: no build has it")
	}
	s, err := Open(SourceDCGMExporter, o)
	if err != nil {
		t.Fatal(err)
	}
	// Opening never connects; the first read reports the dead address.
	if _, err := s.Read(context.Background()); err == nil {
		t.Error("read from a dead dcgm-exporter succeeded")
	}
	if _, err := Open("bogus", o); err == nil {
		t.Error("unknown source opened")
	}
	if !NVMLBuiltIn {
		if _, err := Open(SourceNVML, o); err == nil {
			t.Error("nvml opened in a build without it")
		}
	}
}

func TestProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(page))
	}))
	defer srv.Close()
	o := Options{DCGMExporterURL: srv.URL, Logger: slog.New(slog.DiscardHandler)}
	s, name, err := Probe(context.Background(), o)
	if name == SourceNVML {
		closeSource(s)
		t.Skip("this machine has an NVIDIA driver: NVML is found first")
	}
	if err != nil || name != SourceDCGMExporter || s == nil {
		t.Fatalf("probe = %v %q %v", s, name, err)
	}
	// A node without GPUs: nothing answers; the error names every attempt.
	srv.Close()
	start := time.Now()
	_, _, err = Probe(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "dcgm-exporter") && !strings.Contains(err.Error(), srv.URL) {
		t.Errorf("probe without a source = %v", err)
	}
	if time.Since(start) > probeTimeout+time.Second {
		t.Error("probe took longer than its timeout")
	}
}

func TestLazyRetriesOpen(t *testing.T) {
	n := 0
	l := &lazy{open: func() (Source, error) {
		n++
		if n < 3 {
			return nil, errors.New("driver not loaded yet")
		}
		return NewDCGMExporter("http://127.0.0.1:1/metrics", nil), nil
	}}
	for range 3 {
		_, _ = l.Read(context.Background())
	}
	if n != 3 || l.src == nil {
		t.Errorf("opened %d times, src %v", n, l.src)
	}
	if err := l.Close(); err != nil {
		t.Error(err)
	}
}
