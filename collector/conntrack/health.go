package conntrack

import (
	"errors"
	"syscall"
)

// Down reasons, also the log keys.
const (
	reasonAbsent      = "absent"
	reasonPermission  = "permission"
	reasonOpen        = "open"
	reasonLayout      = "layout"
	reasonRead        = "read"
	reasonImplausible = "implausible"
	reasonAccounting  = "accounting_off"
	reasonAmbiguous   = "layout_ambiguous"
)

var errorReasons = []string{reasonAbsent, reasonPermission, reasonOpen, reasonLayout, reasonRead, reasonImplausible}

// advice is what an operator should change, logged once per state change;
// accounting_off is EnableAdvice.
var advice = map[string]string{
	reasonAbsent:     "no Cilium conntrack map found: is Cilium running on this node, is the host's /sys/fs/bpf mounted into the exporter (hostPath, mountPropagation HostToContainer), and does --conntrack.bpffs-path point at Cilium's tc/globals folder?",
	reasonPermission: "not allowed to read BPF maps: run the exporter as root with capability BPF (SYS_ADMIN on kernels before 5.8)",
	reasonOpen:       "opening a conntrack map failed",
	reasonLayout:     "a conntrack map has a layout this exporter does not know (a newer Cilium?): no bytes are counted from it",
	reasonRead:       "reading a conntrack map failed; counts from the other maps continue",
	reasonAmbiguous:  "the entries disagree about Cilium's ct_entry layout and the Cilium version is not known: set --conntrack.cilium-version (or --conntrack.layout=combined for Cilium 1.16 and later, split before 1.16); egress entries are counted, the growth of ingress entries is held until then",
}

// How to turn accounting on, by Cilium version (checked in each version's
// daemon/cmd/daemon_main.go, pkg/option and Helm chart).
const (
	// 1.14/1.15: the agent sets ConntrackAccounting on at start
	// (daemon_main.go: Opts.SetBool(option.ConntrackAccounting, true)).
	adviceUpTo115 = "Cilium 1.14/1.15 counts by default, so someone turned it off at run time: run `cilium-dbg config ConntrackAccounting=Enabled` (Cilium 1.14: `cilium config ...`) in every cilium agent pod, or restart the agents"
	// 1.16: SetBool(option.ConntrackAccounting, false), no flag, no value.
	advice116 = "Cilium 1.16 has no flag or Helm value for it: run `cilium-dbg config ConntrackAccounting=Enabled` in every cilium agent pod; the agent turns it off again whenever it restarts, so repeat it after each restart (or upgrade to 1.17)"
	// 1.17+: --bpf-conntrack-accounting (cilium#34921, #35142), Helm
	// bpf.ctAccounting; the 1.18+ chart writes the ConfigMap value as "1".
	advice117 = "Cilium 1.17 and later: set the Helm value bpf.ctAccounting=true (agent flag --bpf-conntrack-accounting; ConfigMap key bpf-conntrack-accounting, \"true\" in 1.17, \"1\" from 1.18) and restart the Cilium agents"
)

// EnableAdvice says how to turn Cilium's conntrack accounting on: for
// version when it is known ("1.16.3", "v1.17.0"), else for the layout the
// maps have (split: 1.14/1.15; combined: 1.16 and later), else for all.
func EnableAdvice(version string, layout Layout) string {
	const tail = "; no bytes are counted until then"
	minor := versionMinor(version)
	switch {
	case minor >= 14 && minor <= 15:
		return adviceUpTo115 + tail
	case minor == 16:
		return advice116 + tail
	case minor >= 17:
		return advice117 + tail
	case layout == LayoutSplit:
		return adviceUpTo115 + tail
	case layout == LayoutCombined:
		return advice116 + ". " + advice117 + tail
	}
	return adviceUpTo115 + ". " + advice116 + ". " + advice117 + tail
}

func errReason(err error) string {
	var le *ErrLayout
	switch {
	case errors.As(err, &le):
		return reasonLayout
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return reasonPermission
	case errors.Is(err, errRead):
		return reasonRead
	}
	return reasonOpen
}

var errRead = errors.New("conntrack map read failed")

// setState records up/down and logs only when the state changes.
func (p *Poller) setState(reason string, err error) {
	p.up.Store(reason == "")
	if p.polled && reason == p.reason {
		return
	}
	p.polled = true
	p.reason = reason
	if reason == "" {
		p.log.Info("conntrack source up", "layout", p.layout.String())
		return
	}
	fix := advice[reason]
	if reason == reasonAccounting {
		fix = "Cilium's conntrack accounting is off (connections created since the exporter started count no packets): " + EnableAdvice(p.version, p.layout)
	}
	args := []any{"reason", reason, "fix", fix}
	if err != nil && reason == errReason(err) {
		args = append(args, "err", err)
	}
	p.log.Warn("conntrack source down: no bytes counted", args...)
}
