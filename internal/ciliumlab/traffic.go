package ciliumlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// RendezvousPort is torchrun's c10d store port on the coordinator.
const RendezvousPort = 29500

// Exchange is what a job's processes do: each worker connects to the
// coordinator's rendezvous port and, per step, sends Up bytes and reads
// Down bytes back.
type Exchange struct {
	Up, Down int
	Steps    int
	// DialTimeout bounds one connection attempt. Below the kernel's first
	// SYN retransmission (1 s), a blocked attempt is exactly one SYN.
	DialTimeout time.Duration
	// Addr, when set, is where the workers connect instead of the
	// coordinator's pod IP and RendezvousPort: a Service's VIP and port
	// (Service.Addr) in front of it.
	Addr string
}

// Result is the ground truth of an exchange: what the processes sent and
// received, by direction.
type Result struct {
	// Payload is application bytes by "src pod ref -> dst pod ref",
	// counted where they were read (what reached the peer).
	Payload map[string]int64
	// Attempts and Failed count connection attempts and those that did not
	// connect (dropped SYNs in a hard block); Errors counts the failures by
	// error text.
	Attempts, Failed int
	Errors           map[string]int
}

// Server is a coordinator's rendezvous listener.
type Server struct {
	pod  *Pod
	ln   net.Listener
	down int
	up   int
	wg   sync.WaitGroup
	mu   sync.Mutex
	got  map[string]int64 // remote IP -> bytes read
	sent map[string]int64 // remote IP -> bytes written
}

// Serve starts the coordinator's listener on RendezvousPort.
func (p *Pod) Serve(up, down int) (*Server, error) { return p.ServePort(RendezvousPort, up, down) }

// ServePort starts a listener on port that, per step, reads up bytes and
// writes down bytes back (a coordinator, a dataset server).
func (p *Pod) ServePort(port, up, down int) (*Server, error) {
	ln, err := p.Listen(port)
	if err != nil {
		return nil, err
	}
	s := &Server{pod: p, ln: ln, up: up, down: down, got: map[string]int64{}, sent: map[string]int64{}}
	p.lab.onUndo("listener of "+p.Ref(), s.Close)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.handle(c) }()
		}
	}()
	return s, nil
}

func (s *Server) handle(c net.Conn) {
	defer c.Close()
	peer, _, _ := net.SplitHostPort(c.RemoteAddr().String())
	in, out := make([]byte, s.up), make([]byte, s.down)
	for {
		n, err := io.ReadFull(c, in)
		s.add(s.got, peer, n)
		if err != nil {
			return
		}
		m, err := c.Write(out)
		s.add(s.sent, peer, m)
		if err != nil {
			return
		}
	}
}

func (s *Server) add(m map[string]int64, k string, n int) {
	s.mu.Lock()
	m[k] += int64(n)
	s.mu.Unlock()
}

// Close stops the listener and waits for its connections to end.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Sent returns the bytes the server wrote to ip.
func (s *Server) Sent(ip string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent[ip]
}

// Received returns the bytes the coordinator read from ip.
func (s *Server) Received(ip string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[ip]
}

// Run makes each worker try to connect attempts times (stopping at the
// first success) and, once connected, exchange the steps. Workers run
// together; Run returns when all are done.
func (e Exchange) Run(ctx context.Context, coordinator *Pod, workers []*Pod, attempts int) Result {
	res := Result{Payload: map[string]int64{}, Errors: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	addr := net.JoinHostPort(coordinator.IP.String(), strconv.Itoa(RendezvousPort))
	if e.Addr != "" {
		addr = e.Addr
	}
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c net.Conn
			for i := 0; i < attempts && ctx.Err() == nil; i++ {
				var err error
				c, err = w.Dial(addr, e.DialTimeout)
				mu.Lock()
				res.Attempts++
				if err != nil {
					res.Failed++
					res.Errors[errText(err)]++
				}
				mu.Unlock()
				if err == nil {
					break
				}
			}
			if c == nil {
				return
			}
			defer c.Close()
			up, down := make([]byte, e.Up), make([]byte, e.Down)
			var sent, got int64
			for i := 0; i < e.Steps && ctx.Err() == nil; i++ {
				n, err := c.Write(up)
				sent += int64(n)
				if err != nil {
					break
				}
				m, err := io.ReadFull(c, down)
				got += int64(m)
				if err != nil {
					break
				}
			}
			mu.Lock()
			res.Payload[w.Ref()+" -> "+coordinator.Ref()] += sent
			res.Payload[coordinator.Ref()+" -> "+w.Ref()] += got
			mu.Unlock()
		}()
	}
	wg.Wait()
	return res
}

// errText is an error without its addresses (ports vary).
func errText(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Op + ": " + op.Err.Error()
	}
	return err.Error()
}

// String is one line per direction.
func (r Result) String() string {
	s := fmt.Sprintf("%d attempts, %d failed", r.Attempts, r.Failed)
	for k, v := range r.Payload {
		s += fmt.Sprintf("; %s: %d B", k, v)
	}
	return s
}
