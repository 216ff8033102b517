package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"

	"github.com/google/go-containerregistry/pkg/name"
)

const (
	// DefaultRepository is the image the Helm chart runs (deploy/helm/zonewatch values.yaml).
	DefaultRepository = "ghcr.io/zonewatch/zonewatch-exporter"
	DefaultSource     = "https://github.com/zonewatch/zonewatch"
	// Binary is the exporter's path in the image, and the entrypoint.
	Binary = "/zonewatch-exporter"
	// User is the image's default user, nonroot in /etc/passwd. The chart sets
	// its own runAsUser (root or nobody) from the enabled sources.
	User     = "65532:65532"
	caFile   = "etc/ssl/certs/ca-certificates.crt"
	mainPkg  = "./cmd/exporter"
	exporter = "zonewatch-exporter"
)

// DefaultPlatforms are the platforms of the index.
var DefaultPlatforms = []string{"linux/amd64", "linux/arm64"}

// Options of one build.
type Options struct {
	Out        string
	Commit     string
	Version    string
	Repository string
	Source     string
	Platforms  []string
	// Repo is the git repository (default: the current folder's).
	Repo string
}

// Result of a build.
type Result struct {
	Digest    v1.Hash
	Version   string
	Revision  string
	Created   time.Time
	Platforms []PlatformResult
}

// PlatformResult is one image of the index.
type PlatformResult struct {
	Platform string
	Digest   v1.Hash
	// Size is the sum of the compressed layers.
	Size    int64
	Tarball string
}

// Build builds the index of the commit and writes the layout and tarballs to o.Out.
func Build(o Options) (*Result, error) {
	if o.Repository == "" {
		o.Repository = DefaultRepository
	}
	if o.Source == "" {
		o.Source = DefaultSource
	}
	if len(o.Platforms) == 0 {
		o.Platforms = DefaultPlatforms
	}
	if o.Commit == "" {
		o.Commit = "HEAD"
	}
	rev, err := git(o.Repo, "rev-parse", "--verify", o.Commit+"^{commit}")
	if err != nil {
		return nil, err
	}
	created, err := sourceDate(o.Repo, rev)
	if err != nil {
		return nil, err
	}
	if o.Version == "" {
		d, err := git(o.Repo, "describe", "--tags", "--always", rev)
		if err != nil {
			return nil, err
		}
		o.Version = strings.TrimPrefix(d, "v")
	}
	res := &Result{Version: o.Version, Revision: rev, Created: created}

	if err := clearOut(o.Out); err != nil {
		return nil, err
	}
	src, err := os.MkdirTemp("", "zonewatch-image-src-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	if err := exportCommit(o.Repo, rev, src); err != nil {
		return nil, err
	}

	labels := map[string]string{
		"org.opencontainers.image.title":       exporter,
		"org.opencontainers.image.description": "zonewatch: GPU training jobs split across availability zones, and what it costs",
		"org.opencontainers.image.source":      o.Source,
		"org.opencontainers.image.url":         o.Source,
		"org.opencontainers.image.revision":    rev,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
	base, err := baseLayer(created)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var images []v1.Image
	// The platforms build at once: most of a warm build is linking, one core each.
	bins := make([][]byte, len(o.Platforms))
	errs := make([]error, len(o.Platforms))
	var wg sync.WaitGroup
	for i, p := range o.Platforms {
		goos, goarch, ok := strings.Cut(p, "/")
		if !ok {
			return nil, fmt.Errorf("platform %q: want os/arch", p)
		}
		wg.Go(func() { bins[i], errs[i] = goBuild(src, goos, goarch, o.Version, rev, created) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, p := range o.Platforms {
		goos, goarch, _ := strings.Cut(p, "/")
		bin := bins[i]
		// The binaries beside the image too (release assets, inspection).
		binDir := filepath.Join(o.Out, "bin", goos+"_"+goarch)
		if err := os.MkdirAll(binDir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(binDir, exporter), bin, 0o755); err != nil {
			return nil, err
		}
		img, err := platformImage(base, bin, goos, goarch, created, labels)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		images = append(images, img)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: goos, Architecture: goarch}},
		})
	}
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)

	lp, err := layout.Write(filepath.Join(o.Out, "oci"), empty.Index)
	if err != nil {
		return nil, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": o.Version,
	})); err != nil {
		return nil, fmt.Errorf("writing the OCI layout: %w", err)
	}
	tag, err := name.NewTag(o.Repository + ":" + o.Version)
	if err != nil {
		return nil, err
	}
	for i, img := range images {
		p := o.Platforms[i]
		d, err := img.Digest()
		if err != nil {
			return nil, err
		}
		pr := PlatformResult{Platform: p, Digest: d,
			Tarball: filepath.Join(o.Out, exporter+"_"+strings.ReplaceAll(p, "/", "_")+".tar")}
		layers, err := img.Layers()
		if err != nil {
			return nil, err
		}
		for _, l := range layers {
			s, err := l.Size()
			if err != nil {
				return nil, err
			}
			pr.Size += s
		}
		if err := tarball.WriteToFile(pr.Tarball, tag, img); err != nil {
			return nil, fmt.Errorf("writing %s: %w", pr.Tarball, err)
		}
		res.Platforms = append(res.Platforms, pr)
	}
	if res.Digest, err = idx.Digest(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "digest"), []byte(res.Digest.String()+"\n"), 0o644); err != nil {
		return nil, err
	}
	// make push tags the index with the version it was built as.
	if err := os.WriteFile(filepath.Join(o.Out, "version"), []byte(res.Version+"\n"), 0o644); err != nil {
		return nil, err
	}
	return res, nil
}

