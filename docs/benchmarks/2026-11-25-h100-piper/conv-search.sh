#!/usr/bin/env bash
# cuDNN convolution search and batch settings for the jenny voice on CUDA: one server at a time.
# Paths are the GPU host's layout of the run in README.md (ONNX Runtime in /tmp/ort, the voice in
# /tmp/v, voxmux and piper-bin-linux in /tmp/b).
set -u
export LD_LIBRARY_PATH=/tmp/ort:/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu:/tmp/esplib
w=/tmp/exp; mkdir -p $w
cat > $w/v.yaml <<Y
kind: piper
name: en_GB-jenny_dioco-medium
voices: [/tmp/v/en_GB-jenny_dioco-medium.onnx]
espeak_data: /tmp/b/piper/espeak-ng-data
Y
run() { # NAME OPTIONS
  cat > $w/$1.yaml <<Y
listen: 127.0.0.1:8095
model: $w/v.yaml
provider: cuda
onnxruntime: /tmp/ort/libonnxruntime.so
request_timeout: 10m
queue: {size: 1024, timeout: 5m}
groups:
  - name: g0
    gpus: [0]
    instances: 1
    max_inflight: 256
    provider_options: $2
Y
  /tmp/b/voxmux serve --config $w/$1.yaml > $w/$1.log 2>&1 & local pid=$!
  for i in $(seq 200); do curl -sf 127.0.0.1:8095/readyz >/dev/null && break; sleep 0.3; done
  /tmp/b/voxmux bench --url http://127.0.0.1:8095 --name $1 --concurrency 1,64,256 --duration-per-level 6s --format wav --quiet --label "$1" --out $w/$1 2>&1 | grep -E "bench level|rror" | sed 's/.*target=//' | cut -c1-250
  kill $pid; wait $pid 2>/dev/null
  grep -iE "error|fail" $w/$1.log | head -3 | cut -c1-300
}
run heuristic "{cudnn_conv_algo_search: HEURISTIC}"
run default-b128-w3 "{piper_batch: \"128\", piper_workers: \"3\"}"
run exhaustive "{cudnn_conv_algo_search: EXHAUSTIVE}"
