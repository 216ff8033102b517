package conntrack

// SetCiliumVersion gives the Cilium version the agent reports (Hubble's
// ServerStatus); unless --conntrack.layout forces one, it decides the
// layout of every map at once, without waiting for entries to tell.
func (p *Poller) SetCiliumVersion(version string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setVersion(version)
}

func (p *Poller) setVersion(version string) {
	p.version = version
	if p.cfg.Layout != LayoutAuto {
		return
	}
	l, ok := VersionLayout(version)
	if !ok {
		p.log.Info("the Cilium version does not tell the conntrack layout; it is told from the entries", "version", version)
		return
	}
	if l == p.versionLayout {
		return
	}
	p.versionLayout = l
	p.log.Info("conntrack layout decided from the Cilium version", "version", version, "layout", l.String())
	for name, ts := range p.tables {
		if ts.layout == l {
			continue
		}
		if ts.layout != LayoutAuto {
			p.log.Warn("conntrack layout changed: the Cilium version says otherwise than the entries did", "map", name, "was", ts.layout.String(), "layout", l.String(), "version", version)
			p.m.layoutChanges.WithLabelValues(mapLabel(name)).Inc()
		}
		p.setLayout(ts, l)
	}
	p.useLayout(l)
}
