package ctmappeer

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/cilium/cilium/pkg/identity"
	ciliumipcache "github.com/cilium/cilium/pkg/maps/ipcache"
	"github.com/cilium/ebpf"

	"github.com/zonewatch/zonewatch/collector/ipcache"
)

// TestIPCacheLayoutMatchesCilium: the ipcache reader's sizes, offsets,
// flags, family values, map name and reserved identities are those of
// Cilium v1.20.2's pkg/maps/ipcache (struct ipcache_key and struct
// remote_endpoint_info of bpf/lib/eps.h).
func TestIPCacheLayoutMatchesCilium(t *testing.T) {
	var k ciliumipcache.Key
	var v ciliumipcache.RemoteEndpointInfo
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(Key)", unsafe.Sizeof(k), ipcache.KeySize},
		{"offsetof(Key.Prefixlen)", unsafe.Offsetof(k.Prefixlen), 0},
		{"offsetof(Key.ClusterID)", unsafe.Offsetof(k.ClusterID), 4},
		{"offsetof(Key.Family)", unsafe.Offsetof(k.Family), 7},
		{"offsetof(Key.IP)", unsafe.Offsetof(k.IP), 8},
		{"sizeof(RemoteEndpointInfo)", unsafe.Sizeof(v), ipcache.ValueSizeV2},
		{"offsetof(SecurityIdentity)", unsafe.Offsetof(v.SecurityIdentity), 0},
		{"offsetof(TunnelEndpoint)", unsafe.Offsetof(v.TunnelEndpoint), 4},
		{"offsetof(Key)", unsafe.Offsetof(v.Key), 22},
		{"offsetof(Flags)", unsafe.Offsetof(v.Flags), 23},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d in Cilium, %d in the reader", c.what, c.got, c.want)
		}
	}
	for _, c := range []struct {
		name      string
		got, want uint8
	}{
		{"FlagSkipTunnel", ipcache.FlagSkipTunnel, uint8(ciliumipcache.FlagSkipTunnel)},
		{"FlagHasTunnelEndpoint", ipcache.FlagHasTunnelEndpoint, uint8(ciliumipcache.FlagHasTunnelEndpoint)},
		{"FlagIPv6TunnelEndpoint", ipcache.FlagIPv6TunnelEndpoint, uint8(ciliumipcache.FlagIPv6TunnelEndpoint)},
		{"FlagRemoteCluster", ipcache.FlagRemoteCluster, uint8(ciliumipcache.FlagRemoteCluster)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, Cilium's is %#x", c.name, c.got, c.want)
		}
	}
	if ipcache.MapV2 != ciliumipcache.Name {
		t.Errorf("map name %q, Cilium's is %q", ipcache.MapV2, ciliumipcache.Name)
	}
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"host", ipcache.IdentityHost, uint32(identity.ReservedIdentityHost)},
		{"world", ipcache.IdentityWorld, uint32(identity.ReservedIdentityWorld)},
		{"remote-node", ipcache.IdentityRemoteNode, uint32(identity.ReservedIdentityRemoteNode)},
		{"kube-apiserver", ipcache.IdentityKubeAPIServer, uint32(identity.ReservedIdentityKubeAPIServer)},
		{"world-ipv4", ipcache.IdentityWorldIPv4, uint32(identity.ReservedIdentityWorldIPv4)},
		{"world-ipv6", ipcache.IdentityWorldIPv6, uint32(identity.ReservedIdentityWorldIPv6)},
	} {
		if c.got != c.want {
			t.Errorf("identity %s = %d, Cilium's is %d", c.name, c.got, c.want)
		}
	}
	// The encoder the tests and the simulation use writes Cilium's bytes.
	node := netip.MustParseAddr("10.200.0.12")
	for _, p := range []string{"10.201.2.10/32", "10.201.2.0/24", "0.0.0.0/0", "fd00:201::10/128", "fd00:201::/64"} {
		pre := netip.MustParsePrefix(p)
		ck := ciliumipcache.NewKey(pre, 3)
		if got, want := ipcache.AppendKey(nil, pre, 3), bytesOf(&ck); string(got) != string(want) {
			t.Errorf("key %s: % x, Cilium's % x", p, got, want)
		}
	}
	for _, tun := range []netip.Addr{{}, node, netip.MustParseAddr("fd00:200::13")} {
		cv := ciliumipcache.NewValue(51234, tun, 2, ciliumipcache.FlagSkipTunnel)
		got := ipcache.AppendValue(nil, ipcache.Value{Identity: 51234, TunnelEndpoint: tun, EncryptKey: 2, Flags: ipcache.FlagSkipTunnel}, ipcache.LayoutV2)
		if want := bytesOf(&cv); string(got) != string(want) {
			t.Errorf("value via %s: % x, Cilium's % x", tun, got, want)
		}
	}
	// The map the agent creates (NewMap: LPM trie of Key and
	// RemoteEndpointInfo): what BPFSource accepts.
	m := ciliumipcache.NewMap(nil, ciliumipcache.Name)
	if m.Type() != ebpf.LPMTrie || int(m.KeySize()) != ipcache.KeySize || int(m.ValueSize()) != ipcache.ValueSizeV2 {
		t.Errorf("Cilium's map: %s of %d/%d bytes", m.Type(), m.KeySize(), m.ValueSize())
	}
	if l, err := ipcache.LayoutOf(int(m.KeySize()), int(m.ValueSize())); err != nil || l != ipcache.LayoutV2 {
		t.Errorf("LayoutOf(Cilium's map) = %v, %v", l, err)
	}
}

