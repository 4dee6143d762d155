"""Exports the CosyVoice3-0.5B-shaped benchmark pipeline (random weights) for voxmux.

    usage: python3 -m scripts.staged.shaped_export OUT_DIR [--dtype float16|float32] [--device cuda|cpu]
                                                   [--opset 17] [--plain] [--cache shared|concat]
                                                   [--no-verify]

Writes OUT_DIR/lm.onnx, flow_encoder.onnx, flow_estimator.onnx, flow_step.onnx (the estimator with
guidance and the Euler update), vocoder.onnx (the stage contract of docs/pipeline.md, dynamic batch
and length axes), OUT_DIR/pipeline.yaml (the manifest) and
OUT_DIR/weights.pt (the same weights as a PyTorch state dict, for scripts/staged/shaped_baseline.py). Then
it checks every graph with ONNX Runtime against the PyTorch modules: shapes, dtypes, masking of
padded items, that a padded batch gives each item what it gets alone, that KV-cache decoding
equals a whole-sequence prefill, and that chunked vocoding with the manifest's context equals a
whole run.

By default the attention, RoPE, RMSNorm and GELU of the LM and the DiT are written as ONNX Runtime's
fused operators (RotaryEmbedding, MultiHeadAttention, SimplifiedLayerNormalization, FastGelu;
scripts/staged/shaped_net.py says why); --plain writes them in standard ONNX operators only, which every
ONNX runtime can load.

Needs torch, onnx and onnxruntime (onnxruntime-gpu for the CUDA check); runs on a GPU host. The
.onnx files are large (about 2 GB in float16) and are never committed.
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

from . import shaped_net as cs

# Manifest values. Random weights almost never make end of speech the most likely token, so every
# request runs to max_tokens_per_char: 25 tokens/s / 2.0833 tokens/char = 12 characters of text per
# second of audio, about the pace of English speech. The minimum only matters if the LM stops early.
MIN_TOKENS_PER_CHAR = 2.0
MAX_TOKENS_PER_CHAR = 2.0833
MAX_TOKENS = 4000
STEPS = 10              # CosyVoice3 flow: n_timesteps=10, Euler
CFG_STRENGTH = 0.7      # CosyVoice3 inference_cfg_rate
# Streaming chunks: a small first one for the first audio, then at most doubling, so each chunk's
# audio (40 ms a token) lasts while the next one's tokens are decoded at up to 20 ms a step.
# H100 (voxmux 5d6eabf): against [15, 50, 100], first audio at 1 stream 231 -> 159 ms P50 and P95 at
# 64 streams 1201 -> 892 ms, for 5% less throughput at 256 streams (113 -> 108x).
CHUNK_TOKENS = [8, 25, 50, 100]
# Positions of one sequence's slot in the shared cache: a prompt and its speech tokens; text of up
# to about 600 characters (Latin script) fits. 25 MB of float16 cache per sequence.
MAX_POSITIONS = 2048


def context_tokens():
    """Tokens of left context whose mel frames cover the vocoder's receptive field."""
    return math.ceil(cs.vocoder_receptive_field_frames() / cs.FRAMES_PER_TOKEN)


MANIFEST = """\
# CosyVoice3-0.5B-shaped pipeline with random weights, for benchmarks (its audio is noise).
# Made by scripts/staged/shaped_export.py; dimensions and sources: docs/benchmarks/model.md.
kind: staged
name: cosyvoice3-shaped
sample_rate: {sample_rate}
dtype: {dtype}
voices: [default]
tokenizer:
  type: bytes
  offset: {text_offset}
  bos: {bos}
lm:
  file: lm.onnx
{cache}  layers: {layers}
  kv_heads: {kv_heads}
  head_dim: {head_dim}
  speech_vocab: {speech_vocab}
  speech_token_offset: {speech_token_offset}
  sos: {sos}
  token_rate: {token_rate}
  min_tokens_per_char: {min_tpc}   # random weights never pick end of speech, so requests run to
  max_tokens_per_char: {max_tpc}   # the maximum: 25 / {max_tpc} = 12 characters per second of audio
  max_tokens: {max_tokens}
flow:
  encoder: flow_encoder.onnx
  estimator: flow_estimator.onnx
  step: flow_step.onnx       # guidance and the Euler update in the graph: the engine keeps the sample on the GPU
  mel_bins: {mel_bins}
  frames_per_token: {fpt}
  steps: {steps}
  cfg_strength: {cfg}
  # ONNX Runtime's CUDA kernels index with 32 bits; past this a run's largest tensor passes 2^31 values
  max_batch_frames: {max_frames}
vocoder:
  file: vocoder.onnx
  hop: {hop}
streaming:
  chunk_tokens: [{chunks}]
  context_tokens: {context}   # {context_frames} mel frames cover the vocoder's receptive field ({rf} frames)
"""


