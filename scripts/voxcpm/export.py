"""Exports a published VoxCPM 1.5 model directory for voxmux's voxcpm family (docs/voxcpm.md).

    usage: python3 -m scripts.voxcpm.export MODEL_DIR OUT_DIR [--dtype float32|float16] [--device cpu|cuda]
                                            [--max-positions N] [--timesteps N] [--cfg-value X]
                                            [--name NAME] [--voice NAME:WAV:TEXT]...
                                            [--random-voice NAME:SECONDS]... [--no-check]

MODEL_DIR is the directory as released (openbmb/VoxCPM1.5): config.json, model.safetensors,
audiovae.pth, tokenizer.json. OUT_DIR gets:

  pipeline.yaml      the manifest, written last (a failed export leaves none)
  prefill.onnx       text and prompt latents -> both LMs' caches, mu and stop logits of patch 0
  step.onnx          one patch: the whole flow solve (--timesteps Euler steps baked in), LocEnc,
                     one base-LM and one residual-LM step, the next mu and stop logits
  vae_decoder.onnx   the AudioVAE decoder, streaming exactly (float32)
  vae_encoder.onnx   the AudioVAE encoder's mean (float32), for voices made from clips
  tokenizer.json     MODEL_DIR's
  voices/NAME/       voice.yaml and latents.f32 for each --voice and --random-voice (the voice
                     library's format, tts/promptfile)

--dtype is the LM, LocEnc and DiT graphs' weights and caches (the LMs run as ONNX Runtime's
GroupQueryAttention, which CUDA runs in float16 only; float32 is for the CPU). float16 needs
--device cuda with torch 1.x, whose CPU has no half matmul. --max-positions is the cache
positions per sequence and the rows of the RoPE tables baked in (default config.json's
max_length).

--voice NAME:WAV:TEXT makes a voice from a clip and its transcript: the WAV (PCM 8/16/24/32-bit
or float, channels averaged) is resampled to the model's rate with a Hann-windowed sinc (6 zero
crossings, roll-off 0.99, the defaults of the torchaudio resampler the reference uses), left-padded
with zeros to whole patches as the reference does, and encoded by the AudioVAE encoder here in
PyTorch. --random-voice NAME:SECONDS makes a voice of random latents (for benchmarks and tests).

Before exporting it checks in PyTorch, in float32 on --device: that the streaming VAE decoder fed
patch by patch (and in odd pieces) equals one whole decode (max |diff| <= 1e-4), and that
PrefillGraph and StepGraph, with GroupQueryAttention's computation written out in PyTorch,
equal the reference's own way of computing (whole-sequence LMs without a cache, the DiT's
concatenated sequence, the doubled guidance batch) for two requests, one with a voice prompt,
prefilled alone and together (right-padded, one batch) and stepped batched at different
positions. With onnxruntime importable it then runs the written graphs in
its CPU provider against PyTorch (a difference over 1e-3 fails a float32 export; a float16 one's
are printed). --no-check skips every check.

Needs torch (1.13 or later), numpy and onnx.
"""

import argparse
import math
import os
import shutil
import struct
import sys
import time
import warnings

import numpy as np
import torch

from . import net

OPSET = 17
AUDIO_START = 101            # VoxCPMModel's audio_start_token
CONTEXT_PATCHES = 2          # the reference's streaming_prefix_len (3) - 1
MIN_LEN = 2                  # VoxCPM.generate's defaults
MAX_LEN = 4096
LEN_RATIO = 6.0              # retry_badcase_ratio_threshold: patches <= target tokens * 6 + 10
RANDOM_VOICE_SEED = 7
RANDOM_VOICE_TEXT = "A sentence of random text for a random voice."


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Clips


