package main

import (
	"log/slog"
	"os"

	"github.com/cilium/ebpf"

	"github.com/zonewatch/zonewatch/internal/confine"
)

// confineSelf applies --bpf.confine (internal/confine): in the first
// process it starts the confined child and serves its map opens until the
// child ends (exit true, with the child's exit code); in the child it
// returns the opener the BPF sources read through. Off, it says what is
// lost and returns nil (the sources open pins themselves, read-only).
func confineSelf(o *options, logger *slog.Logger) (loadPin func(string) (*ebpf.Map, error), code int, exit bool) {
	if !*o.confine {
		logger.Warn("BPF confinement off (--no-bpf.confine): with root and CAP_BPF this process could open Cilium's pinned maps for writing")
		return nil, 0, false
	}
	op, err := confine.Child()
	if err != nil {
		logger.Error("confining the exporter", "err", err)
		return nil, 1, true
	}
	if op == nil {
		code, err := confine.Supervise()
		if err != nil {
			logger.Error("running the confined exporter", "err", err)
		}
		return nil, code, true
	}
	logger.Info("BPF confinement on: bpf() only reads open maps; pinned maps are opened read-only by the parent process", "parent_pid", os.Getppid())
	return op.LoadPinnedMap, 0, false
}
