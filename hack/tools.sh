#!/usr/bin/env bash
# Builds and installs every tool the tests need, pinned, into a tools cache
# shared by every checkout on the machine, and links them into this
# checkout's git-ignored .tools/bin (the one folder the Makefile, the tests
# and the docs use). Sources: the Go module proxy (go install / go build)
# and Debian's apt; nothing else is downloaded.
#
#   hack/tools.sh             every test tool (make tools)
#   hack/tools.sh --release   also the release tools (SBOM generator, crane)
#   hack/tools.sh --linters   only staticcheck and actionlint (make lint, make check)
#
# The cache: $ZONEWATCH_TOOLS, else $XDG_CACHE_HOME/zonewatch/tools, else
# ~/.cache/zonewatch/tools. Each tool has a folder named by tool, version
# and a short hash of its recipe (the bash functions below that build it,
# the values they pin, and the Go version, OS and architecture), so an
# edited recipe builds a new folder and never reuses an old build. A folder
# is used only when complete: a tool is built in <folder>.tmp, marked .done
# last and renamed into place, so an interrupted build leaves nothing a
# later run trusts. Each tool is built under a lock (flock on <folder>.lock
# in the cache): a second run at the same time waits for it and then uses
# it. A warm run only checks the .done markers and relinks .tools/bin.
# Nothing is ever deleted from the cache: remove the folder to reclaim the
# space of old versions and recipes.
#
# Prints the bin folder on its last line of stdout.
# The whole script is one compound command, parsed before it runs: an edit
# to this file while a (cold, long) run is in progress cannot break it.
{
set -euo pipefail

K8S_VERSION=v1.37.2
K8S_STAGING_VERSION=v0.37.2
# Built from one wrapper module (kube_recipe).
KUBE_COMPONENTS="kube-apiserver kube-scheduler kube-proxy kube-controller-manager"
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
# Kueue (internal/kueuelab: its manager against the test apiserver, TAS);
# its CRDs and webhook configuration from the same module, and the CRDs of
# the training controllers at the versions its go.mod requires (analyze's
# CRD check).
KUEUE_VERSION=v0.17.0
# Release tools, built only with --release (make sbom, make push): the SBOM
# generator and crane, which pushes the image index.
CYCLONEDX_GOMOD_VERSION=v1.10.0
CRANE_VERSION=v0.22.1

mode=all
case "${1:-}" in
  "") ;;
  --release) mode=release ;;
  --linters) mode=linters ;;
  *) echo "usage: hack/tools.sh [--release | --linters]" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
tools=${ZONEWATCH_TOOLS:-${XDG_CACHE_HOME:-${HOME:?set HOME or ZONEWATCH_TOOLS}/.cache}/zonewatch/tools}
mkdir -p "$tools"
# Links in bin/ name the physical folder.
tools=$(cd "$tools" && pwd -P)
# The flat bin/ of links is this checkout's: two checkouts whose recipes
# differ each link their own builds.
bin=$root/.tools/bin
log() { echo "tools: $*" >&2; }

# ---- Recipes. Each builds one tool into its first argument, an empty
# folder, with its second, an empty folder, for any work files (a wrapper
# module). Their source is part of the tool's key: edit one, and the next
# run builds that tool into a new folder.
#
# Every Go build here is CGO_ENABLED=0 -trimpath with
# -gcflags=all=-dwarf=false and a stripped link (-ldflags "-s -w"): the
# tools are run, never debugged, and the linker would drop the DWARF the
# compiler wrote for every package anyway (Alertmanager cold: 130 -> 113
# CPU-seconds, one build each way on a loaded machine). Panics still print
# their stacks (those come from the pclntab, not DWARF).

