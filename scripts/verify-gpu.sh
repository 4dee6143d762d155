#!/usr/bin/env bash
# Runs voxmux's GPU checks and the benchmarks of docs/benchmarks/ on a GPU host and prints what they
# saw. Needs: bin/voxmux (or $VOXMUX; `go build -tags noffmpeg` where the host lacks FFmpeg's
# libraries), ONNX Runtime with the CUDA provider in $ORT_DIR (scripts/ort-gpu-parts.sh),
# CUDA 13 and cuDNN 9 on LD_LIBRARY_PATH. Logs go to $LOGS (default /tmp/voxmux-verify).
#
#   usage: scripts/verify-gpu.sh tiny|groups|gpus|gputests|piperfirst|bench|cv3bench|clonebench|voxbench|voxgroups|voxgpu|voxcapture|voxparity|stages|together|sweep|compare|twogroups|ws|seed ...
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${VOXMUX:-$repo/bin/voxmux}
ort=${ORT_DIR:-$repo/third_party/onnxruntime}
logs=${LOGS:-/tmp/voxmux-verify}
mkdir -p "$logs"

wait_ready() { # url seconds [pid]: gives up early once the server (pid) has exited
  for _ in $(seq 1 $(($2 * 10))); do
    curl -sf "$1/readyz" >/dev/null && return 0
    [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && return 1
    sleep 0.1
  done
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
  wait_ready http://127.0.0.1:18080 120 $pid || { echo "not ready"; tail -20 "$logs/tiny.log"; kill $pid; return 1; }
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
  wait_ready http://127.0.0.1:18081 180 $pid || { echo "not ready"; tail -20 "$logs/groups.log"; kill $pid; return 1; }
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

# The engines' GPU tests from prebuilt test binaries (TESTBIN, default testbin/: staged.test,
# piper.test, voxcpm.test, each `go test -c -tags noffmpeg` where Go is), run from their packages'
# folders, with the tests' verdicts one a line and their logs in $LOGS/gputests-<pkg>.log.
# GPU_MANIFEST is the staged export (default models/tiny-cosyvoice3, float32, with flow.chunk_step:
# TestChunkFlowOnGPU; the other staged tests need an export with flow.step and lm.cache: shared,
# BIG's), VOX the VoxCPM export (voxcpm.test runs only where $VOX/pipeline.yaml exists).
# PROVIDER=cpu runs the tests' own logic on the CPU (no GPU needed). VOXMUX_GPU_WAVS=DIR (an
# absolute path) has piper's TestPiperFloat16OnGPU write jenny's float32 and float16 audio there,
# for scripts/piper-fp16-wer.sh DIR.
gputests() {
  local tb=${TESTBIN:-$repo/testbin} provider=${PROVIDER:-cuda} rc=0 pkg
  local manifest=${GPU_MANIFEST:-$repo/models/tiny-cosyvoice3/pipeline.yaml}
  for pkg in staged piper voxcpm; do
    [ -x "$tb/$pkg.test" ] || { echo "== $pkg: no $tb/$pkg.test, skipped"; continue; }
    local env=(ORT_LIB="$ort/libonnxruntime.so" VOXMUX_GPU_PROVIDER="$provider")
    local run=OnGPU
    case $pkg in
      staged)
        env+=(VOXMUX_GPU_MANIFEST="$manifest")
        [ -n "${GPU_MANIFEST:-}" ] || run=TestChunkFlowOnGPU ;; # the tiny export has no step graphs' LM cache
      piper) env+=(VOXMUX_GPU_PIPER=1) ;;
      voxcpm)
        [ -f "${VOX:-/tmp/vox}/pipeline.yaml" ] || { echo "== voxcpm: no ${VOX:-/tmp/vox}/pipeline.yaml, skipped"; continue; }
        env+=(VOXMUX_GPU_VOXCPM="${VOX:-/tmp/vox}/pipeline.yaml"); run=TestGPU ;;
    esac
    echo "== $pkg ($provider)"
    (cd "$repo/instance/$pkg" && env "${env[@]}" "$tb/$pkg.test" -test.run "${GPU_RUN:-$run}" -test.v -test.count=1) \
      > "$logs/gputests-$pkg.log" 2>&1 || rc=1
    grep -E '^(--- |ok|FAIL|PASS)' "$logs/gputests-$pkg.log" | grep -v '^PASS$'
    grep -E 'relative rms|within|per run|on the CPU provider|copy nodes|against the CPU|float16 .* rel rms|first chunk' "$logs/gputests-$pkg.log" | grep -v '  on the CPU provider: ' | sed 's/^ */   /'
  done
  [ $rc = 0 ] && echo "gputests: PASS" || echo "gputests: FAIL (logs in $logs/gputests-*.log)"
  return $rc
}

