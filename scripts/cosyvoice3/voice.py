"""A CosyVoice3 zero-shot voice prompt from a reference clip and its transcript.

CosyVoice3's frontend turns a prompt clip into three things, which voxmux keeps in a voice folder:

  speech tokens   the clip at 16 kHz -> Whisper's 128-bin log-mel -> speech_tokenizer_v3.onnx (25 Hz)
  embedding       the clip at 16 kHz -> Kaldi fbank (80 bins), less its mean -> campplus.onnx (192)
  mel             the clip at 24 kHz -> the flow's 80-bin log-mel (hop 480, 50 Hz), [frames][80]

then trims the mel and the tokens so that the mel has exactly two frames per token. The clip is
used as it is: no trimming of silence and no change of level, as in the reference. Clips over
30 s are refused (the speech tokenizer's limit) and so are clips under 16 kHz.

Needs torch and numpy; onnxruntime for the two networks and torchaudio for the Kaldi fbank.
torchaudio also reads files that Python's `wave` cannot (float WAV, FLAC, ...) and resamples;
without it a windowed-sinc resampler with the same kernel is used (it agrees with torchaudio's to
about 1e-4; its kernel is computed in float64).

    extract_prompt(wav_path, model_dir) -> Prompt(tokens, mel, embedding, seconds)
"""

import math
import os
import wave
from dataclasses import dataclass

import numpy as np
import torch

TOKEN_RATE_HZ = 16000          # speech tokens and speaker embedding
MEL_RATE_HZ = 24000            # the flow's prompt mel
MAX_SECONDS = 30.0             # the speech tokenizer's limit
MIN_SECONDS = 0.1              # shorter clips give no whole speech token
MIN_INPUT_RATE_HZ = 16000
FRAMES_PER_TOKEN = 2           # CosyVoice3: 50 Hz mel, 25 Hz tokens

# Whisper's front end (the speech tokenizer's input).
WHISPER_N_FFT = 400
WHISPER_HOP = 160
WHISPER_MELS = 128
# The flow's mel (matcha's mel_spectrogram with CosyVoice3's settings).
MEL_N_FFT = 1920
MEL_HOP = 480
MEL_WIN = 1920
MEL_BINS = 80
# Speaker embedding input.
FBANK_BINS = 80

TOKENIZER_FILE = "speech_tokenizer_v3.onnx"
CAMPPLUS_FILE = "campplus.onnx"


class VoiceError(Exception):
    """A clip that cannot become a prompt; the message names the file."""


@dataclass
class Prompt:
    tokens: list          # speech tokens, 25 per second
    mel: np.ndarray       # float32 [2 * len(tokens)][80]
    embedding: np.ndarray  # float32 [192]
    seconds: float        # the clip's length


# ---------------------------------------------------------------------------------------------
# Reading and resampling


def read_wav(path):
    """Returns (float32 mono samples in [-1, 1), sample rate). Channels are averaged."""
    if not os.path.isfile(path):
        raise VoiceError("%s: no such file" % path)
    try:
        with wave.open(path, "rb") as w:
            ch, width, sr, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(n)
    except (wave.Error, EOFError) as e:
        # Not PCM WAV (float WAV, FLAC, MP3...): torchaudio reads those, if it is here.
        return _read_torchaudio(path, e)
    if width not in (1, 2, 3, 4):
        raise VoiceError("%s: %d-byte samples; PCM WAV of 8, 16, 24 or 32 bits is read" % (path, width))
    n = len(raw) // (width * ch)     # a truncated file holds fewer frames than its header says
    raw = raw[:n * width * ch]
    if width == 1:
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        x = v.astype(np.float32) / float(1 << 23)
    else:
        dt = "<i2" if width == 2 else "<i4"
        x = np.frombuffer(raw, dtype=dt).astype(np.float32) / float(1 << (8 * width - 1))
    x = x.reshape(-1, ch).mean(axis=1, dtype=np.float32) if ch > 1 else x
    return np.ascontiguousarray(x, dtype=np.float32), sr


def _read_torchaudio(path, wave_error):
    try:
        import torchaudio
    except ImportError:
        raise VoiceError("%s: not a PCM WAV file (%s); convert it to 16-bit PCM WAV, or install "
                         "torchaudio to read other formats" % (path, wave_error)) from None
    try:
        x, sr = torchaudio.load(path)
    except Exception as e:  # its backends raise several kinds
        raise VoiceError("%s: cannot be read as audio (%s); convert it to 16-bit PCM WAV" % (path, e)) from None
    return x.to(torch.float32).mean(dim=0).numpy(), int(sr)


