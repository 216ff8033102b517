package conntrack

import (
	"fmt"
	"slices"
	"strings"
)

// LocalMap reports whether name is a per-endpoint CT map, which Cilium
// 1.14-1.17 creates for endpoints with the (deprecated, opt-in) option
// ConntrackLocal: the global map's name with the endpoint ID in 5 digits
// instead of "global" (pkg/maps/ctmap/ctmap.go and bpf.LocalMapName,
// v1.14.0-v1.17.0; removed in 1.18). Same key and value layout.
func LocalMap(name string) bool {
	for _, prefix := range [...]string{"cilium_ct4_", "cilium_ct6_", "cilium_ct_any4_", "cilium_ct_any6_"} {
		if id, ok := strings.CutPrefix(name, prefix); ok && len(id) == 5 {
			for _, c := range id {
				if c < '0' || c > '9' {
					return false
				}
			}
			return true
		}
	}
	return false
}

// mapNames returns the maps to read this poll: the configured ones, or the
// global ones plus every per-endpoint map the source lists. When the
// listing fails it returns the maps listed last, and the error: forgetting
// the per-endpoint maps would make their next read a baseline, and what
// they moved meanwhile would be lost.
func (p *Poller) mapNames() ([]string, error) {
	if p.cfg.Maps != nil {
		return p.cfg.Maps, nil
	}
	l, ok := p.src.(Lister)
	if !ok {
		return MapNames, nil
	}
	listed, err := l.List()
	if err != nil {
		if p.names == nil {
			return MapNames, fmt.Errorf("%w: listing the conntrack maps: %w", errRead, err)
		}
		return p.names, fmt.Errorf("%w: listing the conntrack maps (reading the %d listed before): %w", errRead, len(p.names), err)
	}
	p.names = append(p.names[:0], MapNames...)
	for _, n := range listed {
		if LocalMap(n) {
			p.names = append(p.names, n)
		}
	}
	return p.names, nil
}

// forgetGone drops the state of maps no longer listed (an endpoint's map
// goes with the endpoint).
func (p *Poller) forgetGone(names []string) {
	if len(p.tables) <= len(names) {
		return
	}
	for name := range p.tables {
		if !slices.Contains(names, name) {
			delete(p.tables, name)
		}
	}
}