# Piper's first audio: the voice JENNY (default models/voices/en_GB-jenny_dioco-medium.onnx) on
# GPU 0, decoded in chunks (the default) and with piper_decode: sentences, side by side: N (24)
# requests one at a time (TTFB P50/P95), then a sweep at LEVELS (1,16,64,256) for throughput.
# Reports go to $LOGS/piperfirst/{ttfb,sweep}/bench.md. Targets: first audio P50 ≤ 40 ms at one
# stream, ≥ 1000× real time at 256 streams. PROVIDER=cpu serves on the CPU instead (a check of this
# step, not a measurement). PIPER_PRECISION=float16 serves the chunked side with piper_precision:
# float16 (the sentences side stays float32, which whole sentences need), its reports in
# $LOGS/piperfirst-float16. PIPER_FRONT=cpu serves the chunked side with piper_front: cpu (the
# front graph on ONNX Runtime's CPU provider, the decoder on the GPU; FRONT_THREADS=N sets the
# group's intra_op_num_threads, the front's threads), its reports in $LOGS/piperfirst-frontcpu
# ($LOGS/piperfirst-frontcpu-N with FRONT_THREADS; -float16-frontcpu with both). PIPER_FLOW=chunks
# (or front) sets the chunked side's piper_flow, its reports in $LOGS/piperfirst-flowchunks (with
# the others' suffixes before it); unset, the provider's default.
piperfirst() (
  provider=${PROVIDER:-cuda} precision=${PIPER_PRECISION:-float32} front=${PIPER_FRONT:-gpu} out=$logs/piperfirst
  [ "$precision" = float32 ] || out=$out-$precision
  [ "$front" = gpu ] || out=$out-front$front${FRONT_THREADS:+-$FRONT_THREADS}
  [ -z "${PIPER_FLOW:-}" ] || out=$out-flow$PIPER_FLOW
  engine="piper_precision: $precision, piper_front: $front${FRONT_THREADS:+, intra_op_num_threads: $FRONT_THREADS}${PIPER_FLOW:+, piper_flow: $PIPER_FLOW}"
  voice=${JENNY:-$repo/models/voices/en_GB-jenny_dioco-medium.onnx}
  name=$(basename "$voice" .onnx)
  rm -rf "$out" && mkdir -p "$out/voices" || exit 1
  cp "$voice" "$voice.json" "$out/voices/" || exit 1
  printf 'kind: piper\nname: %s\nvoices: [%s.onnx]\n' "$name" "$name" > "$out/voices/voices.yaml"
  gpus="[0]" device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [ "$provider" = cpu ] && gpus="[]" device="the CPU ($(nproc) cores)"
  cfg() { # port engine
    cat <<YAML
listen: 127.0.0.1:$1
model: $out/voices/voices.yaml
provider: $provider
onnxruntime: $ort/libonnxruntime.so
max_input_chars: 4096
request_timeout: 10m
queue: {size: 2048, timeout: 5m}
groups:
  - {name: g0, gpus: $gpus, instances: 1, max_inflight: 256, engine: $2}
YAML
  }
  cfg 8092 "{$engine}" > "$out/chunked.yaml"
  cfg 8093 "{piper_decode: sentences}" > "$out/sentences.yaml"
  pids=()
  trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null' EXIT
  "$bin" serve --config "$out/chunked.yaml" > "$out/serve-chunked.log" 2>&1 & pids+=($!)
  "$bin" serve --config "$out/sentences.yaml" > "$out/serve-sentences.log" 2>&1 & pids+=($!)
  wait_ready http://127.0.0.1:8092 300 "${pids[0]}" || { echo "chunked: not ready"; tail -20 "$out/serve-chunked.log"; exit 1; }
  wait_ready http://127.0.0.1:8093 300 "${pids[1]}" || { echo "sentences: not ready"; tail -20 "$out/serve-sentences.log"; exit 1; }
  label="$name on $device, provider $provider, chunked decoder in $precision, front on $front${FRONT_THREADS:+ with intra_op_num_threads $FRONT_THREADS}${PIPER_FLOW:+, flow in the $PIPER_FLOW}, voxmux $("$bin" version | cut -d' ' -f2)"
  "$bin" bench --url http://127.0.0.1:8092 --name chunked --compare http://127.0.0.1:8093 --compare-name sentences \
    --concurrency 1 --compare-concurrency 1 --requests-per-level "${N:-24}" --warmup 4 --format wav --quiet \
    --label "$label: first audio, one request at a time" --out "$out/ttfb" || exit 1
  "$bin" bench --url http://127.0.0.1:8092 --name chunked --compare http://127.0.0.1:8093 --compare-name sentences \
    --concurrency "${LEVELS:-1,16,64,256}" --compare-concurrency "${LEVELS:-1,16,64,256}" --duration-per-level "${DUR:-10s}" \
    --warmup 4 --format wav --quiet --label "$label: throughput" --out "$out/sweep" || exit 1
  echo "reports: $out/ttfb/bench.md, $out/sweep/bench.md (targets: chunked P50 first audio ≤ 40 ms at 1 stream, ≥ 1000× at 256)"
  cat "$out/ttfb/bench.md"
)

# The CosyVoice3-shaped model (scripts/staged/shaped_export.py wrote it to $BIG) on one GPU,
# swept by voxmux bench against the eager PyTorch baseline on the same GPU.
bigcfg() { # name listen groups...
  cat > "$logs/$1.yaml" <<YAML
listen: $2
model: ${BIG:-/tmp/big}/pipeline.yaml
provider: cuda
onnxruntime: $ort/libonnxruntime.so
request_timeout: 10m
queue: {size: 2048, timeout: 5m}
groups:
$3
YAML
}

