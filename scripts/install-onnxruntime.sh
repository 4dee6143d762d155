#!/usr/bin/env bash
# Installs ONNX Runtime 1.29.0 (linux-x64) into a git-ignored folder from the npm registry,
# checking pinned sha256 sums. A no-op when the files are already there and match.
#
#   usage: scripts/install-onnxruntime.sh [--gpu] [DEST]     (DEST defaults to third_party/onnxruntime)
#   ORT_LIB=/path/libonnxruntime.so overrides the CPU library (nothing is downloaded for it).
#
# --gpu adds the CUDA execution provider (libonnxruntime_providers_cuda.so and
# libonnxruntime_providers_shared.so, the same ORT 1.29.0 build, linked against CUDA 13 / cuDNN 9).
set -euo pipefail

gpu=0
dest=""
for a in "$@"; do
  case "$a" in
    --gpu) gpu=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "install-onnxruntime: unknown flag $a" >&2; exit 2 ;;
    *) dest=$a ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${dest:-$root/third_party/onnxruntime}
mkdir -p "$dest"

CPU_PKG=onnxruntime-node@1.29.0
CPU_FILE=package/bin/napi-v6/linux/x64/libonnxruntime.so.1
CPU_SHA=89688f5cf51c7e31befbb7b9101bc027799009b18d1baa9a5b1146a72e69538d
GPU_PKG=com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9
CUDA_SHA=56cf3254b118ad837ccc4ed8f6d1b23504bbf7ef91b34cbc0b289cb7f10b3037
SHARED_SHA=c6a12593396095f5670160e284c35d1700b7708cf3037b7042e2a5200ccae772

ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

fetch() { # fetch PKG -> prints the tarball path in $work
  command -v npm >/dev/null || { echo "install-onnxruntime: npm is needed (apt-get install -y npm)" >&2; exit 1; }
  (cd "$work" && npm pack --silent "$1" | tail -n1)
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -n "${ORT_LIB:-}" ]; then
  [ -f "$ORT_LIB" ] || { echo "install-onnxruntime: ORT_LIB=$ORT_LIB does not exist" >&2; exit 1; }
  echo "install-onnxruntime: using ORT_LIB=$ORT_LIB"
elif ok "$dest/libonnxruntime.so" "$CPU_SHA"; then
  echo "install-onnxruntime: $dest/libonnxruntime.so present"
else
  echo "install-onnxruntime: fetching $CPU_PKG (about 110 MB) ..."
  tgz=$(fetch "$CPU_PKG")
  tar xzf "$work/$tgz" -C "$work" "$CPU_FILE"
  got=$(sha256sum "$work/$CPU_FILE" | cut -d' ' -f1)
  [ "$got" = "$CPU_SHA" ] || { echo "install-onnxruntime: sha256 mismatch for $CPU_FILE: got $got want $CPU_SHA" >&2; exit 1; }
  install -m 0755 "$work/$CPU_FILE" "$dest/libonnxruntime.so"
  echo "install-onnxruntime: installed $dest/libonnxruntime.so"
fi

if [ "$gpu" = 1 ]; then
  if ok "$dest/libonnxruntime_providers_cuda.so" "$CUDA_SHA" && ok "$dest/libonnxruntime_providers_shared.so" "$SHARED_SHA"; then
    echo "install-onnxruntime: CUDA provider present"
  else
    echo "install-onnxruntime: fetching $GPU_PKG (about 100 MB) ..."
    tgz=$(fetch "$GPU_PKG")
    d=package/Plugins/Linux/x64
    tar xzf "$work/$tgz" -C "$work" "$d/libonnxruntime_providers_cuda.so" "$d/libonnxruntime_providers_shared.so"
    for pair in "libonnxruntime_providers_cuda.so:$CUDA_SHA" "libonnxruntime_providers_shared.so:$SHARED_SHA"; do
      f=${pair%%:*}; want=${pair#*:}
      got=$(sha256sum "$work/$d/$f" | cut -d' ' -f1)
      [ "$got" = "$want" ] || { echo "install-onnxruntime: sha256 mismatch for $f: got $got want $want" >&2; exit 1; }
      install -m 0755 "$work/$d/$f" "$dest/$f"
    done
    echo "install-onnxruntime: installed the CUDA provider into $dest"
  fi
fi
