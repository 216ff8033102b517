package testenv

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreePort returns a loopback TCP port that was free a moment ago, for a
// process the test starts to listen on. It is taken below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default),
// never from it: a port the kernel hands out (":0") is also what it gives
// the next outgoing connection of any process on the machine, so between
// this check and the child's bind another test's client could hold it
// ("bind: address already in use": seen with Kueue's webhook port while
// parallel tests each started a bed). Each port is handed out once per test
// binary; another test binary picking the same port in the same moment is
// the one race left (about 1 in 20,000 per pick).
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := portRange()
	for range 1000 {
		p := lo + rand.IntN(hi-lo)
		ports.Lock()
		taken := ports.given[p]
		ports.Unlock()
		if taken {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		ports.Lock()
		if ports.given[p] {
			ports.Unlock()
			continue
		}
		ports.given[p] = true
		ports.Unlock()
		return p
	}
	t.Fatalf("no free loopback port in %d-%d after 1000 tries", lo, hi)
	return 0
}

var ports = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// portRange is the range FreePort picks from: 10000 up to the start of the
// ephemeral range (or 32768 when it cannot be read or leaves too little).
func portRange() (lo, hi int) {
	lo, hi = 10000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	if start, err := strconv.Atoi(f[0]); err == nil && start-lo >= 4096 {
		hi = start
	}
	return lo, hi
}
