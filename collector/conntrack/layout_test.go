package conntrack

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// Fixtures are written field by field at the offsets of the C structs
// (quoted in layout.go), not with AppendKey/AppendValue, so the encoder
// and decoder are checked against the documented layout.

// ctEntrySplit is struct ct_entry of Cilium v1.15 and earlier.
type ctEntrySplit struct {
	rxPackets, rxBytes, txPackets, txBytes uint64
	lifetime                               uint32
	flags, revNat, ifindex                 uint16
	txFlagsSeen, rxFlagsSeen               uint8
	srcSecID, lastTxReport, lastRxReport   uint32
}

func (e ctEntrySplit) raw() []byte {
	b := make([]byte, 56)
	ne := binary.NativeEndian
	ne.PutUint64(b[0:], e.rxPackets)
	ne.PutUint64(b[8:], e.rxBytes)
	ne.PutUint64(b[16:], e.txPackets)
	ne.PutUint64(b[24:], e.txBytes)
	ne.PutUint32(b[32:], e.lifetime)
	ne.PutUint16(b[36:], e.flags)
	ne.PutUint16(b[38:], e.revNat)
	ne.PutUint16(b[40:], e.ifindex)
	b[42], b[43] = e.txFlagsSeen, e.rxFlagsSeen
	ne.PutUint32(b[44:], e.srcSecID)
	ne.PutUint32(b[48:], e.lastTxReport)
	ne.PutUint32(b[52:], e.lastRxReport)
	return b
}

// ctEntryCombined is struct ct_entry of Cilium v1.16 to v1.20 (natAddr is
// the v1.20 union over reserved0/backend_id).
type ctEntryCombined struct {
	natAddr                  [16]byte
	backendID                uint64 // service entries, overlaps natAddr[8:16]
	packets, bytes           uint64
	lifetime                 uint32
	flags, revNat, natPort   uint16
	txFlagsSeen, rxFlagsSeen uint8
	srcSecID                 uint32
}

func (e ctEntryCombined) raw() []byte {
	b := make([]byte, 56)
	ne := binary.NativeEndian
	copy(b[0:16], e.natAddr[:])
	if e.backendID != 0 {
		ne.PutUint64(b[8:], e.backendID)
	}
	ne.PutUint64(b[16:], e.packets)
	ne.PutUint64(b[24:], e.bytes)
	ne.PutUint32(b[32:], e.lifetime)
	ne.PutUint16(b[36:], e.flags)
	ne.PutUint16(b[38:], e.revNat)
	binary.BigEndian.PutUint16(b[40:], e.natPort)
	b[42], b[43] = e.txFlagsSeen, e.rxFlagsSeen
	ne.PutUint32(b[44:], e.srcSecID)
	return b
}

// "TCP OUT 10.0.1.5:43210 -> 10.0.2.7:80" as `cilium bpf ct list global`
// prints it: daddr=10.0.1.5 saddr=10.0.2.7 dport=80 sport=43210.
var key4Out = []byte{
	10, 0, 1, 5, // daddr: the opener
	10, 0, 2, 7, // saddr: the acceptor
	0x00, 0x50, // dport 80, big endian
	0xa8, 0xca, // sport 43210
	6, // nexthdr TCP
	0, // TUPLE_F_OUT
}

func TestDecodeKeyV4(t *testing.T) {
	got, err := DecodeKey(key4Out)
	if err != nil {
		t.Fatal(err)
	}
	want := Tuple{Src: netip.MustParseAddr("10.0.1.5"), Dst: netip.MustParseAddr("10.0.2.7"), SrcPort: 43210, DstPort: 80, Proto: 6, Flags: 0}
	if got != want {
		t.Fatalf("DecodeKey = %+v, want %+v", got, want)
	}
	if got.Ingress() || got.Service() {
		t.Fatal("OUT entry decoded as ingress or service")
	}
	if enc := AppendKey(nil, got); !bytes.Equal(enc, key4Out) {
		t.Fatalf("AppendKey = %v, want %v", enc, key4Out)
	}
}

