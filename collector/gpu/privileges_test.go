package gpu_test

import (
	"context"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/internal/testenv"
	"github.com/zonewatch/zonewatch/sim"
)

// TestPodResourcesWithChartPrivileges reads the kubelet's PodResources
// socket the way the chart's pod does: the parent serves the simulated
// node's allocations on a socket made as the kubelet makes it (root,
// srwxr-xr-x under umask 022: only root may connect), and a child of this
// test binary, with the chart's container securityContext (setpriv: root
// holding CAP_BPF only, no_new_privs), lists them through DialPodResources.
func TestPodResourcesWithChartPrivileges(t *testing.T) {
	if vals, child := testenv.AsChild(t); child {
		n, err := allocatedDevices(vals["SOCKET"])
		if err != nil {
			t.Fatalf("with the chart's privileges: %v", err)
		}
		if strconv.Itoa(n) != vals["DEVICES"] {
			t.Fatalf("%d GPU devices allocated, want %s", n, vals["DEVICES"])
		}
		return
	}
	testenv.Integration(t)
	testenv.CanStartAs(t)
	s := sim.Default()
	var node string
	for _, n := range s.Nodes {
		if len(n.GPUs) > 0 {
			node = n.Name
			break
		}
	}
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	old := syscall.Umask(0o022)
	srv, err := sim.StartPodResources(s, node, sock)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	// What root reads here is what the child must read.
	n, err := allocatedDevices(sock)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatalf("node %s: no GPU allocated in the simulation", node)
	}
	sc := testenv.ChartSecurityContext(t)
	out, err := testenv.RunTestAs(t, sc, map[string]string{"SOCKET": sock, "DEVICES": strconv.Itoa(n)})
	if err != nil {
		t.Fatalf("reading PodResources as %s: %v\n%s", sc, err, out)
	}
	t.Logf("as %s: %d GPU devices of node %s mapped to pods", sc, n, node)
}

// allocatedDevices counts the GPU devices that the PodResources socket
// lists as allocated to pods.
func allocatedDevices(sock string) (int, error) {
	pr, err := gpu.DialPodResources(sock, gpu.ResourceFilter{}, nil)
	if err != nil {
		return 0, err
	}
	defer pr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := pr.Read(ctx)
	if err != nil {
		return 0, err
	}
	return a.Len(), nil
}
