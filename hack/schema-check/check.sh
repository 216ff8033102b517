#!/usr/bin/env bash
# Type-checks generated Grafana dashboards against the npm package
# @grafana/schema with TypeScript (tsc --noEmit).
#
#   hack/schema-check/check.sh [dashboard.json...]   (default: dashboards/json/*.json)
#   hack/schema-check/check.sh --install              (only fill the cache)
#
# The pinned packages (package.json + package-lock.json here) are installed
# with `npm ci` into the tools cache hack/tools.sh uses ($ZONEWATCH_TOOLS,
# else $XDG_CACHE_HOME/zonewatch/tools, else ~/.cache/zonewatch/tools),
# in npm-schema-<schema>-ts<typescript>-<hash>/, the hash covering both
# files, the install step and node's version: a changed lock file installs
# into a new folder. The folder is used only when complete (.done, written
# last, then renamed into place); two runs at once install it once (flock
# on <folder>.lock). A warm run installs nothing and needs no network.
#
# Each dashboard becomes a .ts file that assigns its JSON, as an object
# literal, to the type in dashboard-types.ts (read it for the one
# allow-listed field group). Errors are reported against the JSON file and
# line.
#
# Exit status: 0 all match, 1 a dashboard does not match, 2 bad arguments,
# 3 cannot run (no node/npm, or the packages cannot be installed).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tools=${ZONEWATCH_TOOLS:-${XDG_CACHE_HOME:-${HOME:?set HOME or ZONEWATCH_TOOLS}/.cache}/zonewatch/tools}

for bin in node npm; do
  command -v "$bin" >/dev/null 2>&1 || { echo "schema-check: $bin not found" >&2; exit 3; }
done

version() { # package name -> pinned version from package.json
  node -e 'const p=require(process.argv[1]); process.stdout.write(p.dependencies[process.argv[2]])' "$here/package.json" "$1"
}
schema_version=$(version @grafana/schema)
ts_version=$(version typescript)
# The install step, part of the folder's key.
npm_install() { # folder
  cp "$here/package.json" "$here/package-lock.json" "$1/"
  (cd "$1" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
}
key=$({ cat "$here/package.json" "$here/package-lock.json"; declare -f npm_install; node --version; } | sha256sum)
mkdir -p "$tools"
cache=$tools/npm-schema-$schema_version-ts$ts_version-${key:0:12}

if [ ! -f "$cache/.done" ]; then
  exec {lock}>"$cache.lock"
  if ! flock -n "$lock"; then
    echo "schema-check: waiting for another run to finish $cache" >&2
    flock "$lock"
  fi
  if [ ! -f "$cache/.done" ]; then
    echo "schema-check: installing @grafana/schema@$schema_version typescript@$ts_version into $cache" >&2
    rm -rf "$cache.tmp" "$cache"
    mkdir -p "$cache.tmp"
    if ! npm_install "$cache.tmp"; then
      echo "schema-check: cannot install the pinned packages (npm ci failed; no registry access?)" >&2
      rm -rf "$cache.tmp"
      exit 3
    fi
    touch "$cache.tmp/.done"
    mv "$cache.tmp" "$cache"
  fi
  exec {lock}>&-
fi

if [ "${1:-}" = --install ]; then
  echo "$cache"
  exit 0
fi
if [ $# -eq 0 ]; then
  set -- "$root"/dashboards/json/*.json
fi

# A fresh work folder next to node_modules, so imports resolve from there.
work=$(mktemp -d "$cache/work.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$here/dashboard-types.ts" "$here/tsconfig.json" "$work/"

declare -A source
for f in "$@"; do
  [ -f "$f" ] || { echo "schema-check: no such file: $f" >&2; exit 2; }
  stem=$(basename "$f" .json)
  if [ -n "${source[$stem]:-}" ]; then
    echo "schema-check: $f and ${source[$stem]} share the name $stem" >&2
    exit 2
  fi
  # Line 1 is the header, so JSON line N is TypeScript line N+1.
  {
    printf "import type { ZonewatchDashboard } from './dashboard-types'; export const dashboard: ZonewatchDashboard = "
    cat "$f"
  } >"$work/$stem.ts"
  source[$stem]=$f
done

set +e
out=$(cd "$work" && node "$cache/node_modules/typescript/bin/tsc" -p tsconfig.json --pretty false 2>&1)
rc=$?
set -e

# Map "work/x.ts(L,C): error ..." back to "dashboards/json/x.json:L-1:C: error ...".
while IFS= read -r line; do
  [ -n "$line" ] || continue
  if [[ $line =~ ^([A-Za-z0-9._-]+)\.ts\(([0-9]+),([0-9]+)\):\ (.*)$ ]] && [ -n "${source[${BASH_REMATCH[1]}]:-}" ]; then
    rel=${source[${BASH_REMATCH[1]}]#"$root"/}
    echo "$rel:$((BASH_REMATCH[2] - 1)):${BASH_REMATCH[3]}: ${BASH_REMATCH[4]}"
  else
    echo "$line"
  fi
done <<<"$out"

if [ $rc -ne 0 ]; then
  echo "schema-check: FAIL (@grafana/schema $schema_version, typescript $ts_version)" >&2
  exit 1
fi
echo "schema-check: ok: $# dashboards match @grafana/schema $schema_version (typescript $ts_version)"