bench() {
  bigcfg big 127.0.0.1:8080 "  - {name: gpu0, gpus: [0], max_inflight: 256${GROUP_EXTRA:-}}"
  "$bin" serve --config "$logs/big.yaml" > "$logs/big.log" 2>&1 &
  vpid=$!
  PYTHONPATH="$repo" python3 -m scripts.staged.shaped_baseline --model-dir "${BIG:-/tmp/big}" --port 8081 --workers 1 > "$logs/baseline.log" 2>&1 &
  bpid=$!
  wait_ready http://127.0.0.1:8080 300 $vpid || { echo "voxmux not ready"; tail -20 "$logs/big.log"; kill $vpid $bpid; return 1; }
  wait_ready http://127.0.0.1:8081 300 $bpid || { echo "baseline not ready"; tail -20 "$logs/baseline.log"; kill $vpid $bpid; return 1; }
  "$bin" bench --url http://127.0.0.1:8080 --compare http://127.0.0.1:8081 --compare-concurrency ${BASE_LEVELS:-1,4,8} \
    --concurrency ${LEVELS:-1,4,8,16,32,64,128,256} --duration-per-level ${DUR:-12s} --warmup 4 --format pcm --quiet \
    --label "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), CosyVoice3-shaped fp16, voxmux $("$bin" version | cut -d' ' -f2)" \
    --out "${BENCH_OUT:-$logs/bench}"
  kill -TERM $vpid $bpid; wait $vpid $bpid
}

# CosyVoice3 itself on GPU 0: voxmux serving the float16 export in $CV3 (scripts/cosyvoice3/export.py
# --dtype float16, with the voice $VOICE) and the eager baseline running the published model in
# $CV3_MODEL (scripts/cosyvoice3/baseline.py, float16, the export's voices), swept at the same LEVELS.
cv3bench() {
  local model=${CV3_MODEL:?set CV3_MODEL to the published CosyVoice3 model directory} cv3=${CV3:-/tmp/cv3}
  local voice=${VOICE:-bench} ratio length prompt engine
  # Request length (docs/cosyvoice3.md, "Benchmarks"): random weights end speech at the LM's
  # minimum, so both servers get MIN_RATIO speech tokens per text token, 9 by default (English
  # speech, 25 tokens a second at 12–15 characters a second); MIN_RATIO=model keeps the model's 2.
  ratio=${MIN_RATIO:-9}
  if [ "$ratio" = model ]; then
    length="the model's minimum, 2 speech tokens per text token"
    ratio=2
    engine=${ENGINE_EXTRA:+, engine: {$ENGINE_EXTRA}}
  else
    length="realistic, $ratio speech tokens per text token"
    engine=", engine: {lm_min_tokens_per_text_token: $ratio${ENGINE_EXTRA:+, $ENGINE_EXTRA}}"
  fi
  # The voice's prompt, as its speech tokens at the model's token rate.
  prompt=$(python3 - "$cv3" "$voice" <<'PY'
import re, sys
d, v = sys.argv[1], sys.argv[2]
rate = float(re.search(r"^  token_rate: *([0-9.]+)", open(d + "/pipeline.yaml").read(), re.M).group(1))
toks = re.search(r"^speech_tokens: *\[(.*)\]", open("%s/voices/%s/voice.yaml" % (d, v)).read(), re.M)
n = len([t for t in toks.group(1).split(",") if t.strip()]) if toks else 0
print("%.1f s, %d speech tokens" % (n / rate, n))
PY
) || { echo "cannot read voice $voice's prompt in $cv3"; return 1; }
  BIG=$cv3 bigcfg cv3 127.0.0.1:8084 "  - {name: gpu0, gpus: [0], max_inflight: 256${GROUP_EXTRA:-}$engine}"
  "$bin" serve --config "$logs/cv3.yaml" > "$logs/cv3.log" 2>&1 &
  local vpid=$!
  PYTHONPATH="$repo" python3 -m scripts.cosyvoice3.baseline --model-dir "$model" --voices "$cv3/voices" --port 8085 \
    --workers 1 --dtype float16 --min-tokens-per-text-token "$ratio" > "$logs/cv3-baseline.log" 2>&1 &
  local bpid=$!
  wait_ready http://127.0.0.1:8084 300 $vpid || { echo "voxmux not ready"; tail -20 "$logs/cv3.log"; kill $vpid $bpid; return 1; }
  wait_ready http://127.0.0.1:8085 300 $bpid || { echo "baseline not ready"; tail -20 "$logs/cv3-baseline.log"; kill $vpid $bpid; return 1; }
  "$bin" bench --url http://127.0.0.1:8084 --compare http://127.0.0.1:8085 --compare-concurrency ${BASE_LEVELS:-1,4,8} \
    --concurrency ${LEVELS:-1,4,8,16,32,64,128,256} \
    --duration-per-level ${DUR:-12s} --warmup 4 --format pcm --voice "$voice" --quiet \
    --request-length "$length" --voice-prompt "$prompt" \
    --label "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), CosyVoice3-0.5B fp16, voice $voice, voxmux $("$bin" version | cut -d' ' -f2)" \
    --out "${BENCH_OUT:-$logs/cv3bench}"
  engine_metrics http://127.0.0.1:8084 "${BENCH_OUT:-$logs/cv3bench}/engine-metrics.txt"
  kill -TERM $vpid $bpid; wait $vpid $bpid
}

# engine_metrics URL FILE: the router's prompt cache and flow key-value memory lines of /metrics
# (voxmux_engine_prompt_cache_*, voxmux_engine_flow_kv_*), written to FILE and printed.
engine_metrics() {
  # The router refreshes the engines' counters every 2 s: wait for the sweep's last.
  sleep 2.5
  curl -sf "$1/metrics" | grep -E '^voxmux_engine_(prompt_cache|flow_kv)_' > "$2" || echo "no engine metrics at $1/metrics" > "$2"
  echo "== engine metrics after the sweep ($2)"
  cat "$2"
}

