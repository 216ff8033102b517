//go:build !linux

package confine

import (
	"errors"

	"github.com/cilium/ebpf"
)

// Opener opens pinned maps through the parent (Linux only).
type Opener struct{}

// Child returns nil, nil: no process is ever a confined child here.
func Child() (*Opener, error) { return nil, nil }

// LoadPinnedMap is not reached: Child never returns an Opener here.
func (*Opener) LoadPinnedMap(string) (*ebpf.Map, error) { return nil, errNotLinux }

// Supervise refuses: seccomp and pinned BPF maps are Linux's.
func Supervise() (int, error) { return 1, errNotLinux }

var errNotLinux = errors.New("confinement needs Linux (seccomp, BPF); run with --no-bpf.confine")
