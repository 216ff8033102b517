#!/usr/bin/env bash
# Installs every tool the tests need, pinned, into a git-ignored folder keyed
# by version ($ZONEWATCH_TOOLS, default .tools/). A warm run only checks that
# each binary exists. Sources: the Go module proxy (go install / go build) and
# Debian's apt; nothing else is downloaded.
#
# --release also builds the release tools (SBOM generator, crane).
#
# Prints the tools folder on its last line of stdout.
# The whole script is one compound command, parsed before it runs: an edit
# to this file while a (cold, long) run is in progress cannot break it.
{
set -euo pipefail

K8S_VERSION=v1.37.2
K8S_STAGING_VERSION=v0.37.2
PROMETHEUS_VERSION=v0.316.0
ALERTMANAGER_VERSION=v0.31.1
HELM_VERSION=v3.22.0
# staticcheck 2026.1 (v0.8.x) is the first release for Go 1.26.
STATICCHECK_VERSION=v0.8.2
# The CRDs deploy/apiserver_test.go installs come from the same version.
PROMETHEUS_OPERATOR_VERSION=v0.85.0
# The real-Cilium lab (internal/ciliumlab): agent, CNI plugin and Hubble
# Relay from the module; the agent compiles its BPF at run time with
# Debian's clang/llc 19 (Cilium's own LLVM major).
CILIUM_VERSION=v1.20.2
# v1.20.2 pins a gobgp pseudo-version the module proxy refuses (403); v4.7.0
# was tagged the same day. BGP stays off in the lab.
CILIUM_GOBGP_REPLACE=v4.7.0
LLVM_APT_VERSION=1:19.1.7-3~deb12u1
# A second Cilium for the lab (cilium118): the newest 1.18 patch the module
# proxy serves here (v1.18.12 and later answer 403; v1.18.9 and v1.18.10
# fail the checksum database). Its go.mod replaces three modules; the
# wrapper repeats none of them: github.com/cilium/apimachinery v0.33.3-1
# is refused (403) and github.com/cilium/gobgp/v3's pseudo-version is not
# in the checksum database (404), so upstream k8s.io/apimachinery v0.33.13
# and github.com/osrg/gobgp/v3 v3.37.0 (the versions it requires) are
# built instead; the controller-tools replace only concerns code
# generation. BGP stays off; the apimachinery fork adds omitzero handling
# to the unstructured converter (the lab's agents run fine without it).
CILIUM118_VERSION=v1.18.11
# make lint checks .github/workflows with it.
ACTIONLINT_VERSION=v1.7.12
# Release tools, built only with --release (make sbom, make push): the SBOM
# generator and crane, which pushes the image index.
# Kueue (internal/kueuelab: its manager against the test apiserver, TAS);
# its CRDs and webhook configuration from the same module, and the CRDs of
# the training controllers at the versions its go.mod requires (analyze's
# CRD check).
KUEUE_VERSION=v0.17.0
CYCLONEDX_GOMOD_VERSION=v1.10.0
CRANE_VERSION=v0.22.1
release=0
if [ "${1:-}" = --release ]; then release=1; fi

root=$(cd "$(dirname "$0")/.." && pwd)
tools=${ZONEWATCH_TOOLS:-$root/.tools}
mkdir -p "$tools"
# Links in bin/ name the physical folder: a checkout whose .tools is a link
# to another (a CI clone sharing a cache) must not repoint them at itself.
tools=$(cd "$tools" && pwd -P)
log() { echo "tools: $*" >&2; }

# go install a main package at a pinned version into $tools/<name>-<version>/.
goinstall() { # dir pkg@version...
  local dir=$1; shift
  if [ -d "$tools/$dir" ] && [ -f "$tools/$dir/.done" ]; then return; fi
  log "building $dir (cold: minutes)"
  rm -rf "$tools/$dir.tmp"; mkdir -p "$tools/$dir.tmp"
  GOBIN="$tools/$dir.tmp" GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install -trimpath "$@"
  touch "$tools/$dir.tmp/.done"
  rm -rf "${tools:?}/$dir"; mv "$tools/$dir.tmp" "$tools/$dir"
}

etcd_bin() {
  if command -v etcd >/dev/null 2>&1; then return; fi
  log "installing etcd-server from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # Tests run their own etcd on free ports: keep the package from starting
  # one, with Debian's policy-rc.d hook while apt runs (nothing is killed).
  local hook=/usr/sbin/policy-rc.d own=
  if [ ! -e "$hook" ]; then printf '#!/bin/sh\nexit 101\n' >"$hook"; chmod +x "$hook"; own=1; fi
  apt-get install -y -qq --no-install-recommends etcd-server >&2 || { [ -z "$own" ] || rm -f "$hook"; return 1; }
  [ -z "$own" ] || rm -f "$hook"
  # Where systemd runs it, the unit stays off at boot too.
  if [ -d /run/systemd/system ]; then systemctl disable --now etcd >/dev/null 2>&1 || true; fi
}

# kube-apiserver, kube-scheduler and kube-proxy are not go-installable
# modules on their own: k8s.io/kubernetes points its staging modules at local
# paths. A wrapper module replaces each with the published v0.x version of
# the same release; the binaries are built from it in one go (they share
# most packages). kube-proxy runs in the Cilium lab's iptables mode.
kube_components() {
  local dir=$tools/kube-$K8S_VERSION
  if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/kube-scheduler" ] && [ -x "$dir/kube-proxy" ]; then return; fi
  log "building kube-apiserver, kube-scheduler and kube-proxy $K8S_VERSION (cold: about 8 minutes)"
  local w=$tools/kube-build
  rm -rf "$w" "$dir.tmp"; mkdir -p "$w"
  local gomod
  gomod=$(cd "$w" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module zonewatch.local/kubecomponents"
    echo "go 1.26"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" |
      awk -v v="$K8S_STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
  } >"$w/go.mod"
  printf '//go:build tools\n\npackage main\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n\t_ "k8s.io/kubernetes/cmd/kube-proxy"\n)\n' >"$w/tools.go"
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
  (cd "$w" && go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-proxy@$K8S_VERSION" >&2)
  mkdir -p "$dir.tmp"
  for c in kube-apiserver kube-scheduler kube-proxy; do
    (cd "$w" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir.tmp/$c" "k8s.io/kubernetes/cmd/$c")
  done
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  rm -rf "$w"
}

# Cilium's go.mod replaces nothing we can't have except one gobgp
# pseudo-version; a wrapper module requires it at the tag and builds the
# agent, the CNI plugin and hubble-relay. The agent's BPF sources come from
# the same module (lib/bpf beside the binaries). clang-19/llvm-19 from apt,
# linked as clang and llc (the names the agent runs).
# The lab installs Cilium's CRDs (the operator's job on a cluster) from the
# same module: crds/ beside the binaries.
cilium_crds() { # module-dir dest
  rm -rf "$2/crds.tmp"; mkdir -p "$2/crds.tmp"
  cp "$1"/pkg/k8s/apis/cilium.io/client/crds/v2/*.yaml "$1"/pkg/k8s/apis/cilium.io/client/crds/v2alpha1/*.yaml "$2/crds.tmp/"
  chmod -R u+w "$2/crds.tmp"; mv "$2/crds.tmp" "$2/crds"
}
llvm_apt() {
  if ! command -v clang-19 >/dev/null 2>&1 || ! command -v llc-19 >/dev/null 2>&1 || ! command -v iptables >/dev/null 2>&1; then
    log "installing clang-19, llvm-19, iptables from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    # Pinned on Debian 12 (the development machines); elsewhere (the GitHub
    # runner's Ubuntu) the distribution's own LLVM 19 build.
    local llvm=(clang-19 llvm-19)
    if apt-cache madison clang-19 2>/dev/null | grep -qF "$LLVM_APT_VERSION"; then
      llvm=("clang-19=$LLVM_APT_VERSION" "llvm-19=$LLVM_APT_VERSION")
    else
      log "clang-19 $LLVM_APT_VERSION is not in this machine's apt sources: installing its own clang-19"
    fi
    apt-get install -y -qq --no-install-recommends "${llvm[@]}" iptables >&2
  fi
}
cilium() {
  local v=$CILIUM_VERSION
  local dir=$tools/cilium-$v
  # pkg/version parses "VERSION REVISION AUTHOR-DATE" (at least three
  # words: else the agent and Hubble's ServerStatus report no version). The
  # module has no git revision: "zwlab" says it is this build; the date is
  # the module's.
  local vstamp info
  info=$(go mod download -json "github.com/cilium/cilium@$v" | sed -n 's/.*"Info": "\(.*\)".*/\1/p')
  vstamp="${v#v} zwlab $(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")"
  if [ -x "$dir/cilium-agent" ] && [ -x "$dir/cilium-cni" ] && [ -x "$dir/hubble-relay" ] && [ -d "$dir/lib/bpf" ] &&
    [ "$(cat "$dir/.version" 2>/dev/null)" = "$vstamp" ]; then
    # A folder built before the CRDs were copied gets them without a rebuild.
    if [ ! -d "$dir/crds" ]; then
      cilium_crds "$(go mod download -json "github.com/cilium/cilium@$v" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')" "$dir"
    fi
    return
  fi
  log "building cilium-agent, cilium-cni, hubble-relay $v (cold: about 8 minutes, 3 GB)"
  local w=$tools/cilium-build m=github.com/cilium/cilium
  rm -rf "$w" "$dir.tmp"; mkdir -p "$w" "$dir.tmp"
  {
    echo "module zonewatch.local/cilium"
    echo "go 1.26"
    echo "require $m $v"
    echo "replace github.com/osrg/gobgp/v4 => github.com/osrg/gobgp/v4 $CILIUM_GOBGP_REPLACE"
  } >"$w/go.mod"
  printf '//go:build tools\n\npackage main\n\nimport (\n\t_ "%s/daemon"\n\t_ "%s/plugins/cilium-cni"\n\t_ "%s/hubble-relay"\n)\n' "$m" "$m" "$m" >"$w/tools.go"
  (cd "$w" && GOFLAGS=-mod=mod go get "$m@$v" >&2 && GOFLAGS=-mod=mod go mod tidy >&2)
  local ldflags="-s -w -X '$m/pkg/version.ciliumVersion=$vstamp'"
  local name pkg
  for pair in cilium-agent:daemon cilium-cni:plugins/cilium-cni hubble-relay:hubble-relay; do
    name=${pair%%:*} pkg=${pair#*:}
    (cd "$w" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir.tmp/$name" "$m/$pkg")
  done
  local src
  src=$(cd "$w" && go list -m -f '{{.Dir}}' "$m")
  mkdir -p "$dir.tmp/lib"; cp -r "$src/bpf" "$dir.tmp/lib/bpf"; chmod -R u+w "$dir.tmp/lib"
  cilium_crds "$src" "$dir.tmp"
  mkdir -p "$dir.tmp/llvm"; ln -sf "$(command -v clang-19)" "$dir.tmp/llvm/clang"; ln -sf "$(command -v llc-19)" "$dir.tmp/llvm/llc"
  echo "$vstamp" >"$dir.tmp/.version"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  rm -rf "$w"
}

# cilium118 builds cilium-agent and cilium-cni of the second Cilium version
# the lab runs (no hubble-relay: its tests use each node's own socket), with
# the same version stamp, BPF sources, CRDs and LLVM 19 (1.18's own docs ask
# for clang >= 18.1) as cilium(). Linked as bin/cilium-1.18.
cilium118() {
  local v=$CILIUM118_VERSION m=github.com/cilium/cilium
  local dir=$tools/cilium-$v info vstamp
  info=$(go mod download -json "$m@$v" | sed -n 's/.*"Info": "\(.*\)".*/\1/p')
  vstamp="${v#v} zwlab $(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")"
  if [ -x "$dir/cilium-agent" ] && [ -x "$dir/cilium-cni" ] && [ -d "$dir/lib/bpf" ] && [ -d "$dir/crds" ] &&
    [ "$(cat "$dir/.version" 2>/dev/null)" = "$vstamp" ]; then
    return
  fi
  log "building cilium-agent, cilium-cni $v (cold: about 15 CPU-minutes, 3.5 GB)"
  local w=$tools/cilium118-build
  rm -rf "$w" "$dir.tmp"; mkdir -p "$w" "$dir.tmp"
  printf 'module zonewatch.local/cilium118\ngo 1.26\nrequire %s %s\n' "$m" "$v" >"$w/go.mod"
  printf '//go:build tools\n\npackage main\n\nimport (\n\t_ "%s/daemon"\n\t_ "%s/plugins/cilium-cni"\n)\n' "$m" "$m" >"$w/tools.go"
  (cd "$w" && GOFLAGS=-mod=mod go get "$m@$v" >&2 && GOFLAGS=-mod=mod go mod tidy >&2)
  local ldflags="-s -w -X '$m/pkg/version.ciliumVersion=$vstamp'" name pkg
  for pair in cilium-agent:daemon cilium-cni:plugins/cilium-cni; do
    name=${pair%%:*} pkg=${pair#*:}
    (cd "$w" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir.tmp/$name" "$m/$pkg")
  done
  local src
  src=$(cd "$w" && go list -m -f '{{.Dir}}' "$m")
  mkdir -p "$dir.tmp/lib"; cp -r "$src/bpf" "$dir.tmp/lib/bpf"; chmod -R u+w "$dir.tmp/lib"
  cilium_crds "$src" "$dir.tmp"
  mkdir -p "$dir.tmp/llvm"; ln -sf "$(command -v clang-19)" "$dir.tmp/llvm/clang"; ln -sf "$(command -v llc-19)" "$dir.tmp/llvm/llc"
  echo "$vstamp" >"$dir.tmp/.version"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  rm -rf "$w"
}

# prometheus-operator's go.mod replaces its own pkg/apis/monitoring and
# pkg/client modules with local folders, so `go install` refuses it: a
# wrapper module requires it and pins both to the published same version.
prometheus_operator() {
  local v=$PROMETHEUS_OPERATOR_VERSION
  local dir=$tools/prometheus-operator-$v
  if [ -x "$dir/operator" ]; then return; fi
  log "building prometheus-operator $v (cold: minutes)"
  local w=$tools/prometheus-operator-build m=github.com/prometheus-operator/prometheus-operator
  rm -rf "$w" "$dir.tmp"; mkdir -p "$w"
  {
    echo "module zonewatch.local/promoperator"
    echo "go 1.26"
    echo "require $m $v"
    echo "replace $m/pkg/apis/monitoring => $m/pkg/apis/monitoring $v"
    echo "replace $m/pkg/client => $m/pkg/client $v"
  } >"$w/go.mod"
  printf '//go:build tools\n\npackage main\n\nimport _ "%s/cmd/operator"\n' "$m" >"$w/tools.go"
  (cd "$w" && go get "$m/cmd/operator@$v" >&2)
  (cd "$w" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/prometheus/common/version.Version=${v#v}" -o "$dir.tmp/operator" "$m/cmd/operator")
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  rm -rf "$w"
}

# Kueue's manager from its module (go install works: its go.mod replaces
# nothing), stripped. Beside it: crds/ (Kueue's), webhook.yaml (its
# webhook configurations, registered by URL in the test) and
# controller-crds/ (PyTorchJob, MPIJob, JobSet, TrainJob runtimes,
# RayCluster, LeaderWorkerSet CRDs at the versions Kueue requires).
kueue() {
  local v=$KUEUE_VERSION
  local dir=$tools/kueue-$v
  if [ -x "$dir/kueue" ] && [ -f "$dir/.done" ]; then return; fi
  log "building kueue $v (cold: about 4 minutes)"
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp/crds" "$dir.tmp/controller-crds"
  GOBIN="$dir.tmp" GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$v" "sigs.k8s.io/kueue/cmd/kueue@$v"
  local src
  src=$(go mod download -json "sigs.k8s.io/kueue@$v" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  cp "$src"/config/components/crd/bases/*.yaml "$dir.tmp/crds/"
  cp "$src/config/components/webhook/manifests.yaml" "$dir.tmp/webhook.yaml"
  local m f mv mdir
  for pair in github.com/kubeflow/training-operator:manifests/base/crds/kubeflow.org_pytorchjobs.yaml \
    github.com/kubeflow/mpi-operator:manifests/base/kubeflow.org_mpijobs.yaml \
    sigs.k8s.io/jobset:config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml \
    github.com/kubeflow/trainer/v2:manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml \
    github.com/ray-project/kuberay/ray-operator:config/crd/bases/ray.io_rayclusters.yaml \
    sigs.k8s.io/lws:config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml; do
    m=${pair%%:*} f=${pair#*:}
    mv=$(awk -v m="$m" '$1 == m {print $2; exit}' "$src/go.mod")
    mdir=$(go mod download -json "$m@$mv" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    cp "$mdir/$f" "$dir.tmp/controller-crds/"
    echo "$m $mv $f" >>"$dir.tmp/controller-crds/VERSIONS"
  done
  chmod -R u+w "$dir.tmp"
  touch "$dir.tmp/.done"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
}

# Debian's packages first, one apt at a time: etcd, LLVM 19 and iptables
# for the Cilium lab, Node.js for the dashboard schema check (the machine
# image usually has it).
etcd_bin
llvm_apt
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "installing nodejs and npm from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >&2
fi

# Then the Go builds in two lanes at once. One cold go build keeps 2 cores
# busy only about three quarters of the time (module downloads, the
# single-threaded links of 100-200 MB binaries): a cold run took 55m53s
# wall for 85 CPU-minutes in one lane. The go caches take concurrent
# builds; each lane's first failure ends it, and the script fails after
# both lanes are done.
lane1() {
  kube_components
  cilium
  goinstall "prometheus-$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
  goinstall "helm-$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  goinstall "actionlint-$ACTIONLINT_VERSION" "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
}
lane2() {
  kueue
  cilium118
  prometheus_operator
  goinstall "alertmanager-$ALERTMANAGER_VERSION" \
    "github.com/prometheus/alertmanager/cmd/alertmanager@$ALERTMANAGER_VERSION" \
    "github.com/prometheus/alertmanager/cmd/amtool@$ALERTMANAGER_VERSION"
  goinstall "staticcheck-$STATICCHECK_VERSION" "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
  if [ "$release" = 1 ]; then
    goinstall "cyclonedx-gomod-$CYCLONEDX_GOMOD_VERSION" "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$CYCLONEDX_GOMOD_VERSION"
    goinstall "crane-$CRANE_VERSION" "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
  fi
  ZONEWATCH_TOOLS=$tools bash "$root/hack/schema-check/check.sh" --install >&2
}
( set -e; lane1 ) & lane1_pid=$!
( set -e; lane2 ) & lane2_pid=$!
failed=
wait "$lane1_pid" || failed="$failed 1"
wait "$lane2_pid" || failed="$failed 2"
if [ -n "$failed" ]; then log "build lane(s)$failed failed (above)"; exit 1; fi

# One flat bin/ of links so tests and scripts need a single path.
mkdir -p "$tools/bin"
for b in kube-apiserver kube-scheduler kube-proxy; do ln -sf "$tools/kube-$K8S_VERSION/$b" "$tools/bin/$b"; done
ln -sf "$(command -v etcd)" "$tools/bin/etcd"
for b in prometheus promtool; do ln -sf "$tools/prometheus-$PROMETHEUS_VERSION/$b" "$tools/bin/$b"; done
for b in alertmanager amtool; do ln -sf "$tools/alertmanager-$ALERTMANAGER_VERSION/$b" "$tools/bin/$b"; done
ln -sf "$tools/helm-$HELM_VERSION/helm" "$tools/bin/helm"
ln -sf "$tools/staticcheck-$STATICCHECK_VERSION/staticcheck" "$tools/bin/staticcheck"
ln -sf "$tools/actionlint-$ACTIONLINT_VERSION/actionlint" "$tools/bin/actionlint"
if [ "$release" = 1 ]; then
  ln -sf "$tools/cyclonedx-gomod-$CYCLONEDX_GOMOD_VERSION/cyclonedx-gomod" "$tools/bin/cyclonedx-gomod"
  ln -sf "$tools/crane-$CRANE_VERSION/crane" "$tools/bin/crane"
fi
ln -sf "$tools/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION/operator" "$tools/bin/prometheus-operator"
# The Cilium lab reads its folder (binaries, lib/bpf, llvm/) through this link.
ln -sfn "$tools/cilium-$CILIUM_VERSION" "$tools/bin/cilium"
ln -sfn "$tools/cilium-$CILIUM118_VERSION" "$tools/bin/cilium-1.18"
# Kueue's manager and, through the folder link, its CRDs and webhook
# configuration.
ln -sf "$tools/kueue-$KUEUE_VERSION/kueue" "$tools/bin/kueue"
ln -sfn "$tools/kueue-$KUEUE_VERSION" "$tools/bin/kueue.d"
log "ready in $tools/bin"
echo "$tools/bin"
exit
}