def resampled_length(n, sr_in, sr_out):
    g = math.gcd(sr_in, sr_out)
    return -(-n * (sr_out // g) // (sr_in // g))


def resample(x, sr_in, sr_out):
    """float32 [n] -> float32 [ceil(n * sr_out / sr_in)], as torchaudio's default Resample."""
    if sr_in == sr_out:
        return np.asarray(x, dtype=np.float32)
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    try:
        import torchaudio.functional as taf
        return taf.resample(t, sr_in, sr_out).numpy()
    except ImportError:
        return sinc_resample(t, sr_in, sr_out).numpy()


def sinc_resample(x, sr_in, sr_out, zeros=6, rolloff=0.99):
    """Band-limited resampling of a 1-D tensor with a Hann-windowed sinc of `zeros` zero crossings
    and its cut-off at rolloff x the lower Nyquist rate: the kernel torchaudio uses by default, so
    that prompts do not depend on whether it is installed."""
    g = math.gcd(sr_in, sr_out)
    a, b = sr_in // g, sr_out // g      # b outputs for every a inputs
    cutoff = min(a, b) * rolloff        # in units of the reduced rates
    half = math.ceil(zeros * a / cutoff)
    # Output phase j (time j/b in input samples) reads inputs k - half .. k + a + half - 1 of its block.
    taps = torch.arange(-half, half + a, dtype=torch.float64)[None, :] / a
    phase = -torch.arange(b, dtype=torch.float64)[:, None] / b
    u = ((phase + taps) * cutoff).clamp(-zeros, zeros)
    window = torch.cos(u * math.pi / (2 * zeros)) ** 2
    arg = u * math.pi
    sinc = torch.where(arg == 0, torch.ones_like(arg), torch.sin(arg) / arg)
    kernel = (sinc * window * (cutoff / a)).to(torch.float32)[:, None, :]
    n = x.shape[-1]
    padded = torch.nn.functional.pad(x.reshape(1, 1, n), (half, half + a))
    y = torch.nn.functional.conv1d(padded, kernel, stride=a)      # [1, b, blocks]
    return y[0].t().reshape(-1)[:resampled_length(n, sr_in, sr_out)]


# ---------------------------------------------------------------------------------------------
# Spectra


def hz_to_mel(f):
    """Slaney's mel scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log, lin)


def mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    lin = m * (200.0 / 3)
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
    return np.where(m >= 15.0, log, lin)


def slaney_mel_filters(sr, n_fft, n_mels, fmin=0.0, fmax=None):
    """[n_mels][1 + n_fft/2] float32: triangles on Slaney's mel scale, each of area 1 in Hz (the
    filterbank of librosa.filters.mel with htk=False, norm='slaney', which Whisper and matcha use)."""
    fmax = sr / 2.0 if fmax is None else float(fmax)
    bins = np.arange(1 + n_fft // 2) * (sr / n_fft)     # the one-sided FFT's bin frequencies
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lo) / (mid - lo)
    falling = (hi - bins[None, :]) / (hi - mid)
    tri = np.maximum(0.0, np.minimum(rising, falling))
    return (tri * (2.0 / (hi - lo))).astype(np.float32)


def whisper_frames(n):
    """Frames of Whisper's log-mel for n samples: a centred STFT gives 1 + n // hop, and Whisper
    drops the last."""
    return n // WHISPER_HOP


def whisper_log_mel(x16):
    """float32 [n] at 16 kHz -> float32 [128][n // 160], Whisper's log_mel_spectrogram."""
    x = torch.from_numpy(np.ascontiguousarray(x16, dtype=np.float32))
    spec = torch.stft(x, WHISPER_N_FFT, WHISPER_HOP, window=torch.hann_window(WHISPER_N_FFT),
                      center=True, pad_mode="reflect", return_complex=True)
    power = spec[:, :-1].abs() ** 2
    filters = torch.from_numpy(slaney_mel_filters(TOKEN_RATE_HZ, WHISPER_N_FFT, WHISPER_MELS))
    logm = torch.clamp(filters @ power, min=1e-10).log10()
    logm = torch.maximum(logm, logm.max() - 8.0)     # an 80 dB range below the loudest bin
    return ((logm + 4.0) / 4.0).numpy()


def mel_frames(n):
    """Frames of the flow's mel for n samples: reflect-padded by (n_fft - hop)/2 each side, then an
    uncentred STFT, which comes to n // hop."""
    pad = (MEL_N_FFT - MEL_HOP) // 2
    return 1 + (n + 2 * pad - MEL_N_FFT) // MEL_HOP


def prompt_mel(x24):
    """float32 [n] at 24 kHz -> float32 [n // 480][80], the flow's log-mel (natural log)."""
    x = torch.from_numpy(np.ascontiguousarray(x24, dtype=np.float32))
    pad = (MEL_N_FFT - MEL_HOP) // 2
    x = torch.nn.functional.pad(x[None, None], (pad, pad), mode="reflect")[0, 0]
    spec = torch.stft(x, MEL_N_FFT, MEL_HOP, win_length=MEL_WIN, window=torch.hann_window(MEL_WIN),
                      center=False, normalized=False, onesided=True, return_complex=True)
    mag = torch.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
    filters = torch.from_numpy(slaney_mel_filters(MEL_RATE_HZ, MEL_N_FFT, MEL_BINS))
    return torch.log(torch.clamp(filters @ mag, min=1e-5)).t().contiguous().numpy()


def kaldi_fbank(x16, path="clip"):
    """float32 [n] at 16 kHz -> [frames][80] Kaldi fbank less its mean over time (campplus's input)."""
    try:
        import torchaudio.compliance.kaldi as kaldi
    except ImportError:
        raise VoiceError("%s: the speaker embedding needs torchaudio (its Kaldi fbank is campplus's "
                         "input); install torchaudio" % path) from None
    feat = kaldi.fbank(torch.from_numpy(np.ascontiguousarray(x16, dtype=np.float32))[None],
                       num_mel_bins=FBANK_BINS, dither=0.0, sample_frequency=TOKEN_RATE_HZ)
    return (feat - feat.mean(dim=0, keepdim=True)).numpy()


def align(tokens, mel, frames_per_token=FRAMES_PER_TOKEN):
    """Trims both to whole tokens of mel: n = min(frames // 2, tokens); mel[:2n], tokens[:n]."""
    n = min(len(mel) // frames_per_token, len(tokens))
    return list(tokens[:n]), mel[:frames_per_token * n]


# ---------------------------------------------------------------------------------------------
# The two networks (onnxruntime)

_sessions = {}


def _session(path):
    if path not in _sessions:
        try:
            import onnxruntime as ort
        except ImportError:
            raise VoiceError("%s: onnxruntime is needed to run it; install onnxruntime" % path) from None
        if not os.path.isfile(path):
            raise VoiceError("%s: no such file (it comes with the CosyVoice3 model)" % path)
        _sessions[path] = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return _sessions[path]


def run_speech_tokenizer(onnx_path, feats):
    """feats float32 [128][T] -> speech tokens."""
    s = _session(onnx_path)
    names = [i.name for i in s.get_inputs()]
    out = s.run(None, {names[0]: feats[None].astype(np.float32),
                       names[1]: np.array([feats.shape[1]], dtype=np.int32)})[0]
    return [int(t) for t in np.asarray(out).reshape(-1)]


def run_campplus(onnx_path, fbank):
    """fbank float32 [frames][80], mean removed -> float32 [192]."""
    s = _session(onnx_path)
    out = s.run(None, {s.get_inputs()[0].name: fbank[None].astype(np.float32)})[0]
    return np.asarray(out, dtype=np.float32).reshape(-1)


# ---------------------------------------------------------------------------------------------


def missing_modules():
    """The modules a prompt needs that are not importable, so that a caller can stop before work."""
    missing = []
    for m in ("onnxruntime", "torchaudio"):
        try:
            __import__(m)
        except ImportError:
            missing.append(m)
    return missing


def load_clip(path):
    """The clip as mono float32 and its rate, checked against the limits before any work."""
    x, sr = read_wav(path)
    if sr < MIN_INPUT_RATE_HZ:
        raise VoiceError("%s: sample rate %d Hz is below %d Hz" % (path, sr, MIN_INPUT_RATE_HZ))
    n16 = resampled_length(len(x), sr, TOKEN_RATE_HZ)
    if n16 > MAX_SECONDS * TOKEN_RATE_HZ:
        raise VoiceError("%s: %.2f s is longer than the %g s a prompt clip may be (the speech "
                         "tokenizer's limit); cut it" % (path, n16 / TOKEN_RATE_HZ, MAX_SECONDS))
    if len(x) < MIN_SECONDS * sr:
        raise VoiceError("%s: %.3f s of audio is too short for a prompt (at least %g s)"
                         % (path, len(x) / sr, MIN_SECONDS))
    if not np.all(np.isfinite(x)):
        raise VoiceError("%s: holds samples that are not finite numbers" % path)
    return x, sr


def extract_prompt(wav_path, model_dir, tokenize=None, embed=None):
    """The zero-shot prompt of a clip. tokenize(feats [128][T]) -> tokens and
    embed(fbank [frames][80]) -> [192] default to the model directory's ONNX networks."""
    if tokenize is None:
        tok_path = os.path.join(model_dir, TOKENIZER_FILE)
        tokenize = lambda f: run_speech_tokenizer(tok_path, f)  # noqa: E731
    if embed is None:
        cam_path = os.path.join(model_dir, CAMPPLUS_FILE)
        embed = lambda f: run_campplus(cam_path, f)  # noqa: E731
    x, sr = load_clip(wav_path)
    x16 = resample(x, sr, TOKEN_RATE_HZ)
    x24 = resample(x, sr, MEL_RATE_HZ)
    tokens = tokenize(whisper_log_mel(x16))
    mel = prompt_mel(x24)
    tokens, mel = align(tokens, mel)
    if not tokens:
        raise VoiceError("%s: gives no speech tokens" % wav_path)
    emb = np.asarray(embed(kaldi_fbank(x16, wav_path)), dtype=np.float32).reshape(-1)
    return Prompt(tokens=tokens, mel=np.ascontiguousarray(mel, dtype=np.float32), embedding=emb,
                  seconds=len(x) / sr)


def prompt_text(transcript, instruction):
    """The LM's prompt text: the instruction (ending in <|endofprompt|>) and the clip's transcript;
    a transcript that already holds <|endofprompt|> brings its own instruction."""
    t = transcript.strip()
    return t if "<|endofprompt|>" in t else instruction + t
