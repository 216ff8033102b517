package gpu

import (
	"strconv"
	"strings"
)

// devKey names a GPU or MIG instance the way a device plugin does: by UUID
// (GPU-..., or MIG-... in mig), or by device minor number (GKE's nvidiaN).
// gi is the MIG GPU instance id, NoInstance for a whole GPU. A struct key
// keeps scrape-time lookups free of string building.
type devKey struct {
	uuid  string
	mig   string
	minor int
	gi    int
}

// parseDeviceID reads a kubelet PodResources device id as NVIDIA's device
// plugins report it:
//
//	GPU-<uuid>                   whole GPU (NVIDIA's device plugin, whatever
//	                             its DEVICE_ID_STRATEGY: it maps index ids
//	                             back to UUIDs for the kubelet)
//	MIG-<uuid>                   MIG device (R470+ drivers)
//	MIG-GPU-<uuid>/<gi>/<ci>     MIG device (older drivers)
//	nvidiaN                      whole GPU by device minor number (GKE)
//	nvidiaN/giM                  MIG instance M of GPU nvidiaN (GKE)
//	nvidiaN/vgpuK                replica K of a time-shared or MPS GPU (GKE)
//	nvidiaN/giM/vgpuK            replica K of a shared MIG instance (GKE)
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
		return devKey{uuid: parts[0], minor: -1, gi: int(gi)}, true
	case strings.HasPrefix(id, "MIG-"):
		if !validUUID(id) {
			return devKey{}, false
		}
		return devKey{mig: id, minor: -1, gi: NoInstance}, true
	case strings.HasPrefix(id, "GPU-"):
		if !validUUID(id) {
			return devKey{}, false
		}
		return devKey{uuid: id, minor: -1, gi: NoInstance}, true
	case strings.HasPrefix(id, "nvidia"):
		parts := strings.Split(id, "/")
		n, ok := minorOf(parts[0])
		if !ok || len(parts) > 3 {
			return devKey{}, false
		}
		k := devKey{minor: n, gi: NoInstance}
		rest := parts[1:]
		if len(rest) > 0 && strings.HasPrefix(rest[0], "gi") {
			gi, err := strconv.ParseUint(rest[0][2:], 10, 16)
			if err != nil {
				return devKey{}, false
			}
			k.gi = int(gi)
			rest = rest[1:]
		}
		switch {
		case len(rest) == 0:
		case len(rest) == 1 && strings.HasPrefix(rest[0], "vgpu"):
			if _, err := strconv.ParseUint(rest[0][4:], 10, 16); err != nil {
				return devKey{}, false
			}
		default:
			return devKey{}, false
		}
		return k, true
	}
	return devKey{}, false
}

// minorOf reads the number of a device node name nvidiaN.
func minorOf(dev string) (int, bool) {
	if !strings.HasPrefix(dev, "nvidia") {
		return 0, false
	}
	n, err := strconv.ParseUint(dev[len("nvidia"):], 10, 16)
	if err != nil {
		return 0, false
	}
	return int(n), true
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
// first. It writes into buf to stay allocation-free. The device minor comes
// from the source's device name; where the source has none, the NVML index
// stands in (they agree unless the driver enumerates GPUs out of order).
func keysFor(s *Sample, buf *[3]devKey) []devKey {
	minor, ok := minorOf(s.Device)
	if !ok {
		minor = s.Index
	}
	n := 0
	if s.MIG() {
		if s.MIGUUID != "" {
			buf[n] = devKey{mig: s.MIGUUID, minor: -1, gi: NoInstance}
			n++
		}
		buf[n] = devKey{uuid: s.UUID, minor: -1, gi: s.GI}
		n++
	} else {
		buf[n] = devKey{uuid: s.UUID, minor: -1, gi: NoInstance}
		n++
	}
	if minor >= 0 {
		buf[n] = devKey{minor: minor, gi: s.GI}
		n++
	}
	return buf[:n]
}
