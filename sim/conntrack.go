package sim

import (
	"net/netip"
	"time"

	"github.com/zonewatch/zonewatch/collector/conntrack"
)

// CTEntry is one generated Cilium conntrack entry, in original direction:
// Src opened the connection to Dst. Counters are totals since the
// connection opened, per direction; how they land in a ct_entry depends on
// the Cilium version (see Encode). As on Cilium v1.20.2 agents (issue 26's
// lab), both entries of a connection store the opener's address first
// (the key's fields are named for the reply direction) and the ports in
// original order, and both carry the opener's security identity.
type CTEntry struct {
	Node             string // the node whose CT map holds the entry
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8 // 6 TCP, 17 UDP
	// Ingress: created on Dst's node when the connection arrived
	// (TUPLE_F_IN); otherwise on Src's node when it left (TUPLE_F_OUT).
	Ingress bool
	// Service: a load-balancer entry (TUPLE_F_SERVICE), which tracks no
	// connection of its own.
	Service bool
	// Related: the ICMP entry (TUPLE_F_RELATED, ports 0) that ct_create4
	// writes next to every new connection's entry so that ICMP errors about
	// it pass; its counters are the connection's first packet up to 1.15
	// and zero from 1.16 (bpf/lib/conntrack.h, v1.15.19 and v1.20.2).
	Related                   bool
	SentBytes, ReplyBytes     uint64 // Src -> Dst, Dst -> Src
	SentPackets, ReplyPackets uint64
	// SrcIdentity is the opener's security identity, the entry's
	// src_sec_id: its endpoint's on egress (SECLABEL), the packet's source
	// identity on ingress.
	SrcIdentity uint32
}

// Security identities of the generated entries (pkg/identity, v1.20.2):
// reserved ones for the host network and the world; pods get identities
// from identityPods up, one per job (its pods share labels) and one per
// other pod.
const (
	identityHost  = 1
	identityWorld = 2
	identityPods  = 30000
)

// Simulated TCP: full segments of ctMSS payload plus ctHeaders of
// Ethernet/IP/TCP headers each; the receiver ACKs every second segment.
const (
	ctMSS          = 1448
	ctHeaders      = 66
	worldBytesRate = 100e3 // what each non-job pod sends to the internet
	healthRate     = 200   // cilium-health probes between every two nodes
	healthPort     = 4240
)

// kubeDNS is the ClusterIP of the simulated DNS service.
var kubeDNS = netip.AddrFrom4([4]byte{10, 96, 0, 10})

// ConntrackEntries returns the conntrack entries that node's Cilium holds
// elapsed after the scenario started, matching the connections the fake
// Hubble shows: every job worker keeps one TCP connection to its
// coordinator's rendezvous port and sends Behaviour.BytesPerSecond on it
// (a job whose cross-zone traffic a policy blocks has no connection, so no
// entry), non-job pods send to the internet, and the first non-job pod
// has a DNS service (load-balancer) entry. A connection a pod opens has
// an egress entry on its node and an ingress entry on the acceptor's.
// Connections opened by a node's host network have only the acceptor's
// ingress entry (Cilium conntracks host traffic only with its host
// firewall), from the node's cilium_host address: every node's
// cilium-health prober (the agent, in the host network) probes every
// other node's health endpoint, with identity world as issue 26's lab saw
// on the router address (remote-node is as likely); and the host network
// of a traffic-moving job's coordinator's node (a hostNetwork data loader,
// the kubelet) keeps a connection to it, identity host. These two do not
// show in the fake Hubble. An empty node returns every node's entries.
func (s *Scenario) ConntrackEntries(node string, elapsed time.Duration) []CTEntry {
	secs := elapsed.Seconds()
	var out []CTEntry
	add := func(e CTEntry, srcNode, dstNode string, bytesPerSecond float64) {
		payload := uint64(bytesPerSecond * secs)
		segs := (payload + ctMSS - 1) / ctMSS
		acks := (segs + 1) / 2
		// +1 packet each way for the SYN and SYN-ACK.
		e.SentPackets, e.SentBytes = segs+1, payload+(segs+1)*ctHeaders
		e.ReplyPackets, e.ReplyBytes = acks+1, (acks+1)*ctHeaders
		// The related entry, made with the connection's entry (the same
		// ct_entry, src_sec_id included): its first packet (the SYN) only.
		rel := CTEntry{Src: e.Src, Dst: e.Dst, Proto: 1, Related: true, SentPackets: 1, SentBytes: ctHeaders, SrcIdentity: e.SrcIdentity}
		if srcNode != "" && (node == "" || srcNode == node) {
			e.Node, rel.Node = srcNode, srcNode
			out = append(out, e, rel)
		}
		if dstNode != "" && (node == "" || dstNode == node) {
			e.Node, e.Ingress = dstNode, true
			rel.Node, rel.Ingress = dstNode, true
			out = append(out, e, rel)
		}
	}
	for ji := range s.Jobs {
		j := &s.Jobs[ji]
		b := j.Behaviour
		c := j.Coordinator()
		id := uint32(identityPods + ji)
		for wi := range j.Pods {
			w := &j.Pods[wi]
			if w == c || b.BytesPerSecond <= 0 || (b.BlockedBy != "" && s.zoneOf(w) != s.zoneOf(c)) {
				continue
			}
			add(CTEntry{Src: w.IP, Dst: c.IP, SrcPort: uint16(ephemeralPort(w, c)), DstPort: rendezvousPort, Proto: 6, SrcIdentity: id},
				w.Node, c.Node, b.BytesPerSecond)
		}
		if b.BytesPerSecond > 0 && b.BlockedBy == "" {
			if n := s.NodeByName(c.Node); n != nil {
				add(CTEntry{Src: RouterIP(n), Dst: c.IP, SrcPort: hostOpenerPort, DstPort: rendezvousPort, Proto: 6, SrcIdentity: identityHost},
					"", c.Node, HostOpenerRate)
			}
		}
	}
	for i := range s.Others {
		p := &s.Others[i]
		add(CTEntry{Src: p.IP, Dst: worldIP, SrcPort: uint16(ephemeralPort(p, p)), DstPort: httpsPort, Proto: 6,
			SrcIdentity: uint32(identityPods + len(s.Jobs) + i)}, p.Node, "", worldBytesRate)
	}
	for i := range s.Nodes {
		for j := range s.Nodes {
			a, b := &s.Nodes[i], &s.Nodes[j]
			if a == b {
				continue
			}
			add(CTEntry{Src: RouterIP(a), Dst: healthIP(b), SrcPort: uint16(33000 + j), DstPort: healthPort, Proto: 6, SrcIdentity: identityWorld},
				"", b.Name, healthRate)
		}
	}
	if len(s.Others) > 0 && (node == "" || s.Others[0].Node == node) {
		// The socket-LB entry of a DNS lookup: its counters repeat the
		// connection's and must not be counted.
		p := &s.Others[0]
		out = append(out, CTEntry{Node: p.Node, Src: p.IP, Dst: kubeDNS, SrcPort: 53000, DstPort: 53, Proto: 17, Service: true,
			SentBytes: uint64(120 * secs), SentPackets: uint64(2 * secs)})
	}
	return out
}

