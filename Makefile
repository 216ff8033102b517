# zonewatch — every command a developer or CI needs.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/zonewatch-exporter
TOOLS_BIN := $(CURDIR)/.tools/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/prometheus/common/version.Version=$(VERSION) \
	-X github.com/prometheus/common/version.Revision=$(shell git rev-parse --short HEAD 2>/dev/null) \
	-X github.com/prometheus/common/version.Branch=$(shell git rev-parse --abbrev-ref HEAD 2>/dev/null)
# One set of build flags for every Go build and test of the module, so that
# go vet's, the tests', make build's, the e2e tests' and the image's amd64
# exporter compile each package once (cold, a CI run compiled the
# exporter's dependencies twice for amd64: cgo on for vet and the tests, off
# for the image; 275 CPU-seconds each) and without DWARF (13 % less compile
# CPU; stack traces and pprof read the symbol table, not DWARF; for a
# debugger: make test GOFLAGS=-trimpath). The cgo GPU adapters
# (-tags nvml) set CGO_ENABLED=1 where they are built.
export CGO_ENABLED ?= 0
export GOFLAGS ?= -trimpath -gcflags=all=-dwarf=false -ldflags=-w
# Generated artifacts: committed, regenerated and diffed by `make test`.
GENERATED := rules dashboards deploy docs/flags.md
# make test's time table (hack/testtime): each tier's wall time (tiers.tsv),
# each test's (tests.tsv) and the table (table.txt), in the git-ignored tmp/.
TIMES := $(CURDIR)/tmp/testtime
# make test sets RECORD_TIMES=1: the test tiers then append to $(TIMES)/tests.tsv.
RECORD_TIMES ?=
# The test tiers run go test -json through it: go test's own text on the
# log, the times recorded. Their recipes set -o pipefail, so go test's exit
# status is the recipe's.
TESTTIME = $(GO) -C $(CURDIR) run ./hack/testtime $(if $(RECORD_TIMES),-record $(TIMES)/tests.tsv)

.PHONY: run test check test-unit test-integration build lint linters bench tools generate check-generated e2e demo fuzz gpu-smoke clean image sbom chart release check-release-version release-notes push

## run: the exporter on the built-in simulated cluster; prints the /metrics URL
run: build
	./$(BIN) --simulate

## build: bin/zonewatch-exporter
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/exporter

## tools: build the pinned test tools into the tools cache shared by checkouts (~/.cache/zonewatch/tools, or $ZONEWATCH_TOOLS) and link them into .tools/bin
tools:
	@bash hack/tools.sh >/dev/null

## linters: only staticcheck and actionlint (what make lint and make check need)
linters:
	@bash hack/tools.sh --linters >/dev/null

