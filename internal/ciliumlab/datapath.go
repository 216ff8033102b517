package ciliumlab

import (
	"fmt"
	"net/netip"
)

// Routing is how a pod's packets reach a pod on another node.
type Routing string

const (
	// RoutingTunnel: VXLAN between the nodes (the default; Cilium's own).
	RoutingTunnel Routing = "tunnel"
	// RoutingNative: no encapsulation; the nodes share the lab's bridge
	// (one L2 segment) and the agents install a route to each other
	// node's pod CIDR via that node's IP (auto-direct-node-routes).
	RoutingNative Routing = "native"
)

// ServiceLB is what translates a Service's ClusterIP to a backend.
type ServiceLB string

const (
	// ServiceLBNone: no kube-proxy replacement and no kube-proxy (the
	// lab's default before Services: nothing it tests uses one).
	ServiceLBNone ServiceLB = ""
	// ServiceLBSocket: kube-proxy replacement with its default socket LB
	// (cgroup/connect4 translates the VIP at connect, before any packet).
	ServiceLBSocket ServiceLB = "socket"
	// ServiceLBTC: kube-proxy replacement without socket LB
	// (--bpf-lb-sock=false): bpf_lxc translates each packet at tc.
	ServiceLBTC ServiceLB = "tc"
	// ServiceLBKubeProxy: no kube-proxy replacement; the real kube-proxy
	// (iptables mode) runs on every node and DNATs in the node's stack,
	// after Cilium's bpf_lxc has seen the packet to the VIP.
	ServiceLBKubeProxy ServiceLB = "kube-proxy"
)

// nativeCIDR holds every node's pod CIDR (podCIDR): traffic to it is not
// masqueraded and is routed natively.
var nativeCIDR = netip.MustParsePrefix("10.214.0.0/16")

// PodCIDRs is the range of every node's pod CIDR.
func PodCIDRs() netip.Prefix { return nativeCIDR }

// routingArgs are the agent flags of the routing mode.
func (c *Config) routingArgs() ([]string, error) {
	switch c.Routing {
	case "", RoutingTunnel:
		return []string{"--routing-mode=tunnel", "--tunnel-protocol=vxlan"}, nil
	case RoutingNative:
		return []string{"--routing-mode=native", "--ipv4-native-routing-cidr=" + nativeCIDR.String(),
			"--auto-direct-node-routes=true"}, nil
	}
	return nil, fmt.Errorf("routing mode %q: want %q or %q", c.Routing, RoutingTunnel, RoutingNative)
}

// serviceArgs are the agent flags of the Service path.
func (c *Config) serviceArgs() ([]string, error) {
	switch c.ServiceLB {
	case ServiceLBNone, ServiceLBKubeProxy:
		return []string{"--kube-proxy-replacement=false"}, nil
	case ServiceLBSocket:
		return []string{"--kube-proxy-replacement=true"}, nil
	case ServiceLBTC:
		return []string{"--kube-proxy-replacement=true", "--bpf-lb-sock=false"}, nil
	}
	return nil, fmt.Errorf("service LB %q: want %q, %q, %q or none", c.ServiceLB, ServiceLBSocket, ServiceLBTC, ServiceLBKubeProxy)
}
