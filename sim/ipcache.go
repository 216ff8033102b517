package sim

import (
	"net/netip"
	"sort"
	"strings"

	"github.com/zonewatch/zonewatch/collector/ipcache"
)

// IPCacheSource is the ipcache node's Cilium agent holds for the scenario
// (collector/ipcache, "What Cilium writes"): every pod's /32 with its
// identity (one per label set) and, on another node, that node's IP as
// tunnel endpoint; the nodes' own addresses (host on node, remote-node
// elsewhere); the world prefix.
func (s *Scenario) IPCacheSource(node string) ipcache.Source {
	t := ipcache.NewMemTable(ipcache.LayoutV2)
	t.Put(netip.MustParsePrefix("0.0.0.0/0"), ipcache.Value{Identity: ipcache.IdentityWorld})
	nodeIP := map[string]netip.Addr{}
	for _, n := range s.Nodes {
		nodeIP[n.Name] = n.IP
		id := ipcache.IdentityRemoteNode
		if n.Name == node {
			id = ipcache.IdentityHost
		}
		t.Put(netip.PrefixFrom(n.IP, n.IP.BitLen()), ipcache.Value{Identity: id})
	}
	ids := map[string]uint32{}
	for _, p := range s.AllPods() {
		if !p.IP.IsValid() || p.Node == "" {
			continue
		}
		keys := make([]string, 0, len(p.Labels))
		for k, v := range p.Labels {
			keys = append(keys, k+"="+v)
		}
		sort.Strings(keys)
		key := p.Namespace + "|" + strings.Join(keys, ",")
		id, ok := ids[key]
		if !ok {
			id = uint32(10000 + len(ids))
			ids[key] = id
		}
		v := ipcache.Value{Identity: id}
		if p.Node != node {
			v.TunnelEndpoint, v.Flags = nodeIP[p.Node], ipcache.FlagHasTunnelEndpoint
		}
		t.Put(netip.PrefixFrom(p.IP, p.IP.BitLen()), v)
	}
	src := ipcache.NewMemSource()
	src.Set(ipcache.MapV2, t)
	return src
}
