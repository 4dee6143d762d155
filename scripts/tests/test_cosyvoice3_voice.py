"""Tests of scripts/cosyvoice3/voice.py and the exporter's --voice-wav/--voice-text handling.

    /usr/bin/python3 -m pytest scripts/tests/test_cosyvoice3_voice.py

Needs torch, numpy and PyYAML. The two ONNX networks are replaced by stand-ins (they and the
Kaldi fbank need onnxruntime and torchaudio); everything around them is checked against values
derived here.
"""

import math
import os
import struct
import wave

import numpy as np
import pytest
import torch
import yaml

from ..cosyvoice3 import voice as v

# The folder the tests write their files to: pytest's, one per run of this module.
TMP = None


@pytest.fixture(autouse=True, scope="module")
def _tmp(tmp_path_factory):
    global TMP
    TMP = str(tmp_path_factory.mktemp("cv3voice"))


def has(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def write_pcm(name, samples, sr, width=2, channels=1):
    """samples float [n] or [n][channels] in [-1, 1) -> a PCM WAV file."""
    path = os.path.join(TMP, name)
    x = np.asarray(samples, dtype=np.float64).reshape(-1, channels)
    if width == 1:
        data = np.clip(np.round(x * 128 + 128), 0, 255).astype(np.uint8).tobytes()
    elif width == 3:
        q = np.clip(np.round(x * (1 << 23)), -(1 << 23), (1 << 23) - 1).astype(np.int64).reshape(-1)
        data = b"".join(struct.pack("<i", int(s))[:3] for s in q)
    else:
        dt = "<i2" if width == 2 else "<i4"
        q = np.clip(np.round(x * (1 << (8 * width - 1))), -(1 << (8 * width - 1)), (1 << (8 * width - 1)) - 1)
        data = q.astype(dt).tobytes()
    with wave.open(path, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(sr)
        w.writeframes(data)
    return path


def write_float_wav(name, samples, sr):
    """A WAVE_FORMAT_IEEE_FLOAT file, which the wave module does not read."""
    path = os.path.join(TMP, name)
    data = np.asarray(samples, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, sr, sr * 4, 4, 32)
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE")
        f.write(b"fmt " + struct.pack("<I", len(fmt)) + fmt)
        f.write(b"data" + struct.pack("<I", len(data)) + data)
    return path


def raises(fn, *words):
    """fn() must raise VoiceError (or SystemExit) whose message holds every word."""
    try:
        fn()
    except (v.VoiceError, SystemExit) as e:
        msg = str(e)
        for w in words:
            assert w in msg, "message %r lacks %r" % (msg, w)
        return msg
    raise AssertionError("no error raised (wanted one with %s)" % (words,))


# ---------------------------------------------------------------------------------------------
# Filterbank

def test_mel_scale():
    # Slaney's scale: 3 mel per 200 Hz up to 1 kHz (15 mel), then 27 mel per factor 6.4.
    assert abs(v.hz_to_mel(200.0 / 3) - 1.0) < 1e-12
    assert abs(v.hz_to_mel(1000.0) - 15.0) < 1e-12
    assert abs(v.hz_to_mel(6400.0) - 42.0) < 1e-12
    assert abs(v.hz_to_mel(6400.0 * 6.4) - 69.0) < 1e-12
    f = np.array([0.0, 10.0, 500.0, 999.0, 1000.0, 1001.0, 4000.0, 12000.0])
    assert np.allclose(v.mel_to_hz(v.hz_to_mel(f)), f, rtol=1e-12, atol=1e-9)


def test_filterbank_published_values():
    # The slaney-scale, slaney-normalized filterbank for sr 4000, n_fft 30, 4 filters, 0..2000 Hz,
    # as published for librosa-compatible implementations ([bin][filter]).
    want = np.array([
        [0, 0, 0, 0], [1.19217795e-03, 0, 0, 0], [2.38435591e-03, 0, 0, 0],
        [2.40387905e-03, 5.86232616e-04, 0, 0], [1.21170110e-03, 1.77821783e-03, 0, 0],
        [1.95231437e-05, 2.97020305e-03, 0, 0], [0, 1.81763684e-03, 1.04857612e-03, 0],
        [0, 6.26036972e-04, 2.11460963e-03, 0], [0, 0, 2.26505954e-03, 3.07332945e-04],
        [0, 0, 1.40202503e-03, 9.54861093e-04], [0, 0, 5.38990521e-04, 1.60238924e-03],
        [0, 0, 0, 1.83458185e-03], [0, 0, 0, 1.37593638e-03], [0, 0, 0, 9.17290923e-04],
        [0, 0, 0, 4.58645462e-04], [0, 0, 0, 0]])
    got = v.slaney_mel_filters(4000, 30, 4, fmin=0, fmax=2000)
    assert got.shape == (4, 16) and got.dtype == np.float32
    assert np.allclose(got.T, want, rtol=1e-6, atol=1e-9), np.abs(got.T - want).max()


def edges_closed_form(sr, n_mels, fmax=None):
    """The n_mels + 2 edge frequencies of the filters, from the scale's closed form."""
    fmax = sr / 2 if fmax is None else fmax
    top = fmax * 3 / 200 if fmax < 1000 else 15 + 27 * math.log(fmax / 1000) / math.log(6.4)
    out = []
    for k in range(n_mels + 2):
        m = top * k / (n_mels + 1)
        out.append(m * 200 / 3 if m < 15 else 1000 * 6.4 ** ((m - 15) / 27))
    return out


def test_filterbank_triangles():
    # Whisper's (16 kHz, n_fft 400, 128) and the flow's (24 kHz, n_fft 1920, 80): every bin of every
    # filter against a triangle rising from edge i to 2/(edge i+2 - edge i) at edge i+1 and back to
    # 0 at edge i+2, evaluated here one bin at a time.
    for sr, n_fft, n_mels in ((16000, 400, 128), (24000, 1920, 80)):
        fb = v.slaney_mel_filters(sr, n_fft, n_mels)
        assert fb.shape == (n_mels, n_fft // 2 + 1), fb.shape
        e = edges_closed_form(sr, n_mels)
        worst = 0.0
        for i in range(n_mels):
            lo, mid, hi = e[i], e[i + 1], e[i + 2]
            height = 2.0 / (hi - lo)
            for b in range(n_fft // 2 + 1):
                f = b * sr / n_fft
                if lo < f <= mid:
                    w = height * (f - lo) / (mid - lo)
                elif mid < f < hi:
                    w = height * (hi - f) / (hi - mid)
                else:
                    w = 0.0
                worst = max(worst, abs(fb[i, b] - w) / height)
            assert fb[i].max() <= height * (1 + 1e-6)
            assert fb[i].max() > 0, "filter %d of (%d, %d, %d) covers no bin" % (i, sr, n_fft, n_mels)
        assert worst < 1e-5, (sr, n_fft, n_mels, worst)


def test_filterbank_peaks_and_area():
    # With bins 0.125 Hz apart each filter's peak sits at its centre frequency with height
    # 2 / (width in Hz), and its area is 1 (slaney normalization).
    sr, n_fft, n_mels = 24000, 192000, 80
    fb = v.slaney_mel_filters(sr, n_fft, n_mels).astype(np.float64)
    df = sr / n_fft
    e = edges_closed_form(sr, n_mels)
    for i in range(n_mels):
        peak = int(np.argmax(fb[i]))
        height = 2 / (e[i + 2] - e[i])
        assert abs(peak * df - e[i + 1]) <= df, (i, peak * df, e[i + 1])
        # The nearest bin is at most df/2 from the centre, on the steeper side at worst.
        slack = 0.5 * df / min(e[i + 1] - e[i], e[i + 2] - e[i + 1])
        assert height * (1 - slack - 1e-6) <= fb[i, peak] <= height * (1 + 1e-6), (i, fb[i, peak], height)
        area = fb[i].sum() * df
        assert abs(area - 1.0) < 1e-3, (i, area)


# ---------------------------------------------------------------------------------------------
# Spectra

def tone(freq, n, sr, amp=0.5, phase=0.3):
    return (amp * np.sin(2 * np.pi * freq * np.arange(n) / sr + phase)).astype(np.float32)


def test_frame_counts():
    rng = np.random.default_rng(0)
    for n in (201, 399, 400, 16000, 16159, 16160, 16161, 48000):
        got = v.whisper_log_mel(rng.standard_normal(n).astype(np.float32) * 0.1)
        assert got.shape == (128, n // 160) == (128, v.whisper_frames(n)), (n, got.shape)
    for n in (721, 959, 960, 24000, 24479, 24480, 24481, 72000):
        got = v.prompt_mel(rng.standard_normal(n).astype(np.float32) * 0.1)
        assert got.shape == (n // 480, 80) == (v.mel_frames(n), 80), (n, got.shape)


def test_whisper_log_mel_frame():
    # Frame t is centred on sample 160 t of the reflect-padded clip, with a periodic Hann window of
    # 400, power spectrum, filterbank, log10 and the (x + 4) / 4 scaling; the floor is 8 below the
    # loudest value before scaling.
    sr, n = 16000, 4000
    x = tone(440.0, n, sr) + tone(3000.0, n, sr, amp=0.1)
    got = v.whisper_log_mel(x)
    padded = np.pad(x.astype(np.float64), 200, mode="reflect")
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    fb = v.slaney_mel_filters(16000, 400, 128).astype(np.float64)
    logs = []
    for t in range(n // 160):
        spec = np.fft.rfft(padded[160 * t:160 * t + 400] * win)
        logs.append(np.log10(np.maximum(fb @ (np.abs(spec) ** 2), 1e-10)))
    logs = np.array(logs).T
    want = (np.maximum(logs, logs.max() - 8.0) + 4.0) / 4.0
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()
    assert got.max() - got.min() <= 2.0 + 1e-6
    # The tone's filter is the loudest in a middle frame.
    centres = edges_closed_form(16000, 128)[1:-1]
    assert abs(centres[int(np.argmax(got[:, 10]))] - 440.0) < 40.0


def test_prompt_mel_frame():
    # Frame t covers samples 480 t .. 480 t + 1920 of the clip reflect-padded by 720 each side,
    # periodic Hann window, magnitude sqrt(re^2 + im^2 + 1e-9), filterbank, natural log floored at 1e-5.
    sr, n = 24000, 9600
    x = tone(1000.0, n, sr) + tone(220.0, n, sr, amp=0.2)
    got = v.prompt_mel(x)
    padded = np.pad(x.astype(np.float64), 720, mode="reflect")
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(1920) / 1920)
    fb = v.slaney_mel_filters(24000, 1920, 80).astype(np.float64)
    for t in (0, 1, 9, n // 480 - 1):
        spec = np.fft.rfft(padded[480 * t:480 * t + 1920] * win)
        want = np.log(np.maximum(fb @ np.sqrt(np.abs(spec) ** 2 + 1e-9), 1e-5))
        # float32's STFT resolves bins down to about e^-10 of the loudest.
        loud = want > want.max() - 10
        assert np.abs(got[t] - want)[loud].max() < 1e-3, (t, np.abs(got[t] - want)[loud].max())
        assert np.abs(got[t] - want).max() < 0.05, (t, np.abs(got[t] - want).max())
    silent = v.prompt_mel(np.zeros(4800, dtype=np.float32))
    # Silence: the 1e-9 inside the root gives each bin 3.16e-5 before the filterbank.
    assert np.isfinite(silent).all() and silent.max() < -4.0


# ---------------------------------------------------------------------------------------------
# Resampling

def test_resample():
    assert v.resampled_length(44100, 44100, 16000) == 16000
    assert v.resampled_length(1, 44100, 16000) == 1
    assert v.resampled_length(441, 44100, 16000) == 160
    assert v.resampled_length(442, 44100, 16000) == 161
    x = tone(440.0, 4410, 44100)
    assert np.array_equal(v.resample(x, 44100, 44100), x)
    for sr_in, sr_out, f in ((44100, 16000, 440.0), (48000, 24000, 1000.0), (22050, 24000, 300.0),
                             (16000, 24000, 2500.0), (32000, 16000, 3000.0)):
        n = sr_in // 2
        x = tone(f, n, sr_in)
        y = v.sinc_resample(torch.from_numpy(x), sr_in, sr_out).numpy()
        assert len(y) == v.resampled_length(n, sr_in, sr_out), (sr_in, sr_out, len(y))
        want = tone(f, len(y), sr_out)
        mid = slice(len(y) // 10, len(y) * 9 // 10)       # away from the zero-padded ends
        err = np.abs(y[mid] - want[mid]).max()
        # The kernel's pass band is flat to 0.1 % up to about a quarter of the lower rate.
        assert err < 1e-3, (sr_in, sr_out, f, err)
        dc = v.sinc_resample(torch.ones(n), sr_in, sr_out).numpy()[mid]
        assert np.abs(dc - 1).max() < 2e-3, (sr_in, sr_out, np.abs(dc - 1).max())
    # Above the new Nyquist rate a tone is filtered out rather than folded down.
    y = v.sinc_resample(torch.from_numpy(tone(10000.0, 48000, 48000)), 48000, 16000).numpy()
    assert np.abs(y[1600:-1600]).max() < 0.5 * 0.01, np.abs(y[1600:-1600]).max()
    if has("torchaudio"):
        import torchaudio.functional as taf
        x = torch.from_numpy(np.random.default_rng(1).standard_normal(44100).astype(np.float32))
        for sr_in, sr_out in ((44100, 16000), (44100, 24000), (16000, 24000), (48000, 16000)):
            # The same kernel summed in another order: float32 rounding of values up to about 4.
            d = (v.sinc_resample(x, sr_in, sr_out) - taf.resample(x, sr_in, sr_out)).abs().max()
            assert d < 5e-5, (sr_in, sr_out, float(d))


# ---------------------------------------------------------------------------------------------
# Reading clips

def test_read_wav():
    x = tone(300.0, 1600, 16000)
    for width, tol in ((1, 1 / 128), (2, 1 / 32768), (3, 1 / 8388608), (4, 1e-7)):
        got, sr = v.read_wav(write_pcm("w%d.wav" % width, x, 16000, width=width))
        assert sr == 16000 and got.dtype == np.float32 and got.shape == x.shape
        assert np.abs(got - x).max() <= tol, (width, np.abs(got - x).max())
    # Channels are averaged.
    st = np.stack([x, -0.5 * x], axis=1)
    got, sr = v.read_wav(write_pcm("stereo.wav", st, 22050, channels=2))
    assert sr == 22050 and got.shape == x.shape
    assert np.abs(got - 0.25 * x).max() < 2 / 32768
    # 16-bit full scale reads as in torchaudio: -32768 -> -1.
    got, _ = v.read_wav(write_pcm("fs.wav", [-1.0, 0.0, 0.5], 16000))
    assert got.tolist() == [-1.0, 0.0, 0.5]


def test_bad_files():
    missing = os.path.join(TMP, "missing.wav")
    raises(lambda: v.read_wav(missing), missing, "no such file")
    text = os.path.join(TMP, "notes.wav")
    with open(text, "w") as f:
        f.write("not audio at all\n")
    if has("torchaudio"):
        raises(lambda: v.read_wav(text), text)
    else:
        raises(lambda: v.read_wav(text), text, "not a PCM WAV file", "torchaudio")
        fl = write_float_wav("float.wav", tone(300, 1600, 16000), 16000)
        raises(lambda: v.read_wav(fl), fl, "not a PCM WAV file", "16-bit PCM")
    empty = os.path.join(TMP, "empty.wav")
    open(empty, "wb").close()
    raises(lambda: v.read_wav(empty), empty)
    # A header cut short of its data reads what is there.
    full = write_pcm("cut.wav", tone(300, 1600, 16000), 16000)
    cut = os.path.join(TMP, "cut2.wav")
    with open(full, "rb") as f, open(cut, "wb") as g:
        g.write(f.read()[:44 + 1001])
    got, _ = v.read_wav(cut)
    assert len(got) == 500


def test_clip_limits():
    ok = write_pcm("30s.wav", np.zeros(30 * 16000), 16000)
    x, sr = v.load_clip(ok)
    assert len(x) == 480000 and sr == 16000
    long = write_pcm("30s1.wav", np.zeros(30 * 16000 + 1), 16000)
    raises(lambda: v.load_clip(long), long, "30.00 s", "longer than the 30 s")
    # At 44.1 kHz the limit is on the 16 kHz length, as the reference checks it.
    ok44 = write_pcm("30s44.wav", np.zeros(30 * 44100), 44100)
    assert len(v.load_clip(ok44)[0]) == 30 * 44100
    long44 = write_pcm("30s44b.wav", np.zeros(30 * 44100 + 1), 44100)
    raises(lambda: v.load_clip(long44), long44, "longer than the 30 s")
    low = write_pcm("8k.wav", np.zeros(8000), 8000)
    raises(lambda: v.load_clip(low), low, "8000 Hz", "below 16000 Hz")
    short = write_pcm("short.wav", np.zeros(800), 16000)
    raises(lambda: v.load_clip(short), short, "too short")
    nothing = write_pcm("nothing.wav", np.zeros(0), 16000)
    raises(lambda: v.load_clip(nothing), nothing, "too short")


# ---------------------------------------------------------------------------------------------
# The prompt

def test_align():
    mel = np.arange(101 * 3, dtype=np.float32).reshape(101, 3)
    toks, m = v.align(list(range(60)), mel)          # the mel is short: 50 tokens
    assert toks == list(range(50)) and m.shape == (100, 3) and np.array_equal(m, mel[:100])
    toks, m = v.align(list(range(40)), mel)          # the tokens are short: 80 frames
    assert toks == list(range(40)) and m.shape == (80, 3)
    toks, m = v.align(list(range(50)), mel)
    assert len(toks) == 50 and len(m) == 100
    toks, m = v.align([], mel)
    assert toks == [] and len(m) == 0
    toks, m = v.align([1, 2], mel[:1])
    assert toks == [] and len(m) == 0


class Stand:
    """Stand-ins for the two networks that record what they were given."""

    def __init__(self, tokens_per_frame=0.25, extra=0):
        self.tokens_per_frame, self.extra = tokens_per_frame, extra
        self.feats = self.fbank = None

    def tokenize(self, feats):
        self.feats = feats
        return [i % 6561 for i in range(int(feats.shape[1] * self.tokens_per_frame) + self.extra)]

    def embed(self, fbank):
        self.fbank = fbank
        return np.linspace(-1, 1, 192, dtype=np.float32)


def with_fake_fbank(fn):
    real = v.kaldi_fbank
    v.kaldi_fbank = lambda x16, path="clip": np.zeros((1 + (len(x16) - 400) // 160, 80), np.float32)
    try:
        return fn()
    finally:
        v.kaldi_fbank = real


def test_extract_prompt():
    sr = 44100
    n = int(3.3 * sr)
    path = write_pcm("speech.wav", tone(200, n, sr) + tone(1200, n, sr, amp=0.2), sr)
    n16, n24 = v.resampled_length(n, sr, 16000), v.resampled_length(n, sr, 24000)
    # Tokens at 25 Hz from Whisper's 100 Hz frames: the mel's frames // 2 is the limit.
    s = Stand(0.25, extra=3)
    p = with_fake_fbank(lambda: v.extract_prompt(path, TMP, tokenize=s.tokenize, embed=s.embed))
    assert s.feats.shape == (128, n16 // 160) and s.feats.dtype == np.float32
    assert s.fbank.shape == (1 + (n16 - 400) // 160, 80)
    assert len(p.tokens) == (n24 // 480) // 2 == 82, len(p.tokens)
    assert p.mel.shape == (2 * len(p.tokens), 80) and p.mel.dtype == np.float32
    x24 = v.resample(v.read_wav(path)[0], sr, 24000)
    assert np.array_equal(p.mel, v.prompt_mel(x24)[:2 * len(p.tokens)])
    assert p.embedding.shape == (192,) and abs(p.seconds - n / sr) < 1e-9
    # Fewer tokens than mel frames allow: the tokens are the limit.
    s = Stand(0.2)
    p = with_fake_fbank(lambda: v.extract_prompt(path, TMP, tokenize=s.tokenize, embed=s.embed))
    assert len(p.tokens) == int((n16 // 160) * 0.2) and len(p.mel) == 2 * len(p.tokens)
    # No tokens at all.
    s = Stand(0.0)
    raises(lambda: with_fake_fbank(lambda: v.extract_prompt(path, TMP, tokenize=s.tokenize, embed=s.embed)),
           path, "no speech tokens")


def test_missing_dependencies():
    x16 = np.zeros(16000, np.float32)
    if not has("torchaudio"):
        raises(lambda: v.kaldi_fbank(x16, "/clips/a.wav"), "/clips/a.wav", "torchaudio")
    if not has("onnxruntime"):
        onnx = os.path.join(TMP, v.TOKENIZER_FILE)
        raises(lambda: v.run_speech_tokenizer(onnx, np.zeros((128, 10), np.float32)), onnx, "onnxruntime")
        raises(lambda: v.run_campplus(onnx, np.zeros((10, 80), np.float32)), "onnxruntime")


def test_missing_modules():
    assert v.missing_modules() == [m for m in ("onnxruntime", "torchaudio") if not has(m)]


def test_prompt_text():
    d = "You are a helpful assistant.<|endofprompt|>"
    assert v.prompt_text("  Hello there.\n", d) == d + "Hello there."
    own = "Speak slowly.<|endofprompt|>Hello there."
    assert v.prompt_text(own, d) == own


# ---------------------------------------------------------------------------------------------
# The exporter's side

def test_exporter_args_and_voice_folder():
    from ..cosyvoice3 import export as ex
    got = ex.wav_voice_args(["anna=/a.wav", "bo=/b.wav"], ["bo=Hi.", "anna=Hello = there."], {"default"})
    assert got == [("anna", "/a.wav", ex.DEFAULT_PROMPT + "Hello = there."),
                   ("bo", "/b.wav", ex.DEFAULT_PROMPT + "Hi.")], got
    raises(lambda: ex.wav_voice_args(["anna=/a.wav"], [], set()), "--voice-wav anna", "--voice-text anna=")
    raises(lambda: ex.wav_voice_args([], ["anna=Hi"], set()), "--voice-text anna", "--voice-wav anna=")
    raises(lambda: ex.wav_voice_args(["anna"], [], set()), "--voice-wav", "NAME=WAV")
    raises(lambda: ex.wav_voice_args(["anna=/a.wav"], ["anna="], set()), "--voice-text", "NAME=TRANSCRIPT")
    raises(lambda: ex.wav_voice_args(["a=/a.wav", "a=/b.wav"], ["a=x"], set()), "given twice")
    raises(lambda: ex.wav_voice_args(["x/y=/a.wav"], ["x/y=hi"], set()), "not a folder name")
    raises(lambda: ex.wav_voice_args(["default=/a.wav"], ["default=hi"], {"default"}), "already made")

    # The folder the exporter writes for a prompt.
    p = v.Prompt(tokens=[5, 6, 7], mel=np.arange(6 * 80, dtype=np.float32).reshape(6, 80),
                 embedding=np.ones(192, np.float32), seconds=0.12)
    out = os.path.join(TMP, "out")
    ex.write_voice(out, "anna", ex.DEFAULT_PROMPT + 'She said "hi".', p.tokens, p.mel, p.embedding)
    d = os.path.join(out, "voices", "anna")
    y = yaml.safe_load(open(os.path.join(d, "voice.yaml")))
    assert y == {"text": ex.DEFAULT_PROMPT + 'She said "hi".', "speech_tokens": [5, 6, 7],
                 "mel": "mel.f32", "embedding": "embedding.f32"}, y
    assert np.array_equal(np.fromfile(os.path.join(d, "mel.f32"), "<f4").reshape(6, 80), p.mel)
    assert np.fromfile(os.path.join(d, "embedding.f32"), "<f4").shape == (192,)
