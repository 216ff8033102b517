package ciliumlab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// HubblePort is where the agents serve Hubble's gRPC over the network
// (Cilium's hubble.listenAddress, ":4244"): plain text with Config.Relay,
// TLS with mutual authentication with Config.HubbleTLS.
const HubblePort = "4244"

// DefaultHubbleSocketDir is the folder of the agent's Hubble socket when
// Config.HubbleSocketDir is empty: Cilium's default
// (/var/run/cilium/hubble.sock), beside the agent's API socket cilium.sock.
const DefaultHubbleSocketDir = "/var/run/cilium"

// HubbleTLSFiles are the PEM files of the lab's Hubble TLS (Config.HubbleTLS),
// as Cilium's Helm chart issues them (hubble.tls.auto): one CA signs each
// agent's server certificate, for <node>.<cluster>.hubble-grpc.cilium.io,
// and the client certificates the agents accept (Relay's,
// hubble-relay-client-certs; here the exporter's).
type HubbleTLSFiles struct {
	CA         string // ca.crt: verifies the agents, and the agents' client CA
	ClientCert string // a client certificate the agents accept
	ClientKey  string
	dir        string
}

// ServerName is the name an agent's Hubble certificate carries (Cilium's
// certgen: "*.<cluster>.hubble-grpc.cilium.io"; the lab's cluster is
// "default").
func ServerName(node string) string { return node + ".default.hubble-grpc.cilium.io" }

func (f *HubbleTLSFiles) serverFiles(node string) (cert, key string) {
	return filepath.Join(f.dir, node+".crt"), filepath.Join(f.dir, node+".key")
}

// HubbleTLS returns the lab's Hubble TLS files (nil without Config.HubbleTLS).
func (l *Lab) HubbleTLS() *HubbleTLSFiles { return l.tls }

// HubbleSocket is the path of an agent's Hubble socket in its node.
func (l *Lab) HubbleSocket() string {
	dir := l.cfg.HubbleSocketDir
	if dir == "" {
		dir = DefaultHubbleSocketDir
	}
	return filepath.Join(dir, "hubble.sock")
}

// issueHubbleTLS writes a CA, one server certificate per node and a client
// certificate into dir.
func issueHubbleTLS(dir string, nodes []NodeSpec) (*HubbleTLSFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f := &HubbleTLSFiles{CA: filepath.Join(dir, "ca.crt"), ClientCert: filepath.Join(dir, "client.crt"),
		ClientKey: filepath.Join(dir, "client.key"), dir: dir}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hubble-ca.cilium.io"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, dns []string, certPath, keyPath string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyPath, "EC PRIVATE KEY", kb)
	}
	for i, n := range nodes {
		cert, key := f.serverFiles(n.Name)
		if err := issue(int64(10+i), ServerName(n.Name), x509.ExtKeyUsageServerAuth, []string{ServerName(n.Name)}, cert, key); err != nil {
			return nil, fmt.Errorf("hubble server certificate of %s: %w", n.Name, err)
		}
	}
	if err := issue(2, "zonewatch.hubble-grpc-client.cilium.io", x509.ExtKeyUsageClientAuth, nil, f.ClientCert, f.ClientKey); err != nil {
		return nil, fmt.Errorf("hubble client certificate: %w", err)
	}
	return f, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
