#!/usr/bin/env bash
# Runs voxmux's GPU checks on a GPU host and prints what they saw (used for the issues' "Verified
# on a GPU" notes). Needs: bin/voxmux (or $VOXMUX), ONNX Runtime with the CUDA provider in $ORT_DIR,
# CUDA 13 and cuDNN 9 on LD_LIBRARY_PATH. Logs go to $LOGS (default /tmp/voxmux-verify).
#
#   usage: scripts/verify-gpu.sh tiny|groups|gpus ...
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${VOXMUX:-$repo/bin/voxmux}
ort=${ORT_DIR:-$repo/third_party/onnxruntime}
logs=${LOGS:-/tmp/voxmux-verify}
mkdir -p "$logs"

wait_ready() { # url seconds
  for _ in $(seq 1 $(($2 * 10))); do curl -sf "$1/readyz" >/dev/null && return 0; sleep 0.1; done
  return 1
}

tiny() {
  echo "== tiny pipeline on the CUDA execution provider (GPU 0)"
  cat > "$logs/tiny.yaml" <<YAML
listen: 127.0.0.1:18080
model: $repo/models/tiny/pipeline.yaml
provider: cuda
onnxruntime: $ort/libonnxruntime.so
groups:
  - {name: g0, gpus: [0]}
YAML
  "$bin" serve --config "$logs/tiny.yaml" > "$logs/tiny.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18080 120 || { echo "not ready"; tail -20 "$logs/tiny.log"; kill $pid; return 1; }
  grep -o '"msg":"instance ready"[^}]*' "$logs/tiny.log" | head -2
  curl -s 127.0.0.1:18080/v1/audio/speech -d '{"model":"tiny","input":"Hello world.","voice":"default","response_format":"wav"}' -o "$logs/out.wav" -w 'HTTP %{http_code}, %{size_download} bytes, first byte after %{time_starttransfer}s\n'
  python3 -c "import wave,sys; w=wave.open(sys.argv[1]); print('WAV', w.getframerate(), 'Hz,', w.getnchannels(), 'channel,', len(w.readframes(10**9))//2/w.getframerate(), 's')" "$logs/out.wav"
  grep -c '"provider":"cuda"' "$logs/tiny.log" | sed 's/^/log lines naming provider cuda: /'
  kill -TERM $pid; wait $pid; echo "serve exit status after SIGTERM: $?"

  echo "== the same config with a library folder that lacks the CUDA provider"
  mkdir -p "$logs/ort-cpu" && cp "$ort/libonnxruntime.so" "$logs/ort-cpu/"
  sed "s#onnxruntime: .*#onnxruntime: $logs/ort-cpu/libonnxruntime.so#" "$logs/tiny.yaml" > "$logs/nocuda.yaml"
  timeout 120 "$bin" serve --config "$logs/nocuda.yaml" > "$logs/nocuda.log" 2>&1
  echo "serve exit status: $?"
  tail -1 "$logs/nocuda.log" | cut -c1-400
}

groups() {
  echo "== two groups of two GPUs each, CUDA provider"
  nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader
  cat > "$logs/groups.yaml" <<YAML
listen: 127.0.0.1:18081
model: $repo/models/tiny/pipeline.yaml
provider: cuda
onnxruntime: $ort/libonnxruntime.so
admin: {listen: 127.0.0.1:19091, token: verify}
groups:
  - {name: g0, gpus: [0, 1], gpu_memory_limit: "0.2"}
  - {name: g1, gpus: [2, 3], gpu_memory_limit: 4GiB, arena_extend_strategy: kSameAsRequested}
YAML
  CUDA_VISIBLE_DEVICES=3 "$bin" serve --config "$logs/groups.yaml" > "$logs/groups.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18081 180 || { echo "not ready"; tail -20 "$logs/groups.log"; kill $pid; return 1; }
  sleep 1
  echo "(serve itself was started with CUDA_VISIBLE_DEVICES=3)"
  "$bin" ctl --admin 127.0.0.1:19091 --token verify groups
  for i in $(seq 1 24); do
    curl -s -D - -o /dev/null 127.0.0.1:18081/v1/audio/speech -d '{"input":"Both groups serve traffic.","response_format":"pcm"}' &
  done 2>/dev/null | grep -i '^x-voxmux-instance' | sort | uniq -c
  kill -TERM $pid; wait $pid; echo "serve exit status after SIGTERM: $?"
}

gpus() {
  echo "== voxmux gpus"
  "$bin" gpus
  "$bin" gpus --json > "$logs/gpus.json"; echo "(json: $(wc -c < "$logs/gpus.json") bytes)"
}

for step in "$@"; do "$step"; done
