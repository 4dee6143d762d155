#!/usr/bin/env bash
# Benchmarks a Piper voice served by voxmux with batching (the default), the same server with
# batching off (piper_batch: 1, up to 64 sentences' runs at once), and Piper's own executable run
# one process per request on the same machine's CPUs (scripts/piper/process_server.py), with
# `voxmux bench` over the same corpus. Reports go to OUT/batched-vs-off and OUT/piper-process.
#
#   usage: scripts/piper/bench.sh OUT VOXMUX VOICE.onnx PIPER_EXE [PROVIDER [LEVELS [PIPER_LEVELS [SECONDS]]]]
#
# PROVIDER is cuda (default) or cpu; LEVELS the voxmux sweep (default 1,4,16,64,256), PIPER_LEVELS
# Piper's (default 1,4,16); SECONDS per level (default 7). ORT_LIB names ONNX Runtime;
# ESPEAK_DATA an espeak-ng-data folder when it is not in a system folder.
set -euo pipefail
out=$1 vox=$2 voice=$3 piper=$4
provider=${5:-cuda} levels=${6:-1,4,16,64,256} plevels=${7:-1,4,16} secs=${8:-7}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
mkdir -p "$out"
name=$(basename "$voice" .onnx)
cp "$voice" "$voice.json" "$work/"
{
  echo "kind: piper"
  echo "name: $name"
  echo "voices: [$name.onnx]"
  [ -n "${ESPEAK_DATA:-}" ] && echo "espeak_data: $ESPEAK_DATA"
} >"$work/voices.yaml"
gpus="[]"
[ "$provider" = cuda ] && gpus="[0]"
config() { # PORT [PROVIDER_OPTIONS]
  cat <<EOF
listen: 127.0.0.1:$1
model: $work/voices.yaml
provider: $provider
onnxruntime: $ORT_LIB
max_input_chars: 4096
request_timeout: 10m
queue: {size: 1024, timeout: 5m}
groups:
  - name: g0
    gpus: $gpus
    instances: 1
    max_inflight: 256
${2:+    engine: $2}
EOF
}
config 8080 >"$work/batched.yaml"
config 8081 "{piper_batch: 1, piper_workers: 64}" >"$work/off.yaml"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
"$vox" serve --config "$work/batched.yaml" >"$out/serve-batched.log" 2>&1 & pids+=($!)
"$vox" serve --config "$work/off.yaml" >"$out/serve-off.log" 2>&1 & pids+=($!)
PYTHONPATH="$repo" python3 -m scripts.piper.process_server --piper "$piper" --voice "$work/$name.onnx" --port 8082 >"$out/piper-server.log" 2>&1 & pids+=($!)
for port in 8080 8081 8082; do
  for _ in $(seq 300); do
    curl -sf "127.0.0.1:$port/readyz" >/dev/null && break
    sleep 0.2
  done
  curl -sf "127.0.0.1:$port/readyz" >/dev/null || { echo "server on $port did not start"; tail -20 "$out"/*.log; exit 1; }
done
label="$name on $provider"
"$vox" bench --url http://127.0.0.1:8080 --name batched --compare http://127.0.0.1:8081 --compare-name batching-off \
  --concurrency "$levels" --duration-per-level "${secs}s" --format wav --quiet --label "$label: batched vs batching off" \
  --out "$out/batched-vs-off" >/dev/null
"$vox" bench --url http://127.0.0.1:8082 --name piper-process --gpu-metrics http://127.0.0.1:8080 \
  --concurrency "$plevels" --duration-per-level "${secs}s" --format wav --quiet --label "$name: Piper's executable, one process per request, on the CPUs" \
  --out "$out/piper-process" >/dev/null
