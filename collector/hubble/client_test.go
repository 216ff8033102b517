package hubble

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/sim"
)

func TestBackoffCappedWithJitter(t *testing.T) {
	lo, hi := 500*time.Millisecond, 30*time.Second
	for failures, want := range []time.Duration{lo, 2 * lo, 4 * lo, 8 * lo} {
		for range 50 {
			if d := backoff(failures, lo, hi); d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", failures, d, want/2, want)
			}
		}
	}
	for _, failures := range []int{7, 30, 64, 1000} {
		if d := backoff(failures, lo, hi); d < hi/2 || d > hi {
			t.Errorf("backoff(%d) = %v, want capped at %v", failures, d, hi)
		}
	}
}

func TestResumePoint(t *testing.T) {
	c := NewClient(Config{}, NewAggregator(indexOf(testScenario()), "", time.Minute, nil))
	start := t0.Add(time.Hour)
	if got := c.resumeFrom(start); !got.Equal(start) {
		t.Errorf("no flow seen: resume from %v, want the session start %v", got, start)
	}
	mark := func(node string, at time.Time) {
		f := flowOf(node, bertWorker, bertCoord, flowpb.Verdict_FORWARDED, eventTrace)
		f.NodeName, f.Time = node, timestamppb.New(at)
		x := FieldsOf(f)
		c.seen(&x)
	}
	mark("a", t0.Add(10*time.Second))
	mark("b", t0.Add(20*time.Second))
	if got := c.resumeFrom(start); !got.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("resume from %v, want the oldest node's mark", got)
	}
	mark("b", t0.Add(5*time.Minute))
	if got := c.resumeFrom(start); !got.Equal(t0.Add(4 * time.Minute)) {
		t.Errorf("resume from %v, want at most a minute before the newest mark", got)
	}
	// After a reconnect, a node's flows are skipped until the replay has
	// passed its last counted flow; then its flows count, whatever their
	// time (a clock that stepped back).
	c.resumed = true
	c.freezeMarks()
	for _, tc := range []struct {
		node string
		at   time.Time
		skip bool
	}{
		{"a", t0.Add(10 * time.Second), true},
		{"a", t0.Add(11 * time.Second), false},
		{"a", t0.Add(10 * time.Second), false},
		{"b", t0.Add(3 * time.Minute), true},
		{"c", t0, false},
	} {
		f := flowOf(tc.node, bertWorker, bertCoord, flowpb.Verdict_FORWARDED, eventTrace)
		f.NodeName, f.Time = tc.node, timestamppb.New(tc.at)
		x := FieldsOf(f)
		if got := c.seen(&x); got != tc.skip {
			t.Errorf("flow of %s at %v: skipped %v, want %v", tc.node, tc.at.Sub(t0), got, tc.skip)
		}
	}
}

// Relay with mutual TLS: the client verifies the server name against the
// CA and presents its certificate.
func TestRelayMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCert(t, nil, nil, "zonewatch test CA", true)
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", ca.Raw)
	srvCert, srvKey := newCert(t, ca, caKey, "*.hubble-relay.cilium.io", false)
	cliCert, cliKey := newCert(t, ca, caKey, "zonewatch", false)
	writePEM(t, filepath.Join(dir, "client.crt"), "CERTIFICATE", cliCert.Raw)
	der, err := x509.MarshalECPrivateKey(cliKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "client.key"), "EC PRIVATE KEY", der)

	pool := x509.NewCertPool()
	pool.AddCert(ca)
	serverTLS := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{srvCert.Raw}, PrivateKey: srvKey}},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS12,
	}
	s := testScenario()
	h := sim.NewHubble(s, "", 0)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Serve(lis, grpc.Creds(credentials.NewTLS(serverTLS))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)

	good := TLSConfig{Enabled: true, CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "client.crt"),
		KeyFile: filepath.Join(dir, "client.key"), ServerName: "ui.hubble-relay.cilium.io"}
	run := func(cfg TLSConfig, logger *slog.Logger) (*Client, *Aggregator, context.CancelFunc) {
		agg := NewAggregator(indexOf(s), "", time.Minute, nil)
		c := NewClient(Config{Address: lis.Addr().String(), TLS: cfg, Since: t0.Add(-time.Second),
			BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond, Logger: logger}, agg)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		return c, agg, func() { cancel(); <-done }
	}
	c, agg, stop := run(good, nil)
	defer stop()
	h.Generate(t0, 2*time.Second)
	waitFor(t, "drops over mutual TLS", func() bool { return agg.Drops().Value(blockedDrops) == 4 })
	if !c.Up() {
		t.Error("not up")
	}

	noCert := good
	noCert.CertFile, noCert.KeyFile = "", ""
	wrongName := good
	wrongName.ServerName = "relay.example.com"
	for name, cfg := range map[string]TLSConfig{"no client certificate": noCert, "wrong server name": wrongName} {
		// Not a sleep: wait until the client has failed twice, then it
		// must still be down with nothing counted.
		var failed failures
		c, agg, stop := run(cfg, slog.New(&failed))
		waitFor(t, name+": two failed connection attempts", func() bool { return failed.n.Load() >= 2 })
		stop()
		if c.Up() || agg.Drops().Len() != 0 {
			t.Errorf("%s: connected", name)
		}
	}
	if _, err := transportCredentials(TLSConfig{Enabled: true, CertFile: good.CertFile}); err == nil {
		t.Error("a certificate without its key accepted")
	}
	if _, err := transportCredentials(TLSConfig{Enabled: true, CAFile: filepath.Join(dir, "client.key")}); err == nil {
		t.Error("a CA file without certificates accepted")
	}
}

// failures is a slog handler counting the client's log lines that carry an
// error: one per failed connection attempt.
type failures struct{ n atomic.Int32 }

func (f *failures) Enabled(context.Context, slog.Level) bool { return true }
func (f *failures) WithAttrs([]slog.Attr) slog.Handler       { return f }
func (f *failures) WithGroup(string) slog.Handler            { return f }
func (f *failures) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			f.n.Add(1)
		}
		return true
	})
	return nil
}

func newCert(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, name string, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:        isCA, BasicConstraintsValid: true,
	}
	if !isCA {
		tmpl.DNSNames = []string{name}
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
