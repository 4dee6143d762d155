# shellcheck shell=bash
# shellcheck disable=SC2154  # work and provider are the caller's
# Sourced by parity_server.sh and parity_stream_server.sh: serves one manifest with voxmux, sends
# one request and stops the server. The callers set work and provider (cpu | cuda); repo, bin
# (voxmux: $VOXMUX or bin/voxmux) and ort (ONNX Runtime's folder: $ORT_DIR or
# third_party/onnxruntime) are set here. The engine runs without CUDA graphs and with one vocoder
# session of any shape, so that every run computes what the reference computes, in its own shape.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${VOXMUX:-$repo/bin/voxmux}
ort=${ORT_DIR:-$repo/third_party/onnxruntime}

# serve_once NAME MANIFEST PORT REQUEST OUT [ENGINE_KEYS]
# ENGINE_KEYS: more engine options, as YAML flow-mapping entries ("flow_chunk_emit: cosyvoice").
serve_once() {
  local name=$1 manifest=$2 port=$3 request=$4 out=$5 extra=${6:-} gpus="[]"
  [ "$provider" = cuda ] && gpus="[0]"
  cat > "$work/$name.yaml" <<YAML
listen: 127.0.0.1:$port
model: $manifest
provider: $provider
onnxruntime: $ort/libonnxruntime.so
request_timeout: 10m
groups:
  - name: g
    gpus: $gpus
    engine: {flow_cuda_graph: "off", lm_cuda_graph: "off", vocoder_batches: []${extra:+, $extra}}
YAML
  "$bin" serve --config "$work/$name.yaml" > "$work/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 3000); do
    curl -sf "127.0.0.1:$port/readyz" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || { tail -20 "$work/$name.log"; return 1; }
    sleep 0.1
  done
  local rc=0
  curl -sfN "127.0.0.1:$port/v1/audio/speech" -H 'Content-Type: application/json' -d @"$request" -o "$out" \
    -w "$name: HTTP %{http_code}, %{size_download} bytes in %{time_total}s\n" || rc=$?
  kill -TERM "$pid"
  wait "$pid" || true
  [ "$rc" = 0 ] || { echo "$name: the request failed (curl exit $rc); $work/$name.log:"; tail -20 "$work/$name.log"; }
  return "$rc"
}

# server_parity ARGS...: the numpy side (scripts/cosyvoice3/server_parity.py). It runs as a file,
# not as a module of the scripts package, whose import asks for torch and onnx too: the host that
# serves needs only numpy.
server_parity() {
  "${PYTHON:-python3}" "$repo/scripts/cosyvoice3/server_parity.py" "$@"
}
