package conntrack

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Cilium's global CT maps, pinned under the BPF filesystem (by default
// /sys/fs/bpf/tc/globals). Names from pkg/maps/ctmap/ctmap.go (v1.20.2;
// unchanged since v1.0): the TCP maps kept their 1.0 names.
const (
	MapTCP4 = "cilium_ct4_global"
	MapAny4 = "cilium_ct_any4_global"
	MapTCP6 = "cilium_ct6_global"
	MapAny6 = "cilium_ct_any6_global"
)

// MapNames lists the maps a poll reads. The v6 maps exist only with IPv6
// enabled, the v4 ones only with IPv4 enabled.
var MapNames = []string{MapTCP4, MapAny4, MapTCP6, MapAny6}

// Key layout: struct ipv4_ct_tuple / ipv6_ct_tuple (bpf/lib/common.h,
// __packed, identical from v1.12 to v1.20.2):
//
//	daddr, saddr  __be32 / union v6addr   "reversed, correct for reply traffic"
//	dport, sport  __be16                  "correct for original direction"
//	nexthdr       __u8
//	flags         __u8                    TUPLE_F_*
//
// So for every non-service entry, daddr is the address that opened the
// connection and saddr the one that accepted it (cilium issue #5848; `cilium
// bpf ct list global` prints "daddr:sport -> saddr:dport").
const (
	KeySize4   = 4 + 4 + 2 + 2 + 1 + 1
	KeySize6   = 16 + 16 + 2 + 2 + 1 + 1
	ValueSize  = 56
	tupleOut   = 0 // TUPLE_F_OUT: created on the egress of the opener
	tupleIn    = 1 // TUPLE_F_IN: created on the ingress of the acceptor
	tupleRel   = 2 // TUPLE_F_RELATED: ICMP errors of a connection
	tupleSvc   = 4 // TUPLE_F_SERVICE: load-balancer entry, no connection
	protoTCP   = 6
	protoUDP   = 17
	tcpFlagSYN = 0x02
	tcpFlagACK = 0x10
)

// Layout is how a struct ct_entry (56 bytes in every supported version)
// stores its counters. Both layouts have the same size, so the value size
// alone cannot tell them apart; see Evidence.
type Layout uint8

const (
	// LayoutAuto decides from the entries (see Evidence).
	LayoutAuto Layout = iota
	// LayoutSplit is Cilium before v1.16 (checked against v1.14/v1.15
	// bpf/lib/common.h and pkg/maps/ctmap/types.go):
	//
	//	0  rx_packets  8  rx_bytes (backend_id on service entries)
	//	16 tx_packets  24 tx_bytes
	//	32 lifetime  36 flags  38 rev_nat_index  40 ifindex
	//	42 tx_flags_seen  43 rx_flags_seen  44 src_sec_id  48/52 last_tx/rx_report
	//
	// rx counts packets looked up in CT_INGRESS (towards the local
	// endpoint), tx those in CT_EGRESS (sent by it).
	LayoutSplit
	// LayoutCombined is Cilium v1.16 and later (checked against v1.16-v1.19
	// bpf/lib/common.h and v1.20.2 bpf/lib/conntrack.h):
	//
	//	0  reserved0 (0) / nat_addr[0:8] (v1.20)   8 backend_id / nat_addr[8:16]
	//	16 packets  24 bytes
	//	32.. as LayoutSplit (40 is reserved4 / nat_port)
	//
	// packets and bytes count every packet that hit the entry, both
	// directions, and only with bpf.ctAccounting=true.
	LayoutCombined
)

// ParseLayout reads a --conntrack.layout value.
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "auto", "":
		return LayoutAuto, nil
	case "split":
		return LayoutSplit, nil
	case "combined":
		return LayoutCombined, nil
	}
	return LayoutAuto, fmt.Errorf("unknown conntrack layout %q (want auto, split or combined)", s)
}

func (l Layout) String() string {
	switch l {
	case LayoutSplit:
		return "split"
	case LayoutCombined:
		return "combined"
	}
	return "auto"
}

// Tuple is a decoded CT key, in original direction.
type Tuple struct {
	Src, Dst         netip.Addr // Src opened the connection, Dst accepted it
	SrcPort, DstPort uint16
	Proto            uint8
	Flags            uint8 // TUPLE_F_* bits
}

// Ingress reports whether the entry was created on the acceptor's side
// (TUPLE_F_IN); otherwise on the opener's side (TUPLE_F_OUT).
func (t Tuple) Ingress() bool { return t.Flags&tupleIn != 0 }

// Service reports a load-balancer entry, which tracks no connection of its
// own (its counters repeat those of the connection's entry).
func (t Tuple) Service() bool { return t.Flags&tupleSvc != 0 }

// Related reports an ICMP entry (TUPLE_F_RELATED) that ct_create4/6 writes
// next to a new connection's entry so ICMP errors about it pass; up to 1.15
// it is a copy of the connection's entry, counters included
// (bpf/lib/conntrack.h ct_create4, v1.15.19), so counting it would count
// the connection's first packet twice.
func (t Tuple) Related() bool { return t.Flags&tupleRel != 0 }