def write_manifest(out_dir, dtype_name, cache):
    ctx = context_tokens()
    cache_lines = ""
    if cache == "shared":
        cache_lines = "  cache: shared              # one in-place buffer per layer (GroupQueryAttention)\n" \
                      "  max_positions: %d        # prompt and speech tokens of one request\n" % MAX_POSITIONS
    text = MANIFEST.format(
        cache=cache_lines,
        sample_rate=cs.SAMPLE_RATE, dtype=dtype_name, text_offset=cs.TEXT_OFFSET, bos=cs.BOS,
        layers=cs.LM_LAYERS, kv_heads=cs.LM_KV_HEADS, head_dim=cs.LM_HEAD_DIM,
        speech_vocab=cs.SPEECH_VOCAB, speech_token_offset=cs.SPEECH_TOKEN_OFFSET, sos=cs.SOS,
        token_rate=cs.TOKEN_RATE, min_tpc=MIN_TOKENS_PER_CHAR, max_tpc=MAX_TOKENS_PER_CHAR,
        max_tokens=MAX_TOKENS, mel_bins=cs.MEL_BINS, fpt=cs.FRAMES_PER_TOKEN, steps=STEPS,
        cfg=CFG_STRENGTH, max_frames=cs.flow_max_batch_frames(), hop=cs.HOP,
        chunks=", ".join(str(c) for c in CHUNK_TOKENS),
        context=ctx, context_frames=ctx * cs.FRAMES_PER_TOKEN, rf=cs.vocoder_receptive_field_frames())
    path = os.path.join(out_dir, "pipeline.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def size_of(path):
    return "%.1f MB" % (os.path.getsize(path) / 1e6)


# ---------------------------------------------------------------------------------------------
# Export


def export_graph(module, args, path, inputs, outputs, dynamic_axes, opset, fused):
    kwargs = dict(input_names=inputs, output_names=outputs, dynamic_axes=dynamic_axes,
                  opset_version=opset, do_constant_folding=True)
    if fused:
        kwargs["custom_opsets"] = {cs.MS_DOMAIN: 1}
    try:
        # The TorchScript exporter traces the KV-cache graph exactly as written; the dynamo one
        # needs onnxscript and guards on the loops.
        torch.onnx.export(module, args, path, dynamo=False, **kwargs)
    except TypeError:
        torch.onnx.export(module, args, path, **kwargs)  # a torch without the dynamo= argument
    except Exception as e:
        # ONNX's checker does not know SimplifiedLayerNormalization, which ONNX Runtime defines in
        # the default domain; the exporter has written the file before it checks.
        if not (fused and type(e).__name__ == "CheckerError" and os.path.exists(path)):
            raise
        log("  (ONNX's checker does not know ONNX Runtime's own operators; ONNX Runtime checks them at load)")
    if fused:
        import onnx
        model = onnx.load(path)
        if cs.fix_attention_inputs(model) + cs.fix_norm_outputs(model):
            onnx.save(model, path)


class F32IO(torch.nn.Module):
    """Float32 in and out around a module that computes in dtype: the flow and vocoder graphs take
    and give float32 (docs/pipeline.md), and cast to float16 inside, on the GPU."""

    def __init__(self, module, dtype):
        super().__init__()
        self.m = module
        self.dtype = dtype

    def forward(self, *args):
        args = [a.to(self.dtype) if a.is_floating_point() else a for a in args]
        out = self.m(*args)
        return out.to(torch.float32)


def export_all(models, out_dir, dtype, device, opset, fused, cache, only=None):
    lm = models.lm
    enc, est, voc = (F32IO(m, dtype) for m in (models.flow_encoder, models.flow_estimator, models.vocoder))
    step = cs.FlowStep(models.flow_estimator, dtype)
    lm_dtype, dtype = dtype, torch.float32  # only the LM's cache is in the model's dtype
    B, T, P = 2, 3, 5
    past = []
    for _ in range(2 * cs.LM_LAYERS):
        # Distinct tensors: the tracer would merge inputs that are one and the same object.
        past.append(torch.randn(B, cs.LM_KV_HEADS, P, cs.LM_HEAD_DIM, device=device, dtype=lm_dtype))
    lm_args = (torch.randint(0, cs.LM_VOCAB, (B, T), device=device),
               (P + torch.arange(T, device=device)).unsqueeze(0).expand(B, T).contiguous(),
               torch.ones(B, P + T, dtype=torch.int64, device=device), *past)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "total_seq"}, "logits": {0: "batch", 1: "seq"}}
    for n in range(cs.LM_LAYERS):
        for kind in ("key", "value"):
            axes["past_%s.%d" % (kind, n)] = {0: "batch", 2: "past_seq"}
            axes["present_%s.%d" % (kind, n)] = {0: "batch", 2: "total_seq"}
    lm_job = ("lm.onnx", lm, lm_args, cs.lm_input_names(), cs.lm_output_names(), axes)
    if cache == "shared":
        P = 8  # max_positions while tracing
        past = [torch.randn(B, cs.LM_KV_HEADS, P, cs.LM_HEAD_DIM, device=device, dtype=lm_dtype)
                for _ in range(2 * cs.LM_LAYERS)]
        args = (torch.randint(0, cs.LM_VOCAB, (B, T), device=device),
                torch.full((B,), T - 1, dtype=torch.int32, device=device),
                torch.tensor(T, dtype=torch.int32), *past)
        axes = {"input_ids": {0: "batch", 1: "seq"}, "seqlens_k": {0: "batch"},
                "logits": {0: "batch", 1: "seq"}}
        for n in range(cs.LM_LAYERS):
            for kind in ("past_key", "past_value", "present_key", "present_value"):
                axes["%s.%d" % (kind, n)] = {0: "batch", 2: "max_positions"}
        lm_job = ("lm.onnx", cs.SharedCacheLM(lm), args, cs.lm_shared_input_names(),
                  cs.lm_output_names(), axes)
    jobs = [
        lm_job,
        ("flow_encoder.onnx", enc,
         (torch.randint(0, cs.SPEECH_VOCAB, (B, 7), device=device),
          torch.ones(B, 1, 7, device=device, dtype=dtype)),
         ["speech_tokens", "token_mask"], ["mu"],
         {"speech_tokens": {0: "batch", 1: "tokens"}, "token_mask": {0: "batch", 2: "tokens"},
          "mu": {0: "batch", 2: "frames"}}),
        ("flow_estimator.onnx", est,
         (torch.randn(B, cs.MEL_BINS, 14, device=device, dtype=dtype),
          torch.ones(B, 1, 14, device=device, dtype=dtype),
          torch.randn(B, cs.MEL_BINS, 14, device=device, dtype=dtype),
          torch.rand(B, device=device, dtype=dtype)),
         ["x", "mask", "mu", "t"], ["velocity"],
         {"x": {0: "batch", 2: "frames"}, "mask": {0: "batch", 2: "frames"},
          "mu": {0: "batch", 2: "frames"}, "t": {0: "batch"}, "velocity": {0: "batch", 2: "frames"}}),
        ("flow_step.onnx", step,
         (torch.randn(B, cs.MEL_BINS, 14, device=device, dtype=dtype),
          torch.ones(B, 1, 14, device=device, dtype=dtype),
          torch.randn(B, cs.MEL_BINS, 14, device=device, dtype=dtype),
          torch.rand(B, device=device, dtype=dtype),
          torch.tensor([0.1], device=device, dtype=dtype),
          torch.tensor([CFG_STRENGTH], device=device, dtype=dtype)),
         ["x", "mask", "mu", "t", "dt", "cfg"], ["x_next"],
         {"x": {0: "batch", 2: "frames"}, "mask": {0: "batch", 2: "frames"},
          "mu": {0: "batch", 2: "frames"}, "t": {0: "batch"}, "x_next": {0: "batch", 2: "frames"}}),
        ("vocoder.onnx", voc, (torch.randn(B, cs.MEL_BINS, 9, device=device, dtype=dtype),),
         ["mel"], ["audio"], {"mel": {0: "batch", 2: "frames"}, "audio": {0: "batch", 1: "samples"}}),
    ]
    for name, module, args, inputs, outputs, dyn in jobs:
        if only is not None and name not in only:
            continue
        path = os.path.join(out_dir, name)
        log("exporting %s (%d parameters) ..." % (name, cs.count_params(module)))
        with torch.no_grad():
            export_graph(module, args, path, inputs, outputs, dyn, opset, fused)
        log("wrote %s: %s" % (path, size_of(path)))


