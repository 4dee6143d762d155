#!/usr/bin/env bash
# Word error rates of Piper's float32 and float16 decoders: pocketsphinx (Debian's pocketsphinx +
# pocketsphinx-en-us, and ffmpeg) transcribes the WAV files that instance/piper's
# TestPiperFloat16OnGPU wrote to DIR (VOXMUX_GPU_WAVS=DIR: VOICE-I.float32.wav, VOICE-I.float16.wav,
# VOICE-I.txt), through cmd/voxmux's ASR test code (TestPiperWAVsWER), and prints one line per
# voice and precision:
#
#   WER VOICE PRECISION: W over N sentences; heard [...]
#
#   usage: scripts/piper-fp16-wer.sh DIR
set -euo pipefail
[ $# = 1 ] && [ -d "$1" ] || { echo "usage: $0 DIR (the folder TestPiperFloat16OnGPU wrote with VOXMUX_GPU_WAVS=DIR)" >&2; exit 2; }
dir=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=$(VOXMUX_WER_WAVS="$dir" go test -count=1 -run '^TestPiperWAVsWER$' -v ./cmd/voxmux/ 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out" | sed -n 's/^.*_test\.go:[0-9]*: \(WER .*\)$/\1/p'