# Voice cloning on CosyVoice3 (the export in $CV3, with its voice $VOICE): N library voices made
# from one CLIP_S-second clip through POST /v1/audio/voices, each timed, then the first-audio time
# (TTFB) of M short requests in the built-in voice and M in the first cloned one, alternating, one
# at a time (WARMUP of each first, not counted). Prints a markdown table and writes it to
# $LOGS/clonebench.md. PROVIDER=cpu serves on the CPU instead of GPU 0: with the tiny export
# (models/tiny-cosyvoice3) a check of this script, not a measurement.
clonebench() (
  cv3=${CV3:-/tmp/cv3} provider=${PROVIDER:-cuda} voice=${VOICE:-bench} n=${N:-5} m=${M:-20} warmup=${WARMUP:-2}
  port=8086 token=clonebench-admin-token
  url=http://127.0.0.1:$port out=$logs/clonebench
  text=${TEXT:-Good morning. The train to the city leaves at ten.}
  rm -rf "$out" && mkdir -p "$out" || exit 1
  if [ "$provider" = cpu ]; then
    group="  - {name: cpu, gpus: [], instances: 1, max_inflight: 4}"
    device="the CPU ($(nproc) cores)"
  else
    group="  - {name: gpu0, gpus: [0], max_inflight: 256${GROUP_EXTRA:-}}"
    device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  fi
  cat > "$out/clonebench.yaml" <<YAML
listen: 127.0.0.1:$port
model: $cv3/pipeline.yaml
provider: $provider
onnxruntime: $ort/libonnxruntime.so
request_timeout: 10m
queue: {size: 2048, timeout: 5m}
voices: {dir: $out/voices}
admin: {listen: 127.0.0.1:19096, token: $token}
groups:
$group
YAML
  # A voiced-like clip: 12 harmonics of a gliding 140 Hz pitch, a 4 Hz syllable envelope and a
  # little noise (as the engine's tests make theirs), 16-bit mono at 24 kHz.
  python3 - "$out/clip.wav" "${CLIP_S:-5}" <<'PY' || { echo "could not write the clip"; exit 1; }
import math, random, struct, sys, wave
rate, secs = 24000, float(sys.argv[2])
rnd, phase, frames = random.Random(1), 0.0, bytearray()
for i in range(int(secs * rate)):
    t = i / rate
    phase += 2 * math.pi * (140 + 30 * math.sin(2 * math.pi * 0.7 * t)) / rate
    v = sum(math.sin(h * phase) / h for h in range(1, 13))
    x = 0.25 * (0.55 + 0.45 * math.sin(2 * math.pi * 4 * t)) * v + 0.01 * rnd.gauss(0, 1)
    frames += struct.pack("<h", max(-32768, min(32767, round(x * 32767))))
with wave.open(sys.argv[1], "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(rate); w.writeframes(bytes(frames))
PY
  "$bin" serve --config "$out/clonebench.yaml" > "$out/serve.log" 2>&1 &
  pid=$!
  trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
  wait_ready "$url" "${READY_S:-600}" $pid || { echo "not ready"; tail -20 "$out/serve.log"; exit 1; }

  auth="Authorization: Bearer $token"
  for i in $(seq 1 "$n"); do
    curl -s -o "$out/voice-$i.json" -w '%{http_code} %{time_total}\n' -H "$auth" "$url/v1/audio/voices" \
      -F "name=clone$i" -F "file=@$out/clip.wav" -F "text=A synthetic voiced clip for timing voice creation." \
      -F "consent=Synthetic audio, no speaker." > "$out/create-$i.txt"
    read -r code secs < "$out/create-$i.txt"
    [ "$code" = 201 ] || { echo "creating clone$i: HTTP $code"; cat "$out/voice-$i.json"; echo; exit 1; }
    echo "$secs" >> "$out/create.txt"
  done

  # say VOICE SEED: prints the seconds to the first byte of a streamed answer.
  say() {
    local r code secs bytes
    r=$(curl -s -o /dev/null -w '%{http_code} %{time_starttransfer} %{size_download}' "$url/v1/audio/speech" \
      -d "{\"input\":\"$text\",\"voice\":\"$1\",\"response_format\":\"pcm\",\"seed\":$2}") || { echo "curl failed" >&2; return 1; }
    read -r code secs bytes <<< "$r"
    [ "$code" = 200 ] && [ "$bytes" -gt 0 ] || { echo "voice $1: HTTP $code, $bytes bytes" >&2; return 1; }
    echo "$secs"
  }
  for i in $(seq 1 "$warmup"); do
    say "$voice" "$i" >> "$out/warmup-builtin.txt" && say clone1 "$i" >> "$out/warmup-cloned.txt" || exit 1
  done
  for i in $(seq 1 "$m"); do
    say "$voice" "$i" >> "$out/ttfb-builtin.txt" && say clone1 "$i" >> "$out/ttfb-cloned.txt" || exit 1
  done

  python3 - "$out" "$cv3/voices/$voice/voice.yaml" "$voice" "$n" "$m" "$warmup" "$device" "$provider" "$("$bin" version | cut -d' ' -f2)" "${CLIP_S:-5}" <<'PY' | tee "$logs/clonebench.md"
import json, math, os, re, sys
out, yml, voice, n, m, warmup, device, provider, version, clip = sys.argv[1:]
def secs(name):
    p = os.path.join(out, name)
    return [float(l) for l in open(p)] if os.path.exists(p) else []
def pct(xs, p):  # nearest rank
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]
def row(what, xs):
    ms = [1000 * x for x in xs]
    return "| %s | %d | %.0f | %.0f |" % (what, len(ms), pct(ms, 50), pct(ms, 95))
try:
    bench_tokens = len(re.search(r"speech_tokens:\s*\[([^\]]*)\]", open(yml).read()).group(1).split(","))
except (OSError, AttributeError):
    bench_tokens = "?"
clone_tokens = json.load(open(os.path.join(out, "voice-1.json"))).get("tokens", "?")
print("Voice cloning on %s, provider %s, voxmux %s: %s library voices made from one %s s clip, then %s requests"
      " in each voice, alternating, one at a time, after %s warm-up requests each." % (device, provider, version, n, clip, m, warmup))
print("Prompts: built-in `%s` %s speech tokens, cloned `clone1` %s.\n" % (voice, bench_tokens, clone_tokens))
print("| what | n | P50 (ms) | P95 (ms) |")
print("|---|---:|---:|---:|")
print(row("voice creation (POST /v1/audio/voices, whole request)", secs("create.txt")))
print(row("TTFB, built-in voice `%s`" % voice, secs("ttfb-builtin.txt")))
print(row("TTFB, cloned voice `clone1` (cached)", secs("ttfb-cloned.txt")))
w = secs("warmup-cloned.txt")
if w:
    print("\nFirst request in the cloned voice (warm-up, not counted): %.0f ms; in the built-in: %.0f ms."
          % (1000 * w[0], 1000 * secs("warmup-builtin.txt")[0]))
PY
)