func platformImage(base v1.Layer, bin []byte, goos, goarch string, created time.Time, labels map[string]string) (v1.Image, error) {
	binLayer, err := layer(created, []entry{{name: strings.TrimPrefix(Binary, "/"), mode: 0o755, data: bin}})
	if err != nil {
		return nil, err
	}
	at := v1.Time{Time: created}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{Created: at, CreatedBy: "hack/image: CA certificates (golang.org/x/crypto/x509roots/fallback), /etc/passwd, /etc/group"}},
		mutate.Addendum{Layer: binLayer, MediaType: types.OCILayer, History: v1.History{Created: at, CreatedBy: "hack/image: CGO_ENABLED=0 go build -trimpath " + mainPkg}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = goos, goarch, at
	cf.Author = ""
	cf.Config = v1.Config{
		Entrypoint:   []string{Binary},
		User:         User,
		WorkingDir:   "/",
		Env:          []string{"PATH=/"},
		ExposedPorts: map[string]struct{}{"19420/tcp": {}},
		Labels:       labels,
	}
	return mutate.ConfigFile(img, cf)
}

// baseLayer holds what the static binary needs from a file system.
func baseLayer(created time.Time) (v1.Layer, error) {
	var ca bytes.Buffer
	ca.WriteString("# Root CAs of golang.org/x/crypto/x509roots/fallback (Mozilla's trust store via CCADB),\n# without the roots it trusts only with a distrust-after constraint.\n")
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if err := pem.Encode(&ca, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
		n++
	}
	if n == 0 {
		return nil, errors.New("no root certificates in the fallback bundle")
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
	return layer(created, []entry{
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: caFile, mode: 0o644, data: ca.Bytes()},
		{name: "home/nonroot", mode: 0o700, dir: true, uid: 65532},
		{name: "tmp", mode: 0o1777, dir: true},
	})
}

type entry struct {
	name string
	mode int64
	data []byte
	dir  bool
	uid  int
}

// layer is a gzipped tar of the entries and their parent folders, sorted by
// name, every time the build's, owned by root unless the entry says: the
// bytes depend on the entries only.
func layer(created time.Time, entries []entry) (v1.Layer, error) {
	all := map[string]entry{}
	for _, e := range entries {
		all[e.name] = e
		for d := path.Dir(e.name); d != "."; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				all[d] = entry{name: d, mode: 0o755, dir: true}
			}
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)

	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, n := range names {
		e := all[n]
		h := &tar.Header{Name: n, Mode: e.mode, ModTime: created, Uid: e.uid, Gid: e.uid, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag, h.Name = tar.TypeDir, n+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// goBuild builds the static exporter from the exported source folder.
func goBuild(src, goos, goarch, version, rev string, created time.Time) ([]byte, error) {
	out := filepath.Join(src, ".image-bin", goos+"_"+goarch, exporter)
	const v = "github.com/prometheus/common/version"
	ldflags := strings.Join([]string{
		"-s", "-w", "-buildid=",
		"-X", v + ".Version=" + version,
		"-X", v + ".Revision=" + rev,
		"-X", v + ".Branch=",
		"-X", v + ".BuildUser=zonewatch",
		"-X", v + ".BuildDate=" + created.Format("20060102-15:04:05"),
	}, " ")
	// No DWARF (-s -w drops it anyway): the flags of the Makefile's GOFLAGS,
	// so the tests' compile of the packages serves the amd64 build.
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-mod=readonly", "-gcflags=all=-dwarf=false", "-ldflags", ldflags, "-o", out, mainPkg)
	cmd.Dir = src
	cmd.Env = append(os.Environ(),
		"CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch,
		// The baseline of each architecture, whatever the environment asks.
		"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=", "GOEXPERIMENT=",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s/%s: %w\n%s", goos, goarch, err, stderr.String())
	}
	return os.ReadFile(out)
}

// sourceDate is SOURCE_DATE_EPOCH when set, else the commit's time.
func sourceDate(repo, rev string) (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		var err error
		if s, err = git(repo, "show", "-s", "--format=%ct", rev); err != nil {
			return time.Time{}, err
		}
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// clearOut removes the output folder of an earlier build; it refuses a
// folder that holds anything else (-out . must not delete a checkout).
func clearOut(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch n := e.Name(); {
		case n == "oci", n == "bin", n == "digest", n == "version", strings.HasPrefix(n, exporter+"_") && strings.HasSuffix(n, ".tar"):
		default:
			return fmt.Errorf("refusing to replace %s: it holds %s, not only an earlier image build", dir, n)
		}
	}
	return os.RemoveAll(dir)
}

// exportCommit writes the commit's files (git archive) into dir.
func exportCommit(repo, rev, dir string) error {
	cmd := exec.Command("git", "archive", "--format=tar", rev)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	r, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			_ = cmd.Wait()
			return fmt.Errorf("git archive %s: %w\n%s", rev, err, stderr.String())
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		}
		if err != nil {
			_ = cmd.Wait()
			return err
		}
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w\n%s", rev, err, stderr.String())
	}
	return nil
}

func git(repo string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