# go install main packages at pinned versions.
goinstall() { # out pkg@version...
  local out=$1; shift
  GOBIN="$out" GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" "$@"
}
# Prometheus, promtool and helm: one wrapper module, one go build.
# - Service discoveries: only the ones a test's Prometheus configuration
#   uses (kubernetes_sd_configs in e2e's operator test; static, file and
#   http are always in). Prometheus' plugins/ files are built unless
#   remove_all_sd is set, or with it, enable_<name>_sd. Cold (empty
#   GOCACHE, warm module cache, go install of both, /usr/bin/time, a loaded
#   2-core machine): every SD 739 CPU-seconds (636 s user, 103 s sys), these
#   tags 398 (334 s user, 64 s sys): 341 CPU-seconds less.
# - helm on Prometheus' graph: helm v3.22.0 requires k8s.io v0.37.0, so it
#   cannot join the controllers' wrappers (k8s.io v0.35.3: moving them to
#   v0.37 breaks controller-runtime v0.23, above). It could join the kube
#   wrapper (v0.37.2; it would move golang.org/x/crypto, x/text, x/tools and
#   go.yaml.in/yaml/v3 of kube-apiserver's build), not measured. Here it
#   moves none of Prometheus' modules (Prometheus' build list is the same
#   as go install's) and shares 53 of its 111 modules with it; 31 of helm's
#   move up (k8s.io/api, apimachinery and client-go v0.37.0 -> v0.37.1, the
#   golang.org/x modules, go-openapi). helm alone (go install, cold): 228
#   CPU-seconds (186 s user, 42 s sys); this recipe on a GOCACHE holding
#   only the tagged Prometheus build: 63 (the go get, helm's packages whose
#   modules moved, the links): at least 165 CPU-seconds less.
# - Alertmanager stays on its own graph: Prometheus v0.316.0 requires
#   alertmanager v0.34.1, so one graph would build amtool and alertmanager
#   at v0.34.1, not the pinned v0.31.1.
# The recipe fails if a pinned main module moved.
PROMETHEUS_TAGS=remove_all_sd,enable_kubernetes_sd
prometheus_recipe() { # out work
  local out=$1 w=$2 p=github.com/prometheus/prometheus/cmd h=helm.sh/helm/v3 m
  printf 'module zonewatch.local/prometheus\ngo 1.26\n' >"$w/go.mod"
  printf '//go:build tools\n\npackage main\n\nimport (\n\t_ "%s"\n\t_ "%s"\n\t_ "%s"\n)\n' \
    "$p/prometheus" "$p/promtool" "$h/cmd/helm" >"$w/tools.go"
  (cd "$w" && go get "$p/prometheus@$PROMETHEUS_VERSION" "$p/promtool@$PROMETHEUS_VERSION" "$h/cmd/helm@$HELM_VERSION" >&2 &&
    go mod tidy >&2)
  for m in "github.com/prometheus/prometheus $PROMETHEUS_VERSION" "$h $HELM_VERSION"; do
    [ "$(cd "$w" && go list -m -f '{{.Path}} {{.Version}}' "${m% *}")" = "$m" ] || { log "the wrapper moved ${m% *} from ${m#* }"; return 1; }
  done
  (cd "$w" && GOFLAGS=-buildvcs=false CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" -tags "$PROMETHEUS_TAGS" -o "$out/" "$p/prometheus" "$p/promtool" "$h/cmd/helm")
  mkdir -p "$out/wrapper"
  cp "$w/go.mod" "$w/go.sum" "$out/wrapper/"
}
alertmanager_recipe() {
  goinstall "$1" "github.com/prometheus/alertmanager/cmd/alertmanager@$ALERTMANAGER_VERSION" \
    "github.com/prometheus/alertmanager/cmd/amtool@$ALERTMANAGER_VERSION"
}
staticcheck_recipe() { goinstall "$1" "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"; }
actionlint_recipe() { goinstall "$1" "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"; }
cyclonedx_recipe() { goinstall "$1" "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$CYCLONEDX_GOMOD_VERSION"; }
crane_recipe() { goinstall "$1" "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"; }

# kube-apiserver, kube-scheduler and kube-proxy are not go-installable
# modules on their own: k8s.io/kubernetes points its staging modules at local
# paths. A wrapper module replaces each with the published v0.x version of
# the same release; the binaries are built from it in one go (they share
# most packages). kube-proxy runs in the Cilium lab's iptables mode;
# kube-controller-manager's Job and StatefulSet controllers create the pods
# of JobSet, Trainer v2, the MPI launcher and LeaderWorkerSet (issue 43).
kube_recipe() { # out work
  local out=$1 w=$2 gomod
  gomod=$(cd "$w" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module zonewatch.local/kubecomponents"
    echo "go 1.26"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" |
      awk -v v="$K8S_STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
  } >"$w/go.mod"
  # shellcheck disable=SC2086 # a list of names
  { printf '//go:build tools\n\npackage main\n\nimport (\n'; printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' $KUBE_COMPONENTS; printf ')\n'; } >"$w/tools.go"
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
  # shellcheck disable=SC2046,SC2086 # a list of names
  (cd "$w" && go get $(printf "k8s.io/kubernetes/cmd/%s@$K8S_VERSION " $KUBE_COMPONENTS) >&2)
  for c in $KUBE_COMPONENTS; do
    (cd "$w" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "$ldflags" -o "$out/$c" "k8s.io/kubernetes/cmd/$c")
  done
}

# Cilium's go.mod replaces nothing we can't have except one gobgp
# pseudo-version; a wrapper module requires it at the tag and builds the
# agent, the CNI plugin and hubble-relay. The agent's BPF sources come from
# the same module (lib/bpf beside the binaries). clang-19/llvm-19 from apt,
# linked as clang and llc (the names the agent runs) in llvm/.
# The lab installs Cilium's CRDs (the operator's job on a cluster) from the
# same module: crds/ beside the binaries.
# pkg/version parses "VERSION REVISION AUTHOR-DATE" (at least three words:
# else the agent and Hubble's ServerStatus report no version). The module
# has no git revision: "zwlab" says it is this build; the date is the
# module's. It is kept in .version.
cilium_stamp() { # version
  local info
  info=$(go mod download -json "github.com/cilium/cilium@$1" | sed -n 's/.*"Info": "\(.*\)".*/\1/p')
  echo "${1#v} zwlab $(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")"
}
cilium_files() { # out work: lib/bpf, crds/, llvm/ beside the binaries
  local out=$1 src
  src=$(cd "$2" && go list -m -f '{{.Dir}}' github.com/cilium/cilium)
  mkdir -p "$out/lib" "$out/crds" "$out/llvm"
  cp -r "$src/bpf" "$out/lib/bpf"
  cp "$src"/pkg/k8s/apis/cilium.io/client/crds/v2/*.yaml "$src"/pkg/k8s/apis/cilium.io/client/crds/v2alpha1/*.yaml "$out/crds/"
  chmod -R u+w "$out/lib" "$out/crds"
  ln -s "$(command -v clang-19)" "$out/llvm/clang"
  ln -s "$(command -v llc-19)" "$out/llvm/llc"
}
cilium_recipe() { # out work
  local out=$1 w=$2 v=$CILIUM_VERSION m=github.com/cilium/cilium vstamp name pkg
  vstamp=$(cilium_stamp "$v")
  {
    echo "module zonewatch.local/cilium"
    echo "go 1.26"
    echo "require $m $v"
    echo "replace github.com/osrg/gobgp/v4 => github.com/osrg/gobgp/v4 $CILIUM_GOBGP_REPLACE"
  } >"$w/go.mod"
  printf '//go:build tools\n\npackage main\n\nimport (\n\t_ "%s/daemon"\n\t_ "%s/plugins/cilium-cni"\n\t_ "%s/hubble-relay"\n)\n' "$m" "$m" "$m" >"$w/tools.go"
  (cd "$w" && GOFLAGS=-mod=mod go get "$m@$v" >&2 && GOFLAGS=-mod=mod go mod tidy >&2)
  local ldflags="-s -w -X '$m/pkg/version.ciliumVersion=$vstamp'"
  for pair in cilium-agent:daemon cilium-cni:plugins/cilium-cni hubble-relay:hubble-relay; do
    name=${pair%%:*} pkg=${pair#*:}
    (cd "$w" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "$ldflags" -o "$out/$name" "$m/$pkg")
  done
  cilium_files "$out" "$w"
  echo "$vstamp" >"$out/.version"
}

# The second Cilium version the lab runs: cilium-agent and cilium-cni (no
# hubble-relay: its tests use each node's own socket), with the same
# version stamp, BPF sources, CRDs and LLVM 19 (1.18's own docs ask for
# clang >= 18.1) as cilium_recipe. Linked as bin/cilium-1.18.
cilium118_recipe() { # out work
  local out=$1 w=$2 v=$CILIUM118_VERSION m=github.com/cilium/cilium vstamp name pkg
  vstamp=$(cilium_stamp "$v")
  printf 'module zonewatch.local/cilium118\ngo 1.26\nrequire %s %s\n' "$m" "$v" >"$w/go.mod"
  printf '//go:build tools\n\npackage main\n\nimport (\n\t_ "%s/daemon"\n\t_ "%s/plugins/cilium-cni"\n)\n' "$m" "$m" >"$w/tools.go"
  (cd "$w" && GOFLAGS=-mod=mod go get "$m@$v" >&2 && GOFLAGS=-mod=mod go mod tidy >&2)
  local ldflags="-s -w -X '$m/pkg/version.ciliumVersion=$vstamp'"
  for pair in cilium-agent:daemon cilium-cni:plugins/cilium-cni; do
    name=${pair%%:*} pkg=${pair#*:}
    (cd "$w" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "$ldflags" -o "$out/$name" "$m/$pkg")
  done
  cilium_files "$out" "$w"
  echo "$vstamp" >"$out/.version"
}

# The controller-runtime programs: Kueue, prometheus-operator and the six
# training controllers (issue 43 runs them against the test apiserver).
# Built each on its own graph (go install, or a wrapper per program), they
# compiled client-go, apimachinery, apiserver and controller-runtime once
# per graph: no two of them require the same versions. Here they are built
# on two wrapper modules, split only by controller-runtime (below), whose
# shared modules are then raised to the same versions (align_wrappers), so
# the Go build cache compiles each shared package once for both. They do
# not join the kube-* wrapper: k8s.io/kubernetes v1.37.2 fixes every
# k8s.io module at v0.37.2, and there
#   - controller-runtime v0.23.3 (and older) fails to compile:
#     pkg/cache/multi_namespace_cache.go:363: handlerRegistration does not
#     implement cache.ResourceEventHandlerRegistration (missing method
#     HasSyncedChecker); v0.25.3 is the release for k8s.io v0.37;
#   - Trainer v2.2.0's generated OpenAPI fails to compile against
#     k8s.io/api v0.37.2: pkg/apis/trainer/v1alpha1/zz_generated.openapi.go:
#     undefined: corev1.PodStatusResult, corev1.WorkloadReference.
# So every controller keeps the k8s.io minor its own go.mod requires (v0.35,
# at Kueue's patch v0.35.3; LWS asks v0.34.3, training-operator v0.31.3,
# prometheus-operator v0.33.3: they build and run with it).
#
# Versions: the ones Kueue v0.17.0's go.mod requires (its integrations are
# built against them, and analyze's CRD check reads their CRDs from those
# versions; the issue 43 check found each served by the module proxy, with
# no replace directive in its go.mod).
JOBSET_VERSION=v0.11.1            # Kueue v0.17.0's; main.go
LWS_VERSION=v0.8.0                # Kueue v0.17.0's; cmd/main.go
TRAINER_VERSION=v2.2.0            # Kueue v0.17.0's; cmd/trainer-controller-manager
TRAINING_OPERATOR_VERSION=v1.9.3  # Kueue v0.17.0's (the v1 operator's last); cmd/training-operator.v1
MPI_OPERATOR_VERSION=v0.8.0       # Kueue v0.17.0's; cmd/mpi-operator
KUBERAY_VERSION=v1.6.0            # Kueue v0.17.0's; ray-operator/main.go
# The two controller-runtime lines. Kueue v0.17.0, Trainer v2.2.0 and MPI
# Operator v0.8.0 require v0.23 (Kueue's v0.23.3). JobSet, LWS and KubeRay
# require v0.22.4, training-operator v0.19.1 and prometheus-operator v0.21.0;
# none of them compiles with v0.23.3 (the split):
#   jobset pkg/webhooks/jobset_webhook.go:103, lws
#   pkg/webhooks/leaderworkerset_webhook.go:43, training-operator
#   pkg/webhooks/pytorch/pytorchjob_webhook.go:45, kuberay
#   pkg/webhooks/v1/raycluster_webhook.go:23: not enough arguments in call
#   to ctrl.NewWebhookManagedBy (have (Manager), want (manager.Manager, T));
#   prometheus-operator pkg/admission/admission.go:88: not enough arguments
#   in call to conversion.NewWebhookHandler (want (*Scheme, Registry)).
# They build together on v0.22.4, the newest before that change.
CONTROLLER_RUNTIME_V023=v0.23.3
CONTROLLER_RUNTIME_V022=v0.22.4
# Each: NAME=MAIN-PACKAGE@VERSION, built to NAME in the tool's folder.
CONTROLLERS_V023=(
  "kueue=sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  "trainer-controller-manager=github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager@$TRAINER_VERSION"
  "mpi-operator=github.com/kubeflow/mpi-operator/cmd/mpi-operator@$MPI_OPERATOR_VERSION"
)
CONTROLLERS_V022=(
  "prometheus-operator=github.com/prometheus-operator/prometheus-operator/cmd/operator@$PROMETHEUS_OPERATOR_VERSION"
  "jobset=sigs.k8s.io/jobset@$JOBSET_VERSION"
  "lws=sigs.k8s.io/lws/cmd@$LWS_VERSION"
  "training-operator=github.com/kubeflow/training-operator/cmd/training-operator.v1@$TRAINING_OPERATOR_VERSION"
  "kuberay-operator=github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION"
)

# wrapper_module WORK NAME CR EXTRA SPEC...: a module in WORK whose tools.go
# imports each SPEC's main package, required at its version, with
# controller-runtime at CR; EXTRA is added to go.mod first (replaces).
wrapper_module() {
  local w=$1 name=$2 cr=$3 extra=$4 s
  shift 4
  mkdir -p "$w"
  printf 'module zonewatch.local/%s\ngo 1.26\n%s\n' "$name" "$extra" >"$w/go.mod"
  {
    printf '//go:build tools\n\npackage main\n\nimport (\n'
    for s in "$@"; do s=${s#*=}; printf '\t_ "%s"\n' "${s%@*}"; done
    printf ')\n'
  } >"$w/tools.go"
  local gets=()
  for s in "$@"; do gets+=("${s#*=}"); done
  (cd "$w" && go get "${gets[@]}" "sigs.k8s.io/controller-runtime@$cr" >&2 && go mod tidy >&2)
}
# buildlist WORK: "module version" of every module the wrapper's main
# packages are built from (not the rest of its module graph).
buildlist() {
  local pkgs
  pkgs=$(grep -o '"[^"]*"' "$1/tools.go" | tr -d '"')
  # shellcheck disable=SC2086 # a list of packages
  (cd "$1" && go list -deps -f '{{with .Module}}{{if and .Version (not .Main)}}{{.Path}} {{.Version}}{{end}}{{end}}' $pkgs) | sort -u
}
# semver_max V...: the highest, in Go's order for these versions (a
# pre-release or pseudo-version sorts before its release: "-" becomes "~").
semver_max() { printf '%s\n' "$@" | sed 's/-/~/' | sort -V | tail -n 1 | sed 's/~/-/'; }
# align_wrappers A B: every module both build goes to the higher of its two
# versions in both, then both are tidied, until they agree. Except
# controller-runtime (the split) and what requires its newer line:
# cert-controller v0.16.0 (Kueue's) requires controller-runtime v0.23.3, so
# JobSet, LWS and KubeRay keep their v0.15.0. controller-runtime must stay
# where it was put.
ALIGN_EXCEPT="sigs.k8s.io/controller-runtime github.com/open-policy-agent/cert-controller"
align_wrappers() {
  local a=$1 b=$2 i m va vb hi more cra crb
  cra=$(cd "$a" && go list -m -f '{{.Version}}' sigs.k8s.io/controller-runtime)
  crb=$(cd "$b" && go list -m -f '{{.Version}}' sigs.k8s.io/controller-runtime)
  for i in 1 2 3 4 5; do
    more=
    buildlist "$a" >"$a/buildlist" && buildlist "$b" >"$b/buildlist"
    while read -r m va vb; do
      [ "$va" != "$vb" ] && [[ " $ALIGN_EXCEPT " != *" $m "* ]] || continue
      hi=$(semver_max "$va" "$vb") more=1
      [ "$va" = "$hi" ] || (cd "$a" && go mod edit -require="$m@$hi")
      [ "$vb" = "$hi" ] || (cd "$b" && go mod edit -require="$m@$hi")
    done < <(join "$a/buildlist" "$b/buildlist")
    if [ -z "$more" ]; then
      [ "$(cd "$a" && go list -m -f '{{.Version}}' sigs.k8s.io/controller-runtime)" = "$cra" ] &&
        [ "$(cd "$b" && go list -m -f '{{.Version}}' sigs.k8s.io/controller-runtime)" = "$crb" ] ||
        { log "aligning the wrappers moved controller-runtime"; return 1; }
      return 0
    fi
    (cd "$a" && go mod tidy >&2) && (cd "$b" && go mod tidy >&2)
  done
  log "the wrappers' shared modules did not converge in 5 rounds"
  return 1
}
# module_dir MODULE@VERSION: its folder in the module cache (downloaded).
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }
# controller_files OUT NAME MODULE@VERSION CRDS WEBHOOK: NAME.d/ beside the
# binary with the CRDs (a glob under the module) and the webhook
# configuration (if the module has one) from the built version, and VERSION.
controller_files() {
  local out=$1/$2.d src f
  src=$(module_dir "$3")
  mkdir -p "$out/crds"
  for f in $4; do cp "$src"/$f "$out/crds/"; done
  [ -z "$5" ] || cp "$src/$5" "$out/webhook.yaml"
  echo "$3" >"$out/VERSION"
}
controllers_recipe() { # out work
  local out=$1 w=$2 s name pkg v ldx src m f mv mdir
  local po=github.com/prometheus-operator/prometheus-operator
  wrapper_module "$w/v023" controllers-v023 "$CONTROLLER_RUNTIME_V023" "" "${CONTROLLERS_V023[@]}"
  # prometheus-operator's go.mod replaces its own pkg/apis/monitoring and
  # pkg/client modules with local folders: pinned to the published same version.
  wrapper_module "$w/v022" controllers-v022 "$CONTROLLER_RUNTIME_V022" \
    "$(printf 'replace %s => %s %s\n' "$po/pkg/apis/monitoring" "$po/pkg/apis/monitoring" "$PROMETHEUS_OPERATOR_VERSION" \
      "$po/pkg/client" "$po/pkg/client" "$PROMETHEUS_OPERATOR_VERSION")" "${CONTROLLERS_V022[@]}"
  align_wrappers "$w/v023" "$w/v022"
  mkdir -p "$out/wrappers"
  for s in v023 v022; do cp "$w/$s/go.mod" "$out/wrappers/$s.go.mod"; cp "$w/$s/go.sum" "$out/wrappers/$s.go.sum"; done
  for s in "${CONTROLLERS_V023[@]/#/v023:}" "${CONTROLLERS_V022[@]/#/v022:}"; do
    name=${s#*:} name=${name%%=*} pkg=${s#*=} v=${pkg##*@} pkg=${pkg%@*}
    case $name in
      kueue) ldx="-X sigs.k8s.io/kueue/pkg/version.GitVersion=$v" ;;
      prometheus-operator) ldx="-X github.com/prometheus/common/version.Version=${v#v}" ;;
      jobset) ldx="-X sigs.k8s.io/jobset/pkg/version.GitVersion=$v" ;;
      lws) ldx="-X sigs.k8s.io/lws/pkg/version.GitVersion=$v" ;;
      mpi-operator) ldx="-X github.com/kubeflow/mpi-operator/pkg/version.Version=$v" ;;
      *) ldx= ;;
    esac
    (cd "$w/${s%%:*}" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w $ldx" -o "$out/$name" "$pkg")
    echo "$name $pkg $v" >>"$out/VERSIONS"
  done
  # Kueue: crds/, webhook.yaml (registered by URL in the test) and
  # controller-crds/ (PyTorchJob, MPIJob, JobSet, TrainJob runtimes,
  # RayCluster, LeaderWorkerSet CRDs at the versions Kueue requires, for
  # analyze's CRD check).
  src=$(module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION")
  mkdir -p "$out/kueue.d/crds" "$out/kueue.d/controller-crds"
  cp "$src"/config/components/crd/bases/*.yaml "$out/kueue.d/crds/"
  cp "$src/config/components/webhook/manifests.yaml" "$out/kueue.d/webhook.yaml"
  for pair in github.com/kubeflow/training-operator:manifests/base/crds/kubeflow.org_pytorchjobs.yaml \
    github.com/kubeflow/mpi-operator:manifests/base/kubeflow.org_mpijobs.yaml \
    sigs.k8s.io/jobset:config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml \
    github.com/kubeflow/trainer/v2:manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml \
    github.com/ray-project/kuberay/ray-operator:config/crd/bases/ray.io_rayclusters.yaml \
    sigs.k8s.io/lws:config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml; do
    m=${pair%%:*} f=${pair#*:}
    mv=$(awk -v m="$m" '$1 == m {print $2; exit}' "$src/go.mod")
    mdir=$(module_dir "$m@$mv")
    cp "$mdir/$f" "$out/kueue.d/controller-crds/"
    echo "$m $mv $f" >>"$out/kueue.d/controller-crds/VERSIONS"
  done
  # The training controllers' own CRDs and webhook configurations, from the
  # versions built (issue 43's harness installs them).
  controller_files "$out" jobset "sigs.k8s.io/jobset@$JOBSET_VERSION" \
    'config/components/crd/bases/*.yaml' config/components/webhook/manifests.yaml
  controller_files "$out" lws "sigs.k8s.io/lws@$LWS_VERSION" 'config/crd/bases/*.yaml' config/webhook/manifests.yaml
  controller_files "$out" trainer-controller-manager "github.com/kubeflow/trainer/v2@$TRAINER_VERSION" \
    'manifests/base/crds/trainer.kubeflow.org_*.yaml' manifests/base/webhook/manifests.yaml
  controller_files "$out" training-operator "github.com/kubeflow/training-operator@$TRAINING_OPERATOR_VERSION" \
    'manifests/base/crds/kubeflow.org_*.yaml' manifests/base/webhook/manifests.yaml
  controller_files "$out" mpi-operator "github.com/kubeflow/mpi-operator@$MPI_OPERATOR_VERSION" \
    'manifests/base/kubeflow.org_mpijobs.yaml' ""
  controller_files "$out" kuberay-operator "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION" \
    'config/crd/bases/*.yaml' config/webhook/manifests.yaml
  chmod -R u+w "$out"
}

# ---- The cache: keys, locks, complete folders.

goenv=$(go env GOVERSION GOOS GOARCH | tr '\n' ' ')
declare -A dir recipe hint
# tool KEY NAME VERSION "RECIPE HELPER..." [VALUE...] [-- HINT]: the folder
# of a tool in the cache, $tools/NAME-VERSION-HASH, where HASH covers the
# source of the recipe and its helpers, the version, the VALUEs the recipe
# reads besides it, and Go's version, OS and architecture.
tool() {
  local key=$1 name=$2 version=$3 fns=$4 h
  shift 4
  local values=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do values+=("$1"); shift; done
  [ $# -eq 0 ] || { shift; hint[$key]=$*; }
  # shellcheck disable=SC2086 # fns is a list of function names
  h=$({ declare -f $fns; printf '%s\n' "$version" "${values[@]}" "$goenv"; } | sha256sum)
  dir[$key]=$tools/$name-$version-${h:0:12}
  recipe[$key]=${fns%% *}
}
# cpuspent BEFORE AFTER: seconds of CPU (user + sys) that this shell's
# finished children used between two outputs of bash's times (its second
# line: the children's), each written to a file by the shell itself (in a
# command substitution times would report the subshell's children: none).
cpuspent() {
  awk 'FNR == 2 { for (i = 1; i <= 2; i++) { sub(/s$/, "", $i); split($i, t, "m"); c[FILENAME] += t[1] * 60 + t[2] } }
    END { printf "%.0f", c[ARGV[2]] - c[ARGV[1]] }' "$1" "$2"
}
# ensure KEY: the tool's folder, complete (.done), building it unless it is.
# One builder per folder: the others wait on its lock, then find it done.
# A build logs its wall time and the CPU time of its processes.
ensure() {
  local d=${dir[$1]} lock t0 cpu
  [ ! -f "$d/.done" ] || return 0
  exec {lock}>"$d.lock"
  if ! flock -n "$lock"; then
    log "waiting for another run to finish ${d##*/}"
    flock "$lock"
  fi
  if [ ! -f "$d/.done" ]; then
    log "building ${d##*/}${hint[$1]:+ (cold: ${hint[$1]})}"
    rm -rf "$d.tmp" "$d.work" "$d" "$d.times0" "$d.times1"
    mkdir -p "$d.tmp" "$d.work"
    t0=$SECONDS
    times >"$d.times0"
    "${recipe[$1]}" "$d.tmp" "$d.work"
    times >"$d.times1"
    cpu=$(cpuspent "$d.times0" "$d.times1")
    rm -f "$d.times0" "$d.times1"
    touch "$d.tmp/.done"
    mv "$d.tmp" "$d"
    rm -rf "$d.work"
    log "built ${d##*/} in $((SECONDS - t0))s (${cpu}s CPU)"
  fi
  exec {lock}>&-
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

