#!/usr/bin/env bash
# Packs ONNX Runtime 1.29.0 with its CUDA provider (scripts/install-onnxruntime.sh --gpu) into
# xz-compressed parts of at most 59.5 MB, for a GPU host that receives at most 64 MiB per transfer:
# three parts instead of five uncompressed ones. xz takes about 3.5 minutes on 2 cores.
#
#   usage: scripts/ort-gpu-parts.sh OUT_DIR      (keep OUT_DIR git-ignored, e.g. .ortparts)
#   on the GPU host: cat OUT_DIR/ort.tar.xz.part* | xz -dc | tar xf - -C DEST
set -euo pipefail
out=${1:?usage: ort-gpu-parts.sh OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-onnxruntime.sh" --gpu "$root/third_party/onnxruntime"
mkdir -p "$out"
rm -f "$out"/ort.tar.xz.part*
tar cf - -C "$root/third_party/onnxruntime" libonnxruntime.so libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so |
  xz -6 -T0 | split -b 59500000 -d - "$out/ort.tar.xz.part"
ls -l "$out"
