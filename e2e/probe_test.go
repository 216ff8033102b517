package e2e

import (
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

var probePortOnce struct {
	sync.Mutex
	port int
}

// probeArgs has an exporter serve its probe echo on its pod IP (the host
// of addr, see exporterAddr) at one port every exporter shares, as a
// DaemonSet's pods do, and probe its peers (the exporter pod objects) every
// two seconds.
func probeArgs(t *testing.T, addr string) []string {
	t.Helper()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &probePortOnce
	p.Lock()
	defer p.Unlock()
	for p.port == 0 {
		p.port = testenv.FreePort(t)
		for i := range 200 {
			if !free("127.0.0."+strconv.Itoa(10+i), p.port) {
				p.port = 0
				break
			}
		}
	}
	port := strconv.Itoa(p.port)
	return []string{"--probe.listen-address=" + net.JoinHostPort(host, port), "--probe.port=" + port, "--probe.interval=2s", "--probe.timeout=1s"}
}
