#!/usr/bin/env python3
"""Reference values for the clipfeat tests: reference.json.

    /usr/bin/python3 -m instance.clipfeat.testdata.reference > instance/clipfeat/testdata/reference.json

Needs torch and numpy. Resampling, Whisper's log-mel and the flow's mel come from
scripts/cosyvoice3/voice.py, the exporter's own functions (its torchaudio-free resampler). The
Kaldi fbank is computed here in float64 numpy from Kaldi's algorithm (feature-window.cc,
mel-computations.cc, feature-fbank.cc) with the options CosyVoice passes to torchaudio's
kaldi.fbank, so that it is checked against something other than the Go code.

The test clip is a formula that the Go test reproduces: a 1.3 s chirp from 80 Hz to 6 kHz, a
weak 7 kHz tone and uniform noise from splitmix64, with 50 ms of digital silence at 0.40 s and
100 ms at 1/1000 of the level at 0.80 s (the log floors).
"""

import json
import math
import sys

import numpy as np
import torch

from scripts.cosyvoice3 import voice as v

SEED = 0x5EED
MASK = (1 << 64) - 1


def splitmix64(state):
    """The next (state, output) of splitmix64."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def clip(sr):
    """The test clip at sr, float32 [sr * 13 // 10]."""
    n = sr * 13 // 10
    dur, f0, f1 = 1.3, 80.0, 6000.0
    rate = (f1 - f0) / dur
    state = SEED
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        t = i / sr
        state, z = splitmix64(state)
        u = (z >> 11) * (1.0 / (1 << 53))
        x = (0.5 * math.sin(2 * math.pi * (f0 * t + 0.5 * rate * t * t))
             + 0.02 * math.sin(2 * math.pi * 7000.0 * t) + 0.04 * (u - 0.5))
        if sr * 40 // 100 <= i < sr * 45 // 100:
            x = 0.0
        elif sr * 80 // 100 <= i < sr * 90 // 100:
            x *= 0.001
        out[i] = x
    return out


# ---------------------------------------------------------------------------------------------
# Kaldi fbank, float64


def kaldi_mel(f):
    return 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def kaldi_mel_banks(num_bins, padded, sr, low, high):
    """MelBanks: [num_bins][padded/2 + 1], triangles of peak 1 on the HTK mel scale; FFT bin
    padded/2 (Nyquist) is not covered."""
    nyquist = 0.5 * sr
    if high <= 0.0:
        high += nyquist
    bin_width = sr / padded
    mlo, mhi = kaldi_mel(low), kaldi_mel(high)
    delta = (mhi - mlo) / (num_bins + 1)
    banks = np.zeros((num_bins, padded // 2 + 1))
    for b in range(num_bins):
        left, centre, right = mlo + b * delta, mlo + (b + 1) * delta, mlo + (b + 2) * delta
        for i in range(padded // 2):
            mel = kaldi_mel(bin_width * i)
            if left < mel < right:
                banks[b, i] = (mel - left) / (centre - left) if mel <= centre else (right - mel) / (right - centre)
    return banks


def kaldi_fbank(x, sr=16000, num_bins=80, frame_ms=25.0, shift_ms=10.0, preemph=0.97,
                low=20.0, high=0.0):
    """Kaldi's fbank with dither 0, remove_dc_offset, povey window, round_to_power_of_two,
    snip_edges, use_power, use_log_fbank and no energy; [frames][num_bins] float64."""
    x = np.asarray(x, dtype=np.float64)
    size, shift = int(sr * frame_ms / 1000), int(sr * shift_ms / 1000)
    padded = 1 << (size - 1).bit_length()
    frames = 0 if len(x) < size else 1 + (len(x) - size) // shift
    a = 2 * math.pi / (size - 1)
    window = (0.5 - 0.5 * np.cos(a * np.arange(size))) ** 0.85
    banks = kaldi_mel_banks(num_bins, padded, sr, low, high)
    floor = float(np.finfo(np.float32).eps)
    out = np.empty((frames, num_bins))
    for t in range(frames):
        w = x[t * shift:t * shift + size].copy()
        w -= w.mean()
        for i in range(size - 1, 0, -1):
            w[i] -= preemph * w[i - 1]
        w[0] -= preemph * w[0]
        w *= window
        buf = np.zeros(padded)
        buf[:size] = w
        spec = np.fft.rfft(buf)
        power = spec.real ** 2 + spec.imag ** 2
        out[t] = np.log(np.maximum(banks @ power, floor))
    return out


# ---------------------------------------------------------------------------------------------


def r(a):
    """Rounded to 9 significant digits: more than float32 holds."""
    return [float("%.9g" % float(x)) for x in np.asarray(a, dtype=np.float64).reshape(-1)]


def summary(m, rows):
    """A frame-major [frames][bins] array: its shape, sums, per-frame and per-bin sums and the
    selected frames in full."""
    m = np.asarray(m, dtype=np.float64)
    return {
        "frames": m.shape[0], "bins": m.shape[1],
        "sum": r([m.sum()])[0], "abs_sum": r([np.abs(m).sum()])[0],
        "frame_sums": r(m.sum(axis=1)), "bin_sums": r(m.sum(axis=0)),
        "rows": {str(t): r(m[t]) for t in rows},
    }


def main():
    out = {"seed": SEED, "clips": {}, "resample": [], }
    clips = {sr: clip(sr) for sr in (16000, 22050, 24000, 44100)}
    for sr, x in clips.items():
        out["clips"][str(sr)] = {"n": len(x), "sum": r([x.astype(np.float64).sum()])[0],
                                 "sum_sq": r([(x.astype(np.float64) ** 2).sum()])[0]}
    for src, dst in ((44100, 16000), (44100, 24000), (16000, 24000), (24000, 16000), (22050, 24000)):
        y = v.sinc_resample(torch.from_numpy(clips[src]), src, dst).numpy().astype(np.float64)
        n = len(y)
        out["resample"].append({
            "from": src, "to": dst, "n": n, "sum": r([y.sum()])[0], "sum_sq": r([(y ** 2).sum()])[0],
            "windows": {str(o): r(y[o:o + 16]) for o in (0, n // 4, n * 5 // 8, n - 16)}})
    x16, x24 = clips[16000], clips[24000]
    whisper = v.whisper_log_mel(x16)           # [128][T]
    out["whisper"] = summary(whisper.T, (0, 42, 85, 110, whisper.shape[1] - 1))
    mel = v.prompt_mel(x24)                    # [T][80]
    out["flow"] = summary(mel, (0, 21, 42, 55, mel.shape[0] - 1))
    fb = kaldi_fbank(x16)
    out["fbank"] = summary(fb, (0, 41, 82, 100, fb.shape[0] - 1))
    sub = fb - fb.mean(axis=0, keepdims=True)
    out["fbank_mean_removed"] = summary(sub, (0, 41, fb.shape[0] - 1))
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