# VoxCPM 1.5 on GPU 0: voxmux serving the float16 export in $VOX (scripts/voxcpm/export.py --dtype
# float16 --device cuda) and the eager baseline (scripts/voxcpm/baseline.py: OpenBMB/VoxCPM's own
# generation loop from the reference copy $VOX_REF, default .ref) running the published-format
# directory $VOX_MODEL in BASE_DTYPE (default bfloat16, the model's own), swept by voxmux bench at
# LEVELS (voxmux) and BASE_LEVELS (baseline) in the voice VOICE (default: `default`, no prompt).
# Random weights' stop head ends rows at random, so both servers ignore it (IGNORE_STOP=1) and
# generate exactly min(CAP, int(text tokens * 6 + 10)) patches of 160 ms per request, CAP default
# 64 (10.24 s): the baseline through --max-patches/--ignore-stop, voxmux through a copy of the
# manifest, $VOX/pipeline-bench.yaml, with generation.max_len (and min_len) set to CAP. Responses
# are FORMAT (default wav: at the model's 44.1 kHz, which a build without FFmpeg serves; pcm is
# resampled to 24 kHz and needs FFmpeg). BASELINE=0 leaves the baseline out (voxmux alone).
# VARIANTS="A;B" serves and sweeps voxmux once per variant of group options (", engine: {lm_cuda_graph: off}"),
# against one baseline process; reports in BENCH_OUT-1, BENCH_OUT-2, ... (default $LOGS/voxbench-N).
# BASE_URL compares with a baseline already serving there (started as below) instead of starting one.
# voxmanifest: $VOX/pipeline-bench.yaml, the export's manifest with generation.max_len CAP (and
# min_len CAP unless IGNORE_STOP=0).
voxmanifest() {
  local vox=${VOX:-/tmp/vox} cap=${CAP:-64}
  local sedargs=(-e "s/^  max_len: .*/  max_len: $cap/")
  [ "${IGNORE_STOP:-1}" = 1 ] && sedargs+=(-e "s/^  min_len: .*/  min_len: $cap/")
  sed "${sedargs[@]}" "$vox/pipeline.yaml" > "$vox/pipeline-bench.yaml"
  grep -q "^  max_len: $cap\$" "$vox/pipeline-bench.yaml" || { echo "$vox/pipeline.yaml has no generation.max_len to set"; return 1; }
}

