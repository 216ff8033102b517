// Package trainlab is the training-controller test bed (issue 43): the
// test kube-apiserver of internal/testenv, the real kube-scheduler
// (internal/schedlab), kube-controller-manager with the controllers that
// stand between a training job and its pods, a kubelet stand-in, and the
// real training controllers, each with the CRDs and webhooks of its own
// module (hack/tools.sh builds them into .tools/bin). Tests and `make demo`
// create the custom resources users write; the controllers make the pods.
//
// No container runs. The kubelet stand-in (Kubelet) moves every bound pod
// to Running, gives it an IP from its node's range and finishes the
// deletion of bound pods, as a kubelet does; a test moves a pod to
// Succeeded or Failed with Kubelet.Exit.
//
// kube-controller-manager runs only these controllers (DefaultControllers):
//   - job-controller: the pods of batch Jobs, and so of JobSet, Trainer v2,
//     the MPI Operator's launcher and KubeRay's submitter;
//   - statefulset-controller: the pods of LeaderWorkerSet's leader and
//     worker StatefulSets;
//   - garbage-collector-controller: deleting a job deletes its Jobs,
//     StatefulSets and pods through their owner references, as on a
//     cluster.
//
// The others are off: no cloud, no nodes to watch (the node lifecycle
// controller would taint the nodes, which have no kubelet heartbeat, not
// ready), no service accounts (the apiserver's ServiceAccount admission is
// off), no ReplicaSets (no training controller here makes Deployments);
// pod-garbage-collector-controller is not needed because the kubelet
// stand-in finishes deletions itself. WithControllers adds more.
//
// # Adding a controller
//
// A training controller is one function beside StartJobSet (jobset.go)
// and StartLWS (lws.go): it fills a Controller — the tool's name in
// .tools/bin (its CRDs are read from NAME.d/crds, its webhook
// configuration from NAME.d/webhook.yaml), its command line for the ports
// and folders the bed picked (Endpoints: leader election and certificate
// management off, webhook on 127.0.0.1 with the bed's test CA, health
// probe on loopback), the webhook paths it serves, and a Probe: an object
// its validating webhook denies, which tells the bed the apiserver calls
// the webhook — and calls Bed.StartController. Kinds the bed's pods need
// to be read back through (e.g. a TrainJob's JobSet) need no registration:
// tests read pods and owners from the apiserver.
package trainlab

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// DefaultControllers are the kube-controller-manager controllers the bed
// runs (see the package comment for why these).
var DefaultControllers = []string{"job-controller", "statefulset-controller", "garbage-collector-controller"}

// Bed is a running test bed: the schedlab cluster (apiserver, scheduler,
// nodes as API objects), kube-controller-manager, the kubelet stand-in
// and the training controllers started on it.
type Bed struct {
	*schedlab.Lab
	Dyn     dynamic.Interface
	Kubelet *Kubelet
	// CA signs the controllers' webhook serving certificates.
	CA *testenv.CA
}

type options struct {
	gang        bool
	controllers []string
}

// Option changes how Start starts the bed.
type Option func(*options)

// WithGang starts the apiserver, scheduler and kube-controller-manager
// with kube-scheduler v1.37's gang and topology scheduling gates
// (schedlab.StartGang), and adds podgroup-protection-controller, which
// removes the PodGroups' protection finalizer.
func WithGang() Option {
	return func(o *options) {
		o.gang = true
		o.controllers = append(o.controllers, "podgroup-protection-controller")
	}
}

// WithControllers adds kube-controller-manager controllers to
// DefaultControllers.
func WithControllers(names ...string) Option {
	return func(o *options) { o.controllers = append(o.controllers, names...) }
}

// Start starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager
// and the kubelet stand-in, and waits until each is ready. Add nodes with
// AddNodes and controllers with StartJobSet, StartLWS, ... Everything stops
// at the test's cleanup.
func Start(t testing.TB, opts ...Option) *Bed {
	t.Helper()
	o := options{controllers: append([]string(nil), DefaultControllers...)}
	for _, opt := range opts {
		opt(&o)
	}
	testenv.ToolsBin(t, "etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
	var lab *schedlab.Lab
	if o.gang {
		lab = schedlab.StartGang(t)
	} else {
		lab = schedlab.Start(t)
	}
	var gates []string
	if o.gang {
		gates = []string{"--feature-gates", schedlab.GangFeatureGates}
	}
	startKCM(t, lab.API, o.controllers, gates)
	b := On(t, lab)
	b.Kubelet = startKubelet(t, lab.Client)
	return b
}

// On makes a bed of a lab already running whose bound pods another
// kubelet runs (`make demo`'s Cilium lab wires them with cilium-cni, its
// real agents in the way): no kube-controller-manager, no kubelet
// stand-in (Kubelet is nil). Start the training controllers on it as on
// any bed.
func On(t testing.TB, lab *schedlab.Lab) *Bed {
	t.Helper()
	dyn, err := dynamic.NewForConfig(lab.API.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &Bed{Lab: lab, Dyn: dyn, CA: testenv.NewCA(t)}
}

// startKCM runs kube-controller-manager against the apiserver with only
// the given controllers, no leader election, serving its health on
// loopback, and waits until it is healthy.
func startKCM(t testing.TB, api *testenv.APIServer, controllers, extra []string) {
	t.Helper()
	bin := testenv.ToolsBin(t, "kube-controller-manager")
	dir := t.TempDir()
	port := testenv.FreePort(t)
	testenv.Start(t, dir, "kube-controller-manager", filepath.Join(bin, "kube-controller-manager"), append([]string{
		"--kubeconfig", api.Kubeconfig,
		"--authentication-kubeconfig", api.Kubeconfig, "--authorization-kubeconfig", api.Kubeconfig,
		"--leader-elect=false",
		"--controllers", strings.Join(controllers, ","),
		"--use-service-account-credentials=false",
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
		"-v", "1"}, extra...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := waitHTTP(ctx, "https://127.0.0.1:"+strconv.Itoa(port)+"/healthz"); err != nil {
		t.Fatalf("kube-controller-manager: %v", err)
	}
}

// waitHTTP polls url until it answers 200 or ctx ends (TLS not verified:
// the components serve self-signed certificates on loopback).
func waitHTTP(ctx context.Context, url string) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last: %v)", url, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
