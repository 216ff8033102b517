package deploy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/zonewatch/zonewatch/collector/conntrack"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
)

// nodeSockets are a node's host-side endpoints as Cilium and the kubelet
// make them: the Hubble socket (0660, root and the socket group), the
// kubelet's PodResources socket (root, 0755 as a listening socket gets it
// under the kubelet's umask), and Cilium's conntrack maps pinned in a
// bpffs mounted mode 0700 (pins 0600, root).
type nodeSockets struct {
	hubble, podResources, bpfDir string
}

// socketGroup is the gid the Hubble socket is given, standing for the
// host's group "cilium" (absent on this machine; testenv.CiliumSocket
// uses it where it exists).
const socketGroup = 4242

func startNodeSockets(t *testing.T) nodeSockets {
	t.Helper()
	dir := t.TempDir()
	s := sim.Default()
	hub := sim.NewHubble(s, rbacNode, 0)
	ns := nodeSockets{hubble: filepath.Join(dir, "cilium", "hubble.sock"), podResources: filepath.Join(dir, "pod-resources", "kubelet.sock")}
	for _, d := range []string{filepath.Dir(ns.hubble), filepath.Dir(ns.podResources)} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := hub.Start(ns.hubble); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Stop)
	testenv.CiliumSocket(t, ns.hubble)
	if err := os.Chown(ns.hubble, 0, socketGroup); err != nil {
		t.Fatal(err)
	}
	old := syscall.Umask(0o022)
	pr, err := sim.StartPodResources(s, rbacNode, ns.podResources)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pr.Close)

	bpffs := filepath.Join(dir, "bpffs")
	if err := os.Mkdir(bpffs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		if testenv.Required() {
			t.Fatal(err)
		}
		t.Skipf("mounting a bpffs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(bpffs, syscall.MNT_DETACH) })
	ns.bpfDir = filepath.Join(bpffs, "tc", "globals")
	if err := os.MkdirAll(ns.bpfDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{conntrack.MapTCP4, conntrack.MapAny4} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: conntrack.KeySize4, ValueSize: conntrack.ValueSize, MaxEntries: 64})
		if err != nil {
			t.Skipf("creating a BPF map: %v", err)
		}
		t.Cleanup(func() { m.Close() })
		if err := m.Pin(filepath.Join(ns.bpfDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{ns.hubble, ns.podResources, ns.bpfDir} {
		testenv.Reachable(t, p)
	}
	return ns
}

// TestExporterPrivileges runs the real exporter with the chart's container
// securityContext, and with less, against a node's real sockets and pinned
// BPF maps: what each source needs, measured. The chart's default (root
// holding CAP_BPF only, no_new_privs) reads every source. Without CAP_BPF,
// root still reads the pinned maps on Linux 6.5 and later (the bpf()
// syscall checks the capability only to create maps and load programs
// since "bpf: move unprivileged checks into map_create() and
// bpf_prog_load()"; opening a pin checks the file's mode, 0600 root);
// before 6.5, with unprivileged BPF disabled, the conntrack source is down
// and says why. As nobody (65534) the pins, the kubelet's socket and, without
// its group, the Hubble socket are out of reach; with the group (the
// chart's hubble.socketGroup) Hubble works.
func TestExporterPrivileges(t *testing.T) {
	c := startRBACCluster(t)
	id := c.api.ChartIdentity(t, nil)
	ns := startNodeSockets(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "# no GPUs on this page")
	}))
	t.Cleanup(page.Close)
	chart := testenv.ChartSecurityContext(t)
	if chart.UID != 0 || len(chart.Caps) != 1 || !strings.EqualFold(chart.Caps[0], "BPF") || !chart.NoNewPrivs {
		t.Fatalf("the chart's DaemonSet runs as %s, want root holding BPF only with no_new_privs (update this test with the chart)", chart)
	}
	noBPF, noBPFLog := "0", "not allowed to read BPF maps: run the exporter as root with capability BPF"
	if kernelAtLeast(t, 6, 5) {
		noBPF, noBPFLog = "1", ""
	}
	nobody := testenv.SecurityContext{UID: 65534, GID: 65534, NoNewPrivs: true}
	withGroup := nobody
	withGroup.Groups = []int{socketGroup}
	for _, tc := range []struct {
		name string
		sc   testenv.SecurityContext
		want map[string]string
		// log and log2 say what the user sees when a source is down
		log, log2 string
	}{
		{"chart", chart, map[string]string{"kubernetes": "1", "hubble": "1", "podresources": "1", "conntrack": "1"}, "", ""},
		{"chart without CAP_BPF", chart.Without("BPF"), map[string]string{"kubernetes": "1", "hubble": "1", "podresources": "1", "conntrack": noBPF},
			noBPFLog, ""},
		{"nobody with the socket group", withGroup, map[string]string{"kubernetes": "1", "hubble": "1", "podresources": "0", "conntrack": "0"},
			"not allowed to read BPF maps: run the exporter as root with capability BPF",
			`msg="permission denied on a host socket: the kubelet's PodResources socket is root's`},
		{"nobody", nobody, map[string]string{"kubernetes": "1", "hubble": "0", "podresources": "0", "conntrack": "0"},
			"not allowed to read BPF maps: run the exporter as root with capability BPF",
			`msg="permission denied on a host socket: the Hubble socket is root's, mode 0660, group cilium where that group exists: run as root, or set the chart's hubble.socketGroup to that group's gid" component=hubble starved_source=hubble`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
			name := "exporter-" + strings.ReplaceAll(tc.name, " ", "-")
			testenv.StartAs(t, c.dir, name, tc.sc, c.bin, "--kubeconfig="+id.Kubeconfig, "--web.listen-address="+addr,
				"--node-name="+rbacNode, "--no-probe.enabled",
				"--hubble.address=unix://"+ns.hubble,
				"--gpu.source=dcgm-exporter", "--gpu.dcgm-exporter-url="+page.URL+"/metrics", "--gpu.interval=1s",
				"--gpu.podresources-socket="+ns.podResources,
				"--conntrack.bpffs-path="+ns.bpfDir, "--conntrack.layout=combined", "--conntrack.cilium-version=1.20.2", "--conntrack.poll-interval=1s")
			e := runningExporter{addr: addr, log: filepath.Join(c.dir, name+".log")}
			e.waitSources(t, tc.want)
			logs, _ := os.ReadFile(e.log)
			for _, want := range []string{tc.log, tc.log2} {
				if want != "" && !strings.Contains(string(logs), want) {
					t.Errorf("the exporter log lacks %q:\n%s", want, logs)
				}
			}
			if tc.log2 == "" && strings.Contains(string(logs), "permission denied on a host socket") {
				t.Errorf("a socket reported refused as %s:\n%s", tc.sc, logs)
			}
			t.Logf("as %s: zonewatch_source_up %v", tc.sc, tc.want)
			for _, l := range strings.Split(string(logs), "\n") {
				if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
					t.Logf("  %s", l)
				}
			}
		})
	}
}

// kernelAtLeast reports whether the running kernel is major.minor or later.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	var ma, mi int
	if _, err := fmt.Sscanf(b.String(), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", b.String(), err)
	}
	t.Logf("kernel %s", b.String())
	return ma > major || ma == major && mi >= minor
}