func TestDecodeKeyV6(t *testing.T) {
	src, dst := netip.MustParseAddr("fd00:10:244:1::5"), netip.MustParseAddr("fd00:10:244:2::7")
	key := make([]byte, 0, 38)
	s16, d16 := src.As16(), dst.As16()
	key = append(key, s16[:]...)
	key = append(key, d16[:]...)
	key = append(key, 0x75, 0x30, 0x9c, 0x40, 17, 1|2) // dport 30000, sport 40000, UDP, IN|RELATED
	got, err := DecodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	want := Tuple{Src: src, Dst: dst, SrcPort: 40000, DstPort: 30000, Proto: 17, Flags: tupleIn | tupleRel}
	if got != want {
		t.Fatalf("DecodeKey = %+v, want %+v", got, want)
	}
	if !got.Ingress() {
		t.Fatal("IN entry not ingress")
	}
	if enc := AppendKey(nil, got); !bytes.Equal(enc, key) {
		t.Fatalf("AppendKey round trip differs")
	}
}

func TestDecodeKeyBadSize(t *testing.T) {
	for _, n := range []int{0, 13, 15, 37, 39} {
		if _, err := DecodeKey(make([]byte, n)); err == nil {
			t.Errorf("DecodeKey(%d bytes) accepted", n)
		}
	}
}

