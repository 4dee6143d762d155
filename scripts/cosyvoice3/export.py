"""Exports a published CosyVoice3 model directory as a voxmux staged pipeline.

    usage: python3 -m scripts.cosyvoice3.export MODEL_DIR OUT_DIR [--dtype float32|float16]
                                                [--device cpu|cuda] [--voice NAME=VOICE_DIR]...
                                                [--voice-wav NAME=WAV --voice-text NAME=TRANSCRIPT]...
                                                [--random-voice NAME:SECONDS]... [--flow-noise FILE]
                                                [--hift-noise FILE] [--chunk-flow] [--no-check]

MODEL_DIR is the directory as released (Fun-CosyVoice3-0.5B): cosyvoice3.yaml, llm.pt, flow.pt,
hift.pt and CosyVoice-BlankEN/ (the Qwen2 config and tokenizer files). OUT_DIR gets:

  pipeline.yaml          the manifest (docs/pipeline.md)
  lm.onnx                the LM with its key/value cache as inputs and outputs (lm.dtype)
  flow_encoder.onnx      speech tokens -> mu (token embedding and look-ahead layer)
  flow_step.onnx         one guided Euler step of the DiT, with the voice's cond and embedding
  flow_chunk.onnx        with --chunk-flow: one guided Euler step over new frames under CosyVoice's
                         streaming (chunk-causal) mask, from the keys and values of every earlier
                         frame (docs/cosyvoice3.md, "Chunk-causal flow"); the manifest's
                         flow.chunk_step names it
  vocoder.onnx           HiFT, float32, with its source phase carried between windows
  flow_noise.f32         the flow's starting noise by frame, as the reference draws it
  tokenizer/             the Qwen2 tokenizer files
  voices/NAME/           each voice's zero-shot prompt (voice.yaml, mel.f32, embedding.f32)
  speech_tokenizer_v3.onnx, campplus.onnx
                         MODEL_DIR's voice-prompt networks, copied when it has both; the manifest
                         then has a voice_encoder section, and the server makes voices from clips

Every OUT_DIR has the voice `default`: the instruction prompt alone, with no speech prompt.
--voice copies a prepared voice folder; --random-voice makes a voice of random speech tokens, mel
and embedding of the given length (for benchmarks with random weights).

--voice-wav NAME=WAV with --voice-text NAME=TRANSCRIPT (both once per voice) makes the zero-shot
voice NAME from a reference clip and what is said in it, as CosyVoice3's frontend does: speech
tokens from MODEL_DIR/speech_tokenizer_v3.onnx, the speaker embedding from MODEL_DIR/campplus.onnx
and the prompt mel, trimmed to two mel frames a token (scripts/cosyvoice3/voice.py). The voice's
text is the default instruction, "You are a helpful assistant.<|endofprompt|>", then the
transcript; a transcript that holds <|endofprompt|> is taken as the whole text, its own instruction
first. The clip is WAV (PCM, any channels, averaged; other formats when torchaudio is importable),
16 kHz or more, at most 30 s. These voices need onnxruntime and torchaudio, and are made before
the export so that a bad clip fails at once.

--flow-noise and --hift-noise replace the noise tables with float32 files (frame-major
[frames][mel] and sample-major [samples][harmonics]); the parity check uses them to give voxmux
the reference's own noise. Without them the flow noise is the reference's (seed 0, drawn as
CausalConditionalCFM draws it) and the HiFT noise comes from a fixed seed.

Then it checks the graphs it wrote against the PyTorch modules when onnxruntime is importable, and
always checks in PyTorch that chunked vocoding with the manifest's context, look-ahead and carried
phase equals a whole run.

Needs torch (1.13 or later), onnx and PyYAML (and for --voice-wav onnxruntime and torchaudio).
"""

import argparse
import copy
import os
import shutil
import sys
import time

import numpy as np
import torch

from . import net
from . import voice as cv_voice