# ---------------------------------------------------------------------------------------------
# Verification


class Checker:
    def __init__(self, fp16):
        self.tol = 3e-2 if fp16 else 2e-3
        self.failures = []

    def close(self, what, got, want, tol=None):
        """max |got - want| within tol x max(1, max |want|)."""
        tol = self.tol if tol is None else tol
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            self.fail("%s: shape %s, want %s" % (what, got.shape, want.shape))
            return
        scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
        err = float(np.abs(got - want).max()) if want.size else 0.0
        ok = np.isfinite(got).all() and err <= tol * scale
        log("  %-4s %s: max error %.3g (scale %.3g)" % ("ok" if ok else "FAIL", what, err, scale))
        if not ok:
            self.failures.append(what)

    def true(self, what, cond, detail=""):
        log("  %-4s %s %s" % ("ok" if cond else "FAIL", what, detail))
        if not cond:
            self.failures.append(what)

    def fail(self, what):
        log("  FAIL " + what)
        self.failures.append(what)


def ort_session(path, provider):
    import onnxruntime as ort
    available = ort.get_available_providers()
    if provider == "cuda":
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    elif provider == "cpu":
        providers = ["CPUExecutionProvider"]
    else:
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=providers)


def to_np(t):
    return t.detach().cpu().numpy()