def read_wav(path):
    """(samples float32 [N], rate): RIFF WAVE, PCM 8/16/24/32-bit or IEEE float 32/64, channels
    averaged."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise SystemExit("%s: not a RIFF WAVE file" % path)
    fmt, pcm, i = None, None, 12
    while i + 8 <= len(data):
        cid, size = data[i:i + 4], struct.unpack("<I", data[i + 4:i + 8])[0]
        body = data[i + 8:i + 8 + size]
        if cid == b"fmt ":
            tag, ch, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if tag == 0xFFFE and len(body) >= 26:   # WAVE_FORMAT_EXTENSIBLE: the subformat's tag
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, ch, rate, bits)
        elif cid == b"data":
            pcm = body
        i += 8 + size + (size & 1)
    if fmt is None or pcm is None:
        raise SystemExit("%s: no fmt or data chunk" % path)
    tag, ch, rate, bits = fmt
    width = bits // 8
    n = len(pcm) // (width * ch) * width * ch
    pcm = pcm[:n]
    if tag == 1 and bits == 8:
        x = (np.frombuffer(pcm, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == 1 and bits == 16:
        x = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
    elif tag == 1 and bits == 24:
        b = np.frombuffer(pcm, np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        x = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    elif tag == 1 and bits == 32:
        x = np.frombuffer(pcm, "<i4").astype(np.float32) / float(1 << 31)
    elif tag == 3 and bits in (32, 64):
        x = np.frombuffer(pcm, "<f4" if bits == 32 else "<f8").astype(np.float32)
    else:
        raise SystemExit("%s: WAVE format %d with %d bits is not read here" % (path, tag, bits))
    return x.reshape(-1, ch).mean(axis=1), rate


def resample(x, orig, new, zeros=6, rolloff=0.99):
    """Band-limited resampling of x [N] (float64 in the filter) with a Hann-windowed sinc of
    `zeros` zero crossings at rolloff times the lower Nyquist rate: each of the `new` output phases
    of a period is a convolution with its own kernel, stepping `orig` input samples."""
    if orig == new:
        return x
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    cutoff = min(orig, new) * rolloff
    width = int(math.ceil(zeros * orig / cutoff))
    idx = torch.arange(-width, width + orig, dtype=torch.float64) / orig
    t = (-torch.arange(new, dtype=torch.float64) / new).unsqueeze(1) + idx.unsqueeze(0)
    t = (t * cutoff).clamp(-zeros, zeros)
    window = torch.cos(t * math.pi / zeros / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / torch.where(t == 0, torch.ones_like(t), t))
    kernels = (sinc * window * (cutoff / orig)).unsqueeze(1)          # [new, 1, taps]
    n = x.shape[-1]
    w = torch.nn.functional.pad(torch.as_tensor(x, dtype=torch.float64).reshape(1, 1, n), (width, width + orig))
    y = torch.nn.functional.conv1d(w, kernels, stride=orig)            # [1, new, frames]
    y = y.transpose(1, 2).reshape(-1)
    return y[: int(math.ceil(new * n / orig))].float()


def clip_latents(vae, cfg, wav, device):
    """The clip's latents [patches, P, D] as the reference's prompt: resampled, left-padded with
    zeros to whole patches, the encoder's mean."""
    x, rate = read_wav(wav)
    if len(x) == 0:
        raise SystemExit("--voice: %s holds no samples" % wav)
    audio = resample(torch.from_numpy(x.copy()), rate, cfg.vae.sample_rate)
    patch = cfg.patch_size * cfg.vae.chunk_size
    audio = torch.nn.functional.pad(audio, ((-audio.shape[0]) % patch, 0))
    with torch.no_grad():
        lat = net.VAEEncoder(vae)(audio.unsqueeze(0).to(device))[0].cpu()   # [frames, D]
    return lat.reshape(-1, cfg.patch_size, cfg.feat_dim), len(x) / rate


def write_voice(out, name, text, latents):
    """A voice folder in the voice library's format (tts/promptfile): voice.yaml with the
    transcript, the latents file and latent_dim; latents.f32 frame-major [frames][feat_dim]."""
    d = os.path.join(out, "voices", name)
    os.makedirs(d, exist_ok=True)
    latents.numpy().astype("<f4").tofile(os.path.join(d, "latents.f32"))
    with open(os.path.join(d, "voice.yaml"), "w", encoding="utf-8") as f:
        f.write("# A VoxCPM voice prompt (docs/voxcpm.md): the clip's transcript and its latents.\n")
        f.write("text: %s\nlatents: latents.f32\nlatent_dim: %d\n" % (yaml_str(text), latents.shape[-1]))


def yaml_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# ---------------------------------------------------------------------------------------------
# Checks in PyTorch


def check_vae_stream(vae, cfg, device):
    """Streaming in patches and in odd pieces, the state carried, against one whole decode."""
    P, D = cfg.patch_size, cfg.feat_dim
    g = torch.Generator().manual_seed(3)
    frames = 6 * P
    z = torch.randn(1, frames, D, generator=g).to(device)
    stream = net.VAEDecoderStream(vae)
    worst = 0.0
    with torch.no_grad():
        whole = vae.decode(z.transpose(1, 2))[:, 0]
        for pieces in ([P] * 6, [1, 3, 5, 2, 7, 6]):
            state = torch.zeros(1, stream.state_size, device=device)
            out, at = [], 0
            for n in pieces:
                a, state = stream(z[:, at:at + n], state)
                out.append(a)
                at += n
            worst = max(worst, float((torch.cat(out, dim=1) - whole).abs().max()))
    log("  VAE decoder streamed (in patches and in odd pieces) against a whole decode: max |diff| %.2e" % worst)
    if worst > 1e-4:
        raise SystemExit("the streaming VAE decoder differs from a whole decode by %.3g" % worst)
    return stream.state_size