OPSET = 17
# The instruction CosyVoice3's LM expects before <|endofprompt|> (its frontend's default).
DEFAULT_PROMPT = "You are a helpful assistant.<|endofprompt|>"
# Streaming: a small first chunk for the first audio, then larger ones.
CHUNK_TOKENS = [8, 25, 50, 100]
CONTEXT_TOKENS = 8
# Vocoder look-ahead: conv_pre reads 4 frames ahead and the inverse STFT's last samples reach into
# the next frame.
VOCODER_LOOKAHEAD = 5
# Positions of one sequence's slot in the shared cache: a prompt (voice and text) and its speech
# tokens. A segment is at most 80 text tokens (text.split), so 20 x 80 speech tokens after a
# prompt of up to 400 fit.
MAX_POSITIONS = 2048
PROMPT_TOKENS = 400
HIFT_NOISE_SAMPLES = 240000     # 10 s; the table repeats after it
HIFT_NOISE_SEED = 1986
# A clip the server makes a voice from (voice_encoder): at least this long after trimming silence,
# and at most the speech tokenizer's limit.
VOICE_MIN_SECONDS = 3
VOICE_MAX_SECONDS = 30


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def export(module, args, path, inputs, outputs, axes):
    kwargs = dict(input_names=inputs, output_names=outputs, dynamic_axes=axes, opset_version=OPSET,
                  do_constant_folding=True)
    t0 = time.time()
    with torch.no_grad():
        try:
            torch.onnx.export(module, args, path, dynamo=False, **kwargs)
        except TypeError:
            torch.onnx.export(module, args, path, **kwargs)  # torch without the dynamo= argument
    log("  wrote %s (%.0f MB, %.1f s)" % (os.path.basename(path), file_mb(path), time.time() - t0))


def file_mb(path):
    total = os.path.getsize(path)
    d = os.path.dirname(path)
    for f in os.listdir(d):  # external data written beside a graph over 2 GB
        if f.startswith(os.path.basename(path) + ".") or f.endswith(".data"):
            total += os.path.getsize(os.path.join(d, f))
    return total / 1e6


def load_models(model_dir, cfg):
    lm = net.CosyVoice3LM(cfg.lm)
    net.load_into(lm, net.load_checkpoint(os.path.join(model_dir, "llm.pt")), "llm.pt",
                  ignore=("llm.model.lm_head.", "llm.model.model.rotary_emb."))
    flow = net.CosyVoice3Flow(cfg.flow)
    net.load_into(flow, net.load_checkpoint(os.path.join(model_dir, "flow.pt")), "flow.pt")
    return lm.eval(), flow.eval(), load_hift(model_dir, cfg)


def load_hift(model_dir, cfg):
    hift = net.CosyVoice3HiFT(cfg.hift)
    net.load_into(hift, net.fold_weight_norm(net.load_checkpoint(os.path.join(model_dir, "hift.pt"))), "hift.pt")
    return hift.eval()


def read_f32(path, width):
    a = np.fromfile(path, dtype="<f4")
    if a.size % width:
        raise SystemExit("%s: %d floats is not a whole number of rows of %d" % (path, a.size, width))
    return torch.from_numpy(a.reshape(-1, width).copy())


