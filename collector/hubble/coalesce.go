package hubble

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
)

// DefaultReadCoalesce is the longest the stream's connection waits, after
// a read that emptied the socket, before it reads again. A node sends its
// flows one at a time at the rates of real traffic: without the wait each
// flow is a read and wake-ups of gRPC's reader, the receiving goroutine
// and the runtime's sysmon, about 100 us of the exporter's CPU a flow at
// 500 flows/s against the decoder's 0.8 (BenchmarkRealPath,
// docs/performance.md). Counters are scraped every 15 s or more, so the
// delay is not seen.
const DefaultReadCoalesce = 50 * time.Millisecond

// coalescingCreds wraps transport credentials so that the connection gRPC
// reads from coalesces short reads (coalescingConn); gRPC's own dialer
// (proxy, TCP keepalive) is kept.
type coalescingCreds struct {
	credentials.TransportCredentials
	wait time.Duration
}

func (c coalescingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return conn, info, err
	}
	return &coalescingConn{Conn: conn, wait: c.wait}, info, nil
}

func (c coalescingCreds) Clone() credentials.TransportCredentials {
	return coalescingCreds{c.TransportCredentials.Clone(), c.wait}
}

// coalescingConn delays a read that follows a short one, so that what the
// server sent meanwhile is read at once. The wait adapts: a read after a
// wait that fills the buffer means more gathered than one read takes (a
// busy node), and the wait is cut to a quarter; a short read doubles it
// again, up to wait. So at low rates the flows of wait share a read, and
// at high ones a wait gathers about one buffer, well within the kernel's
// socket buffer, and the server is not slowed (it would block, and its
// ring overrun). Only gRPC's reader goroutine reads a connection.
type coalescingConn struct {
	net.Conn
	wait, cur time.Duration
	next      time.Time
}

func (c *coalescingConn) Read(p []byte) (int, error) {
	waited := false
	if !c.next.IsZero() {
		if d := time.Until(c.next); d > 0 {
			time.Sleep(d)
			waited = true
		}
	}
	n, err := c.Conn.Read(p)
	c.next = time.Time{}
	switch full := n == len(p); {
	case full && waited:
		c.cur /= 4
	case !full:
		c.cur = min(c.wait, max(2*c.cur, time.Millisecond))
		c.next = time.Now().Add(c.cur)
	}
	return n, err
}