// Value is the part of a struct ct_entry the reader uses, by offset; what
// Word0/Word1 and Packets/Bytes mean depends on the Layout.
type Value struct {
	Word0, Word1   uint64 // split: rx_packets, rx_bytes; combined: reserved/backend_id or nat_addr
	Packets, Bytes uint64 // split: tx_packets, tx_bytes; combined: packets, bytes
	Lifetime       uint32
	TxFlagsSeen    uint8
	RxFlagsSeen    uint8
	// SrcSecID (offset 44, "do not change offset!" in every version) is the
	// security identity of the packet that created the entry; on ingress
	// entries, the opener's.
	SrcSecID uint32
}

// ErrLayout reports a map whose key or value size matches no known Cilium
// layout.
type ErrLayout struct {
	Map                string
	KeySize, ValueSize int
}

func (e *ErrLayout) Error() string {
	return fmt.Sprintf("conntrack map %s has key size %d and value size %d: no supported Cilium layout has these (want key %d or %d, value %d; Cilium newer than this exporter knows?)",
		e.Map, e.KeySize, e.ValueSize, KeySize4, KeySize6, ValueSize)
}

// CheckSizes fails with *ErrLayout unless the sizes are a known layout.
func CheckSizes(name string, keySize, valueSize int) error {
	if (keySize != KeySize4 && keySize != KeySize6) || valueSize != ValueSize {
		return &ErrLayout{Map: name, KeySize: keySize, ValueSize: valueSize}
	}
	return nil
}

// DecodeKey decodes a 14-byte (v4) or 38-byte (v6) CT key.
func DecodeKey(b []byte) (Tuple, error) {
	var t Tuple
	switch len(b) {
	case KeySize4:
		t.Src = netip.AddrFrom4([4]byte(b[0:4]))
		t.Dst = netip.AddrFrom4([4]byte(b[4:8]))
	case KeySize6:
		t.Src = netip.AddrFrom16([16]byte(b[0:16]))
		t.Dst = netip.AddrFrom16([16]byte(b[16:32]))
	default:
		return t, fmt.Errorf("conntrack key of %d bytes (want %d or %d)", len(b), KeySize4, KeySize6)
	}
	p := b[len(b)-6:]
	t.DstPort = binary.BigEndian.Uint16(p[0:2])
	t.SrcPort = binary.BigEndian.Uint16(p[2:4])
	t.Proto = p[4]
	t.Flags = p[5]
	return t, nil
}

// keyFlags returns the TUPLE_F_* byte of a raw key (its last byte).
func keyFlags(key []byte) uint8 { return key[len(key)-1] }

// AppendKey encodes t as Cilium stores it (v4 when both addresses are v4).
func AppendKey(dst []byte, t Tuple) []byte {
	if t.Src.Is4() && t.Dst.Is4() {
		s, d := t.Src.As4(), t.Dst.As4()
		dst = append(dst, s[:]...)
		dst = append(dst, d[:]...)
	} else {
		s, d := t.Src.As16(), t.Dst.As16()
		dst = append(dst, s[:]...)
		dst = append(dst, d[:]...)
	}
	dst = binary.BigEndian.AppendUint16(dst, t.DstPort)
	dst = binary.BigEndian.AppendUint16(dst, t.SrcPort)
	return append(dst, t.Proto, t.Flags)
}

// DecodeValue decodes a 56-byte struct ct_entry (host byte order).
func DecodeValue(b []byte) (Value, error) {
	if len(b) != ValueSize {
		return Value{}, fmt.Errorf("conntrack value of %d bytes (want %d)", len(b), ValueSize)
	}
	return decodeValue(b), nil
}

func decodeValue(b []byte) Value {
	_ = b[ValueSize-1]
	ne := binary.NativeEndian
	return Value{
		Word0:       ne.Uint64(b[0:8]),
		Word1:       ne.Uint64(b[8:16]),
		Packets:     ne.Uint64(b[16:24]),
		Bytes:       ne.Uint64(b[24:32]),
		Lifetime:    ne.Uint32(b[32:36]),
		TxFlagsSeen: b[42],
		RxFlagsSeen: b[43],
		SrcSecID:    ne.Uint32(b[44:48]),
	}
}

// AppendValue encodes v as a 56-byte struct ct_entry; fields the reader
// does not use are zero.
func AppendValue(dst []byte, v Value) []byte {
	ne := binary.NativeEndian
	dst = ne.AppendUint64(dst, v.Word0)
	dst = ne.AppendUint64(dst, v.Word1)
	dst = ne.AppendUint64(dst, v.Packets)
	dst = ne.AppendUint64(dst, v.Bytes)
	dst = ne.AppendUint32(dst, v.Lifetime)
	dst = append(dst, 0, 0, 0, 0, 0, 0, v.TxFlagsSeen, v.RxFlagsSeen)
	dst = ne.AppendUint32(dst, v.SrcSecID)
	return append(dst, make([]byte, ValueSize-48)...)
}