def reference_flow_noise(mel):
    """CausalConditionalCFM's noise: seed 0, then randn([1, mel, 50 * 300]) (frame-major here)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn([1, mel, 50 * 300], generator=g)[0].t().contiguous()


def export_lm(lm, cfg, out, dtype, device, cache):
    c = cfg.lm
    if cache == "shared":
        return export_lm_shared(lm, cfg, out, dtype, device)
    names_in = ["input_ids", "position_ids", "attention_mask"]
    names_out = ["logits"]
    axes = {"input_ids": {0: "B", 1: "T"}, "position_ids": {0: "B", 1: "T"},
            "attention_mask": {0: "B", 1: "S"}, "logits": {0: "B", 1: "T"}}
    past = []
    for i in range(c.layers):
        for kind in ("key", "value"):
            names_in.append("past_%s.%d" % (kind, i))
            names_out.append("present_%s.%d" % (kind, i))
            axes["past_%s.%d" % (kind, i)] = {0: "B", 2: "P"}
            axes["present_%s.%d" % (kind, i)] = {0: "B", 2: "S"}
            past.append(torch.zeros(2, c.kv_heads, 2, c.head_dim, dtype=dtype, device=device))
    ids = torch.tensor([[5, 6, 7], [8, 9, c.text_vocab + 3]], device=device)
    pos = torch.tensor([[2, 3, 4], [2, 3, 4]], device=device)
    mask = torch.ones(2, 5, dtype=torch.int64, device=device)
    export(lm, (ids, pos, mask, *past), os.path.join(out, "lm.onnx"), names_in, names_out, axes)


def export_lm_shared(lm, cfg, out, dtype, device):
    c = cfg.lm
    names_in = ["input_ids", "seqlens_k", "total_sequence_length"]
    names_out = ["logits"]
    axes = {"input_ids": {0: "B", 1: "T"}, "seqlens_k": {0: "B"}, "logits": {0: "B", 1: "T"}}
    past = []
    P = 8  # max_positions while tracing; the engine's buffers set the real one
    for i in range(c.layers):
        for kind in ("key", "value"):
            names_in.append("past_%s.%d" % (kind, i))
            names_out.append("present_%s.%d" % (kind, i))
            axes["past_%s.%d" % (kind, i)] = {0: "B", 2: "M"}
            axes["present_%s.%d" % (kind, i)] = {0: "B", 2: "M"}
            past.append(torch.zeros(2, c.kv_heads, P, c.head_dim, dtype=dtype, device=device))
    ids = torch.tensor([[5, 6, 7], [8, 9, c.text_vocab + 3]], device=device)
    args = (ids, torch.full((2,), 2, dtype=torch.int32, device=device), torch.tensor(3, dtype=torch.int32),
            *past)
    export(net.SharedCacheLM(lm, MAX_POSITIONS).to(device), args, os.path.join(out, "lm.onnx"),
           names_in, names_out, axes)


def export_flow(flow, cfg, out, dtype, device):
    c = cfg.flow
    enc = net.FlowEncoder(flow)
    toks = torch.randint(0, c.vocab, (2, 7), device=device)
    tmask = torch.ones(2, 1, 7, device=device)
    export(enc, (toks, tmask), os.path.join(out, "flow_encoder.onnx"), ["speech_tokens", "token_mask"], ["mu"],
           {"speech_tokens": {0: "B", 1: "N"}, "token_mask": {0: "B", 2: "N"}, "mu": {0: "B", 2: "F"}})
    step = net.FlowStep(flow)
    Fr = 14
    args = (torch.randn(2, c.mel, Fr, device=device), torch.ones(2, 1, Fr, device=device),
            torch.randn(2, c.mel, Fr, device=device), torch.full((2,), 0.3, device=device),
            torch.full((1,), 0.1, device=device), torch.full((1,), c.cfg_rate, device=device),
            torch.randn(2, c.mel, Fr, device=device), torch.randn(2, c.spk_dim, device=device))
    fa = {0: "B", 2: "F"}
    export(step, args, os.path.join(out, "flow_step.onnx"),
           ["x", "mask", "mu", "t", "dt", "cfg", "cond", "embedding"], ["x_next"],
           {"x": fa, "mask": fa, "mu": fa, "cond": fa, "t": {0: "B"}, "embedding": {0: "B"}, "x_next": fa})


CHUNK_INPUTS = ["x", "mask", "mu", "cond", "start", "t", "dt", "cfg", "embedding", "past_kv"]


def chunk_flow_args(flow, B, N, P, device, seed=0):
    """Inputs of net.ChunkFlowStep for B rows of N new frames after P past frames."""
    c = flow.c
    g = torch.Generator().manual_seed(seed)
    C = net.conv_context(flow)
    W = C + N
    mask = torch.ones(B, 1, W)
    mask[:, :, :max(C - P, 0)] = 0
    inner = c.heads * c.dim_head
    dtype = next(flow.parameters()).dtype
    args = (torch.randn(B, c.mel, W, generator=g), mask, torch.randn(B, c.mel, W, generator=g),
            torch.randn(B, c.mel, W, generator=g), torch.full((B,), P, dtype=torch.int64),
            torch.full((B,), 0.3), torch.full((1,), 0.1), torch.full((1,), c.cfg_rate),
            torch.randn(B, c.spk_dim, generator=g), torch.randn(B, max(P, 1), c.depth, 4, inner, generator=g).to(dtype))
    return tuple(a.to(device) for a in args)


def export_chunk_flow(flow, out, device):
    step = net.ChunkFlowStep(flow)
    fa = {0: "B", 2: "W"}
    export(step, chunk_flow_args(flow, 2, 20, 30, device), os.path.join(out, "flow_chunk.onnx"), CHUNK_INPUTS,
           ["x_next", "present_kv"],
           {"x": fa, "mask": fa, "mu": fa, "cond": fa, "start": {0: "B"}, "t": {0: "B"}, "embedding": {0: "B"},
            "past_kv": {0: "B", 1: "P"}, "x_next": {0: "B", 2: "N"}, "present_kv": {0: "B", 1: "N"}})


def export_vocoder(hift, cfg, out):
    c = cfg.hift
    H = c.nb_harmonics + 1
    args = (torch.randn(2, c.in_channels, 20), torch.zeros(2, H), torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int64))
    export(hift, args, os.path.join(out, "vocoder.onnx"),
           ["mel", "phase", "phase_at", "sample_offset"], ["audio", "phase_out"],
           {"mel": {0: "B", 2: "F"}, "phase": {0: "B"}, "phase_at": {0: "B"}, "sample_offset": {0: "B"},
            "audio": {0: "B", 1: "L"}, "phase_out": {0: "B", 1: "F"}})


def vocoder_reach(hift, cfg):
    """Frames after a changed mel frame whose audio changes, with the source held fixed, and the
    same for a changed source: how far each path's convolutions carry a frame forwards."""
    c = cfg.hift
    hop = c.hop
    n = 96
    torch.manual_seed(1)
    mel = torch.randn(1, c.in_channels, n)
    with torch.no_grad():
        f0 = hift.f0_predictor(mel)
        s, _ = hift.source(f0, torch.zeros(1, c.nb_harmonics + 1), torch.zeros(1, dtype=torch.int64),
                           torch.zeros(1, dtype=torch.int64))
        base = hift.decode(mel, s)
        j = 20
        mel2 = mel.clone()
        mel2[:, :, j] += 1.0
        s2 = s.clone()
        s2[:, :, j * hop:(j + 1) * hop] += 0.5
        reach = []
        for a, b in ((mel2, s), (mel, s2)):
            d = (hift.decode(a, b) - base).abs().reshape(n, hop).amax(dim=1)
            changed = torch.nonzero(d > 0).flatten()
            reach.append(int(changed.max()) - j if len(changed) else 0)
    return reach


