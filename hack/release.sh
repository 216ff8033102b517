#!/usr/bin/env bash
# Release helpers behind the Makefile's release targets (docs/release.md).
#
#   hack/release.sh check-version VERSION   the chart's version and appVersion are VERSION and CHANGELOG.md has its entry
#   hack/release.sh notes VERSION           CHANGELOG.md's section of VERSION (the GitHub release text)
#   hack/release.sh checksums DIST          DIST/SHA256SUMS of what a release publishes
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
chart=$root/deploy/helm/zonewatch/Chart.yaml

field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *$/\1/p" "$chart"; }

case ${1:-} in
check-version)
  v=${2:?version}
  ok=1
  for f in version appVersion; do
    if [ "$(field "$f")" != "$v" ]; then
      echo "release: Chart.yaml $f is $(field "$f"), the tag says $v" >&2
      ok=0
    fi
  done
  if ! grep -q "^## \[$v\]" "$root/CHANGELOG.md"; then
    echo "release: CHANGELOG.md has no '## [$v]' section" >&2
    ok=0
  fi
  [ "$ok" = 1 ] && echo "release: $v: chart version, appVersion and CHANGELOG agree" >&2
  [ "$ok" = 1 ]
  ;;
notes)
  v=${2:?version}
  awk -v h="## [$v]" 'index($0, h) == 1 {on = 1; next} on && /^## \[/ {exit} on' "$root/CHANGELOG.md"
  ;;
checksums)
  dist=${2:?dist folder}
  cd "$dist"
  shopt -s nullglob
  files=(./*.tgz ./*.cdx.json image/*.tar image/digest)
  if [ ${#files[@]} -eq 0 ]; then
    echo "release: nothing to sum in $dist (make image sbom chart first)" >&2
    exit 1
  fi
  sha256sum "${files[@]#./}" >SHA256SUMS
  cat SHA256SUMS
  ;;
*)
  sed -n '2,7p' "$0" >&2
  exit 2
  ;;
esac