func TestDecodeValueSplit(t *testing.T) {
	raw := ctEntrySplit{rxPackets: 3, rxBytes: 210, txPackets: 5, txBytes: 7300, lifetime: 21600,
		flags: 1 << 4, revNat: 0x0100, ifindex: 7, txFlagsSeen: 0x1a, rxFlagsSeen: 0x12, srcSecID: 4242, lastTxReport: 9, lastRxReport: 8}.raw()
	v, err := DecodeValue(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := Value{Word0: 3, Word1: 210, Packets: 5, Bytes: 7300, Lifetime: 21600, TxFlagsSeen: 0x1a, RxFlagsSeen: 0x12, SrcSecID: 4242}
	if v != want {
		t.Fatalf("DecodeValue = %+v, want %+v", v, want)
	}
	if ev := Classify(tupleOut, v); ev != EvidenceSplit {
		t.Fatalf("Classify split entry = %d, want split", ev)
	}
	// Freshly created on ingress: rx_packets=1, nothing sent yet.
	v, _ = DecodeValue(ctEntrySplit{rxPackets: 1, rxBytes: 74, rxFlagsSeen: 0x02}.raw())
	if ev := Classify(tupleIn, v); ev != EvidenceNone {
		t.Fatalf("Classify split ingress without reply = %d, want none", ev)
	}
}

func TestDecodeValueCombined(t *testing.T) {
	raw := ctEntryCombined{packets: 8, bytes: 7510, lifetime: 21600, revNat: 0, txFlagsSeen: 0x1a, rxFlagsSeen: 0x12, srcSecID: 4242}.raw()
	v, err := DecodeValue(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := Value{Packets: 8, Bytes: 7510, Lifetime: 21600, TxFlagsSeen: 0x1a, RxFlagsSeen: 0x12, SrcSecID: 4242}
	if v != want {
		t.Fatalf("DecodeValue = %+v, want %+v", v, want)
	}
	if ev := Classify(tupleOut, v); ev != EvidenceCombined {
		t.Fatalf("Classify combined entry with reply = %d, want combined", ev)
	}
	if ev := Classify(tupleIn, Value{Packets: 1, Bytes: 74}); ev != EvidenceCombined {
		t.Fatalf("Classify new combined ingress entry = %d, want combined", ev)
	}
	// An egress entry with no reply yet says nothing: a split entry looks the same.
	if ev := Classify(tupleOut, Value{Packets: 1, Bytes: 74, TxFlagsSeen: 0x02}); ev != EvidenceNone {
		t.Fatalf("Classify unanswered egress entry = %d, want none", ev)
	}
}

func TestClassifyNoise(t *testing.T) {
	// v1.20 SNAT'd egress entry: nat_addr holds an IPv4 address.
	nat := ctEntryCombined{packets: 8, bytes: 7510, rxFlagsSeen: 0x12}
	copy(nat.natAddr[:4], []byte{192, 0, 2, 1})
	v, _ := DecodeValue(nat.raw())
	if ev := Classify(tupleOut, v); ev != EvidenceNone {
		t.Errorf("Classify NAT'd v4 entry = %d, want none", ev)
	}
	// ... or an IPv6 one.
	nat6 := ctEntryCombined{packets: 8, bytes: 7510, rxFlagsSeen: 0x12}
	nat6.natAddr = netip.MustParseAddr("fd00:10:244:1::1a").As16()
	v, _ = DecodeValue(nat6.raw())
	if ev := Classify(tupleOut, v); ev != EvidenceNone {
		t.Errorf("Classify NAT'd v6 entry = %d, want none", ev)
	}
	// Service entries carry a backend id in both layouts.
	svc := ctEntryCombined{backendID: 17, packets: 3, bytes: 222}
	v, _ = DecodeValue(svc.raw())
	if ev := Classify(tupleSvc, v); ev != EvidenceNone {
		t.Errorf("Classify service entry = %d, want none", ev)
	}
	// Accounting off: zero counters say nothing.
	if ev := Classify(tupleIn, Value{RxFlagsSeen: 0x12}); ev != EvidenceNone {
		t.Errorf("Classify zero counters = %d, want none", ev)
	}
}

func TestDecodeValueBadSize(t *testing.T) {
	for _, n := range []int{0, 48, 55, 57, 64, 72} {
		if _, err := DecodeValue(make([]byte, n)); err == nil {
			t.Errorf("DecodeValue(%d bytes) accepted", n)
		}
	}
}

func TestCheckSizes(t *testing.T) {
	for _, ok := range [][2]int{{14, 56}, {38, 56}} {
		if err := CheckSizes("m", ok[0], ok[1]); err != nil {
			t.Errorf("CheckSizes(%v) = %v", ok, err)
		}
	}
	// 72: a hypothetical future entry; 48: not any Cilium version.
	for _, bad := range [][2]int{{14, 72}, {38, 48}, {16, 56}, {40, 56}} {
		err := CheckSizes("cilium_ct4_global", bad[0], bad[1])
		var le *ErrLayout
		if !errors.As(err, &le) {
			t.Fatalf("CheckSizes(%v) = %v, want *ErrLayout", bad, err)
		}
		if !strings.Contains(err.Error(), "cilium_ct4_global") || !strings.Contains(err.Error(), "no supported Cilium layout") {
			t.Errorf("unclear error: %v", err)
		}
	}
}

func TestValueRoundTrip(t *testing.T) {
	v := Value{Word0: 1, Word1: 2, Packets: 3, Bytes: 4, Lifetime: 5, TxFlagsSeen: 6, RxFlagsSeen: 7}
	b := AppendValue(nil, v)
	if len(b) != ValueSize {
		t.Fatalf("AppendValue wrote %d bytes", len(b))
	}
	if got, _ := DecodeValue(b); got != v {
		t.Fatalf("round trip %+v != %+v", got, v)
	}
}

func TestParseLayout(t *testing.T) {
	for s, want := range map[string]Layout{"auto": LayoutAuto, "": LayoutAuto, "split": LayoutSplit, "combined": LayoutCombined} {
		got, err := ParseLayout(s)
		if err != nil || got != want {
			t.Errorf("ParseLayout(%q) = %v, %v", s, got, err)
		}
		if s != "" && got.String() != s {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
	if _, err := ParseLayout("1.16"); err == nil {
		t.Error("ParseLayout accepted 1.16")
	}
}

// FuzzDecode feeds arbitrary bytes to the decoders: they must never panic,
// must accept exactly the documented sizes, and keys must round-trip.
func FuzzDecode(f *testing.F) {
	f.Add(append(append([]byte{}, key4Out...), ctEntrySplit{rxPackets: 3, rxBytes: 210, txPackets: 5, txBytes: 7300}.raw()...))
	f.Add(append(make([]byte, 38), ctEntryCombined{packets: 8, bytes: 7510, rxFlagsSeen: 0x12}.raw()...))
	f.Add([]byte{})
	f.Add(make([]byte, 13))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, ks := range []int{KeySize4, KeySize6, len(b) % 64} {
			if len(b) < ks {
				continue
			}
			key, val := b[:ks], b[ks:]
			tu, err := DecodeKey(key)
			if (err == nil) != (ks == KeySize4 || ks == KeySize6) {
				t.Fatalf("DecodeKey(%d bytes) err = %v", ks, err)
			}
			if err == nil {
				if enc := AppendKey(nil, tu); !bytes.Equal(enc, key) {
					t.Fatalf("key round trip: %x -> %+v -> %x", key, tu, enc)
				}
			}
			v, err := DecodeValue(val)
			if (err == nil) != (len(val) == ValueSize) {
				t.Fatalf("DecodeValue(%d bytes) err = %v", len(val), err)
			}
			if err == nil && len(key) > 0 {
				ev := Classify(keyFlags(key), v)
				if ev == EvidenceSplit && !plausible(v.Word0, v.Word1) {
					t.Fatalf("split evidence from implausible words %+v", v)
				}
				if got := AppendValue(nil, v); len(got) != ValueSize {
					t.Fatalf("AppendValue wrote %d bytes", len(got))
				}
			}
		}
	})
}