def vocoder_context(hift, cfg):
    """The left context, in frames, that a vocoder window needs for its audio to equal a whole
    run's."""
    reach_mel, reach_src = vocoder_reach(hift, cfg)
    ctx = max(reach_mel, net.F0_LEFT_FRAMES + reach_src) + 1
    log("vocoder: a mel frame reaches %d frames ahead, a source frame %d: %d frames of context"
        % (reach_mel, reach_src, ctx))
    return ctx


def run_windows(hift, mel, ctx, la, phase_at_frames, window):
    """Vocodes mel [1,C,F] as the engine does (instance/staged/vocwindow.go): windows of up to
    `window` new frames, each with ctx frames of left context, the last la frames held back until
    the next window, the phase_out of the frame before phase_at carried, reduced mod 1 and in
    float32. Returns the audio."""
    hop = hift.c.hop
    Fr = mel.shape[-1]
    out = []
    kept = 0              # frames whose audio has been emitted
    phase = torch.zeros(1, hift.c.nb_harmonics + 1, dtype=torch.float64)
    prev = None           # (window start, phase_out) of the last run
    end = 0
    while kept < Fr:
        end = min(Fr, end + window)
        last = end == Fr
        a = max(0, kept - ctx)
        at = 0 if a == 0 else phase_at_frames
        if a > 0:
            a_prev, phase_out = prev
            phase = torch.remainder(phase_out[:, a + at - 1 - a_prev].to(torch.float64), 1.0)
        with torch.no_grad():
            audio, phase_out = hift(mel[:, :, a:end], phase.to(torch.float32), torch.tensor([at]),
                                    torch.tensor([a * hop]))
        prev = (a, phase_out)
        stop = end if last else max(kept, end - la)
        out.append(audio[:, (kept - a) * hop:(stop - a) * hop])
        kept = stop
    return torch.cat(out, dim=1)


# The check's limit on |windows - whole run|. On the tiny checkpoint with F0 up to 1 kHz
# (scripts/tests/test_cosyvoice3_export.py) float32 rounding gives 1e-7; 0.01 added to one
# weight gives 5e-4, the phase summed in float32 4e-4, the phase not carried 0.1.
VOCODER_WINDOW_LIMIT = 1e-4


def check_mel(cfg, frames=150):
    """The mel the vocoder check runs: 6 s of random frames, the same for every export."""
    g = torch.Generator().manual_seed(2)
    return torch.randn(1, cfg.hift.in_channels, frames, generator=g) * 0.5


