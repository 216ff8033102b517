package ipcache

import (
	"encoding/binary"
	"net/netip"
)

// val is an entry as a snapshot holds it: 8 bytes, the node IP as an
// index into the snapshot's node table (a cluster has far fewer nodes
// than addresses).
type val struct {
	identity uint32
	node     uint16 // index+1 into snapshot.nodes; 0: no tunnel endpoint
	flags    uint8
}

// snapshot is one read of the map: one hash map per prefix length in use,
// looked up longest first. Two snapshots alternate, so that a refresh
// reuses the memory of the one before last and allocates nothing once
// warm.
type snapshot struct {
	v4      [33]map[uint32]val
	v6      [129]map[[16]byte]val
	lens4   []uint8 // lengths with entries, longest first
	lens6   []uint8
	nodes   []netip.Addr
	nodeIdx map[netip.Addr]uint16
	n       int
	skipped map[string]int
}

func newSnapshot() *snapshot {
	return &snapshot{nodeIdx: map[netip.Addr]uint16{}, skipped: map[string]int{}}
}

func (s *snapshot) reset() {
	// Every map, not only the lengths listed: a read that failed midway
	// filled some without listing them.
	for _, m := range s.v4 {
		clear(m)
	}
	for _, m := range s.v6 {
		clear(m)
	}
	s.lens4, s.lens6, s.nodes = s.lens4[:0], s.lens6[:0], s.nodes[:0]
	clear(s.nodeIdx)
	clear(s.skipped)
	s.n = 0
}

func (s *snapshot) add(k, v []byte, l Layout) {
	key, err := DecodeKey(k)
	if err != nil {
		if d, ok := err.(decodeError); ok {
			s.skipped[string(d)]++
		}
		return
	}
	if key.ClusterID != 0 {
		s.skipped[skipCluster]++
		return
	}
	value, err := DecodeValue(v, l)
	if err != nil {
		return // the sizes were checked before the read
	}
	e := val{identity: value.Identity, flags: value.Flags}
	if ep := value.TunnelEndpoint; ep.IsValid() {
		i, ok := s.nodeIdx[ep]
		if !ok {
			if len(s.nodes) >= 1<<16-1 {
				s.skipped[skipNodes]++
				return
			}
			s.nodes = append(s.nodes, ep)
			i = uint16(len(s.nodes))
			s.nodeIdx[ep] = i
		}
		e.node = i
	}
	bits := key.Prefix.Bits()
	a := key.Prefix.Addr()
	if a.Is4() {
		m := s.v4[bits]
		if m == nil {
			m = map[uint32]val{}
			s.v4[bits] = m
		}
		m[be32(a)&mask4(bits)] = e
	} else {
		m := s.v6[bits]
		if m == nil {
			m = map[[16]byte]val{}
			s.v6[bits] = m
		}
		m[mask16(a.As16(), bits)] = e
	}
	s.n++
}

// finish lists the prefix lengths in use, longest first.
func (s *snapshot) finish() {
	for l := 32; l >= 0; l-- {
		if len(s.v4[l]) > 0 {
			s.lens4 = append(s.lens4, uint8(l))
		}
	}
	for l := 128; l >= 0; l-- {
		if len(s.v6[l]) > 0 {
			s.lens6 = append(s.lens6, uint8(l))
		}
	}
}

func (s *snapshot) lookup(a netip.Addr) (Entry, bool) {
	a = a.Unmap()
	if a.Is4() {
		u := be32(a)
		for _, l := range s.lens4 {
			if v, ok := s.v4[l][u&mask4(int(l))]; ok {
				return s.entry(v, l), true
			}
		}
		return Entry{}, false
	}
	if !a.Is6() {
		return Entry{}, false
	}
	a16 := a.As16()
	for _, l := range s.lens6 {
		if v, ok := s.v6[l][mask16(a16, int(l))]; ok {
			return s.entry(v, l), true
		}
	}
	return Entry{}, false
}

func (s *snapshot) entry(v val, bits uint8) Entry {
	e := Entry{Identity: v.identity, Flags: v.flags, Bits: bits}
	if v.node != 0 {
		e.NodeIP = s.nodes[v.node-1]
	}
	return e
}

func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func mask4(bits int) uint32 {
	if bits == 0 {
		return 0
	}
	return ^uint32(0) << (32 - bits)
}

func mask16(a [16]byte, bits int) [16]byte {
	for i := range a {
		switch {
		case bits >= 8:
			bits -= 8
		case bits > 0:
			a[i] &= ^byte(0) << (8 - bits)
			bits = 0
		default:
			a[i] = 0
		}
	}
	return a
}