def lm_ort_step(sess, np_dtype, seqs, tokens):
    """One batched LM run the way voxmux's engine does it: right-padded inputs, each sequence's
    cache padded to the longest with masked slots. seqs are dicts {"past": [arrays [H,pos,D]],
    "pos": int}; returns each sequence's last logits and updates the caches."""
    B = len(seqs)
    H, D, L = cs.LM_KV_HEADS, cs.LM_HEAD_DIM, cs.LM_LAYERS
    T = max(len(t) for t in tokens)
    P = max(s["pos"] for s in seqs)
    ids = np.zeros((B, T), np.int64)
    pos = np.zeros((B, T), np.int64)
    mask = np.zeros((B, P + T), np.int64)
    for b, s in enumerate(seqs):
        pos[b] = s["pos"] + np.arange(T)
        ids[b, :len(tokens[b])] = tokens[b]
        mask[b, P:P + len(tokens[b])] = 1
        mask[b, :s["pos"]] = 1
    feed = {"input_ids": ids, "position_ids": pos, "attention_mask": mask}
    for i in range(2 * L):
        buf = np.zeros((B, H, P, D), np_dtype)
        for b, s in enumerate(seqs):
            buf[b, :, :s["pos"]] = s["past"][i]
        feed["past_%s.%d" % ("key" if i % 2 == 0 else "value", i // 2)] = buf
    outs = sess.run(None, feed)
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, outs))
    last = []
    for b, s in enumerate(seqs):
        n = len(tokens[b])
        last.append(got["logits"][b, n - 1])
        for i in range(2 * L):
            pres = got["present_%s.%d" % ("key" if i % 2 == 0 else "value", i // 2)][b]
            s["past"][i] = np.concatenate([pres[:, :s["pos"]], pres[:, P:P + n]], axis=1)
        s["pos"] += n
    return last


def new_seq():
    return {"past": [np.zeros((cs.LM_KV_HEADS, 0, cs.LM_HEAD_DIM))] * (2 * cs.LM_LAYERS), "pos": 0}


def lm_reference(lm, device, dtype):
    """The LM checks' sequences, and PyTorch's last logits for the whole of them in one prefill."""
    prompt = cs.tokenize("Hello world.")
    short = cs.tokenize("你好")
    speech = [cs.SPEECH_TOKEN_OFFSET + k for k in (17, 4000, 6560, 0)]
    full = prompt + speech
    args = [torch.tensor([full], device=device), torch.arange(len(full), device=device).unsqueeze(0),
            torch.ones(1, len(full), dtype=torch.int64, device=device)]
    args += [torch.zeros(1, cs.LM_KV_HEADS, 0, cs.LM_HEAD_DIM, device=device, dtype=dtype)] * (2 * cs.LM_LAYERS)
    with torch.no_grad():
        want = to_np(lm(*args)[0][0, -1])
    return prompt, short, speech, full, want


def verify_lm(chk, sess, lm, device, dtype, np_dtype):
    log("checking lm.onnx")
    for o in sess.get_outputs():
        if o.name == "logits":
            chk.true("logits are float32", o.type == "tensor(float)", o.type)
    prompt, short, speech, full, want = lm_reference(lm, device, dtype)

    # ONNX Runtime against PyTorch on the same whole-sequence prefill.
    s = new_seq()
    got_prefill = lm_ort_step(sess, np_dtype, [s], [full])[0]
    chk.close("prefill logits, ONNX Runtime vs PyTorch", got_prefill, want)

    # KV-cache decoding: prompt, then one token at a time, ends on the same logits.
    s = new_seq()
    lm_ort_step(sess, np_dtype, [s], [prompt])
    for tok in speech:
        got = lm_ort_step(sess, np_dtype, [s], [[tok]])[0]
    chk.close("KV-cache decode vs whole prefill", got, got_prefill)
    chk.true("cache length after decode", s["pos"] == len(full), "%d" % s["pos"])

    # A padded batch: a short prompt beside a long one, then decode steps with caches of
    # different lengths, gives each sequence what it gets alone.
    a, b = new_seq(), new_seq()
    la, lb = lm_ort_step(sess, np_dtype, [a, b], [prompt, short])
    alone_b = new_seq()
    chk.close("padded prefill vs alone", lb, lm_ort_step(sess, np_dtype, [alone_b], [short])[0])
    alone_a = new_seq()
    lm_ort_step(sess, np_dtype, [alone_a], [prompt])
    for tok in speech[:2]:
        ga, gb = lm_ort_step(sess, np_dtype, [a, b], [[tok], [tok]])
        wa = lm_ort_step(sess, np_dtype, [alone_a], [[tok]])[0]
        wb = lm_ort_step(sess, np_dtype, [alone_b], [[tok]])[0]
    chk.close("padded decode vs alone (longer cache)", ga, wa)
    chk.close("padded decode vs alone (shorter cache)", gb, wb)
    eos_rank = int((want > want[cs.END_OF_SPEECH]).sum())
    log("  note: end of speech ranks %d of %d in these logits (random weights rarely stop)" % (eos_rank + 1, want.size))


def lm_shared_run(sess, seqs, tokens):
    """One LM run with the shared cache contract: rows of T tokens each; seqs are dicts
    {"cache": [arrays [H,max_positions,D]], "pos": int}. Python's run gives presents in new
    memory (ONNX Runtime then copies the past into them); voxmux binds them in place."""
    T = len(tokens[0])
    ids = np.array(tokens, np.int64)
    seqlens = np.array([s["pos"] + T - 1 for s in seqs], np.int32)
    feed = {"input_ids": ids, "seqlens_k": seqlens,
            "total_sequence_length": np.array(int(seqlens.max()) + 1, np.int32)}
    for i in range(2 * cs.LM_LAYERS):
        name = "past_%s.%d" % ("key" if i % 2 == 0 else "value", i // 2)
        feed[name] = np.stack([s["cache"][i] for s in seqs])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    for b, s in enumerate(seqs):
        for i in range(2 * cs.LM_LAYERS):
            s["cache"][i] = got["present_%s.%d" % ("key" if i % 2 == 0 else "value", i // 2)][b]
        s["pos"] += T
    return [got["logits"][b, T - 1] for b in range(len(seqs))]


def verify_lm_shared(chk, sess, lm, device, dtype, np_dtype):
    log("checking lm.onnx (shared cache)")
    maxp = 64

    def new():
        return {"cache": [np.zeros((cs.LM_KV_HEADS, maxp, cs.LM_HEAD_DIM), np_dtype)] * (2 * cs.LM_LAYERS),
                "pos": 0}

    prompt, short, speech, full, want = lm_reference(lm, device, dtype)
    got_prefill = lm_shared_run(sess, [new()], [full])[0]
    chk.close("prefill logits, ONNX Runtime vs PyTorch", got_prefill, want)

    s = new()
    lm_shared_run(sess, [s], [prompt])
    for tok in speech:
        got = lm_shared_run(sess, [s], [[tok]])[0]
    chk.close("KV-cache decode vs whole prefill", got, got_prefill)

    # Two rows of different lengths decode in one batch, each as it does alone.
    a, b, alone_a, alone_b = new(), new(), new(), new()
    for seq, p in ((a, prompt), (b, short), (alone_a, prompt), (alone_b, short)):
        lm_shared_run(sess, [seq], [p])
    for tok in speech[:2]:
        ga, gb = lm_shared_run(sess, [a, b], [[tok], [tok]])
        wa = lm_shared_run(sess, [alone_a], [[tok]])[0]
        wb = lm_shared_run(sess, [alone_b], [[tok]])[0]
    chk.close("batched decode vs alone (longer sequence)", ga, wa)
    chk.close("batched decode vs alone (shorter sequence)", gb, wb)


def verify_flow(chk, enc_sess, est_sess, enc, est, device, dtype, np_dtype):
    log("checking flow_encoder.onnx and flow_estimator.onnx")
    rng = np.random.default_rng(1)
    toks = rng.integers(0, cs.SPEECH_VOCAB, size=(2, 9)).astype(np.int64)
    tmask = np.ones((2, 1, 9), np_dtype)
    tmask[1, :, 5:] = 0
    toks[1, 5:] = 0
    mu = enc_sess.run(None, {"speech_tokens": toks, "token_mask": tmask})[0]
    chk.true("mu shape [B, 80, 2N]", mu.shape == (2, cs.MEL_BINS, 18), str(mu.shape))
    chk.true("mu dtype", mu.dtype == np_dtype, str(mu.dtype))
    chk.true("mu is zero at padded frames", np.all(mu[1, :, 10:] == 0))
    alone = enc_sess.run(None, {"speech_tokens": toks[1:, :5], "token_mask": tmask[1:, :, :5]})[0]
    chk.close("mu: padded batch vs alone", mu[1, :, :10], alone[0])
    with torch.no_grad():
        want = to_np(enc(torch.from_numpy(toks).to(device), torch.from_numpy(tmask).to(device)))
    chk.close("mu: ONNX Runtime vs PyTorch", mu, want)

    F = 18
    x = rng.standard_normal((2, cs.MEL_BINS, F)).astype(np_dtype)
    mask = np.ones((2, 1, F), np_dtype)
    mask[1, :, 10:] = 0
    x[1, :, 10:] = 0
    t = np.array([0.3, 0.3], np_dtype)
    v = est_sess.run(None, {"x": x, "mask": mask, "mu": mu, "t": t})[0]
    chk.true("velocity shape", v.shape == x.shape, str(v.shape))
    chk.true("velocity is zero at padded frames", np.all(v[1, :, 10:] == 0))
    alone = est_sess.run(None, {"x": x[1:, :, :10], "mask": mask[1:, :, :10], "mu": mu[1:, :, :10], "t": t[1:]})[0]
    chk.close("velocity: padded batch vs alone", v[1, :, :10], alone[0])
    with torch.no_grad():
        want = to_np(est(*(torch.from_numpy(a).to(device) for a in (x, mask, mu, t))))
    chk.close("velocity: ONNX Runtime vs PyTorch", v, want)


def verify_flow_step(chk, step_sess, est_sess, step, device):
    """flow_step.onnx against the estimator graph with the engine's host update, alone against
    padded, and against PyTorch."""
    log("checking flow_step.onnx")
    rng = np.random.default_rng(2)
    F = 18
    x = rng.standard_normal((2, cs.MEL_BINS, F)).astype(np.float32)
    mask = np.ones((2, 1, F), np.float32)
    mask[1, :, 10:] = 0
    x[1, :, 10:] = 0
    mu = (rng.standard_normal((2, cs.MEL_BINS, F)) * mask).astype(np.float32)
    t = np.array([0.4, 0.4], np.float32)
    dt = np.array([0.1], np.float32)
    cfg = np.array([CFG_STRENGTH], np.float32)
    feed = {"x": x, "mask": mask, "mu": mu, "t": t, "dt": dt, "cfg": cfg}
    got = step_sess.run(None, feed)[0]
    chk.true("x_next shape", got.shape == x.shape, str(got.shape))
    v = est_sess.run(None, {"x": np.concatenate((x, x)), "mask": np.concatenate((mask, mask)),
                            "mu": np.concatenate((mu, np.zeros_like(mu))), "t": np.concatenate((t, t))})[0]
    chk.close("x_next: step graph vs estimator graph and the host's update", got,
              x + dt * ((1 + cfg) * v[:2] - cfg * v[2:]))
    alone = step_sess.run(None, {"x": x[1:, :, :10], "mask": mask[1:, :, :10], "mu": mu[1:, :, :10],
                                 "t": t[1:], "dt": dt, "cfg": cfg})[0]
    chk.close("x_next: padded batch vs alone", got[1, :, :10], alone[0])
    with torch.no_grad():
        want = to_np(step(*(torch.from_numpy(a).to(device) for a in (x, mask, mu, t, dt, cfg))))
    chk.close("x_next: ONNX Runtime vs PyTorch", got, want)


def verify_vocoder(chk, sess, voc, device, dtype, np_dtype, context):
    log("checking vocoder.onnx")
    for o in sess.get_outputs():
        chk.true("audio is float32", o.type == "tensor(float)", o.type)
    rng = np.random.default_rng(2)
    F, real = 80, 50
    mel = rng.standard_normal((2, cs.MEL_BINS, F)).astype(np_dtype)
    mel[1, :, real:] = 0
    audio = sess.run(None, {"mel": mel})[0]
    chk.true("audio shape [B, F*480]", audio.shape == (2, F * cs.HOP), str(audio.shape))
    rms = float(np.sqrt((audio[0].astype(np.float64) ** 2).mean()))
    chk.true("audio level", 0.01 < rms < 0.9, "RMS %.3f" % rms)
    alone = sess.run(None, {"mel": mel[1:, :, :real]})[0]
    chk.close("audio: padded batch vs alone", audio[1, :real * cs.HOP], alone[0])
    with torch.no_grad():
        want = to_np(F32IO(voc, dtype)(torch.from_numpy(mel).to(device)))
    chk.close("audio: ONNX Runtime vs PyTorch", audio, want)

    # Chunked vocoding, as the engine does it at a chunk edge: the chunk's frames with `context`
    # frames of left context, keeping the chunk's samples.
    s = 45
    assert s > context, "the chunk test needs a chunk that starts after the context"
    part = sess.run(None, {"mel": mel[:1, :, s - context:]})[0]
    chk.close("chunk with %d context frames vs whole run" % context, part[0, context * cs.HOP:], audio[0, s * cs.HOP:])

    # The receptive field measured in float32 on the CPU: perturb frame 0 and find the last
    # sample that moves.
    v32 = cs.Vocoder()
    v32.load_state_dict({k: p.float().cpu() for k, p in voc.state_dict().items()})
    with torch.no_grad():
        base = torch.from_numpy(rng.standard_normal((1, cs.MEL_BINS, F)).astype(np.float32))
        moved = base.clone()
        moved[:, :, 0] += 1.0
        diff = (v32(moved) - v32(base)).abs()[0]
    last = int(torch.nonzero(diff > 0).max()) if bool((diff > 0).any()) else 0
    measured = last // cs.HOP
    chk.true("receptive field %d frames (measured) within the manifest's context of %d frames"
             % (measured, context), measured <= context)


def checks_on_cpu(provider):
    import onnxruntime as ort
    return provider == "cpu" or (provider == "auto" and "CUDAExecutionProvider" not in ort.get_available_providers())


def verify(out_dir, models, device, dtype, provider, cache, estimator=None, step=None):
    import onnxruntime as ort
    fp16 = dtype == torch.float16
    np_dtype = np.float16 if fp16 else np.float32
    chk = Checker(fp16)
    log("verifying with ONNX Runtime %s (%s)" % (ort.__version__, ", ".join(ort.get_available_providers())))
    sess = {n: ort_session(os.path.join(out_dir, n + ".onnx"), provider)
            for n in ("lm", "flow_encoder", "flow_estimator", "flow_step", "vocoder")
            if not (n == "flow_estimator" and estimator) and not (n == "flow_step" and step)}
    if estimator:
        sess["flow_estimator"] = ort_session(estimator, provider)
    if step:
        sess["flow_step"] = ort_session(step, provider)
    log("  sessions run on %s" % sess["lm"].get_providers()[0])
    if cache == "shared":
        verify_lm_shared(chk, sess["lm"], models.lm, device, dtype, np_dtype)
    else:
        verify_lm(chk, sess["lm"], models.lm, device, dtype, np_dtype)
    # Flow and vocoder take and give float32 whatever the model's dtype (F32IO).
    verify_flow(chk, sess["flow_encoder"], sess["flow_estimator"], F32IO(models.flow_encoder, dtype),
                F32IO(models.flow_estimator, dtype), device, torch.float32, np.float32)
    verify_flow_step(chk, sess["flow_step"], sess["flow_estimator"], cs.FlowStep(models.flow_estimator, dtype), device)
    verify_vocoder(chk, sess["vocoder"], models.vocoder, device, dtype, np.float32,
                   context_tokens() * cs.FRAMES_PER_TOKEN)
    return chk.failures


def relative_error(got, want):
    """Largest absolute difference over the largest magnitude of want."""
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-6)).item()


def require_close(what, err, tol, against="the plain form"):
    """Stops the export when a fused form (what) is further than tol from the form it replaces."""
    if err > tol:
        raise SystemExit("%s differs from %s: relative error %.3g" % (what, against, err))
    log("%s equals %s (relative error %.1e)" % (what, against, err))


def check_matmul_convs(models):
    """The export writes the flow's convolutions as matrix products (cs.conv1d_as_matmul): they
    must equal nn.Conv1d. Float32 on the CPU, before the modules move; a wrong export stops here."""
    g = torch.Generator().manual_seed(3)
    toks = torch.randint(0, cs.SPEECH_VOCAB, (2, 11), generator=g)
    tmask = torch.ones(2, 1, 11)
    tmask[1, :, 6:] = 0
    h = torch.randn(2, 37, cs.DIT_DIM, generator=g)
    fmask = torch.ones(2, 37, 1)
    fmask[1, 20:] = 0
    worst = 0.0
    with torch.no_grad():
        for mod, args in ((models.flow_encoder, (toks, tmask)), (models.flow_estimator.pos_conv, (h, fmask))):
            mod.fused = False
            want = mod(*args)
            mod.fused = True
            got = mod(*args)
            mod.fused = False
            worst = max(worst, relative_error(got, want))
    require_close("flow convolutions as matrix products (against nn.Conv1d)", worst, 1e-5)


def estimator_inputs(seed, t):
    """Estimator inputs for the float32 checks: two items of 24 frames, the second padded after
    16, both at flow time t."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, cs.MEL_BINS, 24, generator=g)
    mu = torch.randn(2, cs.MEL_BINS, 24, generator=g)
    mask = torch.ones(2, 1, 24)
    mask[1, :, 16:] = 0
    return x, mask, mu, torch.tensor([t, t])


def check_shared_time(est, skip_norms):
    """With one flow time for the batch, the fused estimator (modulation folded into the layer
    norms, gates into the output projections; with skip_norms, residual adds fused into the norms
    as well) must equal the plain one. Float32 on the CPU."""
    x, mask, mu, t = estimator_inputs(4, 0.3)
    with torch.no_grad():
        want = est(x, mask, mu, t)
        cs.use_fused(est, True)
        est.shared_time, est.skip_norms = True, skip_norms
        got = est(x, mask, mu, t)
        cs.use_fused(est, False)
        est.shared_time = est.skip_norms = False
    require_close("flow estimator with a shared flow time", relative_error(got, want), 1e-4)


def check_qkv_attention(est):
    """The DiT with its attention as one operator (QKVAttentionOp: projection, RoPE and attention)
    must equal the split form. Float32 on the CPU."""
    x, mask, mu, t = estimator_inputs(6, 0.6)
    with torch.no_grad():
        cs.use_fused(est, True)
        want = est(x, mask, mu, t)
        cs.use_qkv_attention(est, True)
        got = est(x, mask, mu, t)
        cs.use_qkv_attention(est, False)
        cs.use_fused(est, False)
    require_close("flow attention as one Attention operator", relative_error(got, want), 1e-5,
                  against="the split form")


def check_skip_norms_lm(lm):
    """The LM with its residual adds fused into the norms (concat cache) must equal the plain
    one: logits and caches. Float32 on the CPU."""
    g = torch.Generator().manual_seed(5)
    B, T, P = 2, 4, 3
    ids = torch.randint(0, cs.LM_VOCAB, (B, T), generator=g)
    pos = (P + torch.arange(T)).unsqueeze(0).expand(B, T)
    mask = torch.ones(B, P + T, dtype=torch.int64)
    mask[1, 0] = 0
    past = [torch.randn(B, cs.LM_KV_HEADS, P, cs.LM_HEAD_DIM, generator=g) for _ in range(2 * cs.LM_LAYERS)]
    with torch.no_grad():
        want = lm(ids, pos, mask, *past)
        cs.use_fused(lm, True)
        lm.skip_norms = True
        got = lm(ids, pos, mask, *past)
        cs.use_fused(lm, False)
        lm.skip_norms = False
    require_close("LM with residual adds fused into the norms",
                  max(relative_error(a, b) for a, b in zip(got, want)), 1e-4)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the modules run while tracing (default: cuda when available)")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--provider", choices=["auto", "cuda", "cpu"], default="auto",
                    help="ONNX Runtime provider for the checks")
    ap.add_argument("--seed", type=int, default=cs.SEED)
    ap.add_argument("--plain", action="store_true",
                    help="standard ONNX operators only (no ONNX Runtime fused operators)")
    ap.add_argument("--cache", choices=["concat", "shared"], default="shared",
                    help="the LM's key/value cache contract (docs/pipeline.md): shared (in place, "
                         "GroupQueryAttention), whose decode steps voxmux runs as CUDA graphs, or "
                         "concat, copied every step and never run as CUDA graphs (for comparisons)")
    ap.add_argument("--flow-convs", choices=["matmul", "conv"], default="matmul",
                    help="the flow's convolutions as gather + matrix product (default) or as ONNX Conv "
                         "(cuDNN; for comparisons)")
    ap.add_argument("--flow-time", choices=["shared", "per-item"], default="shared",
                    help="the flow estimator takes the first item's flow time for the whole batch, as "
                         "voxmux runs it, so the AdaLN modulation folds into the layer norms (default), "
                         "or one per item (for comparisons)")
    ap.add_argument("--norms", choices=["skip", "separate"], default="skip",
                    help="each residual add fused into the norm after it, with the projection bias "
                         "before it (ONNX Runtime's SkipLayerNormalization and "
                         "SkipSimplifiedLayerNormalization; default), or add and norm as separate "
                         "nodes (for comparisons). The flow's fusion needs --flow-time shared")
    ap.add_argument("--dit-attention", choices=["qkv", "split"], default="qkv",
                    help="the DiT's q/k/v projection, RoPE and attention as one ONNX Runtime Attention "
                         "operator (default), or as MatMul, Add, Split, two RotaryEmbedding and "
                         "MultiHeadAttention (for comparisons)")
    ap.add_argument("--no-verify", action="store_true")
    a = ap.parse_args()
    if a.cache == "shared" and a.plain:
        ap.error("--cache shared needs ONNX Runtime's GroupQueryAttention: drop --plain or use --cache concat")

    os.makedirs(a.out_dir, exist_ok=True)
    dtype = torch.float16 if a.dtype == "float16" else torch.float32
    log("building modules (seed %d) ..." % a.seed)
    models = cs.build(a.seed)
    for name in ("lm", "flow_encoder", "flow_estimator", "vocoder"):
        log("  %-15s %6.1f M parameters" % (name, cs.count_params(getattr(models, name)) / 1e6))
    log("  vocoder receptive field %d frames -> context_tokens %d" % (cs.vocoder_receptive_field_frames(), context_tokens()))
    if not a.plain and a.flow_convs == "matmul":
        check_matmul_convs(models)
    skip_norms = not a.plain and a.norms == "skip"
    if not a.plain and a.flow_time == "shared":
        check_shared_time(models.flow_estimator, skip_norms)
    if skip_norms:
        check_skip_norms_lm(models.lm)
    qkv_attention = not a.plain and a.dit_attention == "qkv"
    if qkv_attention:
        check_qkv_attention(models.flow_estimator)
    models = models.to(device=a.device, dtype=dtype)

    weights = os.path.join(a.out_dir, "weights.pt")
    torch.save({"seed": a.seed, "dtype": a.dtype, "state_dict": models.state_dict()}, weights)
    log("wrote %s: %s" % (weights, size_of(weights)))
    cs.use_fused(models, not a.plain)
    models.flow_estimator.shared_time = a.flow_time == "shared"
    models.flow_estimator.skip_norms = models.lm.skip_norms = skip_norms
    cs.use_qkv_attention(models.flow_estimator, qkv_attention)
    if a.flow_convs == "conv":
        models.flow_encoder.fused = models.flow_estimator.pos_conv.fused = False
    log("flow convolutions: %s" % ("ONNX Conv" if a.plain or a.flow_convs == "conv" else "gather + matrix product"))
    log("operators: %s" % ("standard ONNX only" if a.plain else "ONNX Runtime's fused operators"))
    log("LM cache: %s" % a.cache)
    log("residual adds: %s" % ("fused into the norms" if skip_norms else "separate nodes"))
    log("flow attention: %s" % ("one Attention operator (projection, RoPE, attention)" if qkv_attention
                                else "projection, RoPE and MultiHeadAttention as separate nodes"))
    export_all(models, a.out_dir, dtype, a.device, a.opset, not a.plain, a.cache)
    log("wrote %s" % write_manifest(a.out_dir, a.dtype, a.cache))

    if a.no_verify:
        return 0
    estimator = step = None
    if qkv_attention and checks_on_cpu(a.provider):
        # Everything else in the estimator is the same graph; the Attention form itself is
        # compared with the split form on a GPU by scripts/staged/shaped_attention_check.py.
        check_dir = os.path.join(a.out_dir, "check")
        os.makedirs(check_dir, exist_ok=True)
        log("ONNX Runtime's CPU Attention kernel has no RoPE: the checks take the flow estimator in its "
            "split form (--dit-attention split, same weights) from %s; scripts/staged/shaped_attention_check.py "
            "compares the two forms on a GPU" % check_dir)
        cs.use_qkv_attention(models.flow_estimator, False)
        export_all(models, check_dir, dtype, a.device, a.opset, not a.plain, a.cache,
                   only={"flow_estimator.onnx", "flow_step.onnx"})
        estimator = os.path.join(check_dir, "flow_estimator.onnx")
        step = os.path.join(check_dir, "flow_step.onnx")
    # The checks compare the graphs with the plain modules, as the baseline runs them.
    cs.use_fused(models, False)
    try:
        failures = verify(a.out_dir, models, a.device, dtype, a.provider, a.cache, estimator, step)
    except Exception as e:
        log("verification could not run: %s: %s" % (type(e).__name__, e))
        log("hint: float16 graphs need ONNX Runtime's CUDA provider (onnxruntime-gpu) on most builds; "
            "--provider cuda forces it, --no-verify skips the checks")
        return 1
    if failures:
        log("%d checks failed: %s" % (len(failures), "; ".join(failures)))
        return 1
    log("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