## test: every tier in turn: the tools, lint, the unit and integration tests,
## the end-to-end tests (what .ci/run calls), then the time table: each
## tier's wall time and the ten slowest tests (also when a tier fails: the
## tiers after it do not run, and make test exits with its status).
## Generated artifacts are compared with their generators inside the Go tests.
TIERS := tools:tools lint:lint integration:test-integration e2e:e2e
test:
	@rm -rf $(TIMES) && mkdir -p $(TIMES)
	@rc=0; for t in $(TIERS); do \
		name=$${t%%:*} target=$${t#*:}; \
		if [ $$rc != 0 ]; then printf '%s\t\t\tnot run\n' $$name >>$(TIMES)/tiers.tsv; continue; fi; \
		start=$$EPOCHREALTIME; \
		$(MAKE) --no-print-directory $$target RECORD_TIMES=1 || rc=$$?; \
		printf '%s\t%s\t%s\t%s\n' $$name $$start $$EPOCHREALTIME $$rc >>$(TIMES)/tiers.tsv; \
	done; \
	$(GO) run ./hack/testtime -table $(TIMES) | tee $(TIMES)/table.txt || true; \
	exit $$rc

## check: the inner loop, before every commit: lint and the unit tier; no tools but the linters
check: lint test-unit

## test-unit: the unit tier: no tools, no root, no network (go test -short); seconds
test-unit:
	env -u CI -u ZONEWATCH_REQUIRE_TOOLS $(GO) test -short -count=1 ./...

## test-integration: every test but the end-to-end ones, with the tools required
## (kube-apiserver, promtool, helm, the schema check, real BPF maps as root)
test-integration: tools
	@# Beside the main run (its log printed after it): the cgo GPU adapters,
	@# the conntrack reader against Cilium's own ctmap types in real BPF maps
	@# and the Hubble client against Cilium's own Observer, parser, filters
	@# and field mask (each peer a module of its own). Cold, their builds are
	@# minutes of CPU (Cilium's packages) that the main run's waiting tests
	@# leave idle; one after the other they were 4 minutes at the tier's end.
	@side=$$(mktemp); set -o pipefail; ( set -o pipefail; \
		CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" $(GO) test -json -count=1 -tags nvml ./collector/gpu/ | $(TESTTIME) -tier integration && \
		(cd internal/ctmappeer && $(GO) vet ./... && $(GO) test -json -count=1 ./... | $(TESTTIME) -tier integration) && \
		(cd internal/hubblepeer && $(GO) vet ./... && $(GO) test -json -count=1 ./... | $(TESTTIME) -tier integration) ) >$$side 2>&1 & pid=$$!; \
	echo 'ZONEWATCH_TOOLS_BIN=$(TOOLS_BIN) ZONEWATCH_REQUIRE_TOOLS=1 $(GO) test -json -count=1 -timeout 30m <every package but e2e> | $(TESTTIME) -tier integration'; \
	ZONEWATCH_TOOLS_BIN=$(TOOLS_BIN) ZONEWATCH_REQUIRE_TOOLS=1 $(GO) test -json -count=1 -timeout 30m $$($(GO) list ./... | grep -v '/e2e$$') | $(TESTTIME) -tier integration; rc=$$?; \
	wait $$pid; src=$$?; \
	echo '--- beside it: go test -tags nvml ./collector/gpu/, internal/ctmappeer and internal/hubblepeer (go vet, go test)'; cat $$side; rm -f $$side; \
	[ $$rc = 0 ] && [ $$src = 0 ]

## lint: go vet (also the cgo GPU adapters), gofmt, tidy modules (every go.mod), staticcheck (pinned, staticcheck.conf), actionlint; needs only the linters
lint: linters
	$(GO) vet ./...
	CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" $(GO) vet -tags nvml ./collector/gpu/...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for m in $$(git ls-files 'go.mod' '*/go.mod'); do (cd $$(dirname $$m) && $(GO) mod tidy -diff) || { echo "$$m is not tidy: run go mod tidy in $$(dirname $$m)"; exit 1; }; done
	$(TOOLS_BIN)/staticcheck ./...
	$(TOOLS_BIN)/actionlint -no-color

## generate: rule files, dashboards, rendered manifests, the flag tables of docs/flags.md
generate:
	$(GO) test -count=1 -run '^TestFlagsDoc$$' ./cmd/exporter -update
	$(GO) run ./rules/cmd/generate
	$(GO) run ./dashboards/gen
	bash deploy/render.sh

## check-generated: regenerate and fail when committed artifacts differ
check-generated: generate
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
		echo "generated files differ from what is committed; run 'make generate' and commit:"; \
		git status --porcelain -- $(GENERATED); git --no-pager diff --stat -- $(GENERATED); exit 1; fi

## bench: the hot-path benchmarks (allocations reported)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## e2e: only the end-to-end tests (real kube-apiserver, Prometheus, Alertmanager), verbose
e2e: tools
	set -o pipefail; ZONEWATCH_TOOLS_BIN=$(TOOLS_BIN) ZONEWATCH_REQUIRE_TOOLS=1 $(GO) test -json -count=1 -v -parallel 32 -timeout 30m ./e2e/ | $(TESTTIME) -v -tier e2e

## demo: the seed's before/after on real Cilium agents (as root): a job split across zones and blocked by the zone fence pages, the fix resolves the page; the lab, exporters, Prometheus and Alertmanager stay up until Ctrl-C
demo: tools
	ZONEWATCH_TOOLS_BIN=$(TOOLS_BIN) ZONEWATCH_REQUIRE_TOOLS=1 ZONEWATCH_DEMO=1 $(GO) test -count=1 -v -timeout 0 -run '^TestCiliumLabDemo$$' ./e2e/

## fuzz: every fuzz target for FUZZTIME each
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzReadFlows$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./collector/hubble/
	$(GO) test -run '^$$' -fuzz '^FuzzClassify$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./collector/hubble/
	$(GO) test -run '^$$' -fuzz '^FuzzWireDecode$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./collector/hubble/
	$(GO) test -run '^$$' -fuzz '^FuzzParseDCGMExporter$$' -fuzztime $(FUZZTIME) ./collector/gpu/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./collector/conntrack/

## gpu-smoke: on a machine with an NVIDIA GPU, run the exporter with NVML and print what it reads
gpu-smoke:
	bash hack/gpu-smoke.sh

# ---- Release (docs/release.md): what a tag publishes, built in dist/ ----
DIST := dist
# Image and chart version: the tag without its v (v0.1.0 -> 0.1.0), else git describe.
RELEASE_VERSION ?= $(patsubst v%,%,$(shell git describe --tags --always 2>/dev/null || echo dev))
IMAGE_REPO ?= ghcr.io/zonewatch/zonewatch-exporter
CHART_REPO ?= oci://ghcr.io/zonewatch/charts
CHART_VERSION = $(shell sed -n 's/^version: *//p' deploy/helm/zonewatch/Chart.yaml)
# e.g. --plain-http for a local registry
HELM_PUSH_FLAGS ?=

## image: the exporter's OCI image index (linux/amd64, linux/arm64) of HEAD's committed files, without Docker: dist/image/ (OCI layout, docker-load tarballs, digest)
image:
	$(GO) run ./hack/image -out $(DIST)/image -version $(RELEASE_VERSION) -repository $(IMAGE_REPO)

## sbom: CycloneDX SBOM of the image's exporter (the modules linked for linux, their licenses): dist/zonewatch-exporter.cdx.json
sbom:
	@bash hack/tools.sh --release >/dev/null
	@mkdir -p $(DIST)
	GOOS=linux GOARCH=amd64 CGO_ENABLED=0 $(TOOLS_BIN)/cyclonedx-gomod app -json -licenses -noserial -notimestamp \
		-main cmd/exporter -output $(DIST)/zonewatch-exporter.cdx.json .

## chart: lint (strict) and package the Helm chart: dist/zonewatch-<version>.tgz
chart: tools
	$(TOOLS_BIN)/helm lint --strict deploy/helm/zonewatch
	$(TOOLS_BIN)/helm package deploy/helm/zonewatch --destination $(DIST)

## release: image, SBOM, chart and dist/SHA256SUMS: everything a tag publishes
release: image sbom chart
	bash hack/release.sh checksums $(DIST)

## check-release-version: the version (the tag) is the chart's version and appVersion and has a CHANGELOG entry
check-release-version:
	bash hack/release.sh check-version $(RELEASE_VERSION)

## release-notes: this version's CHANGELOG section
release-notes:
	@bash hack/release.sh notes $(RELEASE_VERSION)

## push: the image index and the chart to IMAGE_REPO and CHART_REPO (CI on a tag, after make release and the registry logins)
push:
	@bash hack/tools.sh --release >/dev/null
	$(TOOLS_BIN)/crane push $(DIST)/image/oci $(IMAGE_REPO):$$(cat $(DIST)/image/version)
	$(TOOLS_BIN)/helm push $(HELM_PUSH_FLAGS) $(DIST)/zonewatch-$(CHART_VERSION).tgz $(CHART_REPO)

clean:
	rm -rf bin $(DIST)
