package sim

import (
	"context"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/zonewatch/zonewatch/collector/probe"
)

// ZoneDelay is the one-way delay the simulation adds between zones: a
// probe's round trip across zones is about twice this longer than within.
const ZoneDelay = 500 * time.Microsecond

// ProbePeers starts one real probe echo server on loopback for each of the
// scenario's nodes other than from (the first node when from is empty),
// the peers in other zones behind a relay that holds each packet
// ZoneDelay each way. It returns the node probing and its peers; the
// servers stop with ctx.
func (s *Scenario) ProbePeers(ctx context.Context, from string) (string, []probe.Peer, error) {
	if from == "" {
		from = s.Nodes[0].Name
	}
	self := s.NodeByName(from)
	if self == nil {
		return "", nil, nil
	}
	var peers []probe.Peer
	for _, n := range s.Nodes {
		if n.Name == from {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		go probe.Serve(ctx, l, slog.New(slog.DiscardHandler))
		addr := l.Addr().String()
		if n.Zone != self.Zone {
			if addr, err = delayRelay(ctx, addr); err != nil {
				return "", nil, err
			}
		}
		peers = append(peers, probe.Peer{Node: n.Name, Zone: n.Zone, Addr: addr})
	}
	return from, peers, nil
}

// delayRelay forwards TCP to target, holding what it reads in each
// direction for ZoneDelay.
func delayRelay(ctx context.Context, target string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go hold(u, c)
				hold(c, u)
			}()
		}
	}()
	return l.Addr().String(), nil
}

func hold(dst io.Writer, src io.Reader) {
	buf := make([]byte, 512)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		time.Sleep(ZoneDelay)
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}