// HostOpenerRate is what a job coordinator's node's host network sends it
// (payload per second), and hostOpenerPort that connection's port there.
const (
	HostOpenerRate = 2000
	hostOpenerPort = 45000
)

// RouterIP is the node's cilium_host address, the first of its pod CIDR:
// the source of what its host network sends to pods (tunnel routing).
func RouterIP(n *Node) netip.Addr { return n.PodCIDR.Addr().Next() }

// healthIP is the node's cilium-health endpoint: an address of its pod
// CIDR that no simulated pod gets.
func healthIP(n *Node) netip.Addr {
	a := n.PodCIDR.Addr().As4()
	a[3] = 250
	return netip.AddrFrom4(a)
}

func (s *Scenario) zoneOf(p *Pod) string {
	if n := s.NodeByName(p.Node); n != nil {
		return n.Zone
	}
	return ""
}

// Encode lays a generated entry out as Cilium stores it. Combined (1.16
// and later) counts both directions in one pair; split (before 1.16)
// counts what the entry's local endpoint sent (tx) and received (rx).
func (e CTEntry) Encode(layout conntrack.Layout) (conntrack.Tuple, conntrack.Value) {
	const (
		tupleIn      = 1 // TUPLE_F_IN
		tupleRelated = 2 // TUPLE_F_RELATED
		tupleService = 4 // TUPLE_F_SERVICE
		synAck       = 0x12
	)
	tu := conntrack.Tuple{Src: e.Src, Dst: e.Dst, SrcPort: e.SrcPort, DstPort: e.DstPort, Proto: e.Proto}
	var v conntrack.Value
	switch {
	case e.Service:
		tu.Flags = tupleService
		v.Packets, v.Bytes = e.SentPackets, e.SentBytes
	case e.Related && layout != conntrack.LayoutSplit:
		tu.Flags = tupleRelated // zero counters from 1.16
	case layout == conntrack.LayoutSplit:
		tx, txp, rx, rxp := e.SentBytes, e.SentPackets, e.ReplyBytes, e.ReplyPackets
		if e.Ingress {
			tx, txp, rx, rxp = rx, rxp, tx, txp
		}
		v = conntrack.Value{Word0: rxp, Word1: rx, Packets: txp, Bytes: tx}
	default:
		v.Packets, v.Bytes = e.SentPackets+e.ReplyPackets, e.SentBytes+e.ReplyBytes
	}
	if e.Ingress {
		tu.Flags |= tupleIn
	}
	if e.Related {
		tu.Flags |= tupleRelated
	}
	if e.Proto == 6 && !e.Service {
		v.TxFlagsSeen, v.RxFlagsSeen = synAck, synAck // established both ways
	}
	v.SrcSecID = e.SrcIdentity
	return tu, v
}

// ConntrackSource serves the generated entries as Cilium's four global
// CT maps hold them, in the given layout (combined unless split), so the
// simulation runs the real decoder, layout check, deltas and attribution.
// Counters grow from start.
func (s *Scenario) ConntrackSource(node string, layout conntrack.Layout, start time.Time) conntrack.Source {
	if layout != conntrack.LayoutSplit {
		layout = conntrack.LayoutCombined
	}
	return &ctSource{s: s, node: node, layout: layout, start: start, now: time.Now}
}

type ctSource struct {
	s      *Scenario
	node   string
	layout conntrack.Layout
	start  time.Time
	now    func() time.Time
}

func (c *ctSource) Open(name string) (conntrack.Table, error) {
	v6 := name == conntrack.MapTCP6 || name == conntrack.MapAny6
	tcp := name == conntrack.MapTCP4 || name == conntrack.MapTCP6
	size := conntrack.KeySize4
	if v6 {
		size = conntrack.KeySize6
	}
	t := conntrack.NewMemTable(size)
	// Cilium's default sizes (bpf-ct-global-tcp-max, -any-max).
	t.Max = 262144
	if tcp {
		t.Max = 524288
	}
	for _, e := range c.s.ConntrackEntries(c.node, c.now().Sub(c.start)) {
		if e.Src.Is6() != v6 || (e.Proto == 6) != tcp {
			continue
		}
		t.Put(e.Encode(c.layout))
	}
	return t, nil
}