# Debian's packages first, one apt at a time: etcd, LLVM 19 and iptables
# for the Cilium lab, Node.js for the dashboard schema check (the machine
# image usually has it). The linters need none of them.
if [ "$mode" != linters ]; then
  etcd_bin
  llvm_apt
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "installing nodejs and npm from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >&2
  fi
fi

# The tools and their keys (after apt: the Cilium folders link its clang).
tool kube kube "$K8S_VERSION" kube_recipe "$K8S_STAGING_VERSION" "$KUBE_COMPONENTS" -- "about 10 minutes"
tool cilium cilium "$CILIUM_VERSION" "cilium_recipe cilium_stamp cilium_files" "$CILIUM_GOBGP_REPLACE" \
  "$(command -v clang-19 || true)" "$(command -v llc-19 || true)" -- "about 8 minutes, 3 GB"
tool cilium118 cilium "$CILIUM118_VERSION" "cilium118_recipe cilium_stamp cilium_files" \
  "$(command -v clang-19 || true)" "$(command -v llc-19 || true)" -- "about 15 CPU-minutes, 3.5 GB"
tool controllers k8s-controllers "$KUEUE_VERSION" \
  "controllers_recipe wrapper_module buildlist semver_max align_wrappers module_dir controller_files" \
  "$ALIGN_EXCEPT" "$CONTROLLER_RUNTIME_V023" "$CONTROLLER_RUNTIME_V022" "${CONTROLLERS_V023[@]}" "${CONTROLLERS_V022[@]}" \
  -- "about 10 CPU-minutes"
