#!/usr/bin/env bash
# Measures what concurrent long prompts cost a staged model's instance in memory, the figure
# docs/pipeline.md ("Limits") states: serves MODEL (default models/tiny/pipeline.yaml, whose bytes
# tokenizer makes a prompt of the text's bytes plus 2) on the CPU, one instance taking N requests
# at once (default 16), sends N concurrent requests whose input is CHARS letters (default 1020: a
# prompt of 1,022 tokens, two under lm.max_prompt_tokens' default 1,024), and prints the instance
# process's resident memory idle and at its peak (VmHWM, reset before the requests) while it
# answers them all. First it checks that CHARS+3 letters are refused as one prompt over the limit,
# so the input is one segment of that many tokens, not cut into smaller ones.
#
#   usage: scripts/prompt-memory.sh [MODEL] [N] [CHARS]      (after `make build`; ORT_LIB as serve reads it)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$(realpath "${1:-models/tiny/pipeline.yaml}")
n=${2:-16}
chars=${3:-1020}
bin=${VOXMUX:-bin/voxmux}
tmp=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

cat >"$tmp/voxmux.yaml" <<EOF
listen: 127.0.0.1:0
model: $model
provider: cpu
max_input_chars: $((chars + 100))
groups:
  - name: cpu
    gpus: []
    instances: 1
    max_inflight: $n
EOF
"$bin" serve --config "$tmp/voxmux.yaml" --log-format text >"$tmp/serve.log" 2>&1 &
pid=$!
url=""
for _ in $(seq 600); do
  url=$(sed -n 's|.*msg=ready .*\(http://127\.0\.0\.1:[0-9]*\)/.*|\1|p' "$tmp/serve.log" | head -n1)
  [ -z "$url" ] || break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/serve.log" >&2; exit 1; }
  sleep 0.2
done
[ -n "$url" ] || { cat "$tmp/serve.log" >&2; echo "prompt-memory: serve did not become ready" >&2; exit 1; }
inst=$(cat /proc/"$pid"/task/*/children | tr ' ' '\n' | grep . | head -n1)
[ -n "$inst" ] || { echo "prompt-memory: the router has no instance process" >&2; exit 1; }

text() { head -c "$1" /dev/zero | tr '\0' a; }
over=$(curl -s "$url/v1/audio/speech" -d "{\"input\":\"$(text $((chars + 3)))\",\"response_format\":\"pcm\"}")
if ! grep -q "makes $((chars + 5)) prompt tokens" <<<"$over"; then
  echo "prompt-memory: $((chars + 3)) letters were not refused as one prompt of $((chars + 5)) tokens: $over" >&2
  exit 1
fi

rate=$(sed -n 's/^sample_rate: *\([0-9]*\).*/\1/p' "$model")
kb() { sed -n "s/^$1:[[:space:]]*\([0-9]*\) kB/\1/p" "/proc/$inst/status"; }
idle=$(kb VmRSS)
echo 5 >"/proc/$inst/clear_refs" # VmHWM from here on
printf '{"input":"%s","response_format":"pcm"}' "$(text "$chars")" >"$tmp/body.json"
start=$SECONDS
curls=()
for i in $(seq "$n"); do
  curl -s -o /dev/null -w '%{http_code} %{size_download}\n' "$url/v1/audio/speech" -d @"$tmp/body.json" >"$tmp/r$i" &
  curls+=($!)
done
wait "${curls[@]}"
peak=$(kb VmHWM)
bad=$(cat "$tmp"/r* | grep -vc '^200 ' || true)
[ "$bad" = 0 ] || { cat "$tmp"/r* >&2; echo "prompt-memory: $bad of $n requests failed" >&2; exit 1; }
echo "prompt-memory: $n concurrent prompts of $((chars + 2)) tokens to $model on the CPU, answered in $((SECONDS - start)) s:"
echo "  instance resident memory idle $((idle / 1024)) MiB, peak $((peak / 1024)) MiB (VmHWM); $(awk -v r="$rate" '{ s += $2 } END { printf "%.0f", s / NR / 2 / r }' "$tmp"/r*) s of audio each"
