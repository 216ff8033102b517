package gpu

import (
	"strconv"
	"strings"
)

// devKey names a GPU or MIG instance the way a device plugin does: by UUID
// (GPU-..., or MIG-... in mig), or by NVML index (nvidiaN). gi is the MIG GPU
// instance id, NoInstance for a whole GPU. A struct key keeps scrape-time
// lookups free of string building.
type devKey struct {
	uuid  string
	mig   string
	index int
	gi    int
}

// parseDeviceID reads a kubelet PodResources device id as NVIDIA's device
// plugins report it:
//
//	GPU-<uuid>                   whole GPU (the default id strategy)
//	MIG-<uuid>                   MIG device (R470+ drivers)
//	MIG-GPU-<uuid>/<gi>/<ci>     MIG device (older drivers)
//	nvidiaN                      whole GPU by index (id strategy "index", GKE)
//	nvidiaN/giM                  MIG instance by index (GKE)
//	nvidiaN/vgpuK                a time-shared GPU (GKE)
//
// each optionally with a "::N" replica suffix when time-slicing shares the
// device. ok is false for anything else.
func parseDeviceID(id string) (devKey, bool) {
	if i := strings.Index(id, "::"); i >= 0 {
		if _, err := strconv.ParseUint(id[i+2:], 10, 32); err != nil {
			return devKey{}, false
		}
		id = id[:i]
	}
	switch {
	case strings.HasPrefix(id, "MIG-GPU-"):
		parts := strings.Split(id[len("MIG-"):], "/")
		if len(parts) != 3 || !validUUID(parts[0]) {
			return devKey{}, false
		}
		gi, err := strconv.ParseUint(parts[1], 10, 16)
		if err != nil {
			return devKey{}, false
		}
		if _, err := strconv.ParseUint(parts[2], 10, 16); err != nil {
			return devKey{}, false
		}
		return devKey{uuid: parts[0], index: -1, gi: int(gi)}, true
	case strings.HasPrefix(id, "MIG-"):
		if !validUUID(id) {
			return devKey{}, false
		}
		return devKey{mig: id, index: -1, gi: NoInstance}, true
	case strings.HasPrefix(id, "GPU-"):
		if !validUUID(id) {
			return devKey{}, false
		}
		return devKey{uuid: id, index: -1, gi: NoInstance}, true
	case strings.HasPrefix(id, "nvidia"):
		rest := id[len("nvidia"):]
		sub := ""
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			rest, sub = rest[:i], rest[i+1:]
		}
		n, err := strconv.ParseUint(rest, 10, 16)
		if err != nil {
			return devKey{}, false
		}
		k := devKey{index: int(n), gi: NoInstance}
		switch {
		case sub == "":
		case strings.HasPrefix(sub, "gi"):
			gi, err := strconv.ParseUint(sub[2:], 10, 16)
			if err != nil {
				return devKey{}, false
			}
			k.gi = int(gi)
		case strings.HasPrefix(sub, "vgpu"):
			if _, err := strconv.ParseUint(sub[4:], 10, 16); err != nil {
				return devKey{}, false
			}
		default:
			return devKey{}, false
		}
		return k, true
	}
	return devKey{}, false
}

// validUUID accepts GPU-/MIG- followed by hex digits and dashes; real ones
// are 36 characters after the prefix, but truncated ones appear in the wild.
func validUUID(s string) bool {
	s = s[4:]
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '-') {
			return false
		}
	}
	return true
}

// keysFor lists the keys a sample may be allocated under, most specific
// first. It writes into buf to stay allocation-free.
func keysFor(s *Sample, buf *[3]devKey) []devKey {
	if s.MIG() {
		n := 0
		if s.MIGUUID != "" {
			buf[n] = devKey{mig: s.MIGUUID, index: -1, gi: NoInstance}
			n++
		}
		buf[n] = devKey{uuid: s.UUID, index: -1, gi: s.GI}
		n++
		if s.Index >= 0 {
			buf[n] = devKey{index: s.Index, gi: s.GI}
			n++
		}
		return buf[:n]
	}
	buf[0] = devKey{uuid: s.UUID, index: -1, gi: NoInstance}
	if s.Index >= 0 {
		buf[1] = devKey{index: s.Index, gi: NoInstance}
		return buf[:2]
	}
	return buf[:1]
}