def check_vocoder_windows(hift, reference, cfg, ctx):
    """Refuses the export unless `hift`, the module the vocoder graph is exported from, run in the
    engine's windows equals one run over the whole mel of `reference`, the checkpoint's HiFT
    loaded again. Both sum the source's phase in float64 (net.CosyVoice3HiFT.source), so the
    whole run is the exact phase that the windows, each starting from the carried phase, must
    continue."""
    mel = check_mel(cfg)
    ref = copy.deepcopy(reference)
    ref.set_noise(hift.noise)
    zero = torch.zeros(1, dtype=torch.int64)
    with torch.no_grad():
        whole, _ = ref(mel, torch.zeros(1, cfg.hift.nb_harmonics + 1), zero, zero)
        f0 = ref.f0_predictor(mel)
    worst = 0.0
    for window in (16, 50, 66):
        chunked = run_windows(hift, mel, ctx, VOCODER_LOOKAHEAD, net.F0_LEFT_FRAMES, window)
        assert chunked.shape == whole.shape, (chunked.shape, whole.shape)
        worst = max(worst, float((chunked - whole).abs().max()))
    log("  vocoder in windows (context %d, look-ahead %d frames, phase carried; F0 %.0f to %.0f Hz) "
        "against a whole run: max |diff| %.2e"
        % (ctx, VOCODER_LOOKAHEAD, float(f0.min()), float(f0.max()), worst))
    if not worst <= VOCODER_WINDOW_LIMIT:
        raise SystemExit("vocoder windows differ from a whole run by %.3g (limit %g)" % (worst, VOCODER_WINDOW_LIMIT))
    return worst


def check_onnx(out, lm, flow, hift, cfg):
    try:
        import onnxruntime as ort
    except ImportError:
        log("  onnxruntime is not importable here: the graphs are checked by voxmux's tests")
        return
    so = ort.SessionOptions()
    c = cfg
    # LM: a prefill and one cached step against the module.
    s = ort.InferenceSession(os.path.join(out, "lm.onnx"), so, providers=["CPUExecutionProvider"])
    ids = torch.tensor([[1, 2, 3, c.lm.text_vocab + 4]])
    feeds = {"input_ids": ids.numpy(), "position_ids": torch.arange(4).unsqueeze(0).numpy(),
             "attention_mask": np.ones((1, 4), dtype=np.int64)}
    dt = next(lm.parameters()).dtype
    past = [torch.zeros(1, c.lm.kv_heads, 0, c.lm.head_dim, dtype=dt) for _ in range(2 * c.lm.layers)]
    for i in range(c.lm.layers):
        feeds["past_key.%d" % i] = past[2 * i].numpy()
        feeds["past_value.%d" % i] = past[2 * i + 1].numpy()
    got = s.run(["logits"], feeds)[0]
    with torch.no_grad():
        want = lm(ids, torch.arange(4).unsqueeze(0), torch.ones(1, 4, dtype=torch.int64), *past)[0]
    log("  lm.onnx against PyTorch: max |diff| %.2e" % np.abs(got - want.numpy()).max())
    chunk = os.path.join(out, "flow_chunk.onnx")
    if os.path.isfile(chunk):
        # Three chunks after 70 past frames, so the mask's chunks, the past and the context all count.
        s = ort.InferenceSession(chunk, so, providers=["CPUExecutionProvider"])
        args = chunk_flow_args(flow, 2, 150, 70, "cpu", seed=1)
        got = s.run(None, {n: a.numpy() for n, a in zip(CHUNK_INPUTS, args)})
        with torch.no_grad():
            want = net.ChunkFlowStep(flow)(*args)
        worst = max(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want))
        log("  flow_chunk.onnx against PyTorch: max |diff| %.2e" % worst)
        if worst > 1e-4:
            raise SystemExit("flow_chunk.onnx differs from the network by %.2e" % worst)