def _diff(a, b):
    return float((a.float() - b.float()).abs().max())


def check_graphs(model, cfg, device, timesteps):
    """PrefillGraph and StepGraph (GroupQueryAttention computed in PyTorch, caches written in
    place) against plain_prefill / plain_step, for two requests prefilled alone and together
    (right-padded in one batch: each row as alone) and batched in one step."""
    P, D, c = cfg.patch_size, cfg.feat_dim, cfg.lm
    M = 64
    g = torch.Generator().manual_seed(5)
    vocab = max(c.vocab, 2)
    reqs = []
    for text_len, prompt_patches in ((5, 0), (7, 3)):
        ids = torch.randint(1, min(vocab, 30000), (text_len,), generator=g).tolist() + [AUDIO_START]
        T = len(ids) + prompt_patches
        text_ids = torch.tensor([ids + [0] * prompt_patches])
        text_mask = torch.tensor([[1.0] * len(ids) + [0.0] * prompt_patches])
        feat = torch.zeros(1, T, P, D)
        feat[0, len(ids):] = torch.randn(prompt_patches, P, D, generator=g)
        reqs.append([x.to(device) for x in (text_ids, text_mask, feat, 1.0 - text_mask)])
    prefill = net.PrefillGraph(model, M, torch.float32)
    step = net.StepGraph(model, M, torch.float32, timesteps)
    nb, nr = 2 * c.layers, 2 * cfg.residual.layers
    kv = lambda lc: torch.zeros(1, lc.kv_heads, M, lc.head_dim, device=device)   # noqa: E731
    worst = {}

    def note(what, a, b):
        worst[what] = max(worst.get(what, 0.0), _diff(a, b))

    plains, rows, lengths, conds, mus, stops = [], [], [], [], [], []
    with torch.no_grad():
        for text_ids, text_mask, feat, feat_mask in reqs:
            T = text_ids.shape[1]
            caches = [kv(c) for _ in range(nb)] + [kv(cfg.residual) for _ in range(nr)]
            out = prefill(text_ids, text_mask, feat, feat_mask, torch.tensor([T - 1], dtype=torch.int32, device=device),
                          torch.tensor(T, dtype=torch.int32), *caches)
            s = net.plain_prefill(model, text_ids, text_mask, feat, feat_mask)
            note("prefill mu", out[0], s["mu"])
            note("prefill stop_logits", out[1], s["stop"])
            plains.append(s)
            rows.append(caches)
            lengths.append(T)
            conds.append(feat[:, -1])
            mus.append(out[0])
            stops.append(out[1])
        # Both prompts in one prefill, right-padded past the longer: each row as it was alone, its
        # outputs at its own last position, its cache positions the same.
        Tp = max(lengths) + 3
        pad_t = lambda x: torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, Tp - x.shape[1]))   # noqa: E731
        batch = [torch.cat([pad_t(r[i]) for r in reqs]) for i in range(4)]
        both = [torch.cat([kv(c) for _ in range(2)]) for _ in range(nb)] + \
               [torch.cat([kv(cfg.residual) for _ in range(2)]) for _ in range(nr)]
        out = prefill(*batch, torch.tensor([L - 1 for L in lengths], dtype=torch.int32, device=device),
                      torch.tensor(Tp, dtype=torch.int32), *both)
        for r, L in enumerate(lengths):
            note("batched prefill mu", out[0][r:r + 1], mus[r])
            note("batched prefill stop_logits", out[1][r:r + 1], stops[r])
            for a, b in zip(both, rows[r]):
                note("batched prefill caches", a[r, :, :L], b[0, :, :L])
        # Both requests in one batch, each row at its own position.
        caches = [torch.cat([a, b]) for a, b in zip(*rows)]
        mu, cond = torch.cat(mus), torch.cat(conds)
        cfg_value = torch.tensor([2.0, 1.5], device=device)
        for i in range(3):
            noise = torch.randn(2, D, P, generator=g).to(device)
            seqlens = torch.tensor([L + i for L in lengths], dtype=torch.int32, device=device)
            out = step(mu, cond, noise, cfg_value, seqlens, torch.tensor(max(lengths) + i + 1, dtype=torch.int32), *caches)
            for r in range(2):
                patch, nmu, nstop = net.plain_step(model, plains[r], cond[r:r + 1], noise[r:r + 1], cfg_value[r:r + 1],
                                                   timesteps)
                note("step patch", out[0][r:r + 1], patch)
                note("step next_mu", out[1][r:r + 1], nmu)
                note("step next_stop_logits", out[2][r:r + 1], nstop)
            mu, cond = out[1], out[0]
    log("  prefill and step graphs against the reference's computation (2 requests prefilled alone and together, "
        "3 batched steps): max |diff| "
        + ", ".join("%s %.2e" % kv_ for kv_ in worst.items()))
    bad = {k: v for k, v in worst.items() if v > 1e-3}
    if bad:
        raise SystemExit("the graphs differ from the reference's computation: %s" % bad)


