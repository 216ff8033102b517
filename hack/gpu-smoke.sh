#!/usr/bin/env bash
# GPU smoke test for a real NVIDIA machine (no Kubernetes needed): builds
# the exporter with the NVML adapter, runs it on the simulated cluster but
# with --gpu.source=nvml reading this machine's GPUs, and prints what it
# exports. Without a kubelet the GPUs carry no job labels and the zone is
# "unknown" (this host is not a simulated node).
#
#   hack/gpu-smoke.sh            # port 19421, 3 reads 2 s apart
#   PORT=19500 READS=5 INTERVAL_S=5 hack/gpu-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PORT:-19421}
INTERVAL_S=${INTERVAL_S:-2}
READS=${READS:-3}
work=$(mktemp -d)
pid=
cleanup() {
	if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "== GPUs as nvidia-smi sees them"
if command -v nvidia-smi >/dev/null; then
	nvidia-smi --query-gpu=index,uuid,name,utilization.gpu,mig.mode.current --format=csv || true
	nvidia-smi -L || true
else
	echo "nvidia-smi not found (is the NVIDIA driver installed?)"
fi

echo "== building the exporter with -tags nvml"
# go-nvml's cgo prologue triggers deprecation warnings from nvml.h; they
# are not ours.
CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}" \
	go build -tags nvml -o "$work/zonewatch-exporter" ./cmd/exporter

echo "== running with --gpu.source=nvml for $READS reads every ${INTERVAL_S}s"
"$work/zonewatch-exporter" --simulate --gpu.source=nvml --gpu.interval="${INTERVAL_S}s" \
	--gpu.podresources-socket= --node-name="$(hostname)" \
	--no-hubble.enabled --web.listen-address="127.0.0.1:$PORT" --log.level=debug \
	>"$work/exporter.log" 2>&1 &
pid=$!

# GPM (SM and tensor activity) needs two samples: wait for a few reads.
sleep $((READS * INTERVAL_S + 2))
if ! kill -0 "$pid" 2>/dev/null; then
	echo "exporter exited:"; cat "$work/exporter.log"; exit 1
fi

echo "== exporter log (gpu)"
grep -iE 'gpu|nvml|source' "$work/exporter.log" || true

echo "== /metrics"
page=$(curl -fsS "http://127.0.0.1:$PORT/metrics")
grep -E '^zonewatch_gpu_|^zonewatch_source_up\{source="gpu"' <<<"$page" || { echo "no zonewatch_gpu series"; exit 1; }
grep -q '^zonewatch_source_up{source="gpu"} 1' <<<"$page" || { echo "GPU source is down"; exit 1; }
echo "== ok"