// VersionLayout returns the ct_entry layout of a Cilium version as the
// agent reports it: Hubble's ServerStatus version ("cilium v1.20.2+g1a2b3c"
// on an agent, "1.20.2 ..." as `cilium-dbg version` prints it) or a
// --conntrack.cilium-version value ("1.16.3", "v1.15.19"). 1.x before 1.16
// is split (checked from 1.14), 1.16 and later combined (checked to
// 1.20.2). A Relay's version ("hubble-relay v...") says nothing about an
// agent's datapath, nor does a version without a number (an agent built
// without one reports "cilium"), nor a major version other than 1.
func VersionLayout(version string) (Layout, bool) {
	if strings.Contains(version, "hubble-relay") {
		return LayoutAuto, false
	}
	switch minor := versionMinor(version); {
	case minor < 0:
		return LayoutAuto, false
	case minor <= 15:
		return LayoutSplit, true
	}
	return LayoutCombined, true
}

// versionMinor returns the minor version of the first word of version
// that is a 1.x version, or -1.
func versionMinor(version string) int {
	for f := range strings.FieldsSeq(version) {
		if m := ciliumMinor(f); m >= 0 {
			return m
		}
	}
	return -1
}

// ciliumMinor returns the minor version of a "1.x[.y][-+suffix]" version,
// with or without a leading v, or -1.
func ciliumMinor(v string) int {
	v = strings.TrimPrefix(v, "v")
	major, rest, ok := strings.Cut(v, ".")
	if !ok || major != "1" {
		return -1
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	if end == 0 || end > 3 {
		return -1
	}
	n, _ := strconv.Atoi(rest[:end])
	return n
}

// Security identities that tell who opened a connection (the src_sec_id
// of an ingress entry; pkg/identity/numericidentity.go, v1.20.2). Reserved
// identities below 128 other than health (4) and init (5) name no Cilium
// endpoint: the host (1), world (2, 9, 10), unmanaged (3), remote-node (6),
// kube-apiserver (7), ingress (8). Identities of the local scope (1<<24,
// CIDR and FQDN selections) and the remote-node scope (2<<24) are not
// endpoints either. An endpoint's egress creates its own OUT entry, on its
// node; nothing else does (Cilium conntracks the host's traffic only with
// its host firewall).
const (
	identityHost            = 1
	identityHealth          = 4
	identityInit            = 5
	identityRemoteNode      = 6
	identityKubeAPIServer   = 7
	identityUserReserved    = 128        // 128-255: user reserved identities, given to endpoints
	identityScopeMask       = 0xFF << 24 // local (1<<24) and remote-node (2<<24) scopes
	identityScopeRemoteNode = 2 << 24
)

// endpointIdentity reports whether an identity names a Cilium endpoint (a
// pod Cilium manages), whose own egress entry holds the connection's bytes
// on its node.
func endpointIdentity(id uint32) bool {
	if id&identityScopeMask != 0 {
		return false
	}
	return id >= identityUserReserved || id == identityHealth || id == identityInit
}

// hostIdentity reports a node's host network as the opener: the local host,
// a remote node or a node running kube-apiserver.
func hostIdentity(id uint32) bool {
	return id == identityHost || id == identityRemoteNode || id == identityKubeAPIServer ||
		id&identityScopeMask == identityScopeRemoteNode
}

// Evidence is what one entry says about the layout. Both layouts are 56
// bytes, so the reader looks at what each could hold:
//
//   - split: an entry created on ingress starts with rx_packets=1, and an
//     entry that saw a reply (rx_flags_seen) has rx_packets>0, so words 0/1
//     are a plausible packets/bytes pair;
//   - combined: words 0/1 are zero (reserved, backend_id of service
//     entries only) or a NAT address, never a packets/bytes pair.
//
// Service entries say nothing (both layouts store a backend id there), nor
// do related (ICMP) entries.
type Evidence uint8

const (
	EvidenceNone Evidence = iota
	EvidenceSplit
	EvidenceCombined
)

// plausible reports whether (packets, bytes) could be a counter pair:
// frames of 20 bytes (an IP header) to 1 MiB (BIG TCP aggregates), and
// fewer than 2^40 packets.
func plausible(packets, bytes uint64) bool {
	return packets > 0 && packets < 1<<40 && bytes >= 20*packets && bytes/packets <= 1<<20
}

// Classify returns what an entry with key flags and value v says about
// the layout.
func Classify(flags uint8, v Value) Evidence {
	if flags&(tupleSvc|tupleRel) != 0 || !plausible(v.Packets, v.Bytes) {
		return EvidenceNone
	}
	if plausible(v.Word0, v.Word1) {
		return EvidenceSplit
	}
	if v.Word0 == 0 && v.Word1 == 0 && (flags&tupleIn != 0 || v.RxFlagsSeen != 0) {
		return EvidenceCombined
	}
	return EvidenceNone
}
