package testenv

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortOutsideEphemeralRange: every port is outside the range the
// kernel gives outgoing connections, bindable when returned, and never
// handed out twice by one test binary.
func TestFreePortOutsideEphemeralRange(t *testing.T) {
	lo, hi := portRange()
	if lo < 1024 || hi <= lo {
		t.Fatalf("range %d-%d", lo, hi)
	}
	seen := map[int]bool{}
	for range 300 {
		p := FreePort(t)
		if p < lo || p >= hi {
			t.Fatalf("port %d outside %d-%d", p, lo, hi)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
	// The kernel's own choice (":0") is in the ephemeral range, which
	// FreePort avoids.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p := l.Addr().(*net.TCPAddr).Port; p >= lo && p < hi {
		t.Errorf("the kernel gave %d, inside FreePort's range %d-%d: the ranges overlap", p, lo, hi)
	}
}
