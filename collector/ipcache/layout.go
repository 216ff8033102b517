package ipcache

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Map names, as Cilium pins them in <bpffs>/tc/globals.
const (
	// MapV2 is the map of Cilium 1.18 and later (IPv6 tunnel endpoints).
	MapV2 = "cilium_ipcache_v2"
	// MapV1 is the map of Cilium 1.14-1.17. A 1.18 agent reads a v1 map it
	// finds once, to restore local identities, and then writes only v2.
	MapV1 = "cilium_ipcache"
)

// Sizes of struct ipcache_key and struct remote_endpoint_info (bpf/lib/eps.h,
// pkg/maps/ipcache Key and RemoteEndpointInfo; checked against Cilium's own
// types in internal/ctmappeer).
const (
	KeySize     = 24 // prefixlen, cluster_id, pad1, family, 16-byte address
	ValueSizeV2 = 24 // sec_identity, 16-byte tunnel_endpoint, pad, key, flags
	ValueSizeV1 = 12 // sec_identity, 4-byte tunnel_endpoint, pad, key, flags
)

// staticPrefixBits is what the LPM prefix length counts before the
// address: cluster_id, pad1 and family (Cilium's IPCACHE_STATIC_PREFIX).
const staticPrefixBits = 32

// Address families of the key (bpf.EndpointKeyIPv4/IPv6).
const (
	familyIPv4 = 1
	familyIPv6 = 2
)

// Flags of an entry (pkg/maps/ipcache RemoteEndpointInfoFlags).
const (
	FlagSkipTunnel         uint8 = 1 << 0
	FlagHasTunnelEndpoint  uint8 = 1 << 1
	FlagIPv6TunnelEndpoint uint8 = 1 << 2
	FlagRemoteCluster      uint8 = 1 << 3 // 1.18 and later
)

// Layout is the value layout of a map.
type Layout int

const (
	LayoutV1 Layout = 1 // 12-byte value: IPv4 tunnel endpoint only
	LayoutV2 Layout = 2 // 24-byte value
)

// LayoutOf tells a map's layout from its key and value sizes.
func LayoutOf(keySize, valueSize int) (Layout, error) {
	if keySize != KeySize {
		return 0, fmt.Errorf("ipcache key of %d bytes, want %d: %w", keySize, KeySize, errLayout)
	}
	switch valueSize {
	case ValueSizeV2:
		return LayoutV2, nil
	case ValueSizeV1:
		return LayoutV1, nil
	}
	return 0, fmt.Errorf("ipcache value of %d bytes, want %d (v2) or %d (v1): %w", valueSize, ValueSizeV2, ValueSizeV1, errLayout)
}

// Key is a decoded ipcache key.
type Key struct {
	Prefix    netip.Prefix
	ClusterID uint16
}

// Value is a decoded ipcache value.
type Value struct {
	Identity uint32
	// TunnelEndpoint is the node the address lives on (the zero Addr when
	// the entry has none: a local endpoint, a world prefix).
	TunnelEndpoint netip.Addr
	EncryptKey     uint8
	Flags          uint8
}

// Skip reasons of entries that are not placed (the metric's label values).
const (
	skipFamily  = "family"  // neither IPv4 nor IPv6
	skipPrefix  = "prefix"  // prefix length out of range for the family
	skipCluster = "cluster" // an entry of another cluster ID (overlapping pod CIDRs in a cluster mesh)
	skipNodes   = "nodes"   // more distinct tunnel endpoints than a snapshot indexes
)

var skipReasons = []string{skipFamily, skipPrefix, skipCluster, skipNodes}

type decodeError string

func (e decodeError) Error() string { return "ipcache entry: bad " + string(e) }

// DecodeKey decodes a 24-byte key (host byte order for prefixlen and
// cluster_id, as the datapath writes them).
func DecodeKey(b []byte) (Key, error) {
	if len(b) != KeySize {
		return Key{}, fmt.Errorf("ipcache key of %d bytes, want %d", len(b), KeySize)
	}
	plen := binary.NativeEndian.Uint32(b[0:4])
	cluster := binary.NativeEndian.Uint16(b[4:6])
	var addr netip.Addr
	switch b[7] {
	case familyIPv4:
		addr = netip.AddrFrom4([4]byte(b[8:12]))
	case familyIPv6:
		addr = netip.AddrFrom16([16]byte(b[8:24]))
	default:
		return Key{}, decodeError(skipFamily)
	}
	if plen < staticPrefixBits || int(plen-staticPrefixBits) > addr.BitLen() {
		return Key{}, decodeError(skipPrefix)
	}
	return Key{Prefix: netip.PrefixFrom(addr, int(plen-staticPrefixBits)), ClusterID: cluster}, nil
}

// DecodeValue decodes a value of layout l.
func DecodeValue(b []byte, l Layout) (Value, error) {
	want := ValueSizeV2
	if l == LayoutV1 {
		want = ValueSizeV1
	}
	if len(b) != want {
		return Value{}, fmt.Errorf("ipcache value of %d bytes, want %d", len(b), want)
	}
	v := Value{Identity: binary.NativeEndian.Uint32(b[0:4]), EncryptKey: b[want-2], Flags: b[want-1]}
	v.TunnelEndpoint = tunnelEndpoint(b, l, v.Flags)
	return v, nil
}

// tunnelEndpoint reads the value's tunnel endpoint: 16 bytes when the v2
// flag says IPv6, else the first 4; an all-zero address is none.
func tunnelEndpoint(b []byte, l Layout, flags uint8) netip.Addr {
	if l == LayoutV2 && flags&FlagIPv6TunnelEndpoint != 0 {
		a := [16]byte(b[4:20])
		if a == [16]byte{} {
			return netip.Addr{}
		}
		return netip.AddrFrom16(a)
	}
	a := [4]byte(b[4:8])
	if a == [4]byte{} {
		return netip.Addr{}
	}
	return netip.AddrFrom4(a)
}

// AppendKey appends the key Cilium writes for prefix p (tests, simulation).
func AppendKey(dst []byte, p netip.Prefix, clusterID uint16) []byte {
	var b [KeySize]byte
	binary.NativeEndian.PutUint32(b[0:4], uint32(staticPrefixBits+p.Bits()))
	binary.NativeEndian.PutUint16(b[4:6], clusterID)
	a := p.Masked().Addr()
	if a.Is4() {
		b[7] = familyIPv4
		a4 := a.As4()
		copy(b[8:12], a4[:])
	} else {
		b[7] = familyIPv6
		a16 := a.As16()
		copy(b[8:24], a16[:])
	}
	return append(dst, b[:]...)
}

// AppendValue appends v in layout l, setting the tunnel flags as Cilium's
// NewValue does (tests, simulation).
func AppendValue(dst []byte, v Value, l Layout) []byte {
	n := ValueSizeV2
	if l == LayoutV1 {
		n = ValueSizeV1
	}
	b := make([]byte, n)
	binary.NativeEndian.PutUint32(b[0:4], v.Identity)
	flags := v.Flags
	if v.TunnelEndpoint.IsValid() {
		flags |= FlagHasTunnelEndpoint
		if v.TunnelEndpoint.Is4() {
			a := v.TunnelEndpoint.As4()
			copy(b[4:8], a[:])
		} else if l == LayoutV2 {
			a := v.TunnelEndpoint.As16()
			copy(b[4:20], a[:])
			flags |= FlagIPv6TunnelEndpoint
		}
	}
	b[n-2], b[n-1] = v.EncryptKey, flags
	return append(dst, b...)
}