voxbench() {
  local model=${VOX_MODEL:?set VOX_MODEL to the published-format VoxCPM 1.5 directory} vox=${VOX:-/tmp/vox}
  local cap=${CAP:-64} stop=() manifest=${VOX:-/tmp/vox}/pipeline-bench.yaml
  voxmanifest || return 1
  [ "${IGNORE_STOP:-1}" = 1 ] && stop=(--ignore-stop)
  local voices=() bpid="" compare=()
  [ -d "$vox/voices" ] && voices=(--voices "$vox/voices")
  if [ -n "${BASE_URL:-}" ]; then
    # A baseline already serving (started as below, e.g. while the export runs).
    compare=(--compare "$BASE_URL" --compare-concurrency "${BASE_LEVELS:-1}")
  elif [ "${BASELINE:-1}" = 1 ]; then
    PYTHONPATH="$repo" python3 -m scripts.voxcpm.baseline --model-dir "$model" --reference "${VOX_REF:-$repo/.ref}" "${voices[@]}" \
      --port 8087 --workers 1 --dtype "${BASE_DTYPE:-bfloat16}" --max-patches "$cap" "${stop[@]}" > "$logs/vox-baseline.log" 2>&1 &
    bpid=$!
    compare=(--compare http://127.0.0.1:8087 --compare-concurrency "${BASE_LEVELS:-1}")
  fi
  # VARIANTS: group options, one variant per ";"-separated item (each ", key: value, ..."), every
  # one served and swept in turn against the same baseline process; default GROUP_EXTRA alone.
  # MAX_INFLIGHT (default 256) is the group's slots, and so its largest captured batch.
  local variants=() i=0 extra vpid
  IFS=';' read -ra variants <<< "${VARIANTS-${GROUP_EXTRA:-}}"
  [ ${#variants[@]} = 0 ] && variants=("")
  for extra in "${variants[@]}"; do
    i=$((i + 1))
    cat > "$logs/vox-$i.yaml" <<YAML
listen: 127.0.0.1:8086
model: $manifest
provider: cuda
onnxruntime: $ort/libonnxruntime.so
request_timeout: 10m
queue: {size: 2048, timeout: 5m}
groups:
  - {name: gpu0, gpus: [0], max_inflight: ${MAX_INFLIGHT:-256}$extra}
YAML
    echo "== variant $i: group options:${extra#,}"
    "$bin" serve --config "$logs/vox-$i.yaml" > "$logs/vox-$i.log" 2>&1 &
    vpid=$!
    wait_ready http://127.0.0.1:8086 600 $vpid || { echo "voxmux not ready"; tail -c 1500 "$logs/vox-$i.log"; kill $vpid; continue; }
    if [ -n "$bpid" ]; then
      # The baseline compiles with torch.compile before it is ready (minutes).
      wait_ready http://127.0.0.1:8087 900 $bpid || { echo "baseline not ready"; tail -20 "$logs/vox-baseline.log"; kill $vpid $bpid; return 1; }
      grep -h "worker warm" "$logs/vox-baseline.log"
    elif [ -n "${BASE_URL:-}" ]; then
      wait_ready "$BASE_URL" 900 || { echo "baseline at $BASE_URL not ready"; kill $vpid; return 1; }
    fi
    "$bin" bench --url http://127.0.0.1:8086 "${compare[@]}" \
      --concurrency ${LEVELS:-1,4,16,64,128,256} --duration-per-level ${DUR:-12s} --warmup 4 --format ${FORMAT:-wav} \
      --voice "${VOICE:-default}" --quiet \
      --label "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), VoxCPM 1.5 fp16 (baseline ${BASE_DTYPE:-bfloat16}), at most $cap patches, voice ${VOICE:-default}, voxmux $("$bin" version | cut -d' ' -f2)${extra:+, group options:${extra#,}}" \
      --out "${BENCH_OUT:-$logs/voxbench}-$i"
    kill -TERM $vpid; wait $vpid
  done
  [ -n "$bpid" ] && { kill -TERM $bpid; wait $bpid; }
  return 0
}

# VoxCPM 1.5 ($VOX, CAP patches as voxbench) as one group on GPU 0, then as two groups of one GPU
# each, swept by voxmux bench at LEVELS2 (default 128,256), with GROUP_EXTRA on every group.
voxgroups() {
  voxmanifest || return 1
  local g0="  - {name: gpu0, gpus: [0], max_inflight: 256${GROUP_EXTRA:-}}"
  local g1="  - {name: gpu1, gpus: [1], max_inflight: 256${GROUP_EXTRA:-}}"
  local name groups
  for name in one two; do
    groups=$g0
    [ $name = two ] && groups="$g0
$g1"
    cat > "$logs/vox-$name.yaml" <<YAML
listen: 127.0.0.1:8088
model: ${VOX:-/tmp/vox}/pipeline-bench.yaml
provider: cuda
onnxruntime: $ort/libonnxruntime.so
request_timeout: 10m
queue: {size: 2048, timeout: 5m}
groups:
$groups
YAML
    "$bin" serve --config "$logs/vox-$name.yaml" > "$logs/vox-$name.log" 2>&1 &
    local pid=$!
    wait_ready http://127.0.0.1:8088 600 $pid || { echo "not ready: $name"; tail -20 "$logs/vox-$name.log"; kill $pid; return 1; }
    "$bin" bench --url http://127.0.0.1:8088 --concurrency "${LEVELS2:-128,256}" --duration-per-level ${DUR:-12s} --warmup 4 \
      --format ${FORMAT:-wav} --quiet --label "VoxCPM 1.5 fp16, $name group(s) of one GPU, at most ${CAP:-64} patches, voxmux $("$bin" version | cut -d' ' -f2)" \
      --out "${BENCH_OUT:-$logs/voxgroups}-$name"
    kill -TERM $pid; wait $pid
  done
}

# The voxcpm engine's GPU test (instance/voxcpm/gpu_test.go) on the float16 export $VOX: plain
# steps against the step's CUDA graphs, alone and batched. Needs the test binary
# (go test -c -o bin/voxcpm.test ./instance/voxcpm/, built where Go is).
voxgpu() {
  ORT_LIB=$ort/libonnxruntime.so VOXMUX_GPU_VOXCPM=${VOX:-/tmp/vox}/pipeline.yaml \
    "${VOXCPM_TEST:-$repo/bin/voxcpm.test}" -test.run 'TestGPU' -test.v
}

# VoxCPM's CUDA graph captures in about a minute, without the full-size export: the tiny model
# (scripts/voxcpm/make_tiny.py) exported in float16 on GPU 0 into $LOGS/voxtiny16, then the
# engine's capture test on it (VOXCPM_TEST, default bin/voxcpm.test): the step captured alone,
# then the step and the decoder, each compared with plain runs at load (the log says "passed its
# check" or why it was refused, with any non-finite values on each side).
voxcapture() {
  local out=$logs/voxtiny16
  (cd "$repo" && python3 -m scripts.voxcpm.make_tiny "$out-published" > "$logs/voxcapture-export.log" 2>&1 &&
    python3 -m scripts.voxcpm.export "$out-published" "$out" --dtype float16 --device cuda --random-voice bench:3 \
      --no-check >> "$logs/voxcapture-export.log" 2>&1) || { tail -5 "$logs/voxcapture-export.log"; return 1; }
  (cd "$repo/instance/voxcpm" && ORT_LIB=$ort/libonnxruntime.so VOXMUX_GPU_VOXCPM=$out/pipeline.yaml \
    VOXMUX_GPU_SDPA="vocoder_cuda_graph=off;vocoder_cuda_graph=on" "${VOXCPM_TEST:-$repo/bin/voxcpm.test}" -test.run TestGPUStepCaptureKernels \
    -test.v -test.count=1) > "$logs/voxcapture.log" 2>&1
  local rc=$?
  grep -E '^(--- |ok|FAIL)|capture with' "$logs/voxcapture.log" | cut -c1-600
  return $rc
}

# VoxCPM 1.5's export against OpenBMB/VoxCPM's own code at the real sizes, random weights
# (scripts/voxcpm/parity.py; the reference copy $VOX_REF, default .ref; ONNX Runtime's Python
# package on the CPU, the reference on GPU 0). DTYPE (default float32) is the export's: float16
# exports on GPU 0 and measures its error against the reference's own in bfloat16 and float16.
# The report goes to $LOGS/voxparity.json ($LOGS/voxparity-float16.json for float16).
voxparity() {
  local dtype=${DTYPE:-float32} report=$logs/voxparity.json
  [ "$dtype" = float32 ] || report=$logs/voxparity-$dtype.json
  PYTHONPATH="$repo" python3 -m scripts.voxcpm.parity --reference "${VOX_REF:-$repo/.ref}" --work "${VOXPARITY_WORK:-$logs/voxparity}" \
    --full --device cuda --dtype "$dtype" --report "$report"
}

# Each stage of $BIG timed alone on GPU 0 (voxmux bench stages).
stages() {
  bigcfg stages 127.0.0.1:8071 "  - {name: gpu0, gpus: [0]${GROUP_EXTRA:-}}"
  "$bin" bench stages --config "$logs/stages.yaml" --batch ${BATCHES:-1,8,32,64} --tokens ${TOKENS:-15,115} \
    --runs ${RUNS:-5} ${VARY:+--vary} --json "${STAGES_JSON:-$logs/stages.json}" 2>"$logs/stages.err" ||
    { tail -3 "$logs/stages.err"; return 1; }
}

# Each stage of $BIG alone and then the three at once, in one process (bench stages --together);
# with PROFILE=prefix, ONNX Runtime profiles every session and the summary follows the timings.
together() {
  local extra=${GROUP_EXTRA:-}
  if [ -n "${PROFILE:-}" ]; then
    mkdir -p "$(dirname "$PROFILE")"
    extra="$extra, engine: {profile: $PROFILE}"
  fi
  bigcfg together 127.0.0.1:8072 "  - {name: gpu0, gpus: [0]$extra}"
  "$bin" bench stages --config "$logs/together.yaml" --batch ${BATCHES:-1,16} --tokens ${TOKENS:-15,115} \
    --runs ${RUNS:-5} --together --json "${STAGES_JSON:-$logs/together.json}" 2>"$logs/together.err" ||
    { tail -3 "$logs/together.err"; return 1; }
  if [ -n "${PROFILE:-}" ]; then PYTHONPATH="$repo" python3 -m scripts.common.ort_profile_summary "$PROFILE"; fi
}

# Serves $BIG with the given groups and sweeps it with voxmux bench (no baseline).
serve_bench() { # name port groups levels label out
  bigcfg "$1" "127.0.0.1:$2" "$3"
  "$bin" serve --config "$logs/$1.yaml" > "$logs/$1.log" 2>&1 &
  local pid=$!
  wait_ready "http://127.0.0.1:$2" 300 $pid || { echo "not ready"; tail -20 "$logs/$1.log"; kill $pid; return 1; }
  "$bin" bench --url "http://127.0.0.1:$2" --concurrency "$4" --duration-per-level ${DUR:-12s} --warmup 4 \
    --format pcm --quiet --label "$5" --out "$6"
  kill -TERM $pid; wait $pid
}

# voxmux alone on $BIG: to compare exports or chunk schedules in one session.
sweep() {
  local name=sweep-${SWEEP_NAME:-run}
  serve_bench "$name" 8070 "  - {name: gpu0, gpus: [0], max_inflight: 256${GROUP_EXTRA:-}}" \
    "${LEVELS:-1,64,256}" "${SWEEP_NAME:-run}: ${BIG:-/tmp/big}" "${BENCH_OUT:-$logs/$name}"
}

# The same request to each export in $MODELS (model folders), one server after the other: prints
# each one's audio difference from the first's (exports that should compute the same thing).
# With OPTIONS (engine option maps separated by ";", e.g. '{lm_cuda_graph: "off"};{lm_cuda_graph: "on"}'),
# each export is served once with each.
compare() {
  local first="" text='The quick brown fox jumps over the lazy dog, and then it runs far away into the forest.'
  local sets=() i
  IFS=';' read -r -a sets <<< "${OPTIONS:-{\}}"
  for m in ${MODELS:?set MODELS to one or more model folders}; do
   for i in "${!sets[@]}"; do
    local name; name=$(basename "$m")
    [ ${#sets[@]} -gt 1 ] && name=$name-$i
    BIG=$m bigcfg compare 127.0.0.1:8060 "  - {name: gpu0, gpus: [0], engine: ${sets[$i]}}"
    "$bin" serve --config "$logs/compare.yaml" > "$logs/compare-$name.log" 2>&1 &
    local pid=$!
    wait_ready http://127.0.0.1:8060 300 $pid || { echo "not ready: $m"; tail -20 "$logs/compare-$name.log"; kill $pid; return 1; }
    curl -s 127.0.0.1:8060/v1/audio/speech -d "{\"input\":\"$text\",\"response_format\":\"pcm\"}" -o "$logs/compare-$name.pcm"
    kill -TERM $pid; wait $pid
    if [ -z "$first" ]; then first=$name; continue; fi
    python3 - "$logs/compare-$first.pcm" "$logs/compare-$name.pcm" "$first" "$name" <<'PY'
import math, sys
from array import array
def pcm(path):
    a = array("h")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder == "big":
        a.byteswap()
    return [v / 32768 for v in a]
a, b = pcm(sys.argv[1]), pcm(sys.argv[2])
n = min(len(a), len(b))
d = [y - x for x, y in zip(a[:n], b[:n])]
ref = math.sqrt(sum(x * x for x in a[:n]) / max(n, 1)) or 1.0
print("%s against %s: %d and %d samples, largest difference %.4g, rms difference / rms signal %.3g"
      % (sys.argv[4], sys.argv[3], len(b), len(a), max(map(abs, d), default=0.0),
         math.sqrt(sum(v * v for v in d) / max(n, 1)) / ref))
PY
   done
  done
}

# One group against two groups (one GPU each) at saturation.
twogroups() {
  serve_bench two 8090 "  - {name: gpu0, gpus: [0], max_inflight: 256}
  - {name: gpu1, gpus: [1], max_inflight: 256}" "${LEVELS2:-256,512}" "two groups of one GPU" "${BENCH_OUT2:-$logs/bench-two}"
}

# Voice agents on $BIG over the WebSocket text-in API: voxmux bench --ws at LEVELS sessions, replies
# streamed as LLM tokens at 25 a second, the user barging in on 30% of the turns.
ws() {
  bigcfg ws 127.0.0.1:8075 "  - {name: gpu0, gpus: [0], max_inflight: 256}"
  "$bin" serve --config "$logs/ws.yaml" > "$logs/ws.log" 2>&1 &
  local pid=$!
  wait_ready http://127.0.0.1:8075 300 $pid || { echo "not ready"; tail -20 "$logs/ws.log"; kill $pid; return 1; }
  "$bin" bench --ws --url http://127.0.0.1:8075 --concurrency "${LEVELS:-1,16,64,256}" --duration-per-level "${DUR:-15s}" \
    --token-rate 25 --barge-in 0.3 --quiet --label "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), CosyVoice3-shaped fp16, voxmux $("$bin" version | cut -d' ' -f2)" \
    --out "${BENCH_OUT:-$logs/ws-bench}"
  kill -TERM $pid; wait $pid
}

# Seeds on the GPU (models/tiny/sampling.yaml: sampled speech tokens): the same request and seed
# twice on an idle server, then N requests each alone and all N at once, compared byte for byte
# (equal audio means equal speech tokens; unequal audio may still hold equal tokens).
seed() {
  cat > "$logs/seed.yaml" <<YAML
listen: 127.0.0.1:18082
model: $repo/models/tiny/sampling.yaml
provider: cuda
onnxruntime: $ort/libonnxruntime.so
groups:
  - {name: g0, gpus: [0], max_inflight: 64}
YAML
  "$bin" serve --config "$logs/seed.yaml" > "$logs/seed.log" 2>&1 &
  local pid=$! n=${N:-32} i same=0
  wait_ready http://127.0.0.1:18082 120 $pid || { echo "not ready"; tail -20 "$logs/seed.log"; kill $pid; return 1; }
  say() { curl -s 127.0.0.1:18082/v1/audio/speech -d "{\"input\":\"Request number $1 says a few words of its own.\",\"response_format\":\"pcm\",\"seed\":$((1000 + $1))}" -o "$2"; }
  say 0 "$logs/seed-a.pcm"; say 0 "$logs/seed-b.pcm"
  cmp -s "$logs/seed-a.pcm" "$logs/seed-b.pcm" && echo "same request and seed twice, idle: byte-identical ($(wc -c < "$logs/seed-a.pcm") bytes)" || echo "same request and seed twice, idle: DIFFERENT"
  for i in $(seq 1 "$n"); do say "$i" "$logs/alone-$i.pcm"; done
  local pids=()
  for i in $(seq 1 "$n"); do say "$i" "$logs/together-$i.pcm" & pids+=($!); done
  wait "${pids[@]}"
  for i in $(seq 1 "$n"); do cmp -s "$logs/alone-$i.pcm" "$logs/together-$i.pcm" && same=$((same + 1)); done
  echo "$n requests alone and all at once: $same of $n byte-identical"
  kill -TERM $pid; wait $pid
}

for step in "$@"; do "$step"; done
