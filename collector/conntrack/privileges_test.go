package conntrack_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestReadPinnedMapsWithChartPrivileges reads real pinned CT maps the way
// the chart's pod does: the parent (full root) mounts a bpffs, mode 0700
// as a host's, and pins a map with Cilium's layout holding entries; a
// child of this test binary, running with the chart's container
// securityContext (setpriv: root holding CAP_BPF only, no_new_privs),
// opens it through BPFSource and counts the entries.
func TestReadPinnedMapsWithChartPrivileges(t *testing.T) {
	if vals, child := testenv.AsChild(t); child {
		tab, err := conntrack.BPFSource{Dir: vals["DIR"]}.Open(conntrack.MapTCP4)
		if err != nil {
			t.Fatalf("with the chart's privileges: %v", err)
		}
		defer tab.Close()
		n := 0
		if err := tab.Each(func(_, _ []byte) { n++ }); err != nil {
			t.Fatal(err)
		}
		if strconv.Itoa(n) != vals["N"] {
			t.Fatalf("read %d entries, want %s", n, vals["N"])
		}
		return
	}
	testenv.Integration(t)
	testenv.CanStartAs(t)
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		if testenv.Required() {
			t.Fatal(err)
		}
		t.Skipf("mounting a bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	dir := filepath.Join(mnt, "tc", "globals")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: conntrack.KeySize4, ValueSize: conntrack.ValueSize, MaxEntries: 16})
	if err != nil {
		t.Skipf("creating a BPF map: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	const entries = 3
	for i := range entries {
		key := make([]byte, conntrack.KeySize4)
		key[0], key[4] = 10, byte(i+1) // saddr 10.0.0.x
		if err := m.Put(key, make([]byte, conntrack.ValueSize)); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Pin(filepath.Join(dir, conntrack.MapTCP4)); err != nil {
		t.Fatal(err)
	}
	sc := testenv.ChartSecurityContext(t)
	out, err := testenv.RunTestAs(t, sc, map[string]string{"DIR": dir, "N": strconv.Itoa(entries)})
	if err != nil {
		t.Fatalf("reading the pinned map as %s: %v\n%s", sc, err, out)
	}
	t.Logf("as %s: read the %d entries", sc, entries)
}
