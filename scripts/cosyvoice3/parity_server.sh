#!/usr/bin/env bash
# The end-to-end half of the CosyVoice3 parity check: after scripts/cosyvoice3/parity.py has written
# WORK/out (the export) and WORK/e2e (the reference's greedy tokens and waveform for one request),
# serves the export with voxmux and compares the audio of that request with the reference's.
#
#   usage: scripts/cosyvoice3/parity_server.sh WORK PROVIDER [REPORT_DIR]     (PROVIDER: cpu | cuda)
#
# The manifest is the export's with greedy decoding (no lm.sampling), exactly 20 speech tokens per
# text token (the reference's maximum; end of speech banned before it, as the reference run was),
# and one chunk for the whole utterance, so the flow and the vocoder see what the reference's
# non-streaming token2wav saw. A second server keeps the export's streaming chunks, to measure
# what chunking changes. Needs bin/voxmux (or $VOXMUX), $ORT_DIR with the CUDA provider for cuda,
# and python3 with numpy.
set -euo pipefail
work=${1:?usage: scripts/cosyvoice3/parity_server.sh WORK cpu|cuda [REPORT_DIR]}
provider=${2:?provider}
report=${3:-$work}
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${VOXMUX:-$repo/bin/voxmux}
ort=${ORT_DIR:-$repo/third_party/onnxruntime}
mkdir -p "$report"

serve_once() { # name manifest port -> writes $work/e2e/$name.pcm
  local name=$1 manifest=$2 port=$3 gpus="[]"
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
    engine: {flow_cuda_graph: "off", lm_cuda_graph: "off", vocoder_batches: []}
YAML
  "$bin" serve --config "$work/$name.yaml" > "$work/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 3000); do
    curl -sf "127.0.0.1:$port/readyz" >/dev/null && break
    kill -0 $pid 2>/dev/null || { tail -20 "$work/$name.log"; return 1; }
    sleep 0.1
  done
  curl -sf "127.0.0.1:$port/v1/audio/speech" -d @"$work/e2e/request.json" -o "$work/e2e/$name.pcm" \
    -w "$name: HTTP %{http_code}, %{size_download} bytes in %{time_total}s\n"
  kill -TERM $pid
  wait $pid || true
}

out=$work/out
sed -e '/^  sampling:/d' -e 's/^  min_tokens_per_text_token: .*/  min_tokens_per_text_token: 20/' \
  -e 's/^  chunk_tokens: .*/  chunk_tokens: [4000]/' "$out/pipeline.yaml" > "$out/parity-whole.yaml"
sed -e '/^  sampling:/d' -e 's/^  min_tokens_per_text_token: .*/  min_tokens_per_text_token: 20/' \
  "$out/pipeline.yaml" > "$out/parity-chunked.yaml"
serve_once "whole-$provider" "$out/parity-whole.yaml" 18311
serve_once "chunked-$provider" "$out/parity-chunked.yaml" 18312

python3 - "$work" "$provider" "$report" <<'PY'
import json, sys
import numpy as np
work, provider, report = sys.argv[1:4]
ref = np.fromfile(f"{work}/e2e/reference_audio.f32", "<f4")
res = {"provider": provider, "reference_samples": int(ref.size),
       "note": "voxmux answers 16-bit PCM: a difference of 1/32768 (3.1e-5) is one quantization step"}
for name in ("whole", "chunked"):
    got = np.fromfile(f"{work}/e2e/{name}-{provider}.pcm", "<i2").astype(np.float64) / 32768.0
    n = min(got.size, ref.size)
    d = got[:n] - ref[:n]
    res[name] = {"samples": int(got.size), "max_abs_diff": float(np.abs(d).max()),
                 "snr_db": float(10 * np.log10((ref[:n] ** 2).sum() / max((d ** 2).sum(), 1e-30)))}
print(json.dumps(res, indent=2))
json.dump(res, open(f"{report}/server-{provider}.json", "w"), indent=2)
PY
