package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// TestPodman loads the amd64 tarball into podman (Debian's `podman`, when
// installed) and runs the image for real: --version, then the exporter on
// the simulated cluster as the image's user with a read-only root, scraped
// over HTTP. Where the sandbox refuses to run containers the test skips and
// says what was refused.
//
// Sandboxes like the development machines (a VM without a cgroup v2 of its
// own, setrlimit refused above the current limits) need runc instead of
// crun and limits no higher than the caller's: the test asks for both.
func TestPodman(t *testing.T) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman not installed (Debian: apt-get install podman runc): the image is not run in a container")
	}
	res, dir := build(t)
	var amd64 *PlatformResult
	for i := range res.Platforms {
		if res.Platforms[i].Platform == "linux/amd64" {
			amd64 = &res.Platforms[i]
		}
	}
	if amd64 == nil {
		t.Fatal("no linux/amd64 image")
	}
	ref := DefaultRepository + ":" + res.Version
	if out, err := exec.Command(podman, "load", "-i", amd64.Tarball).CombinedOutput(); err != nil {
		t.Skipf("podman load refused here: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(podman, "rmi", "-f", ref).Run() })

	base := []string{}
	if _, err := exec.LookPath("runc"); err == nil {
		base = append(base, "--runtime", "runc")
	}
	runArgs := []string{"run", "--rm", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}
	out, err := exec.Command(podman, append(append(base, runArgs...), "--network", "none", ref, "--version")...).CombinedOutput()
	if err != nil {
		t.Skipf("podman run refused here (%v): %s", err, strings.TrimSpace(string(out)))
	}
	if !strings.Contains(string(out), "zonewatch-exporter, version "+res.Version) {
		t.Errorf("--version in the container:\n%s", out)
	}

	// containers/image (podman's) reads the OCI layout too, and picks this
	// machine's platform out of the index: the same config (the image ID).
	ociRef := "oci:" + filepath.Join(dir, "oci") + ":" + res.Version
	if out, err := exec.Command(podman, "pull", "-q", ociRef).CombinedOutput(); err != nil {
		t.Errorf("podman pull %s: %v\n%s", ociRef, err, out)
	} else {
		id := strings.TrimSpace(string(out))
		t.Cleanup(func() { _ = exec.Command(podman, "rmi", "-f", id).Run() })
		want, err := amd64Config(dir, res)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(want, id) {
			t.Errorf("podman pull %s: image %s, want the amd64 config %s", ociRef, id, want)
		}
	}

	port := testenv.FreePort(t)
	name := "zonewatch-image-test-" + strconv.Itoa(port)
	args := append(append(base, runArgs...), "-d", "--name", name, "--network", "host", "--read-only",
		ref, "--simulate", "--web.listen-address=127.0.0.1:"+strconv.Itoa(port))
	if out, err := exec.Command(podman, args...).CombinedOutput(); err != nil {
		t.Fatalf("podman run -d: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command(podman, "logs", name).CombinedOutput()
			t.Logf("container log:\n%s", logs)
		}
		_ = exec.Command(podman, append(base, "rm", "-f", name)...).Run()
	})

	body, err := scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`zonewatch_build_info{`, `revision="` + res.Revision + `"`, `zonewatch_job_split_zone{job_name="llm-blocked",namespace="ml-team"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics from the container lacks %s", want)
		}
	}
	user, err := exec.Command(podman, append(base, "top", name, "user")...).CombinedOutput()
	if err != nil {
		t.Fatalf("podman top: %v\n%s", err, user)
	}
	if !strings.Contains(string(user), "nonroot") {
		t.Errorf("container process user:\n%s\nwant nonroot (65532)", user)
	}
}

// scrape GETs the URL until it answers 200 with split-zone series, or the time is up.
func scrape(url string, within time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && rerr == nil && strings.Contains(string(b), "zonewatch_job_split_zone{") {
				return string(b), nil
			}
			last = fmt.Errorf("status %d", resp.StatusCode)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s: %v", url, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// amd64Config is the config digest (podman's image ID) of the amd64 image.
func amd64Config(dir string, res *Result) (string, error) {
	lp, err := layout.FromPath(filepath.Join(dir, "oci"))
	if err != nil {
		return "", err
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return "", err
	}
	inner, err := idx.ImageIndex(res.Digest)
	if err != nil {
		return "", err
	}
	for _, p := range res.Platforms {
		if p.Platform == "linux/amd64" {
			img, err := inner.Image(p.Digest)
			if err != nil {
				return "", err
			}
			h, err := img.ConfigName()
			return h.Hex, err
		}
	}
	return "", fmt.Errorf("no linux/amd64 image")
}
