package ciliumlab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Service is a ClusterIP Service the lab made, with the EndpointSlice a
// controller manager would have made for it (the lab runs none).
type Service struct {
	Namespace, Name string
	// ClusterIP is the VIP the apiserver allocated.
	ClusterIP netip.Addr
	Port      int
	Backends  []*Pod
}

// Ref is namespace/name.
func (s *Service) Ref() string { return s.Namespace + "/" + s.Name }

// Addr is the VIP and port, for Dial.
func (s *Service) Addr() string {
	return net.JoinHostPort(s.ClusterIP.String(), strconv.Itoa(s.Port))
}

// AddService creates a ClusterIP Service on port (to the same target port)
// and its EndpointSlice with the backends, ready, each with its node and
// zone, as the EndpointSlice controller writes them (label
// kubernetes.io/service-name, managed-by the controller). Close deletes
// both.
func (l *Lab) AddService(ctx context.Context, namespace, name string, port int, backends ...*Pod) (*Service, error) {
	if err := l.EnsureNamespace(ctx, namespace); err != nil {
		return nil, err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{"zonewatch-lab/service": name},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: int32(port),
				TargetPort: intstr.FromInt32(int32(port))}},
		},
	}
	created, err := l.Client.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating Service %s/%s: %w", namespace, name, err)
	}
	l.onUndo("Service "+namespace+"/"+name, func() error {
		return l.Client.CoreV1().Services(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	vip, err := netip.ParseAddr(created.Spec.ClusterIP)
	if err != nil {
		return nil, fmt.Errorf("Service %s/%s: ClusterIP %q: %w", namespace, name, created.Spec.ClusterIP, err)
	}
	yes := true
	tcp := corev1.ProtocolTCP
	pname := "tcp"
	p32 := int32(port)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name + "-lab",
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: created.UID,
				Controller: &yes, BlockOwnerDeletion: &yes}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Protocol: &tcp, Port: &p32}},
	}
	for _, b := range backends {
		node, zone := b.Node.Name, b.Node.Zone
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{b.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes},
			NodeName:   &node, Zone: &zone,
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: b.Spec.Namespace, Name: b.Spec.Name, UID: b.UID},
		})
	}
	if _, err := l.Client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the EndpointSlice of %s/%s: %w", namespace, name, err)
	}
	l.onUndo("EndpointSlice "+namespace+"/"+slice.Name, func() error {
		return l.Client.DiscoveryV1().EndpointSlices(namespace).Delete(context.Background(), slice.Name, metav1.DeleteOptions{})
	})
	s := &Service{Namespace: namespace, Name: name, ClusterIP: vip, Port: port, Backends: backends}
	l.Logf("service %s: %s -> %d backends", s.Ref(), s.Addr(), len(backends))
	return s, nil
}

// WaitService waits until every node's datapath translates the Service:
// with kube-proxy replacement the agent lists the frontend with every
// backend active (GET /v1/service); with kube-proxy, the node's nat table
// has the Service's rule.
func (l *Lab) WaitService(ctx context.Context, s *Service) error {
	for _, n := range l.Nodes {
		var err error
		if l.cfg.ServiceLB == ServiceLBKubeProxy {
			err = n.poll(ctx, time.Minute, "kube-proxy rule of "+s.Ref(), func() (bool, string) {
				out, err := output(ctx, nil, "nsenter", "-t", strconv.Itoa(n.holder.Process.Pid), "-n", "-m", "--",
					"iptables-save", "-t", "nat")
				if err != nil {
					return false, err.Error()
				}
				return strings.Contains(string(out), "-d "+s.ClusterIP.String()+"/32"), "no rule for " + s.ClusterIP.String()
			})
		} else {
			err = n.poll(ctx, time.Minute, "service "+s.Ref(), func() (bool, string) {
				active, detail := n.serviceBackends(ctx, s)
				return active == len(s.Backends), detail
			})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// serviceBackends counts the active backends the agent has for the
// Service's frontend.
func (n *Node) serviceBackends(ctx context.Context, s *Service) (int, string) {
	var svcs []struct {
		Spec struct {
			FrontendAddress struct {
				IP   string `json:"ip"`
				Port int    `json:"port"`
			} `json:"frontend-address"`
			BackendAddresses []struct {
				IP    string `json:"ip"`
				State string `json:"state"`
			} `json:"backend-addresses"`
		} `json:"spec"`
	}
	if err := n.getJSON(ctx, "/v1/service", &svcs); err != nil {
		return 0, err.Error()
	}
	for _, sv := range svcs {
		if sv.Spec.FrontendAddress.IP != s.ClusterIP.String() || sv.Spec.FrontendAddress.Port != s.Port {
			continue
		}
		active := 0
		for _, b := range sv.Spec.BackendAddresses {
			if b.State == "" || b.State == "active" {
				active++
			}
		}
		return active, fmt.Sprintf("%d of %d backends active", active, len(sv.Spec.BackendAddresses))
	}
	return 0, fmt.Sprintf("no frontend %s among %d services", s.Addr(), len(svcs))
}

// startKubeProxy runs the real kube-proxy (iptables mode) in the node's
// network and mount namespaces against the apiserver, as its DaemonSet
// does on a node (no kubelet needed): it watches Services and
// EndpointSlices and writes the node's nat table. Sysctls outside the
// node's network namespace are left alone (conntrack sizes and timeouts).
func (n *Node) startKubeProxy(ctx context.Context, bin string) error {
	kc, err := n.lab.Kubeconfig(n.Name+"-kube-proxy", n.lab.cfg.API.BearerToken)
	if err != nil {
		return err
	}
	p, err := n.Start("kube-proxy", nil, bin,
		"--kubeconfig="+kc, "--hostname-override="+n.Name, "--proxy-mode=iptables",
		"--cluster-cidr="+nativeCIDR.String(),
		"--metrics-bind-address="+net.JoinHostPort(n.IP.String(), "10249"),
		"--healthz-bind-address="+net.JoinHostPort(n.IP.String(), "10256"),
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--iptables-localhost-nodeports=false")
	if err != nil {
		return err
	}
	return n.poll(ctx, time.Minute, "kube-proxy healthy", func() (bool, string) {
		if ok, err := p.Exited(); ok {
			return false, fmt.Sprintf("exited (%v): %s", err, tailFile(p.Log, 2000))
		}
		c := &net.Dialer{Timeout: time.Second}
		conn, err := c.DialContext(ctx, "tcp", net.JoinHostPort(n.IP.String(), "10256"))
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	})
}

// kubeProxyBin is kube-proxy beside the Cilium folder (.tools/bin).
func (c *Config) kubeProxyBin() string {
	if c.KubeProxy != "" {
		return c.KubeProxy
	}
	return filepath.Join(filepath.Dir(c.Cilium), "kube-proxy")
}
