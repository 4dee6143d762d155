#!/usr/bin/env bash
# The end-to-end half of the CosyVoice3 streaming parity check: after
# `python3 -m scripts.cosyvoice3.parity_stream --e2e` has written WORK/out (the export, with the
# chunk-causal flow) and WORK/e2e (the reference's greedy tokens for one request and its streamed
# token2wav), serves the export with voxmux, streams that request and compares the audio with the
# reference's.
#
#   usage: scripts/cosyvoice3/parity_stream_server.sh WORK PROVIDER [REPORT_DIR]   (PROVIDER: cpu | cuda)
#
# The manifest is the export's with greedy decoding and exactly 20 speech tokens per text token
# (as parity_server.sh's). One server runs the engine option `flow_chunk_emit: cosyvoice` (chunks
# on CosyVoice's boundaries: its audio must equal the reference's), another the default `early`
# (first audio after 8 tokens: measured, not bounded). The request streams as SSE, whose deltas
# give the server's chunks. Writes REPORT_DIR/server-stream-PROVIDER.json
# (scripts/cosyvoice3/server_parity.py says what it holds) and exits 1 when the cosyvoice run is
# past its tolerance. Needs bin/voxmux (or $VOXMUX), $ORT_DIR with the CUDA provider for cuda, and
# python3 with numpy.
set -euo pipefail
work=${1:?usage: scripts/cosyvoice3/parity_stream_server.sh WORK cpu|cuda [REPORT_DIR]}
provider=${2:?provider}
report=${3:-$work}
mkdir -p "$report"
# shellcheck source=scripts/cosyvoice3/parity_serve.sh
. "$(dirname "$0")/parity_serve.sh"

out=$work/out
server_parity manifest "$out/pipeline.yaml" "$out/parity-stream.yaml" --chunk-flow
server_parity sse-request "$work/e2e/request.json" "$work/e2e/request-sse.json"
serve_once "stream-cosyvoice-$provider" "$out/parity-stream.yaml" 18313 "$work/e2e/request-sse.json" \
  "$work/e2e/stream-cosyvoice-$provider.sse" "flow_chunk_emit: cosyvoice"
serve_once "stream-early-$provider" "$out/parity-stream.yaml" 18314 "$work/e2e/request-sse.json" \
  "$work/e2e/stream-early-$provider.sse" "flow_chunk_emit: early"
server_parity stream "$work" "$provider" "$report"