# ---------------------------------------------------------------------------------------------
# Export


def export(module, args, path, inputs, outputs, axes):
    """torch.onnx.export into OUT_DIR; a graph over protobuf's 2 GB keeps its weights in one
    PATH.data beside it."""
    import onnx
    t0 = time.time()
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tpath = os.path.join(tmp, os.path.basename(path))
    kwargs = dict(input_names=inputs, output_names=outputs, dynamic_axes=axes, opset_version=OPSET,
                  do_constant_folding=True)
    net.EMULATE_GQA = False
    try:
        # The exporter warns about the custom operator's shapes and unfolded shape arithmetic on
        # every graph; neither matters here and both bury the progress lines.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(module, args, tpath, dynamo=False, **kwargs)
            except TypeError:
                torch.onnx.export(module, args, tpath, **kwargs)   # torch without the dynamo= argument
    finally:
        net.EMULATE_GQA = True
    for stale in (path, path + ".data"):
        if os.path.exists(stale):
            os.remove(stale)
    if os.listdir(tmp) == [os.path.basename(path)]:
        os.replace(tpath, path)
    else:
        m = onnx.load(tpath)
        onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=1024)
    shutil.rmtree(tmp)
    size = sum(os.path.getsize(p) for p in (path, path + ".data") if os.path.exists(p))
    log("  wrote %s (%.1f MB, %.1f s)" % (os.path.basename(path), size / 1e6, time.time() - t0))
    check_io(path, inputs, outputs)


def check_io(path, inputs, outputs):
    import onnx
    m = onnx.load(path, load_external_data=False)
    got_in = [i.name for i in m.graph.input]
    got_out = [o.name for o in m.graph.output]
    if got_in != inputs or got_out != outputs:
        raise SystemExit("%s: inputs %s, outputs %s; want %s, %s" % (path, got_in, got_out, inputs, outputs))
    onnx.checker.check_model(path)


def cache_args(cfg, B, M, dtype, device):
    past, present = net.cache_names(cfg)
    caches = []
    for lc, n in ((cfg.lm, cfg.lm.layers), (cfg.residual, cfg.residual.layers)):
        caches += [torch.zeros(B, lc.kv_heads, M, lc.head_dim, dtype=dtype, device=device) for _ in range(2 * n)]
    axes = {n: {0: "B", 2: "M"} for n in past + present}
    return past, present, caches, axes


def export_lms(prefill, step, cfg, out, dtype, device):
    P, D, H = cfg.patch_size, cfg.feat_dim, cfg.dit.hidden
    M = 16   # positions while tracing; the engine's buffers set the real count
    i32 = dict(dtype=torch.int32, device=device)

    B, T = 2, 7
    past, present, caches, axes = cache_args(cfg, B, M, dtype, device)
    text_ids = torch.full((B, T), 5, dtype=torch.int64, device=device)
    text_ids[:, 4] = AUDIO_START
    text_mask = torch.ones(B, T, device=device)
    text_mask[:, 5:] = 0
    args = (text_ids, text_mask, torch.zeros(B, T, P, D, device=device), 1.0 - text_mask,
            torch.tensor([T - 1, T - 3], **i32), torch.tensor(T, dtype=torch.int32), *caches)
    names_in = ["text_ids", "text_mask", "feat", "feat_mask", "seqlens_k", "total_sequence_length"] + past
    names_out = ["mu", "stop_logits"] + present
    axes.update({"text_ids": {0: "B", 1: "T"}, "text_mask": {0: "B", 1: "T"}, "feat": {0: "B", 1: "T"},
                 "feat_mask": {0: "B", 1: "T"}, "seqlens_k": {0: "B"}, "mu": {0: "B"}, "stop_logits": {0: "B"}})
    log("exporting prefill.onnx")
    export(prefill, args, os.path.join(out, "prefill.onnx"), names_in, names_out, axes)

    B = 3   # odd, so no axis of the batch is mistaken for the guidance batch's 2
    past, present, caches, axes = cache_args(cfg, B, M, dtype, device)
    args = (torch.zeros(B, H, device=device), torch.zeros(B, P, D, device=device), torch.randn(B, D, P, device=device),
            torch.full((B,), 2.0, device=device), torch.tensor([3, 5, 7], **i32), torch.tensor(8, dtype=torch.int32),
            *caches)
    names_in = ["mu", "cond", "noise", "cfg_value", "seqlens_k", "total_sequence_length"] + past
    names_out = ["patch", "next_mu", "next_stop_logits"] + present
    axes.update({n: {0: "B"} for n in ("mu", "cond", "noise", "cfg_value", "seqlens_k", "patch", "next_mu",
                                       "next_stop_logits")})
    log("exporting step.onnx (%d timesteps unrolled)" % step.timesteps)
    path = os.path.join(out, "step.onnx")
    export(step, args, path, names_in, names_out, axes)
    check_capturable(path, parts=False)


