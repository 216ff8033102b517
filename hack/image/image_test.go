package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// built is one build of HEAD's image, shared by the tests of this file
// (each build compiles the exporter twice).
var built struct {
	once sync.Once
	res  *Result
	out  string
	took time.Duration
	err  error
}

func build(t *testing.T) (*Result, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the image build compiles the exporter for two platforms")
	}
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "zonewatch-image-test-")
		if err != nil {
			built.err = err
			return
		}
		built.out = filepath.Join(dir, "image")
		rev, err := git(repoRoot(t), "rev-parse", "HEAD")
		if err != nil {
			built.err = err
			return
		}
		start := time.Now()
		built.res, built.err = Build(Options{Out: built.out, Commit: rev, Repo: repoRoot(t)})
		built.took = time.Since(start)
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	t.Logf("image %s of %s built in %s", built.res.Digest, built.res.Revision, built.took.Round(time.Millisecond))
	return built.res, built.out
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.out != "" {
		os.RemoveAll(filepath.Dir(built.out))
	}
	os.Exit(code)
}

func repoRoot(t *testing.T) string {
	return testenv.RepoRoot()
}

// TestImageLayout reads the OCI layout back and checks the index, each
// platform's config and layers, and runs the amd64 binary taken from its layer.
func TestImageLayout(t *testing.T) {
	res, out := build(t)

	lp, err := layout.FromPath(filepath.Join(out, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 {
		t.Fatalf("index.json has %d entries, want the one image index", len(tm.Manifests))
	}
	if d := tm.Manifests[0]; d.MediaType != types.OCIImageIndex || d.Digest != res.Digest || d.Annotations["org.opencontainers.image.ref.name"] != res.Version {
		t.Errorf("index.json entry %s %s %v, want %s %s ref.name %s", d.MediaType, d.Digest, d.Annotations, types.OCIImageIndex, res.Digest, res.Version)
	}
	if b, err := os.ReadFile(filepath.Join(out, "digest")); err != nil || strings.TrimSpace(string(b)) != res.Digest.String() {
		t.Errorf("digest file %q (%v), want %s", b, err, res.Digest)
	}
	if b, err := os.ReadFile(filepath.Join(out, "version")); err != nil || strings.TrimSpace(string(b)) != res.Version {
		t.Errorf("version file %q (%v), want %s", b, err, res.Version)
	}

	idx, err := top.ImageIndex(res.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			t.Fatalf("manifest %s has no platform", d.Digest)
		}
		platforms = append(platforms, d.Platform.OS+"/"+d.Platform.Architecture)
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("index platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
	if im.Annotations["org.opencontainers.image.revision"] != res.Revision {
		t.Errorf("index annotations %v lack the revision", im.Annotations)
	}

	for _, d := range im.Manifests {
		t.Run(d.Platform.Architecture, func(t *testing.T) {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			if d.MediaType != types.OCIManifestSchema1 {
				t.Errorf("manifest media type %s, want %s", d.MediaType, types.OCIManifestSchema1)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != d.Platform.Architecture {
				t.Errorf("config platform %s/%s, want linux/%s", cf.OS, cf.Architecture, d.Platform.Architecture)
			}
			if !slices.Equal(cf.Config.Entrypoint, []string{"/zonewatch-exporter"}) || len(cf.Config.Cmd) != 0 {
				t.Errorf("entrypoint %q cmd %q, want [/zonewatch-exporter] and no cmd", cf.Config.Entrypoint, cf.Config.Cmd)
			}
			if cf.Config.User != "65532:65532" {
				t.Errorf("user %q, want 65532:65532 (nonroot)", cf.Config.User)
			}
			if !cf.Created.Time.Equal(res.Created) {
				t.Errorf("created %s, want the commit's time %s", cf.Created.Time, res.Created)
			}
			want := map[string]string{
				"org.opencontainers.image.source":   "https://github.com/zonewatch/zonewatch",
				"org.opencontainers.image.revision": res.Revision,
				"org.opencontainers.image.version":  res.Version,
				"org.opencontainers.image.licenses": "Apache-2.0",
			}
			for k, v := range want {
				if cf.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
				}
			}
			if _, ok := cf.Config.ExposedPorts["19420/tcp"]; !ok {
				t.Errorf("exposed ports %v, want 19420/tcp", cf.Config.ExposedPorts)
			}

			files := layerFiles(t, img, res.Created)
			passwd := string(files["etc/passwd"])
			if !strings.Contains(passwd, "nonroot:x:65532:65532:") || !strings.Contains(passwd, "nobody:x:65534:65534:") {
				t.Errorf("/etc/passwd lacks nonroot (65532) or nobody (65534):\n%s", passwd)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(files["etc/ssl/certs/ca-certificates.crt"]) || len(files["etc/ssl/certs/ca-certificates.crt"]) < 100_000 {
				t.Errorf("CA bundle: %d bytes, not a PEM bundle of the public roots", len(files["etc/ssl/certs/ca-certificates.crt"]))
			}

			bin := files["zonewatch-exporter"]
			f, err := elf.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Fatalf("exporter binary: %v", err)
			}
			wantMachine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[cf.Architecture]
			if f.Machine != wantMachine {
				t.Errorf("binary machine %s, want %s", f.Machine, wantMachine)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Error("binary has a dynamic loader (PT_INTERP): not static")
				}
			}
			if cf.Architecture == "amd64" && runtime.GOARCH == "amd64" && runtime.GOOS == "linux" {
				runBinary(t, bin, res)
			}
		})
	}

	// The docker-load tarballs hold the same images.
	for _, p := range res.Platforms {
		img, err := tarball.ImageFromPath(p.Tarball, nil)
		if err != nil {
			t.Fatalf("%s: %v", p.Tarball, err)
		}
		want, _ := idx.Image(p.Digest)
		wc, _ := want.ConfigName()
		gc, err := img.ConfigName()
		if err != nil || gc != wc {
			t.Errorf("%s: config %s (%v), want %s", p.Tarball, gc, err, wc)
		}
		t.Logf("%s: image %s, layers %d bytes compressed", p.Platform, p.Digest, p.Size)
	}
}

// runBinary runs --version and --help of the binary from the image.
func runBinary(t *testing.T, bin []byte, res *Result) {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "zonewatch-exporter")
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	for _, want := range []string{"zonewatch-exporter, version " + res.Version, "revision: " + res.Revision} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--version output lacks %q:\n%s", want, out)
		}
	}
	out, err = exec.Command(exe, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	for _, want := range []string{"usage: zonewatch-exporter", "--log.level"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help output lacks %q:\n%s", want, out)
		}
	}
}

