package ctmappeer

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/cilium/pkg/identity"
	"github.com/cilium/cilium/pkg/maps/ctmap"
	"github.com/cilium/cilium/pkg/tuple"
	"github.com/cilium/cilium/pkg/u8proto"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/topology"
)

// TestOpenersByCiliumIdentity: ingress entries on n1 of connections to a
// job pod, from n2's cilium_host address, one per opener identity as
// Cilium numbers them (pkg/identity v1.20.2), written with Cilium's
// types into a map made from its spec. Only a Cilium endpoint (a pod,
// health, init) has an egress entry of its own on its node, which counts
// the connection there; every other opener's bytes are counted here, at
// the acceptor, with the opener's zone (issue 26: world on the router
// address was counted by nobody). The layout comes from the agent's
// version as Hubble reports it, with no entry that saw a reply needed.
func TestOpenersByCiliumIdentity(t *testing.T) {
	dir := bpfDir(t)
	tcp4 := ciliumMap(t, dir, ctmap.MapNameTCP4Global, ctmap.MapConfig{TCP: true})
	reg := prometheus.NewRegistry()
	p, err := conntrack.New(conntrack.BPFSource{Dir: dir}, index(), conntrack.Config{Node: "n1", Self: reg,
		CiliumVersion: "cilium v1.20.2+g5f2b0f9"})
	if err != nil {
		t.Fatal(err)
	}
	router2 := netip.MustParseAddr("10.2.0.1") // n2's cilium_host
	openers := []struct {
		id       identity.NumericIdentity
		endpoint bool
	}{
		{identity.ReservedIdentityHost, false},
		{identity.ReservedIdentityWorld, false},
		{identity.ReservedIdentityWorldIPv4, false},
		{identity.ReservedIdentityUnmanaged, false},
		{identity.ReservedIdentityRemoteNode, false},
		{identity.ReservedIdentityKubeAPIServer, false},
		{identity.ReservedIdentityIngress, false},
		{identity.IdentityScopeLocal | 5, false},      // a CIDR identity
		{identity.IdentityScopeRemoteNode | 3, false}, // a per-node remote-node identity
		{identity.ReservedIdentityHealth, true},
		{identity.ReservedIdentityInit, true},
		{identity.MinimalNumericIdentity + 1000, true}, // a pod
	}
	write := func(scale uint64) {
		for i, o := range openers {
			update(t, tcp4, key4(router2, worker0, 50000+uint16(i), 29500, u8proto.TCP, tuple.TUPLE_F_IN),
				&ctmap.CtEntry{Packets: scale, Bytes: 100 * scale, TxFlagsSeen: tcpFlags, RxFlagsSeen: tcpFlags,
					SourceSecurityID: o.id.Uint32()})
		}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	write(1)
	p.Poll(t0)
	write(5)
	p.Poll(t0.Add(10 * time.Second))
	want := 0.0
	for _, o := range openers {
		if !o.endpoint {
			want += 400
		}
	}
	if got := p.Bytes("ml", "train", "z-b", "z-a", topology.LocalityCrossZone); got != want {
		t.Fatalf("counted %v bytes at the acceptor, want %v (every opener but Cilium's endpoints)", got, want)
	}
	if !p.Up() {
		t.Fatal("source down")
	}
}