def check_capturable(path, parts=True):
    """What CUDA graphs need of a graph. Everywhere: no tensor's shape read at run time (ONNX
    Runtime computes Shape and the arithmetic on it on the CPU, and captures no session with a
    node off the GPU), and no MatMul whose batch dimensions broadcast (its CUDA kernel passes
    cuBLAS an array of pointers staged in host memory at each run, which a replay reads stale,
    giving NaN). With parts (the VAE decoder's graph): no float tensors joined by
    Concat (ONNX Runtime's CUDA graphs replay a Concat of unequal parts wrongly;
    voxcpm_net.before), and no tensor fed to several Slices (ONNX Runtime fuses them into one
    Split, whose CUDA kernel stages unequal sizes in host memory)."""
    import collections
    import onnx
    m = onnx.load(path, load_external_data=False)
    bad = [n.name for n in m.graph.node if n.op_type in ("Shape", "Size")]
    if bad:
        raise SystemExit("%s: reads shapes at run time (%d nodes, e.g. %s)" % (path, len(bad), bad[:3]))
    bad = broadcast_matmuls(m)
    if bad:
        raise SystemExit("%s: MatMul with broadcast batch dimensions (%d, e.g. %s)" % (path, len(bad), bad[:3]))
    if not parts:
        return
    m = onnx.shape_inference.infer_shapes(m)
    types = {v.name: v.type.tensor_type.elem_type for v in list(m.graph.value_info) + list(m.graph.output)}
    bad = [n.name for n in m.graph.node if n.op_type == "Concat"
           and types.get(n.output[0]) in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, None)]
    if bad:
        raise SystemExit("%s: Concat of float tensors (or of unknown type): %s" % (path, bad[:5]))
    slices = collections.Counter(n.input[0] for n in m.graph.node if n.op_type == "Slice")
    many = [t for t, k in slices.items() if k > 1]
    if many:
        raise SystemExit("%s: tensors sliced several times, which ONNX Runtime fuses into a Split: %s" % (path, many[:3]))


def broadcast_matmuls(m, size=3):
    """The MatMul nodes of model m (weights not needed) whose batch dimensions differ between the
    two sides, or whose right side has batch dimensions the left lacks: ONNX Runtime's CUDA MatMul
    runs those through pointer arrays instead of one strided batched GEMM. Shapes are inferred
    with every symbolic input dimension set to size (not 1, which would hide a broadcast);
    dimensions left symbolic count as equal."""
    import onnx
    from onnx import helper
    # A copy without the weights' values (a float16 step embeds 1.4 GB): inference reads only
    # their dimensions, and the values of the small ones that shape arithmetic may use.
    inits = [t if len(t.raw_data) <= 1 << 16 else onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)
             for t in m.graph.initializer]
    g = helper.make_graph(m.graph.node, m.graph.name, m.graph.input, m.graph.output, inits)
    m = helper.make_model(g, opset_imports=m.opset_import, ir_version=m.ir_version)
    for i in m.graph.input:
        for d in i.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = size
    del m.graph.value_info[:]
    m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output)
              if v.type.tensor_type.HasField("shape")}
    shapes.update({t.name: list(t.dims) for t in m.graph.initializer})
    bad = []
    for n in m.graph.node:
        if n.op_type != "MatMul":
            continue
        a, b = shapes.get(n.input[0]), shapes.get(n.input[1])
        if a is None or b is None or len(b) < 3:
            continue
        if len(a) < 3 or len(a) != len(b) or any(x is not None and y is not None and x != y
                                                 for x, y in zip(a[:-2], b[:-2])):
            bad.append(n.name)
    return bad


