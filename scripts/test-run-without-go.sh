#!/usr/bin/env bash
# `make run` on a machine without Go, as `make test` checks it: with every `go` command taken off
# PATH, `make run` must build voxmux with the toolchain scripts/install-go.sh installs into
# third_party/go (from the Go module proxy; kept there, so a later run downloads nothing), fetch the
# voice with it, and serve configs/cpu.yaml's voice, which must answer a speech request with a WAV.
# It listens on a free port (SERVE_FLAGS) rather than 8080, and stops the server afterwards. Where
# a go is on PATH it is hidden from this check only. Needs curl and setsid.
set -euo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
tmp=$(mktemp -d)
pgid=""
cleanup() {
  if [ -n "$pgid" ]; then
    kill -TERM -- "-$pgid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 -- "-$pgid" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL -- "-$pgid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# PATH without go: a folder that holds one is replaced by a folder of links to all else it holds
# (Debian's golang-go puts go in /usr/bin beside everything else).
nogo=""
i=0
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  [ -n "$d" ] && [ -d "$d" ] || continue
  if [ -e "$d/go" ] || [ -L "$d/go" ]; then
    i=$((i + 1))
    s=$tmp/path$i
    mkdir "$s"
    for f in "$d"/* "$d"/.[!.]*; do
      [ -e "$f" ] || [ -L "$f" ] || continue
      [ "${f##*/}" = go ] || ln -s "$f" "$s/"
    done
    d=$s
  fi
  nogo=${nogo:+$nogo:}$d
done
if PATH=$nogo command -v go >/dev/null; then
  echo "test-run-without-go: go is still on PATH: $(PATH=$nogo command -v go)" >&2
  exit 1
fi

# What a fresh shell has: no GO for the Makefile, nothing from the make that runs this script,
# no GOROOT or GOTOOLCHAIN pointing at another Go.
log=$tmp/run.log
setsid env -u GO -u GOROOT -u GOTOOLCHAIN -u MAKEFLAGS -u MFLAGS -u MAKELEVEL PATH="$nogo" \
  "$make" --no-print-directory run SERVE_FLAGS="--listen 127.0.0.1:0 --log-format text" >"$log" 2>&1 &
pgid=$!
url=""
for _ in $(seq 1800); do # the toolchain's download and the build come first
  url=$(sed -n 's|.*msg=ready .*\(http://127\.0\.0\.1:[0-9]*\)/.*|\1|p' "$log" | head -n1)
  [ -z "$url" ] || break
  if ! kill -0 "$pgid" 2>/dev/null; then
    cat "$log" >&2
    echo "test-run-without-go: make run exited before serving" >&2
    exit 1
  fi
  sleep 0.5
done
if [ -z "$url" ]; then
  cat "$log" >&2
  echo "test-run-without-go: make run did not serve within 15 minutes" >&2
  exit 1
fi
if ! grep -q "third_party/go/bin/go build" "$log"; then
  cat "$log" >&2
  echo "test-run-without-go: make did not build with third_party/go/bin/go" >&2
  exit 1
fi
# Go's own tree under third_party/go is not part of voxmux's module (its go.mod files are there).
if ! pkgs=$(env -u GOROOT third_party/go/bin/go list ./... 2>&1) || grep -q /third_party/ <<<"$pkgs"; then
  tail -n 5 <<<"$pkgs" >&2
  echo "test-run-without-go: go list ./... takes third_party/go for part of voxmux" >&2
  exit 1
fi
code=$(curl -s -o "$tmp/out.wav" -w '%{http_code}' "$url/v1/audio/speech" \
  -d '{"model":"en_GB-jenny_dioco-medium","input":"Hello world.","response_format":"wav","stream":false}')
if [ "$code" != 200 ] || [ "$(head -c 4 "$tmp/out.wav")" != RIFF ] || [ "$(stat -c %s "$tmp/out.wav")" -le 10000 ]; then
  cat "$log" >&2
  echo "test-run-without-go: the speech request got HTTP $code, $(stat -c %s "$tmp/out.wav") bytes" >&2
  exit 1
fi
echo "test-run-without-go: make run built with third_party/go/bin/go and served $url: a $(stat -c %s "$tmp/out.wav")-byte WAV"
