package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zonewatch/zonewatch/internal/ciliumlab"
)

// hubbleOwnDir is the folder of the agents' Hubble socket in
// TestCiliumLabHubbleWithoutAgentSocket: Cilium's hubble.socketPath set to
// a folder of its own, away from cilium.sock.
const hubbleOwnDir = "/var/run/cilium/hubble"

// TestCiliumLabHubbleWithoutAgentSocket: the DaemonSet exporter follows
// its node's Hubble without the folder of the agent's API socket
// (cilium.sock, the agent's whole REST API) in its mount namespace, both
// ways the chart offers (issue 44, item 1), on real v1.20.2 agents:
//
//   - TLS to the node's own Hubble server on :4244 (Cilium's default
//     hubble.tls: a server certificate for <node>.<cluster>.hubble-grpc.cilium.io,
//     client certificates of Cilium's CA required), as Relay reads it, with
//     a client certificate of the same CA; the exporter mounts nothing of
//     the agent's;
//   - the unix socket in a folder of its own (hubble.socketPath), the only
//     part of /var/run/cilium the exporter's mount namespace holds: the
//     test checks that cilium.sock is not there before it starts the
//     exporter.
//
// A job with a worker on each node sends to its master; each exporter's
// forwarded flow events equal what its node's Hubble saw the workers send.
func TestCiliumLabHubbleWithoutAgentSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts two Cilium agents")
	}
	inLane(t)
	lab, api, _ := startCiliumLabWith(t, ciliumlab.Config{Nodes: []ciliumlab.NodeSpec{labNodes[0], labNodes[2]},
		HubbleTLS: true, HubbleSocketDir: hubbleOwnDir})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	tlsNode, sockNode := lab.Node("gpu-a1"), lab.Node("cpu-b1")
	files := lab.HubbleTLS()
	if _, err := os.Stat(filepath.Join(filepath.Dir(sockNode.HubbleSocket()), "..", "cilium.sock")); err != nil {
		t.Fatalf("the agent's API socket is not beside the Hubble folder, as on a real node: %v", err)
	}

	args := func(n *ciliumlab.Node) map[string]string {
		a := map[string]string{"--gpu.source": "none"}
		if n == tlsNode {
			a["--hubble.address"] = net.JoinHostPort(n.IP.String(), ciliumlab.HubblePort)
			a["--hubble.tls.ca-file"] = files.CA
			a["--hubble.tls.cert-file"] = files.ClientCert
			a["--hubble.tls.key-file"] = files.ClientKey
			a["--hubble.tls.server-name"] = ciliumlab.ServerName(n.Name)
		} else {
			a["--hubble.address"] = "unix://" + hubbleOwnDir + "/hubble.sock"
		}
		return a
	}
	// The socket node's exporter runs in a mount namespace whose
	// /run/cilium is an empty tmpfs but for the Hubble folder, bound in
	// from the node's, as a pod that mounts only that folder sees it.
	stage := t.TempDir()
	wrap := func(n *ciliumlab.Node, argv []string) []string {
		if n == tlsNode {
			return append(argv, "--hubble.tls") // a bare bool flag (kingpin takes no =true)
		}
		script := `set -e
mount --bind /run/cilium/hubble "$1"
mount -t tmpfs -o mode=0755 zwhubble /run/cilium
mkdir /run/cilium/hubble
mount --move "$1" /run/cilium/hubble
if [ -e /run/cilium/cilium.sock ] || [ ! -S /run/cilium/hubble/hubble.sock ]; then
  echo "mount namespace: cilium.sock visible or hubble.sock missing" >&2; ls -la /run/cilium >&2; exit 3
fi
shift
exec "$@"`
		return append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", stage}, argv...)
	}
	addrs := startWrappedExporters(t, lab, api, []*ciliumlab.Node{tlsNode, sockNode}, args, wrap)

	const job, port = "hubble-access", 29500
	labels := func(role string) map[string]string {
		return map[string]string{"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": role}
	}
	add := func(name, node, role string) *ciliumlab.Pod {
		p, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: "ml-team", Name: name, Node: node, Labels: labels(role),
			OwnerAPIVersion: "kubeflow.org/v1", OwnerKind: "PyTorchJob", OwnerName: job, Ports: []int32{port}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.SettledIdentity(ctx, "training.kubeflow.org/job-name"); err != nil {
			t.Fatal(err)
		}
		return p
	}
	master := add(job+"-master-0", sockNode.Name, "master")
	workers := []*ciliumlab.Pod{add(job+"-worker-0", tlsNode.Name, "worker"), add(job+"-worker-1", sockNode.Name, "worker")}
	ex := ciliumlab.Exchange{Up: 16 << 10, Down: 4 << 10, Steps: 10, DialTimeout: 2 * time.Second}
	if _, err := master.Serve(ex.Up, ex.Down); err != nil {
		t.Fatal(err)
	}
	r := ex.Run(ctx, master, workers, 3)
	t.Logf("exchanges: %s", r)
	if r.Failed != 0 {
		t.Fatalf("%d of %d exchanges failed", r.Failed, r.Attempts)
	}

	for _, c := range []struct {
		node   *ciliumlab.Node
		sender *ciliumlab.Pod
		how    string
	}{{tlsNode, workers[0], "TLS to :4244"}, {sockNode, workers[1], "socket folder of its own"}} {
		one := map[string]string{c.node.Name: addrs[c.node.Name]}
		match := map[string]string{"namespace": "ml-team", "job_name": job, "verdict": "forwarded"}
		var got float64
		var hubble int
		var kinds map[string]int
		// Both sides read at each look: the agent's Hubble may record the
		// exchange's last events (a FIN) after a first look.
		ok := eventually(t, time.Minute, c.node.Name+" ("+c.how+"): forwarded flow events equal its Hubble's", func() (bool, string) {
			hubble, kinds = hubbleSends(t, master, port, c.sender)
			got = sumExporters(t, one, "zonewatch_job_flow_events_total", match)
			return hubble > 0 && got == float64(hubble), fmt.Sprintf("exporter %g, Hubble %d %v", got, hubble, kinds)
		})
		if up := sumExporters(t, one, "zonewatch_source_up", map[string]string{"source": "hubble"}); up != 1 {
			t.Errorf("%s (%s): zonewatch_source_up{source=\"hubble\"} %g", c.node.Name, c.how, up)
		}
		if !ok {
			t.Logf("where the flows went:\n%s", flowAccounting(t, one))
		}
		t.Logf("%s (%s): exporter %g forwarded flow events, Hubble %d sent %v", c.node.Name, c.how, got, hubble, kinds)
	}
}
