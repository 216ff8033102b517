// Command image builds the exporter's container image without a container
// engine: the static exporter binary (CGO_ENABLED=0) for each platform on an
// empty base that holds only CA certificates and /etc/passwd, as one OCI
// image index. It writes
//
//	DIR/oci/                             OCI image layout (index.json -> the index)
//	DIR/zonewatch-exporter_linux_ARCH.tar  `docker load` / `podman load` tarball per platform
//	DIR/digest                           the index digest (sha256:...)
//	DIR/version                          its version (the tag make push gives it)
//	DIR/bin/linux_ARCH/zonewatch-exporter the binaries
//
// The image is built from a commit (git archive), never from the working
// tree, and every timestamp is the commit's (SOURCE_DATE_EPOCH): two builds of
// one commit give the same digest.
//
//	go run ./hack/image -out dist/image            # HEAD
//	go run ./hack/image -commit v0.1.0 -version 0.1.0
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("image: ")
	var o Options
	flag.StringVar(&o.Out, "out", "dist/image", "output folder (replaced)")
	flag.StringVar(&o.Commit, "commit", "HEAD", "git commit (or tag) to build; its committed files only")
	flag.StringVar(&o.Version, "version", "", "image version (tag and org.opencontainers.image.version); default: git describe of the commit without a leading v")
	flag.StringVar(&o.Repository, "repository", DefaultRepository, "image repository the tarballs are tagged with")
	flag.StringVar(&o.Source, "source", DefaultSource, "org.opencontainers.image.source")
	platforms := flag.String("platforms", strings.Join(DefaultPlatforms, ","), "comma-separated os/arch list")
	flag.Parse()
	o.Platforms = strings.Split(*platforms, ",")

	start := time.Now()
	res, err := Build(o)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range res.Platforms {
		fmt.Fprintf(os.Stderr, "image: %s %s (layers %d bytes)\n", p.Platform, p.Digest, p.Size)
	}
	fmt.Fprintf(os.Stderr, "image: %s:%s index %s in %s (%.1fs)\n", o.Repository, res.Version, res.Digest, o.Out, time.Since(start).Seconds())
	fmt.Println(res.Digest)
}