// layerFiles returns the regular files of the image's layers, and checks
// that every entry's time is the commit's and that entries are sorted.
func layerFiles(t *testing.T, img v1.Image, created time.Time) map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for i, l := range layers {
		if mt, _ := l.MediaType(); mt != types.OCILayer {
			t.Errorf("layer %d media type %s, want %s", i, mt, types.OCILayer)
		}
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		var names []string
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
			if !h.ModTime.Equal(created) {
				t.Errorf("layer %d: %s has time %s, want %s", i, h.Name, h.ModTime, created)
			}
			if h.Typeflag == tar.TypeReg {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				files[h.Name] = b
			}
		}
		rc.Close()
		if !slices.IsSorted(names) {
			t.Errorf("layer %d entries not sorted: %v", i, names)
		}
	}
	return files
}

// TestReproducible builds the same commit a second time: the index digest
// and the tarballs' bytes are the same.
func TestReproducible(t *testing.T) {
	res, _ := build(t)
	out2 := filepath.Join(t.TempDir(), "image")
	start := time.Now()
	res2, err := Build(Options{Out: out2, Commit: res.Revision, Repo: repoRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second build %s in %s", res2.Digest, time.Since(start).Round(time.Millisecond))
	if res2.Digest != res.Digest {
		t.Errorf("two builds of %s: index %s and %s, want the same", res.Revision, res.Digest, res2.Digest)
	}
	for i, p := range res.Platforms {
		a, b := fileSum(t, p.Tarball), fileSum(t, res2.Platforms[i].Tarball)
		if a != b {
			t.Errorf("%s tarball: sha256 %s and %s", p.Platform, a, b)
		}
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestExporterDoesNotLinkTheBuilder: go-containerregistry and the fallback
// roots are the image builder's; the exporter binary links neither. Nor
// does it link client-go's typed clientset or its informer factories (every
// API group's clients, informers and types: 43 MB of a 79 MB binary, 9 MiB
// of resident pages in each process; internal/kubeapi reads the three
// groups the exporter uses).
func TestExporterDoesNotLinkTheBuilder(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/exporter")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "GOOS=linux", "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/google/go-containerregistry") || strings.HasPrefix(pkg, "golang.org/x/crypto/x509roots") {
			t.Errorf("the exporter links %s", pkg)
		}
		for _, heavy := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/listers", "k8s.io/client-go/applyconfigurations", "k8s.io/client-go/discovery"} {
			if pkg == heavy || strings.HasPrefix(pkg, heavy+"/") {
				t.Errorf("the exporter links %s (use internal/kubeapi)", pkg)
			}
		}
		if api, ok := strings.CutPrefix(pkg, "k8s.io/api/"); ok && !slices.Contains([]string{"core/v1", "discovery/v1", "resource/v1"}, api) {
			t.Errorf("the exporter links %s, an API group it does not read", pkg)
		}
	}
}

// TestClearOut: an earlier build's folder is replaced, any other folder is refused.
func TestClearOut(t *testing.T) {
	earlier := t.TempDir()
	for _, f := range []string{"digest", "version", "zonewatch-exporter_linux_amd64.tar"} {
		if err := os.WriteFile(filepath.Join(earlier, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(earlier, "oci", "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := clearOut(earlier); err != nil {
		t.Errorf("earlier build: %v", err)
	}
	if _, err := os.Stat(earlier); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("earlier build folder still there: %v", err)
	}
	if err := clearOut(repoRoot(t)); err == nil {
		t.Fatal("clearOut of the checkout: no error")
	}
	if _, err := os.Stat(filepath.Join(repoRoot(t), "go.mod")); err != nil {
		t.Fatalf("checkout damaged: %v", err)
	}
}