tool prometheus prometheus-helm "$PROMETHEUS_VERSION" prometheus_recipe "$HELM_VERSION" "$PROMETHEUS_TAGS" -- "minutes"
tool alertmanager alertmanager "$ALERTMANAGER_VERSION" "alertmanager_recipe goinstall" -- "minutes"
tool staticcheck staticcheck "$STATICCHECK_VERSION" "staticcheck_recipe goinstall" -- "minutes"
tool actionlint actionlint "$ACTIONLINT_VERSION" "actionlint_recipe goinstall" -- "a minute"
tool cyclonedx cyclonedx-gomod "$CYCLONEDX_GOMOD_VERSION" "cyclonedx_recipe goinstall" -- "minutes"
tool crane crane "$CRANE_VERSION" "crane_recipe goinstall" -- "minutes"

# Then the Go builds, two at once. One cold go build keeps 2 cores busy
# only about three quarters of the time (module downloads, the
# single-threaded links of 100-200 MB binaries, one huge package compiling
# alone): a cold run took 55m53s wall for 85 CPU-minutes one build at a
# time. Two workers take the builds from one queue, the longest first, so
# that neither waits on a fixed half and the last build to run alone is a
# short one (the order is each build's cold CPU, longest first; the log's
# "built ... CPU" lines measure it). The go caches take concurrent builds;
# a worker's first failure ends it, and the script fails after both are
# done. schema is the dashboard schema check's npm install.
case $mode in
  linters) queue=(staticcheck actionlint) ;;
  *) queue=(kube cilium118 cilium controllers prometheus alertmanager staticcheck schema actionlint) ;;
