package ciliumlab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestFailedStartLeavesNothing: a start that fails half-way (the second
// node's namespace cannot be made: the name is taken) returns the error
// and has already removed what it made: the bridge, the first node's
// namespace, veth, cgroup, mount namespace holder and Node object.
func TestFailedStartLeavesNothing(t *testing.T) {
	tools := testenv.ToolsBin(t, "etcd", "kube-apiserver", "cilium")
	testenv.Root(t, "the Cilium lab needs root (network and mount namespaces, BPF)")
	api := testenv.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := fmt.Sprintf("%04x", os.Getpid()&0xffff)
	lab, err := Start(ctx, Config{ID: id,
		Cilium: filepath.Join(tools, "cilium"), Dir: t.TempDir(), API: api.Config, Region: "us-east-1",
		Nodes: []NodeSpec{{Name: "gpu-a1", Zone: "us-east-1a"}, {Name: "gpu-a1", Zone: "us-east-1a"}},
		Logf:  t.Logf,
	})
	if err == nil {
		lab.Close()
		t.Fatal("a lab with two nodes of one name started")
	}
	if lab != nil {
		t.Errorf("Start returned a lab with its error")
	}
	if !strings.Contains(err.Error(), "node gpu-a1") {
		t.Errorf("error does not name the node: %v", err)
	}
	t.Logf("start failed as it should: %v", err)
	left, lerr := Leftovers(id)
	if lerr != nil || len(left) > 0 {
		t.Errorf("a failed start left %v (%v)", left, lerr)
	}
	nodes, err := kubernetes.NewForConfigOrDie(api.Config).CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 0 {
		t.Errorf("a failed start left %d Node objects", len(nodes.Items))
	}
}