def write_voice(out, name, text, tokens, mel, embedding):
    d = os.path.join(out, "voices", name)
    os.makedirs(d, exist_ok=True)
    lines = ["# A CosyVoice3 zero-shot prompt (docs/cosyvoice3.md).",
             "text: %s" % yaml_str(text),
             "speech_tokens: [%s]" % ", ".join(str(int(t)) for t in tokens)]
    if mel is not None and len(tokens):
        np.asarray(mel, dtype="<f4").tofile(os.path.join(d, "mel.f32"))
        lines.append("mel: mel.f32")
    if embedding is not None:
        np.asarray(embedding, dtype="<f4").tofile(os.path.join(d, "embedding.f32"))
        lines.append("embedding: embedding.f32")
    with open(os.path.join(d, "voice.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")


def wav_voice_args(wavs, texts, taken):
    """[(name, wav, text)] from --voice-wav NAME=WAV and --voice-text NAME=TRANSCRIPT; an unpaired,
    repeated or malformed one is an error that names it."""
    def pairs(items, flag, what):
        got = {}
        for item in items:
            name, eq, value = item.partition("=")
            name = name.strip()
            if not eq or not name or not value.strip():
                raise SystemExit("%s %r: expected NAME=%s" % (flag, item, what))
            if "/" in name or name.startswith("."):
                raise SystemExit("%s %r: the voice name %r is not a folder name" % (flag, item, name))
            if name in got:
                raise SystemExit("%s: voice %r given twice" % (flag, name))
            got[name] = value
        return got
    w = pairs(wavs, "--voice-wav", "WAV")
    t = pairs(texts, "--voice-text", "TRANSCRIPT")
    for name in w:
        if name not in t:
            raise SystemExit("--voice-wav %s: no --voice-text %s=TRANSCRIPT (what is said in the clip)"
                             % (name, name))
        if name in taken:
            raise SystemExit("--voice-wav %s: a voice %r is already made by another flag" % (name, name))
    for name in t:
        if name not in w:
            raise SystemExit("--voice-text %s: no --voice-wav %s=WAV" % (name, name))
    return [(name, w[name], cv_voice.prompt_text(t[name], DEFAULT_PROMPT)) for name in w]


def wav_voice_prompts(model_dir, cfg, wav_voices):
    """Each clip's prompt, checked against the model's sizes; any failure stops the export."""
    want = (cv_voice.MEL_RATE_HZ, cv_voice.MEL_BINS, cv_voice.FRAMES_PER_TOKEN)
    if (cfg.sample_rate, cfg.flow.mel, cfg.flow.token_mel_ratio) != want:
        raise SystemExit("--voice-wav: the prompt features are CosyVoice3's (24 kHz, 80 mel bins, 2 frames "
                         "a token) but %s has %d Hz, %d bins, %d frames a token"
                         % (model_dir, cfg.sample_rate, cfg.flow.mel, cfg.flow.token_mel_ratio))
    if not wav_voices:
        return []
    missing = cv_voice.missing_modules()
    if missing:
        raise SystemExit("--voice-wav needs %s (the speech tokenizer and speaker networks run in "
                         "onnxruntime; the speaker network's input is torchaudio's Kaldi fbank): "
                         "install %s" % (" and ".join(missing), " ".join(missing)))
    prompts = []
    for name, wav, text in wav_voices:
        t0 = time.time()
        try:
            p = cv_voice.extract_prompt(wav, model_dir)
        except cv_voice.VoiceError as e:
            raise SystemExit("--voice-wav %s: %s" % (name, e))
        if len(p.embedding) != cfg.flow.spk_dim:
            raise SystemExit("--voice-wav %s: %s gives a %d-float embedding, the flow takes %d"
                             % (name, cv_voice.CAMPPLUS_FILE, len(p.embedding), cfg.flow.spk_dim))
        bad = [x for x in p.tokens if not 0 <= x < cfg.lm.speech_tokens]
        if bad:
            raise SystemExit("--voice-wav %s: %s gives token %d, outside 0..%d"
                             % (name, cv_voice.TOKENIZER_FILE, bad[0], cfg.lm.speech_tokens - 1))
        log("voice %s: %s, %.2f s -> %d speech tokens, %d mel frames (%.1f s)"
            % (name, wav, p.seconds, len(p.tokens), len(p.mel), time.time() - t0))
        if len(p.tokens) > PROMPT_TOKENS:
            log("  note: %d prompt tokens; the LM's slot (%d positions) is sized for prompts of up to %d"
                % (len(p.tokens), MAX_POSITIONS, PROMPT_TOKENS))
        prompts.append((name, text, p))
    return prompts


def yaml_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


MANIFEST = """\
# CosyVoice3 exported for voxmux by scripts/cosyvoice3/export.py from {source}.
# The contract: docs/pipeline.md; the model: docs/cosyvoice3.md.
kind: staged
name: {name}
sample_rate: {sample_rate}
dtype: {dtype}
voices: [{voices}]
voice_dir: voices
tokenizer:
  type: qwen2
  offset: 0
  bos: {bos}
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
  config: tokenizer/tokenizer_config.json
  special_tokens: cosyvoice3
text:
  normalize: true
  split: {{max_tokens: 80, min_tokens: 60, merge_tokens: 20}}
lm:
  file: lm.onnx
{cache}  layers: {layers}
  kv_heads: {kv_heads}
  head_dim: {head_dim}
  speech_vocab: {speech_vocab}
  speech_token_offset: {speech_offset}
  sos: {sos}
  token_rate: {token_rate}
  min_tokens_per_char: 2
  max_tokens_per_char: 20
  min_tokens_per_text_token: 2
  max_tokens_per_text_token: 20
  max_tokens: 4000
  endofprompt: 151646
  default_prompt_text: {default_prompt}
  sampling: {{top_p: {top_p}, top_k: {top_k}, window: {window}, tau_r: {tau_r}}}
flow:
  encoder: flow_encoder.onnx
  step: flow_step.onnx
  mel_bins: {mel}
  frames_per_token: {ratio}
  steps: {steps}
  cfg_strength: {cfg}
  schedule: {schedule}
  embedding_dim: {spk_dim}
  lookahead_tokens: {lookahead}
  noise: flow_noise.f32
{chunk_flow}vocoder:
  file: vocoder.onnx
  hop: {hop}
  context_frames: {voc_ctx}
  lookahead_frames: {voc_la}
  source_phase: {harmonics}
  phase_frames: {phase_frames}
streaming:
  chunk_tokens: {chunks}
  context_tokens: {ctx}
{voice_encoder}"""

CHUNK_FLOW = """\
  chunk_step: flow_chunk.onnx
  chunk_frames: {chunk}
  conv_context_frames: {ctx}
  kv_layers: {layers}
  kv_width: {width}
"""

VOICE_ENCODER = """\
voice_encoder:
  speech_tokenizer: {tokenizer}
  speaker: {speaker}
  prompt_text: {prompt}
  min_seconds: {min_s}
  max_seconds: {max_s}
"""


def copy_voice_encoder(model_dir, out):
    """Copies MODEL_DIR's voice-prompt networks into OUT; returns the manifest's voice_encoder
    section, or "" when MODEL_DIR lacks either."""
    names = (cv_voice.TOKENIZER_FILE, cv_voice.CAMPPLUS_FILE)
    present = [n for n in names if os.path.isfile(os.path.join(model_dir, n))]
    if len(present) < len(names):
        if present:
            log("voice_encoder: %s has %s but not %s; the server will not make voices from clips"
                % (model_dir, present[0], [n for n in names if n not in present][0]))
        return ""
    for n in names:
        shutil.copyfile(os.path.join(model_dir, n), os.path.join(out, n))
    log("voice_encoder: copied %s" % ", ".join(names))
    return VOICE_ENCODER.format(tokenizer=names[0], speaker=names[1], prompt=yaml_str(DEFAULT_PROMPT),
                                min_s=VOICE_MIN_SECONDS, max_s=VOICE_MAX_SECONDS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--name", default="cosyvoice3")
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                    help="the LM's and the flow's weights and cache (the vocoder stays float32)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--voice", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--voice-wav", action="append", default=[], metavar="NAME=WAV",
                    help="a zero-shot voice from a reference clip (with --voice-text NAME=...)")
    ap.add_argument("--voice-text", action="append", default=[], metavar="NAME=TRANSCRIPT",
                    help="what is said in --voice-wav NAME's clip")
    ap.add_argument("--random-voice", action="append", default=[], metavar="NAME:SECONDS")
    ap.add_argument("--flow-noise", metavar="FILE")
    ap.add_argument("--hift-noise", metavar="FILE")
    ap.add_argument("--cache", choices=["concat", "shared"], default="concat",
                    help="the LM's key/value cache contract (docs/pipeline.md): concat runs on every "
                         "provider; shared (in place, ONNX Runtime's GroupQueryAttention) is the fast "
                         "one on CUDA, which runs it in float16 only")
    ap.add_argument("--chunk-flow", action="store_true",
                    help="also write flow_chunk.onnx, the chunk-causal step over cached keys and values")
    ap.add_argument("--no-check", action="store_true")
    a = ap.parse_args()
    taken = {"default"} | {v.partition("=")[0] for v in a.voice} | {v.partition(":")[0] for v in a.random_voice}
    wav_voices = wav_voice_args(a.voice_wav, a.voice_text, taken)

    out = a.out_dir
    log("reading %s" % a.model_dir)
    cfg = net.load_config(a.model_dir)
    wav_prompts = wav_voice_prompts(a.model_dir, cfg, wav_voices)
    os.makedirs(out, exist_ok=True)
    lm, flow, hift = load_models(a.model_dir, cfg)
    H = cfg.hift.nb_harmonics + 1
    if a.hift_noise:
        hift.set_noise(read_f32(a.hift_noise, H))
    else:
        g = torch.Generator().manual_seed(HIFT_NOISE_SEED)
        hift.set_noise(torch.rand(HIFT_NOISE_SAMPLES, H, generator=g))
    noise = read_f32(a.flow_noise, cfg.flow.mel) if a.flow_noise else reference_flow_noise(cfg.flow.mel)
    noise.numpy().astype("<f4").tofile(os.path.join(out, "flow_noise.f32"))

    voc_ctx = vocoder_context(hift, cfg)
    if not a.no_check:
        check_vocoder_windows(hift, load_hift(a.model_dir, cfg), cfg, voc_ctx)

    dtype = torch.float16 if a.dtype == "float16" else torch.float32
    dev = torch.device(a.device)
    log("exporting (%s on %s)" % (a.dtype, a.device))
    export_vocoder(hift, cfg, out)
    lm.to(dev, dtype)
    flow.to(dev, dtype)
    export_lm(lm, cfg, out, dtype, dev, a.cache)
    export_flow(flow, cfg, out, dtype, dev)
    chunk_flow = ""
    if a.chunk_flow:
        export_chunk_flow(flow, out, dev)
        chunk_flow = CHUNK_FLOW.format(chunk=cfg.flow.chunk_frames, ctx=net.conv_context(flow),
                                       layers=cfg.flow.depth, width=cfg.flow.heads * cfg.flow.dim_head)
    if not a.no_check and a.device == "cpu" and dtype == torch.float32 and a.cache == "concat":
        check_onnx(out, lm, flow, hift, cfg)

    tok = os.path.join(out, "tokenizer")
    os.makedirs(tok, exist_ok=True)
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(a.model_dir, "CosyVoice-BlankEN", f), os.path.join(tok, f))

    voices = ["default"]
    write_voice(out, "default", DEFAULT_PROMPT, [], None, None)
    for v in a.voice:
        name, _, src = v.partition("=")
        shutil.copytree(src, os.path.join(out, "voices", name), dirs_exist_ok=True)
        voices.append(name)
    for v in a.random_voice:
        name, _, secs = v.partition(":")
        n = int(float(secs) * cfg.token_rate)
        g = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, cfg.flow.vocab, (n,), generator=g).tolist()
        mel = torch.randn(n * cfg.flow.token_mel_ratio, cfg.flow.mel, generator=g).numpy() - 5.0
        emb = torch.randn(cfg.flow.spk_dim, generator=g).numpy()
        write_voice(out, name, DEFAULT_PROMPT + "A sentence of random text for a random voice.", tokens, mel, emb)
        voices.append(name)
    for name, text, p in wav_prompts:
        write_voice(out, name, text, p.tokens, p.mel, p.embedding)
        voices.append(name)

    voice_encoder = copy_voice_encoder(a.model_dir, out)
    s = cfg.lm.sampling
    with open(os.path.join(out, "pipeline.yaml"), "w") as f:
        f.write(MANIFEST.format(
            cache="  cache: shared\n  max_positions: %d\n" % MAX_POSITIONS if a.cache == "shared" else "",
            source=os.path.basename(os.path.abspath(a.model_dir)), name=a.name,
            sample_rate=cfg.sample_rate, dtype=a.dtype, voices=", ".join(voices),
            bos=cfg.lm.text_vocab + cfg.lm.sos, layers=cfg.lm.layers, kv_heads=cfg.lm.kv_heads,
            head_dim=cfg.lm.head_dim, speech_vocab=cfg.lm.speech_tokens,
            speech_offset=cfg.lm.text_vocab, sos=cfg.lm.text_vocab + cfg.lm.task_id,
            token_rate=cfg.token_rate, default_prompt=yaml_str(DEFAULT_PROMPT),
            top_p=s.get("top_p") or 0.8, top_k=s.get("top_k") or 25, window=s.get("win_size") or 10,
            tau_r=s.get("tau_r") or 0.1, mel=cfg.flow.mel, ratio=cfg.flow.token_mel_ratio,
            steps=cfg.flow.steps, cfg=cfg.flow.cfg_rate, schedule=cfg.flow.schedule,
            spk_dim=cfg.flow.spk_dim, lookahead=cfg.flow.lookahead, hop=cfg.hift.hop,
            voc_ctx=voc_ctx, voc_la=VOCODER_LOOKAHEAD, harmonics=H,
            phase_frames=net.F0_LEFT_FRAMES, chunks=CHUNK_TOKENS, ctx=CONTEXT_TOKENS,
            voice_encoder=voice_encoder, chunk_flow=chunk_flow))
    log("wrote %s" % os.path.join(out, "pipeline.yaml"))


if __name__ == "__main__":
    main()
