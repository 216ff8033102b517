package ciliumlab

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"time"
)

// RelayPort is where StartRelay's hubble-relay listens (the chart's
// container port; its Service maps 80 to it).
const RelayPort = "4245"

// StartRelay runs hubble-relay in node n, as the chart's Deployment does:
// it finds the agents through the node agent's peer service (the Hubble
// socket) and follows every node's Hubble on :4244, without TLS (the lab's
// agents serve it plain, Config.Relay). It returns the address on the
// bridge once Relay accepts connections.
func (l *Lab) StartRelay(ctx context.Context, n *Node) (string, *Proc, error) {
	if !l.cfg.Relay {
		return "", nil, fmt.Errorf("the lab's agents do not serve Hubble on :4244: start it with Config.Relay")
	}
	p, err := n.Start("hubble-relay", nil, filepath.Join(l.cfg.Cilium, "hubble-relay"), "serve",
		"--peer-service=unix://"+l.HubbleSocket(),
		"--listen-address=:"+RelayPort,
		"--cluster-name=default",
		"--disable-client-tls", "--disable-server-tls")
	if err != nil {
		return "", nil, err
	}
	addr := net.JoinHostPort(n.IP.String(), RelayPort)
	err = n.poll(ctx, time.Minute, "hubble-relay listening", func() (bool, string) {
		if ok, err := p.Exited(); ok {
			return false, fmt.Sprintf("exited: %v: %s", err, tailFile(p.Log, 2000))
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	return addr, p, err
}
