package gpu

import "testing"

func TestParseDeviceID(t *testing.T) {
	const u = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
	const m = "MIG-0e0d6b5f-2c3a-5a8e-9d3b-2b1c7c1a9f10"
	for _, tc := range []struct {
		id   string
		want devKey
		ok   bool
	}{
		{u, devKey{uuid: u, minor: -1, gi: NoInstance}, true},
		{u + "::0", devKey{uuid: u, minor: -1, gi: NoInstance}, true},
		{u + "::17", devKey{uuid: u, minor: -1, gi: NoInstance}, true},
		{m, devKey{mig: m, minor: -1, gi: NoInstance}, true},
		{m + "::3", devKey{mig: m, minor: -1, gi: NoInstance}, true},
		{"MIG-" + u + "/7/0", devKey{uuid: u, minor: -1, gi: 7}, true},
		{"nvidia0", devKey{minor: 0, gi: NoInstance}, true},
		{"nvidia7::2", devKey{minor: 7, gi: NoInstance}, true},
		{"nvidia3/gi5", devKey{minor: 3, gi: 5}, true},
		{"nvidia1/vgpu4", devKey{minor: 1, gi: NoInstance}, true},
		// GKE's MIG plus sharing: dcgm-exporter matches the same shape,
		// `^nvidia([0-9]+)/gi([0-9]+)(/vgpu[0-9]+)?$` (NVIDIA/dcgm-exporter
		// 4.5.3-4.8.2, internal/pkg/transformation/kubernetes.go).
		{"nvidia1/gi2/vgpu0", devKey{minor: 1, gi: 2}, true},
		{"nvidia6/gi14/vgpu31::1", devKey{minor: 6, gi: 14}, true},
		{"GPU-7ad09335-aadb-19c3-e3a8", devKey{uuid: "GPU-7ad09335-aadb-19c3-e3a8", minor: -1, gi: NoInstance}, true}, // truncated, as in the wild
		{"", devKey{}, false},
		{"GPU-", devKey{}, false},
		{"GPU-zz", devKey{}, false},
		{u + "::", devKey{}, false},
		{u + "::x", devKey{}, false},
		{"MIG-" + u + "/7", devKey{}, false},
		{"MIG-" + u + "/x/0", devKey{}, false},
		{"nvidia", devKey{}, false},
		{"nvidiax", devKey{}, false},
		{"nvidia0/gix", devKey{}, false},
		{"nvidia0/foo", devKey{}, false},
		{"nvidia0/vgpu1/gi2", devKey{}, false},
		{"nvidia0/gi1/vgpu", devKey{}, false},
		{"nvidia0/gi1/vgpu1/x", devKey{}, false},
		{"0000:3b:00.0", devKey{}, false},
		{"amd.com/gpu", devKey{}, false},
	} {
		got, ok := parseDeviceID(tc.id)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseDeviceID(%q) = %+v, %v; want %+v, %v", tc.id, got, ok, tc.want, tc.ok)
		}
	}
}

func TestKeysForMatchesDeviceIDs(t *testing.T) {
	const u = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
	const m = "MIG-0e0d6b5f-2c3a-5a8e-9d3b-2b1c7c1a9f10"
	whole := Sample{UUID: u, Index: 2, GI: NoInstance}
	mig := Sample{UUID: u, Index: 2, GI: 5, MIGUUID: m}
	migNoUUID := Sample{UUID: u, Index: 2, GI: 5}
	// The device minor number decides over the NVML index when the source
	// names it (dcgm-exporter's device label).
	byMinor := Sample{UUID: u, Index: 2, Device: "nvidia4", GI: NoInstance}
	migByMinor := Sample{UUID: u, Index: 2, Device: "nvidia4", GI: 5}
	for _, tc := range []struct {
		s  Sample
		id string
		ok bool
	}{
		{whole, u, true},
		{whole, u + "::1", true},
		{whole, "nvidia2", true},
		{whole, "nvidia2/vgpu0", true},
		{whole, "nvidia3", false},
		{whole, m, false},
		{whole, "nvidia2/gi5", false},
		{mig, m, true},
		{mig, m + "::0", true},
		{mig, "MIG-" + u + "/5/0", true},
		{mig, "nvidia2/gi5", true},
		{mig, u, false},
		{mig, "nvidia2", false},
		{migNoUUID, m, false}, // a MIG UUID needs a source that knows it (NVML)
		{migNoUUID, "nvidia2/gi5", true},
		{migNoUUID, "nvidia2/gi5/vgpu3", true},
		{byMinor, "nvidia4", true},
		{byMinor, "nvidia4/vgpu1", true},
		{byMinor, "nvidia2", false},
		{migByMinor, "nvidia4/gi5/vgpu0", true},
		{migByMinor, "nvidia2/gi5", false},
	} {
		k, ok := parseDeviceID(tc.id)
		if !ok {
			t.Fatalf("parseDeviceID(%q) failed", tc.id)
		}
		var buf [3]devKey
		found := false
		for _, sk := range keysFor(&tc.s, &buf) {
			found = found || sk == k
		}
		if found != tc.ok {
			t.Errorf("sample %+v vs device %q: matched %v, want %v", tc.s, tc.id, found, tc.ok)
		}
	}
}