def export_vae(vae, cfg, out, device):
    D = cfg.feat_dim
    stream = net.VAEDecoderStream(vae)
    log("exporting vae_decoder.onnx and vae_encoder.onnx")
    path = os.path.join(out, "vae_decoder.onnx")
    export(stream, (torch.randn(2, cfg.patch_size, D, device=device), torch.zeros(2, stream.state_size, device=device)),
           path, ["latent", "state"], ["audio", "state_out"],
           {"latent": {0: "B"}, "state": {0: "B"}, "audio": {0: "B"}, "state_out": {0: "B"}})
    check_capturable(path)
    n = 2 * cfg.patch_size * cfg.vae.chunk_size
    export(net.VAEEncoder(vae), (torch.randn(1, n, device=device) * 0.1,), os.path.join(out, "vae_encoder.onnx"),
           ["audio"], ["latent"], {"audio": {0: "B", 1: "N"}, "latent": {0: "B", 1: "F"}})
    return stream.state_size


def check_onnx(out, model, vae, cfg, timesteps, dtype):
    """The written graphs in ONNX Runtime's CPU provider against the reference-style PyTorch
    computation (float32): a prefill with a voice prompt, two steps, a VAE decode."""
    try:
        import onnxruntime as ort
    except ImportError:
        log("  onnxruntime is not importable here: the graphs are run by voxmux's tests")
        return
    P, D, c = cfg.patch_size, cfg.feat_dim, cfg.lm
    M, n_text, n_prompt = 32, 6, 2
    T = n_text + n_prompt
    npdt = np.float16 if dtype == torch.float16 else np.float32
    g = torch.Generator().manual_seed(11)
    past, _, caches, _ = cache_args(cfg, 1, M, torch.float32, "cpu")
    ids = torch.randint(1, min(c.vocab, 30000), (1, T), generator=g)
    ids[0, n_text - 1] = AUDIO_START
    ids[0, n_text:] = 0
    text_mask = torch.tensor([[1.0] * n_text + [0.0] * n_prompt])
    feat = torch.zeros(1, T, P, D)
    feat[0, n_text:] = torch.randn(n_prompt, P, D, generator=g)
    sess = lambda f: ort.InferenceSession(os.path.join(out, f), providers=["CPUExecutionProvider"])   # noqa: E731
    feeds = {"text_ids": ids.numpy(), "text_mask": text_mask.numpy(), "feat": feat.numpy(),
             "feat_mask": (1.0 - text_mask).numpy(), "seqlens_k": np.array([T - 1], np.int32),
             "total_sequence_length": np.array(T, np.int32)}
    feeds.update({n: t.numpy().astype(npdt) for n, t in zip(past, caches)})
    got = sess("prefill.onnx").run(None, feeds)
    with torch.no_grad():
        s = net.plain_prefill(model, ids, text_mask, feat, 1.0 - text_mask)
    worst = {"prefill mu": np.abs(got[0] - s["mu"].numpy()).max(),
             "prefill stop_logits": np.abs(got[1] - s["stop"].numpy()).max()}
    mu, presents, cond = got[0], got[2:], feat[:, -1]
    step = sess("step.onnx")
    for i in range(2):
        noise = torch.randn(1, D, P, generator=g)
        feeds = {"mu": mu, "cond": cond.numpy(), "noise": noise.numpy(), "cfg_value": np.array([2.0], np.float32),
                 "seqlens_k": np.array([T + i], np.int32), "total_sequence_length": np.array(T + i + 1, np.int32)}
        feeds.update({n: p for n, p in zip(past, presents)})
        got = step.run(None, feeds)
        with torch.no_grad():
            patch, nmu, nstop = net.plain_step(model, s, cond, noise, torch.tensor([2.0]), timesteps)
        for k, a, b in (("step patch", got[0], patch), ("step next_mu", got[1], nmu), ("step next_stop_logits", got[2], nstop)):
            worst[k] = max(worst.get(k, 0.0), np.abs(a - b.numpy()).max())
        mu, presents, cond = got[1], got[3:], torch.from_numpy(got[0])
    z = torch.randn(1, 2 * P, D, generator=g)
    dec, state, pieces = sess("vae_decoder.onnx"), np.zeros((1, net.VAEDecoderStream(vae).state_size), np.float32), []
    for k in range(2):   # patch by patch, the state carried
        a, state = dec.run(None, {"latent": z[:, k * P:(k + 1) * P].contiguous().numpy(), "state": state})
        pieces.append(a[0])
    with torch.no_grad():
        worst["vae_decoder audio"] = np.abs(np.concatenate(pieces) - vae.decode(z.transpose(1, 2))[0, 0].numpy()).max()
        audio = torch.randn(1, 2 * P * cfg.vae.chunk_size, generator=g) * 0.3
        e = sess("vae_encoder.onnx").run(None, {"audio": audio.numpy()})
        worst["vae_encoder latent"] = np.abs(e[0] - net.VAEEncoder(vae)(audio).numpy()).max()
    log("  the graphs in onnxruntime %s (CPU) against PyTorch: max |diff| %s"
        % (ort.__version__, ", ".join("%s %.2e" % kv for kv in worst.items())))
    if dtype == torch.float32:
        bad = {k: v for k, v in worst.items() if v > 1e-3}
        if bad:
            raise SystemExit("the exported graphs differ from PyTorch in onnxruntime: %s" % bad)