func bytesOf[T any](p *T) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(p)), unsafe.Sizeof(*p)) }

// ciliumIPCache creates the map from Cilium's own definition
// (ipcache.NewMap: type, sizes, size and flags) and pins it as the agent
// does in tc/globals.
func ciliumIPCache(t *testing.T, dir string) *ebpf.Map {
	t.Helper()
	cm := ciliumipcache.NewMap(nil, ciliumipcache.Name)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: cm.Type(), KeySize: cm.KeySize(), ValueSize: cm.ValueSize(),
		MaxEntries: cm.MaxEntries(), Flags: cm.Flags()})
	if err != nil {
		t.Fatalf("creating the ipcache from Cilium's definition: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Pin(filepath.Join(dir, ciliumipcache.Name)); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestIPCacheReaderOnCiliumEntries: entries written with Cilium's own
// NewKey and NewValue (as pkg/datapath/ipcache writes them on an ipcache
// upsert) into a real pinned map; each raw entry decodes to what Cilium's
// own types say of it (Prefix, ClusterID, String), and the reader places
// every address as the datapath's longest-prefix lookup would.
func TestIPCacheReaderOnCiliumEntries(t *testing.T) {
	dir := bpfDir(t)
	m := ciliumIPCache(t, dir)
	node1, node2 := netip.MustParseAddr("10.200.0.11"), netip.MustParseAddr("10.200.0.12")
	node6 := netip.MustParseAddr("fd00:200::13")
	type put struct {
		prefix  string
		cluster uint16
		id      identity.NumericIdentity
		tunnel  netip.Addr
		key     uint8
		flags   ciliumipcache.RemoteEndpointInfoFlags
	}
	puts := []put{
		{"10.201.1.10/32", 0, 51234, netip.Addr{}, 0, 0},                                                     // a pod on this node
		{"10.201.2.10/32", 0, 51234, node2, 0, 0},                                                            // a pod on node 2
		{"10.201.2.11/32", 0, 40001, node2, 3, 0},                                                            // with an IPsec key
		{"10.200.0.11/32", 0, identity.ReservedIdentityHost, netip.Addr{}, 0, 0},                             // this node
		{"10.200.0.12/32", 0, identity.ReservedIdentityRemoteNode, netip.Addr{}, 0, 0},                       // node 2
		{"10.201.2.0/24", 0, identity.ReservedIdentityWorldIPv4, node2, 0, 0},                                // node 2's pod CIDR (tunnel)
		{"0.0.0.0/0", 0, identity.ReservedIdentityWorldIPv4, netip.Addr{}, 0, 0},                             // world
		{"192.0.2.0/24", 0, 16777217, netip.Addr{}, 0, ciliumipcache.FlagSkipTunnel},                         // a CIDR identity
		{"fd00:201:3::10/128", 0, 51234, node6, 0, 0},                                                        // a v6 pod behind a v6 node
		{"10.201.3.10/32", 0, 51234, node6, 0, 0},                                                            // a v4 pod behind a v6 node
		{"10.201.2.10/32", 5, 70000, node1, 0, ciliumipcache.FlagRemoteCluster},                              // cluster 5's (overlapping CIDRs)
		{"10.201.9.0/24", 0, identity.ReservedIdentityRemoteNode, node1, 0, ciliumipcache.FlagRemoteCluster}, // a remote cluster's node range
	}
	for _, p := range puts {
		k := ciliumipcache.NewKey(netip.MustParsePrefix(p.prefix), p.cluster)
		v := ciliumipcache.NewValue(uint32(p.id), p.tunnel, p.key, p.flags)
		if err := m.Update(&k, &v, ebpf.UpdateAny); err != nil {
			t.Fatalf("%s: %v", p.prefix, err)
		}
	}

	// Every raw entry, through Cilium's types and through the decoder.
	n := 0
	var rk [ipcache.KeySize]byte
	var rv [ipcache.ValueSizeV2]byte
	it := m.Iterate()
	for it.Next(&rk, &rv) {
		n++
		ck := (*ciliumipcache.Key)(unsafe.Pointer(&rk[0]))
		cv := (*ciliumipcache.RemoteEndpointInfo)(unsafe.Pointer(&rv[0]))
		k, err := ipcache.DecodeKey(rk[:])
		if err != nil {
			t.Errorf("%s: %v", ck, err)
			continue
		}
		if k.Prefix != ck.Prefix() || k.ClusterID != ck.ClusterID {
			t.Errorf("key %s (cluster %d) decoded as %s (cluster %d)", ck.Prefix(), ck.ClusterID, k.Prefix, k.ClusterID)
		}
		v, err := ipcache.DecodeValue(rv[:], ipcache.LayoutV2)
		if err != nil {
			t.Fatal(err)
		}
		tunnel := v.TunnelEndpoint
		if !tunnel.IsValid() {
			tunnel = netip.IPv4Unspecified() // Cilium prints no endpoint as 0.0.0.0
		}
		ours := fmt.Sprintf("identity=%d encryptkey=%d tunnelendpoint=%s flags=%s",
			v.Identity, v.EncryptKey, tunnel, ciliumipcache.RemoteEndpointInfoFlags(v.Flags))
		if cilium := cv.String(); ours != cilium {
			t.Errorf("%s: decoded\n  %s\nCilium says\n  %s", ck, ours, cilium)
		}
	}
	if err := it.Err(); err != nil || n != len(puts) {
		t.Fatalf("iterating: %v, %d entries of %d", err, n, len(puts))
	}

	r, err := ipcache.New(ipcache.BPFSource{Dir: dir}, ipcache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Refresh(); err != nil || !r.Up() {
		t.Fatalf("reading Cilium's map: %v", err)
	}
	if r.Len() != len(puts)-1 {
		t.Errorf("%d entries placed, want %d (cluster 5's skipped)", r.Len(), len(puts)-1)
	}
	has := ciliumipcache.FlagHasTunnelEndpoint
	for _, c := range []struct {
		addr string
		want ipcache.Entry
	}{
		{"10.201.2.10", ipcache.Entry{NodeIP: node2, Identity: 51234, Flags: uint8(has), Bits: 32}},
		{"10.201.2.11", ipcache.Entry{NodeIP: node2, Identity: 40001, Flags: uint8(has), Bits: 32}},
		{"10.201.1.10", ipcache.Entry{Identity: 51234, Bits: 32}},
		{"10.200.0.11", ipcache.Entry{Identity: ipcache.IdentityHost, Bits: 32}},
		{"10.200.0.12", ipcache.Entry{Identity: ipcache.IdentityRemoteNode, Bits: 32}},
		{"10.201.2.200", ipcache.Entry{NodeIP: node2, Identity: ipcache.IdentityWorldIPv4, Flags: uint8(has), Bits: 24}},
		{"192.0.2.7", ipcache.Entry{Identity: 16777217, Flags: ipcache.FlagSkipTunnel, Bits: 24}},
		{"8.8.8.8", ipcache.Entry{Identity: ipcache.IdentityWorldIPv4, Bits: 0}},
		{"fd00:201:3::10", ipcache.Entry{NodeIP: node6, Identity: 51234, Flags: uint8(has | ciliumipcache.FlagIPv6TunnelEndpoint), Bits: 128}},
		{"10.201.3.10", ipcache.Entry{NodeIP: node6, Identity: 51234, Flags: uint8(has | ciliumipcache.FlagIPv6TunnelEndpoint), Bits: 32}},
		{"10.201.9.1", ipcache.Entry{NodeIP: node1, Identity: ipcache.IdentityRemoteNode, Flags: uint8(has | ciliumipcache.FlagRemoteCluster), Bits: 24}},
	} {
		got, ok := r.Lookup(netip.MustParseAddr(c.addr))
		if !ok || got != c.want {
			t.Errorf("Lookup(%s) = %+v, %v; want %+v", c.addr, got, ok, c.want)
		}
	}
	// The same answers as the kernel's own longest-prefix match on the
	// map (the datapath's lookup, cluster 0).
	for _, a := range []string{"10.201.2.10", "10.201.2.200", "10.201.1.10", "192.0.2.7", "8.8.8.8", "fd00:201:3::10", "10.201.9.1"} {
		addr := netip.MustParseAddr(a)
		k := ciliumipcache.NewKey(netip.PrefixFrom(addr, addr.BitLen()), 0)
		var kv ciliumipcache.RemoteEndpointInfo
		if err := m.Lookup(&k, &kv); err != nil {
			if addr.Is6() {
				continue // no ::/0 entry: the kernel finds nothing either
			}
			t.Fatalf("kernel lookup %s: %v", a, err)
		}
		got, _ := r.Lookup(addr)
		if got.Identity != kv.SecurityIdentity || got.Flags != uint8(kv.Flags) {
			t.Errorf("%s: reader %+v, kernel %s", a, got, kv.String())
		}
	}
}