esac
if [ "$mode" = release ]; then queue+=(cyclonedx crane); fi
qfile=$(mktemp) && echo 0 >"$qfile"
# next_build prints the next build in the queue (none when it is empty).
next_build() {
  local fd i
  exec {fd}>>"$qfile.lock"
  flock "$fd"
  i=$(<"$qfile")
  echo $((i + 1)) >"$qfile"
  exec {fd}>&-
  if [ "$i" -lt "${#queue[@]}" ]; then echo "${queue[$i]}"; fi
}
worker() {
  local b
  while b=$(next_build) && [ -n "$b" ]; do
    if [ "$b" = schema ]; then
      ZONEWATCH_TOOLS=$tools bash "$root/hack/schema-check/check.sh" --install >&2
    else
      ensure "$b"
    fi
  done
}
( set -e; worker ) & w1=$!
( set -e; worker ) & w2=$!
failed=
wait "$w1" || failed="$failed 1"
wait "$w2" || failed="$failed 2"
rm -f "$qfile" "$qfile.lock"
if [ -n "$failed" ]; then log "build worker(s)$failed failed (above)"; exit 1; fi

# One flat bin/ of links so tests and scripts need a single path.
mkdir -p "$bin"
link() { ln -sfn "$1" "$bin/$2"; } # target name
link "${dir[staticcheck]}/staticcheck" staticcheck
link "${dir[actionlint]}/actionlint" actionlint
if [ "$mode" != linters ]; then
  for b in kube-apiserver kube-scheduler kube-proxy kube-controller-manager; do link "${dir[kube]}/$b" "$b"; done
  link "$(command -v etcd)" etcd
  for b in prometheus promtool; do link "${dir[prometheus]}/$b" "$b"; done
  for b in alertmanager amtool; do link "${dir[alertmanager]}/$b" "$b"; done
  link "${dir[prometheus]}/helm" helm
  # The Cilium lab reads its folder (binaries, lib/bpf, llvm/) through this link.
  link "${dir[cilium]}" cilium
  link "${dir[cilium118]}" cilium-1.18
  # The controllers (Kueue, prometheus-operator, the training controllers)
  # and, for each but prometheus-operator, NAME.d: its CRDs and webhook
  # configuration (Kueue's also the training controllers' CRDs at the
  # versions it requires).
  link "${dir[controllers]}/prometheus-operator" prometheus-operator
  for b in kueue jobset lws trainer-controller-manager training-operator mpi-operator kuberay-operator; do
    link "${dir[controllers]}/$b" "$b"
    link "${dir[controllers]}/$b.d" "$b.d"
  done
fi
if [ "$mode" = release ]; then
  link "${dir[cyclonedx]}/cyclonedx-gomod" cyclonedx-gomod
  link "${dir[crane]}/crane" crane
fi
log "ready in $bin (tools cache $tools)"
echo "$bin"
exit
}
