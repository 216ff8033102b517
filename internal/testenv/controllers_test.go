package testenv

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestControllerBinariesStart runs each controller that hack/tools.sh builds
// for the training-controller tests (issue 43): each must run its start-up
// (flag parsing, scheme registration) and print its own help or version,
// and its NAME.d must hold CRDs of its own API group. A broken or
// mislinked build fails here, in seconds, before internal/trainlab runs
// kube-controller-manager, JobSet and LWS against an apiserver (the others
// are not run there yet).
func TestControllerBinariesStart(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string // in the output: a flag or version only this program has
		// group of its CRDs in NAME.d/crds; "" when it has no NAME.d
		group string
	}{
		{"kube-controller-manager", []string{"--version"}, "Kubernetes v1.37.2", ""},
		{"jobset", []string{"--help"}, "-health-probe-bind-address", "jobset.x-k8s.io"},
		{"lws", []string{"--version"}, "Version: v0.8.0", "leaderworkerset.x-k8s.io"},
		{"trainer-controller-manager", []string{"--help"}, "-enable-http2", "trainer.kubeflow.org"},
		{"training-operator", []string{"--help"}, "-pytorch-init-container-image", "kubeflow.org"},
		{"mpi-operator", []string{"--version"}, "Version: v0.8.0", "kubeflow.org"},
		{"kuberay-operator", []string{"--help"}, "-reconcile-concurrency", "ray.io"},
	}
	tools := make([]string, 0, 2*len(cases))
	for _, c := range cases {
		tools = append(tools, c.name)
		if c.group != "" {
			tools = append(tools, c.name+".d")
		}
	}
	bin := ToolsBin(t, tools...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(bin, c.name), c.args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", c.name, strings.Join(c.args, " "), err, out)
			}
			if !bytes.Contains(out, []byte(c.want)) {
				t.Fatalf("%s %s: output lacks %q:\n%s", c.name, strings.Join(c.args, " "), c.want, out)
			}
			if c.group != "" {
				checkCRDs(t, filepath.Join(bin, c.name+".d", "crds"), c.group)
			}
		})
	}
}

// checkCRDs: every file in dir is a CustomResourceDefinition of group, and
// there is at least one.
func checkCRDs(t *testing.T, dir, group string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s (%v)", dir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Kind string `json:"kind"`
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Kind string `json:"kind"`
				} `json:"names"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if crd.Kind != "CustomResourceDefinition" || crd.Spec.Group != group || crd.Spec.Names.Kind == "" {
			t.Errorf("%s: kind %q, group %q, names.kind %q; want a CustomResourceDefinition of %s",
				f, crd.Kind, crd.Spec.Group, crd.Spec.Names.Kind, group)
		}
	}
}
