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
# what chunking changes. Writes REPORT_DIR/server-PROVIDER.json. Needs bin/voxmux (or $VOXMUX),
# $ORT_DIR with the CUDA provider for cuda, and python3 with numpy.
set -euo pipefail
work=${1:?usage: scripts/cosyvoice3/parity_server.sh WORK cpu|cuda [REPORT_DIR]}
provider=${2:?provider}
report=${3:-$work}
mkdir -p "$report"
# shellcheck source=scripts/cosyvoice3/parity_serve.sh
. "$(dirname "$0")/parity_serve.sh"

out=$work/out
server_parity manifest "$out/pipeline.yaml" "$out/parity-whole.yaml" --chunk-tokens 4000
server_parity manifest "$out/pipeline.yaml" "$out/parity-chunked.yaml"
serve_once "whole-$provider" "$out/parity-whole.yaml" 18311 "$work/e2e/request.json" "$work/e2e/whole-$provider.pcm"
serve_once "chunked-$provider" "$out/parity-chunked.yaml" 18312 "$work/e2e/request.json" "$work/e2e/chunked-$provider.pcm"
server_parity whole "$work" "$provider" "$report"