MANIFEST = """\
# VoxCPM exported for voxmux by scripts/voxcpm/export.py from {source}.
# The contract: docs/voxcpm.md.
kind: voxcpm
name: {name}
sample_rate: {sample_rate}
dtype: {dtype}
patch_size: {patch_size}
feat_dim: {feat_dim}
chunk_size: {chunk_size}
dit_hidden: {dit_hidden}
tokenizer:
  file: tokenizer.json
  audio_start: {audio_start}
  split_chinese: true
lm:
  layers: {layers}
  residual_layers: {residual_layers}
  kv_heads: {kv_heads}
  head_dim: {head_dim}
  max_positions: {max_positions}
generation:
  timesteps: {timesteps}
  cfg_value: {cfg_value}
  min_len: {min_len}
  max_len: {max_len}
  len_ratio: {len_ratio}
graphs:
  prefill: prefill.onnx
  step: step.onnx
  vae_decoder: vae_decoder.onnx
  vae_encoder: vae_encoder.onnx
vae:
  state_size: {state_size}
  context_patches: {context_patches}
{voices}"""


def voice_args(voices, randoms):
    """[(name, wav, text)], [(name, seconds)]; a malformed or repeated one is an error naming it."""
    seen = set()

    def name_ok(flag, item, name):
        if not name or "/" in name or name.startswith(".") or name == "default":
            raise SystemExit("%s %r: %r is not a voice folder name (default is the built-in voice)" % (flag, item, name))
        if name in seen:
            raise SystemExit("%s: voice %r given twice" % (flag, name))
        seen.add(name)

    clips, rnd = [], []
    for v in voices:
        parts = v.split(":", 2)
        if len(parts) != 3 or not parts[1] or not parts[2].strip():
            raise SystemExit("--voice %r: expected NAME:WAV:TEXT" % v)
        name_ok("--voice", v, parts[0])
        if not os.path.isfile(parts[1]):
            raise SystemExit("--voice %r: no file %s" % (v, parts[1]))
        clips.append((parts[0], parts[1], parts[2]))
    for v in randoms:
        name, _, secs = v.partition(":")
        try:
            s = float(secs)
        except ValueError:
            s = 0.0
        if s <= 0:
            raise SystemExit("--random-voice %r: expected NAME:SECONDS" % v)
        name_ok("--random-voice", v, name)
        rnd.append((name, s))
    return clips, rnd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--name", default="voxcpm1.5")
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                    help="the LM, LocEnc and DiT graphs' weights and caches (the VAE stays float32)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--max-positions", type=int, help="cache positions per sequence (default: config max_length)")
    ap.add_argument("--timesteps", type=int, default=10, help="Euler steps of the flow solve, baked into step.onnx")
    ap.add_argument("--cfg-value", type=float, default=2.0, help="the manifest's default guidance")
    ap.add_argument("--voice", action="append", default=[], metavar="NAME:WAV:TEXT")
    ap.add_argument("--random-voice", action="append", default=[], metavar="NAME:SECONDS")
    ap.add_argument("--no-check", action="store_true")
    a = ap.parse_args()
    clips, randoms = voice_args(a.voice, a.random_voice)
    if a.timesteps < 1:
        raise SystemExit("--timesteps must be at least 1")
    device = torch.device(a.device)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    # Float32 means float32 in the checks: no TF32 in cuDNN's convolutions or in matmuls.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = torch.float16 if a.dtype == "float16" else torch.float32
    out = a.out_dir
    if os.path.exists(os.path.join(out, "pipeline.yaml")):
        os.remove(os.path.join(out, "pipeline.yaml"))
    os.makedirs(out, exist_ok=True)
    tok = os.path.join(a.model_dir, "tokenizer.json")
    if not os.path.isfile(tok):
        raise SystemExit("%s: no tokenizer.json" % a.model_dir)

    t0 = time.time()
    log("reading %s" % a.model_dir)
    try:
        cfg = net.load_config(a.model_dir)
    except net.ConfigError as e:
        raise SystemExit(str(e))
    if (cfg.residual.kv_heads, cfg.residual.head_dim) != (cfg.lm.kv_heads, cfg.lm.head_dim):
        raise SystemExit("the manifest has one kv_heads and head_dim for both LMs; config.json's differ")
    model, vae, _ = net.load_model(a.model_dir, cfg, log)
    model.to(device)
    vae.to(device)
    max_positions = a.max_positions or cfg.max_length
    log("  %d base and %d residual layers of %d, LocEnc %d x %d, DiT %d x %d, patches of %d x %d, "
        "VAE hop %d at %d Hz (%.1f s)" % (cfg.lm.layers, cfg.residual.layers, cfg.lm.hidden, cfg.encoder.layers,
                                          cfg.encoder.hidden, cfg.dit.layers, cfg.dit.hidden, cfg.patch_size,
                                          cfg.feat_dim, cfg.vae.chunk_size, cfg.vae.sample_rate, time.time() - t0))

    voices = []
    for name, wav, text in clips:
        lat, secs = clip_latents(vae, cfg, wav, device)
        log("voice %s: %s, %.2f s -> %d patches" % (name, wav, secs, lat.shape[0]))
        voices.append((name, text.strip(), lat))
    for name, secs in randoms:
        n = max(1, int(round(secs * cfg.vae.sample_rate / (cfg.patch_size * cfg.vae.chunk_size))))
        g = torch.Generator().manual_seed(RANDOM_VOICE_SEED)
        voices.append((name, RANDOM_VOICE_TEXT, torch.randn(n, cfg.patch_size, cfg.feat_dim, generator=g)))

    if not a.no_check:
        log("checking in PyTorch (float32 on %s)" % a.device)
        check_vae_stream(vae, cfg, device)
        check_graphs(model, cfg, device, a.timesteps)

    # The wrappers bake their constants (time embeddings, RoPE tables) from the float32 weights,
    # then the transformer parts take the export's type.
    prefill = net.PrefillGraph(model, max_positions, dtype)
    step = net.StepGraph(model, max_positions, dtype, a.timesteps)
    model.to(dtype)
    export_lms(prefill, step, cfg, out, dtype, device)
    state_size = export_vae(vae, cfg, out, device)
    if not a.no_check:
        model.to(torch.float32).cpu()
        try:
            check_onnx(out, model, vae.cpu(), cfg, a.timesteps, dtype)
        except Exception as e:   # onnxruntime's CPU provider lacks some float16 kernels
            if dtype == torch.float32:
                raise
            log("  onnxruntime could not run the float16 graphs on the CPU: %s" % str(e).splitlines()[0][:200])

    shutil.copyfile(tok, os.path.join(out, "tokenizer.json"))
    if os.path.isdir(os.path.join(out, "voices")):
        shutil.rmtree(os.path.join(out, "voices"))
    for name, text, lat in voices:
        write_voice(out, name, text, lat)
    with open(os.path.join(out, "pipeline.yaml"), "w", encoding="utf-8") as f:
        f.write(MANIFEST.format(
            source=os.path.basename(os.path.abspath(a.model_dir)), name=a.name, sample_rate=cfg.vae.sample_rate,
            dtype=a.dtype, patch_size=cfg.patch_size, feat_dim=cfg.feat_dim, chunk_size=cfg.vae.chunk_size,
            dit_hidden=cfg.dit.hidden, audio_start=AUDIO_START, layers=cfg.lm.layers,
            residual_layers=cfg.residual.layers, kv_heads=cfg.lm.kv_heads, head_dim=cfg.lm.head_dim,
            max_positions=max_positions, timesteps=a.timesteps, cfg_value=a.cfg_value, min_len=MIN_LEN,
            max_len=MAX_LEN, len_ratio=LEN_RATIO, state_size=state_size, context_patches=CONTEXT_PATCHES,
            voices="voices: voices\n" if voices else ""))
    log("wrote %s (vae.state_size %d; %.1f s in all)" % (os.path.join(out, "pipeline.yaml"), state_size, time.time() - t0))


if __name__ == "__main__":
    main()
