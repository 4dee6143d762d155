"""Checks voxmux's VoxCPM 1.5 export against OpenBMB/VoxCPM's own implementation, graph by graph
and end to end, with random weights.

    usage: python3 -m scripts.voxcpm.parity --reference .ref --work DIR --report OUT.json
                                            [--full|--tiny] [--device cpu|cuda] [--no-ort] [--reuse]
                                            [--dtype float32|float16] [--factor 2]

--reference is a copy of VoxCPM's `src/voxcpm` package (scripts/voxcpm/fetch_reference.sh puts
one in the git-ignored .ref/); scripts/voxcpm/reference.py imports it. Needs torch >= 2, numpy,
transformers (LlamaTokenizerFast), safetensors, einops, tqdm, pyyaml, onnxruntime (CPU); not
pydantic.

1. Builds the reference's VoxCPMModel (v1, model/voxcpm.py) and AudioVAE with VoxCPM 1.5's sizes
   (--full; --tiny: a few layers of width 64) and random weights, and saves them as the published
   directory WORK/model: config.json, model.safetensors (bfloat16), audiovae.pth (float32,
   weight-normed convolutions as weight_g/weight_v) and the tiny tokenizer of
   scripts/voxcpm/tokenizer.py.
2. Runs scripts/voxcpm/export.py WORK/model WORK/export --dtype float32.
3. Loads the model back from WORK/model with VoxCPMModel.from_local (optimize off, float32) and
   checks that every weight came back as saved; then compares ONNX Runtime (CPU) on the exported
   graphs with the reference (float32 on --device, TF32 off):
   - prefill: mu (lm_to_dit_proj(lm_hidden) + res_to_dit_proj(residual_hidden)) and the stop
     logits, for a text-only and a prompted input;
   - steps: a batch of three rows at different positions, several steps, each row against the
     reference run alone with the same noise: patch, next mu, next stop logits;
   - the VAE decoder run patch by patch (carried state) against the reference's decode of the
     whole latent sequence, and the VAE encoder against the reference's encode;
   - end to end, text-only and with a voice prompt, a fixed number of patches (stop ignored) with
     fixed noise: the reference's generate_with_prompt_cache (its prefill, cached steps, decode,
     and with a prompt the decode of [2 context patches + generated] cut after the context)
     against the graphs chained as voxmux runs them: mu and stop logits per patch, latents, audio.
   The reference's starting noise is the one fed to the step graph: UnifiedCFM.forward's
   torch.randn is served from a queue (voxcpm_reference.patch_cfm_noise).
   Reference-only cross-check: its cached steps (StaticKVCache, MiniCPMModel.forward_step) against
   an uncached forward of both LMs over the same sequence (teacher-forced patches).
4. Writes the report (every difference and its tolerance) and exits 1 if one is over.

--dtype float16 exports float16 instead (WORK/export-float16, --device cuda: the GPU export) and,
float16 being no float32 parity, measures its error against the reference's own in reduced
precision, all against the float32 reference on the same inputs and noise:
  (a) the reference's modules in bfloat16 (the model's own dtype) on --device;
  (b) the same in float16;
  (d) the float32 reference with every Linear's output rounded to float16: float16 storage with
      float32 arithmetic, the export's intent. The reference in float16 also runs the flow
      solve's state and time, its time embeddings and the FSQ's tanh and rounding in float16,
      which the export keeps in float32, so (b) can be well above (d) on the DiT's path;
  (c) ours: the float16 graphs in ONNX Runtime's CPU provider. It has float16 GroupQueryAttention;
      float16 nodes without a float16 CPU kernel run in float32 between Casts (and Cast pairs
      between two such nodes are dropped), so this is the graphs' float16 tensors, not CUDA's
      float16 arithmetic.
Each as max abs, relative (over the largest reference value), RMS, relative RMS and cosine, for:
prefill mu and stop logits; the batch's steps teacher-forced (each step fed the float32 run's mu,
previous patch and noise, so a step's error is its own); end to end (free-running) mu, stop
logits, latents and audio, with the RMS error by patch. Ours passes a quantity when its RMS error
is at most --factor (default 2) times (b)'s (floored at float16's rounding of the quantity);
quantities of fewer than 16 values are reported, not judged. A NaN or Inf fails. Also printed:
the largest |value| in the float32 reference's residual streams, Linear outputs and MLP products
by module, against float16's 65504. The float32 checks of the reference side and the (float32)
VAE graphs stay.

Rounding in the scalar quantizer (FSQ: round(9 * tanh(x)) / 9 after the base LM) turns a 1e-6
difference into a whole quantization step where a value lies on a rounding boundary. The inputs
(noise, prompt audio) are therefore drawn again, on the reference alone, until every value that
matters lies at least --fsq-margin (default 1e-4, ten times the expected float32 difference)
from a boundary; the margins and the number of draws are in the report.
"""

import argparse
import contextlib
import gc
import json
import os
import sys
import time
import types

import numpy as np

from ..common.paths import run_module
from . import reference as vref

T0 = time.time()


def log(*a):
    print("[%5.1fs]" % (time.time() - T0), *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Sizes

def config_json(full, vocab):
    """The published config.json's layout (VoxCPM 1.5) with --full's or --tiny's sizes."""
    if full:
        hidden, inter, layers, heads, kv, res_layers = 1024, 4096, 24, 16, 2, 8
        loc = {"hidden_dim": 1024, "ffn_dim": 4096, "num_heads": 16, "num_layers": 8}
        fsq = 256
        vae = {"encoder_dim": 64, "encoder_rates": [2, 3, 6, 7, 7], "latent_dim": 64, "decoder_dim": 2048,
               "decoder_rates": [7, 7, 6, 3, 2], "depthwise": True, "sample_rate": 44100, "use_noise_block": False}
        vocab = 73448
        enc, dit = dict(loc), dict(loc)
        max_pos, long_f, short_f = 32768, [1.0] * 32, [1.0] * 32
    else:
        # Widths that differ between the LMs, LocEnc and DiT (heads of 16 throughout, as the
        # shared RoPE factors need), and LongRoPE's scaled path: more positions than the original
        # (long factors, cos/sin scaled) with factors that differ by frequency.
        hidden, inter, layers, heads, kv, res_layers = 64, 128, 2, 4, 2, 2
        enc = {"hidden_dim": 32, "ffn_dim": 64, "num_heads": 2, "num_layers": 2}
        dit = {"hidden_dim": 96, "ffn_dim": 192, "num_heads": 6, "num_layers": 2}
        fsq = 32
        vae = {"encoder_dim": 8, "encoder_rates": [2, 3, 7], "latent_dim": 16, "decoder_dim": 32,
               "decoder_rates": [7, 3, 2], "depthwise": True, "sample_rate": 44100, "use_noise_block": False}
        max_pos = 65536
        long_f = [round(1.0 + 3.0 * i / 7, 4) for i in range(8)]
        short_f = [round(1.0 + 0.5 * i / 7, 4) for i in range(8)]
    lm = {"bos_token_id": 1, "eos_token_id": 2, "hidden_size": hidden, "intermediate_size": inter,
          "max_position_embeddings": max_pos, "num_attention_heads": heads, "num_hidden_layers": layers,
          "num_key_value_heads": kv, "rms_norm_eps": 1e-05,
          "rope_scaling": {"type": "longrope", "long_factor": long_f, "short_factor": short_f,
                           "original_max_position_embeddings": 32768},
          "vocab_size": vocab, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4,
          "rope_theta": 10000.0, "use_mup": False}
    return {"architecture": "voxcpm", "lm_config": lm, "patch_size": 4, "feat_dim": vae["latent_dim"],
            "residual_lm_num_layers": res_layers, "scalar_quantization_latent_dim": fsq,
            "scalar_quantization_scale": 9, "encoder_config": enc,
            "dit_config": dict(dit, cfm_config={"sigma_min": 1e-06, "solver": "euler", "t_scheduler": "log-norm",
                                                "inference_cfg_rate": 2.0}),
            "audio_vae_config": vae, "max_length": 4096, "device": "cuda", "dtype": "bfloat16"}


# ---------------------------------------------------------------------------------------------
# Building and saving the reference


def build_and_save(torch, model_dir, cfg, device, seed):
    """The reference's modules with random weights, saved in the published format. Returns the
    saved tensors (what the reload must give back)."""
    from safetensors.torch import save_file
    from transformers import LlamaTokenizerFast
    vm = vref.model_module()
    from voxcpm.modules.audiovae import AudioVAE, AudioVAEConfig
    from voxcpm.modules.minicpm4.model import MiniCPMRMSNorm
    from voxcpm.modules.audiovae.audio_vae import Snake1d

    torch.manual_seed(seed)
    config = vm.VoxCPMConfig.model_validate_json(json.dumps(cfg))
    tok = LlamaTokenizerFast.from_pretrained(model_dir)
    # Allocating on the GPU makes initialization fast; the weights are random either way.
    ctx = torch.device(device) if device != "cpu" and hasattr(torch.device(device), "__enter__") else contextlib.nullcontext()
    with ctx:
        vae = AudioVAE(config=AudioVAEConfig(**cfg["audio_vae_config"]))
        model = vm.VoxCPMModel(config, tok, vae, device=device)
    with torch.no_grad():
        # Trained-like scales: N(0, 0.02) Linear weights keep every residual stream near unit
        # size through 24 layers without muP scaling; norms and biases away from their trivial
        # values so that an export that dropped one would show.
        for name, mod in model.named_modules():
            if name.startswith("audio_vae"):
                continue
            if isinstance(mod, torch.nn.Linear):
                mod.weight.normal_(0.0, 0.02)
                if mod.bias is not None:
                    mod.bias.normal_(0.0, 0.02)
            elif isinstance(mod, MiniCPMRMSNorm):
                mod.weight.copy_(1.0 + 0.1 * torch.randn_like(mod.weight))
        # The VAE keeps PyTorch's initialization (unit-scale activations); snake's alpha and the
        # weight-norm gains are varied so that both are needed to reproduce it.
        for mod in model.audio_vae.modules():
            if isinstance(mod, Snake1d):
                mod.alpha.uniform_(0.5, 1.5)
            if hasattr(mod, "weight_g"):
                mod.weight_g.mul_(torch.empty_like(mod.weight_g).uniform_(0.8, 1.2))
    sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()
          if not k.startswith("audio_vae.")}
    vae_sd = {k: v.detach().float().cpu().contiguous() for k, v in model.audio_vae.state_dict().items()}
    del model, vae
    save_file(sd, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    torch.save(vae_sd, os.path.join(model_dir, "audiovae.pth"))
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return sd, vae_sd


def reload_check(torch, m, sd, vae_sd):
    """Every saved tensor against the reloaded model's (exact: bfloat16 -> float32 is exact)."""
    got = m.state_dict()
    worst, missing = 0.0, []
    for src, prefix in ((sd, ""), (vae_sd, "audio_vae.")):
        for k, v in src.items():
            g = got.get(prefix + k)
            if g is None:
                missing.append(prefix + k)
                continue
            worst = max(worst, float((g.detach().float().cpu() - v.float()).abs().max()))
    extra = [k for k in got if not (k in sd or (k.startswith("audio_vae.") and k[10:] in vae_sd))]
    return {"tensors": len(sd) + len(vae_sd), "max_abs_diff": worst, "missing": missing,
            "not_in_checkpoint": extra, "pass": worst == 0.0 and not missing and not extra}


# ---------------------------------------------------------------------------------------------
# The reference, instrumented


class Capture:
    """While active: the mu each UnifiedCFM call gets, the stop logits of each stop-head call,
    and each FSQ input's distance from the nearest rounding boundary (per position)."""

    def __init__(self, torch, m):
        self.torch, self.m = torch, m
        self.mu, self.stop, self.margin = [], [], []
        self.on = False
        dec = m.feat_decoder
        orig = dec.forward

        def forward(*a, **kw):
            if self.on:
                self.mu.append(kw["mu"].detach().float().cpu().clone())
            return orig(*a, **kw)
        dec.forward = forward

        def stop_hook(_mod, _inp, out):
            if self.on:
                self.stop.append(out.detach().float().cpu().clone())
        m.stop_head.register_forward_hook(stop_hook)
        scale = float(m.fsq_layer.scale)

        def fsq_hook(_mod, _inp, out):
            if self.on:
                x = torch.tanh(out.detach().double()) * scale - 0.5
                self.margin.append((x - torch.round(x)).abs().amin(dim=-1).reshape(-1).cpu())
        m.fsq_layer.in_proj.register_forward_hook(fsq_hook)

    @contextlib.contextmanager
    def __call__(self):
        self.mu, self.stop, self.margin = [], [], []
        self.on = True
        try:
            yield self
        finally:
            self.on = False


def prompt_audio(torch, seed, samples, sample_rate):
    """A stand-in clip: a few tones and some noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(samples, dtype=torch.float64) / sample_rate
    f = 100 + 400 * torch.rand(3, generator=g, dtype=torch.float64)
    a = sum(0.2 * torch.sin(2 * np.pi * f[i] * t + i) for i in range(3))
    a = a + 0.05 * torch.randn(samples, generator=g, dtype=torch.float64)
    return a.float().unsqueeze(0)


def left_pad(torch, audio, patch_len):
    """As build_prompt_cache pads the clip."""
    if audio.size(1) % patch_len:
        audio = torch.nn.functional.pad(audio, (patch_len - audio.size(1) % patch_len, 0))
    return audio


class Reference:
    def __init__(self, torch, m, timesteps, cfg_value):
        self.torch, self.m = torch, m
        self.vm = vref.model_module()
        self.vm.tqdm = lambda it, **_: it   # no progress bars in the log
        self.noise = vref.patch_cfm_noise()
        self.cap = Capture(torch, m)
        self.timesteps, self.cfg_value = timesteps, cfg_value
        self.P, self.D = m.patch_size, m.feat_dim
        self.patch_len = m.patch_size * m.chunk_size
        self.dtype = m.base_lm.embed_tokens.weight.dtype     # the LMs', LocEnc's and DiT's (the VAE is float32)

    def prompt_cache(self, text, audio):
        """build_prompt_cache(text, clip) with the clip handed over in place of a file."""
        old = self.vm.torchaudio
        self.vm.torchaudio = types.SimpleNamespace(load=lambda _path: (audio.clone(), self.m.sample_rate),
                                                   functional=getattr(old, "functional", None))
        try:
            return self.m.build_prompt_cache(prompt_text=text, prompt_wav_path="clip.wav")
        finally:
            self.vm.torchaudio = old

    def generate(self, target, cache, n, noises):
        """generate_with_prompt_cache for exactly n patches (stop ignored: min_len = n) with the
        given starting noises [n, 1, D, P]."""
        torch = self.torch
        self.noise.queue = [noises[i].to(self.m.device) for i in range(n)]
        with self.cap() as cap:
            audio, _, feats = self.m.generate_with_prompt_cache(
                target_text=target, prompt_cache=cache, min_len=n, max_len=n,
                inference_timesteps=self.timesteps, cfg_value=self.cfg_value)
        if self.noise.queue or len(cap.mu) != n:
            raise SystemExit("reference ran %d patches, %d wanted (noise left: %d)" % (len(cap.mu), n, len(self.noise.queue)))
        k = 0 if cache is None else min(2, cache["audio_feat"].shape[0])
        text_len = len(self.ids(target, cache)) - (0 if cache is None else cache["audio_feat"].shape[0])
        margins = [cap.margin[0][text_len:]] + cap.margin[1:]     # FSQ matters at audio positions only
        margin = float(torch.cat([x.reshape(-1) for x in margins]).min()) if sum(x.numel() for x in margins) else float("inf")
        return {"audio": audio.float().cpu().reshape(-1).numpy(), "latents": feats[k:].float().numpy(),
                "mu": torch.cat(cap.mu).numpy(), "stop": torch.cat(cap.stop).numpy(), "fsq_margin": margin,
                "noise": noises[:n].numpy()}

    def ids(self, target, cache):
        """The token ids the reference builds: text (prompt text + target), audio start, then 0
        per prompt patch."""
        text = target if cache is None else cache["prompt_text"] + target
        ids = list(self.m.text_tokenizer(text)) + [self.m.audio_start_token]
        return ids + [0] * (0 if cache is None else cache["audio_feat"].shape[0])

    def uncached(self, target, cache, latents):
        """mu and stop logits for every patch of a finished run, from one uncached forward of the
        base and residual LM over [prompt, patches 0..n-2] (what the cached steps computed)."""
        torch, m = self.torch, self.m
        n = latents.shape[0]
        ids = self.ids(target, cache)
        k = 0 if cache is None else cache["audio_feat"].shape[0]
        T = len(ids)
        dt = self.dtype
        with torch.inference_mode():
            feats = torch.zeros(1, T + n - 1, self.P, self.D, dtype=dt)
            if k:
                feats[0, T - k:T] = cache["audio_feat"].float()
            feats[0, T:] = torch.from_numpy(latents[:n - 1])
            tokens = torch.tensor([ids + [0] * (n - 1)], device=m.device)
            amask = torch.zeros(1, T + n - 1, 1, device=m.device, dtype=dt)
            amask[0, T - k:] = 1
            tmask = 1 - amask
            feats = feats.to(m.device)
            feat_embed = m.enc_to_lm_proj(m.feat_encoder(feats))
            scale = m.config.lm_config.scale_emb if m.config.lm_config.use_mup else 1.0
            emb = tmask * m.base_lm.embed_tokens(tokens) * scale + amask * feat_embed
            enc, _ = m.base_lm(inputs_embeds=emb, is_causal=True)
            enc = m.fsq_layer(enc) * amask + enc * tmask
            res, _ = m.residual_lm(inputs_embeds=enc + amask * feat_embed, is_causal=True)
            lm_h, res_h = enc[0, T - 1:], res[0, T - 1:]
            mu = m.lm_to_dit_proj(lm_h) + m.res_to_dit_proj(res_h)
            stop = m.stop_head(m.stop_actn(m.stop_proj(lm_h)))
        return mu.float().cpu().numpy(), stop.float().cpu().numpy()

    def teacher_forced(self, target, cache, run, n):
        """The first n steps of a finished (float32) run, each from that run's own inputs rather than
        this model's: patch i from the run's mu_i, previous patch and noise (one batched
        feat_decoder call), next mu and stop logits from an uncached forward over the run's patches.
        Returns {patch [n, P, D], next_mu [n, H], next_stop [n, 2]}."""
        torch, m = self.torch, self.m
        c0 = torch.zeros(self.P, self.D) if cache is None else cache["audio_feat"][-1].float()
        cond = torch.stack([c0] + [torch.from_numpy(run["latents"][i]) for i in range(n - 1)])
        self.noise.queue = [torch.from_numpy(np.ascontiguousarray(run["noise"][:n, 0])).to(m.device)]
        with torch.inference_mode():
            patch = m.feat_decoder(mu=torch.from_numpy(run["mu"][:n]).to(m.device, self.dtype), patch_size=self.P,
                                   cond=cond.transpose(1, 2).contiguous().to(m.device, self.dtype),
                                   n_timesteps=self.timesteps, cfg_value=self.cfg_value).transpose(1, 2)
        self.noise.queue = []
        mu, stop = self.uncached(target, cache, run["latents"][:n + 1])
        return {"patch": patch.float().cpu().numpy(), "next_mu": mu[1:], "next_stop": stop[1:]}

    def decode(self, latents):
        """audio_vae.decode of patches [n, P, D] at once."""
        torch = self.torch
        z = torch.from_numpy(np.ascontiguousarray(latents.reshape(-1, self.D).T))[None].to(self.m.device)
        with torch.inference_mode():
            return self.m.audio_vae.decode(z.float()).float().cpu().reshape(-1).numpy()

    def encode(self, padded):
        torch = self.torch
        with torch.inference_mode():
            z = self.m.audio_vae.encode(padded.to(self.m.device), self.m.sample_rate)
        return z[0].T.float().cpu().numpy()     # [frames, D]


def draw(reference, torch, seed, fsq_margin, attempts, make):
    """make(seed) -> a reference run; draws again until its FSQ margin is at least fsq_margin."""
    best = None
    for a in range(attempts):
        run = make(seed + 1000 * a)
        run["draws"] = a + 1
        if best is None or run["fsq_margin"] > best["fsq_margin"]:
            best = run
        if run["fsq_margin"] >= fsq_margin:
            return run
    log("warning: no draw in %d had an FSQ margin of %g (best %g)" % (attempts, fsq_margin, best["fsq_margin"]))
    return best


# ---------------------------------------------------------------------------------------------
# The exported graphs


class Graphs:
    """The export's graphs in ONNX Runtime (CPU), fed as docs/voxcpm.md says."""

    def __init__(self, out_dir, threads):
        import onnxruntime as ort
        import yaml
        with open(os.path.join(out_dir, "pipeline.yaml")) as f:
            self.pipe = p = yaml.safe_load(f)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        self.s = {}
        for key in ("prefill", "step", "vae_decoder", "vae_encoder"):
            t = time.time()
            self.s[key] = ort.InferenceSession(os.path.join(out_dir, p["graphs"][key]), so, providers=["CPUExecutionProvider"])
            log("  session %s: %.1f s" % (key, time.time() - t))
        self.P, self.D = int(p["patch_size"]), int(p["feat_dim"])
        lm = p["lm"]
        self.kv, self.hd, self.maxpos = int(lm["kv_heads"]), int(lm["head_dim"]), int(lm["max_positions"])
        self.state_size = int(p["vae"]["state_size"])
        self.context_patches = int(p["vae"].get("context_patches", 2))
        self.meta = {k: {i.name: i for i in s.get_inputs()} for k, s in self.s.items()}
        self.cache_names = [n for n in self.meta["step"] if n.startswith(("past_", "res_past_"))]
        self.cache_dtype = np.float16 if "float16" in self.meta["step"][self.cache_names[0]].type else np.float32

    def _int(self, graph, name, values):
        """An integer input as the graph declares it (int32 or int64, a scalar or a vector)."""
        i = self.meta[graph][name]
        dt = np.int64 if "int64" in i.type else np.int32
        a = np.asarray(values, dt)
        return a.reshape(()) if len(i.shape) == 0 else a.reshape(-1)

    def empty_cache(self, B):
        return {n: np.zeros((B, self.kv, self.maxpos, self.hd), self.cache_dtype) for n in self.cache_names}

    def _run(self, graph, feeds, cache):
        s = self.s[graph]
        feeds.update(cache)
        names = [o.name for o in s.get_outputs()]
        outs = dict(zip(names, s.run(names, feeds)))
        new = {n.replace("present_", "past_", 1): v for n, v in outs.items() if "present_" in n}
        return outs, new

    def prefill(self, ids, text_mask, feat, feat_mask):
        T = len(ids)
        feeds = {"text_ids": np.array([ids], np.int64), "text_mask": np.array([text_mask], np.float32),
                 "feat": feat[None].astype(np.float32), "feat_mask": np.array([feat_mask], np.float32),
                 "seqlens_k": self._int("prefill", "seqlens_k", [T - 1]),
                 "total_sequence_length": self._int("prefill", "total_sequence_length", [T])}
        outs, cache = self._run("prefill", feeds, self.empty_cache(1))
        return outs["mu"][0], outs["stop_logits"][0], cache

    def step(self, mu, cond, noise, cfg_value, positions, cache):
        feeds = {"mu": np.asarray(mu, np.float32), "cond": np.asarray(cond, np.float32),
                 "noise": np.asarray(noise, np.float32),
                 "cfg_value": np.full(len(positions), cfg_value, np.float32),
                 "seqlens_k": self._int("step", "seqlens_k", positions),
                 "total_sequence_length": self._int("step", "total_sequence_length", [max(positions) + 1])}
        outs, cache = self._run("step", feeds, cache)
        return outs["patch"], outs["next_mu"], outs["next_stop_logits"], cache

    def decode_stream(self, patches, prime=None):
        """Patch by patch with the state carried; prime (patches) only sets the state."""
        s = self.s["vae_decoder"]
        state = np.zeros((1, self.state_size), np.float32)
        out = []
        seq = ([(p, False) for p in prime] if prime is not None else []) + [(p, True) for p in patches]
        for p, keep in seq:
            audio, state = s.run(["audio", "state_out"], {"latent": p[None].astype(np.float32), "state": state})
            if keep:
                out.append(audio[0])
        return np.concatenate(out)

    def encode(self, padded):
        return self.s["vae_encoder"].run(["latent"], {"audio": padded.astype(np.float32).reshape(1, -1)})[0][0]


def graph_inputs(ids, n_text, prompt_patches, P, D):
    """prefill's text_mask, feat and feat_mask for ids = text, audio start, one 0 per prompt patch."""
    T = len(ids)
    feat = np.zeros((T, P, D), np.float32)
    fmask = np.zeros(T, np.float32)
    if prompt_patches is not None and len(prompt_patches):
        feat[n_text:] = prompt_patches
        fmask[n_text:] = 1
    return 1 - fmask, feat, fmask


def graph_run(G, ids, n_text, prompt_patches, noises, cfg_value):
    """One request through prefill and n steps (B = 1), as voxmux's engine chains them."""
    tmask, feat, fmask = graph_inputs(ids, n_text, prompt_patches, G.P, G.D)
    mu, stop, cache = G.prefill(ids, tmask, feat, fmask)
    cond = feat[-1]
    pos = len(ids)
    mus, stops, patches = [mu], [stop], []
    n = len(noises)
    for i in range(n):
        patch, nmu, nstop, cache = G.step(mu[None], cond[None], noises[i], cfg_value, [pos], cache)
        patches.append(patch[0])
        cond, mu = patch[0], nmu[0]
        pos += 1
        if i + 1 < n:
            mus.append(mu)
            stops.append(nstop[0])
    return np.stack(mus), np.stack(stops), np.stack(patches)


# ---------------------------------------------------------------------------------------------
# --dtype float16: our float16 graphs' error against the reference's own in reduced precision

FP16_MAX = 65504.0
# Below this share of a quantity's RMS a difference is float16's rounding of the quantity itself
# (2^-11, its unit roundoff), so no yardstick is taken smaller.
FP16_ROUNDOFF = 2.0 ** -11
# A ratio of two RMS errors over fewer values than this is too noisy to judge (the two prefill
# stop logits); such quantities are reported, not judged.
MIN_JUDGED_VALUES = 16
GROUPS = {"base_lm": "base LM", "residual_lm": "residual LM", "feat_encoder": "LocEnc", "feat_decoder": "DiT"}

VARIANTS = [  # key, label: each against the reference in float32, the same inputs and noise
    ("bf16", "(a) reference bfloat16"),
    ("fp16", "(b) reference float16"),
    ("f16io", "(d) reference float32, float16 storage"),
    ("ours", "(c) ours float16"),
]
LETTER = {v: label[:3] for v, label in VARIANTS}


def errors(got, want):
    """max abs, relative (over max |want|), RMS, relative RMS (over RMS of want) and cosine of got
    against want; metrics are None where got has a NaN or Inf (counted in nonfinite)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return {"shape": list(got.shape), "reference_shape": list(want.shape), "nonfinite": 0, "values": int(want.size)}
    bad = int(got.size - np.isfinite(got).sum())
    ref_max = float(np.abs(want).max()) if want.size else 0.0
    ref_rms = float(np.sqrt((want ** 2).mean())) if want.size else 0.0
    out = {"values": int(want.size), "nonfinite": bad, "reference_abs_max": ref_max, "reference_rms": ref_rms}
    if bad:
        return dict(out, max_abs=None, rel=None, rms=None, rel_rms=None, cosine=None)
    d = got - want
    mx = float(np.abs(d).max()) if d.size else 0.0
    rms = float(np.sqrt((d ** 2).mean())) if d.size else 0.0
    norm = float(np.linalg.norm(got) * np.linalg.norm(want))
    return dict(out, max_abs=mx, rel=mx / max(ref_max, 1e-30), rms=rms, rel_rms=rms / max(ref_rms, 1e-30),
                cosine=float((got * want).sum() / norm) if norm > 0 else None)


def per_step_rms(got, want):
    """RMS error at each index of the first axis (patches, steps), rows pooled when 3-D+."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or not np.isfinite(got).all():
        return None
    d = (got - want).reshape(got.shape[0], -1) if got.ndim > 1 else (got - want)[:, None]
    return [float(x) for x in np.sqrt((d ** 2).mean(axis=1))]


class Magnitudes:
    """While on: the largest |value| per module of the inputs of every RMSNorm (the residual
    streams, the largest values these networks keep), the outputs of every Linear and the inputs
    of the MLPs' down projections (SiLU(gate) * up), to read against float16's 65504. Running
    maxima stay on the device (no synchronization per call)."""

    def __init__(self, torch, m):
        from voxcpm.modules.minicpm4.model import MiniCPMRMSNorm
        self.torch, self.on, self.max, self.handles = torch, False, {}, []
        for name, mod in m.named_modules():
            if name.startswith("audio_vae"):
                continue
            if isinstance(mod, MiniCPMRMSNorm):
                self.handles.append(mod.register_forward_hook(self._hook(name, "residual stream", True)))
            elif isinstance(mod, torch.nn.Linear):
                self.handles.append(mod.register_forward_hook(self._hook(name, "Linear output", False)))
                if name.endswith("mlp.down_proj"):
                    self.handles.append(mod.register_forward_hook(self._hook(name, "MLP product", True)))

    def _hook(self, name, kind, use_input):
        def hook(_mod, inp, out):
            if self.on:
                v = (inp[0] if use_input else out).detach().abs().amax().float()
                cur = self.max.get((name, kind))
                self.max[(name, kind)] = v if cur is None else self.torch.maximum(cur, v)    # NaN propagates
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()

    def summary(self):
        """{group: {kind: {max, module}}} and the overall largest."""
        out, top = {}, {"max": 0.0, "module": None}
        for (name, kind), v in self.max.items():
            v = float(v)
            g = out.setdefault(GROUPS.get(name.split(".")[0], "projections"), {})
            if kind not in g or not g[kind]["max"] >= v:
                g[kind] = {"max": v, "module": name}
            if not top["max"] >= v:
                top = {"max": v, "module": name, "kind": kind}
        top["float16_headroom"] = FP16_MAX / top["max"] if top["max"] and np.isfinite(top["max"]) else None
        return {"groups": out, "largest": top}


@contextlib.contextmanager
def float16_storage(torch, m):
    """The float32 model with every Linear's output (outside the VAE) rounded to float16: float16
    storage between the matrix products, float32 everywhere else, as the export intends; the
    weights, saved in bfloat16, are already float16 values but for the tiniest."""
    hs = [mod.register_forward_hook(lambda _m, _i, out: out.to(torch.float16).to(out.dtype))
          for name, mod in m.named_modules() if isinstance(mod, torch.nn.Linear) and not name.startswith("audio_vae")]
    try:
        yield
    finally:
        for h in hs:
            h.remove()


def cpu_low_precision(torch):
    """Test shim: torch 1.13's CPU lacks most float16 kernels (addmm, softmax, SiLU, ...); an op that
    raises "not implemented for 'Half'" (or 'BFloat16') runs again in float32 with its result
    rounded back, which is float16 storage with float32 arithmetic."""
    from torch.overrides import TorchFunctionMode
    low = (torch.float16, torch.bfloat16)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                return func(*args, **kwargs)
            except RuntimeError as e:
                if "not implemented for 'Half'" not in str(e) and "not implemented for 'BFloat16'" not in str(e):
                    raise
            seen = []

            def up(x):
                if isinstance(x, torch.Tensor) and x.dtype in low:
                    seen.append(x.dtype)
                    return x.float()
                return type(x)(up(y) for y in x) if isinstance(x, (list, tuple)) else x

            def down(y):
                if isinstance(y, torch.Tensor) and y.dtype == torch.float32:
                    return y.to(seen[0])
                return type(y)(down(z) for z in y) if isinstance(y, (list, tuple)) else y
            return down(func(*up(args), **{k: up(v) for k, v in kwargs.items()}))
    return Mode()


def variant_runs(torch, ref, runs, targets, caches, order, n_steps):
    """One variant of the reference (its model's dtype, hooks on it) on the float32 runs' inputs:
    free-running end to end (text, prompt) with the same noise, and the batch rows' steps
    teacher-forced (Reference.teacher_forced)."""
    out = {}
    for key in ("text", "prompt"):
        r = runs[key]
        out[key] = ref.generate(targets[key], caches[key], len(r["noise"]), torch.from_numpy(r["noise"]))
    out["tf"] = {key: ref.teacher_forced(targets[key], caches[key], runs[key], n_steps) for key in order}
    return out


def graph_teacher_forced(G, order, tok_ids, n_text, prompt_patches, runs, n_steps, cfg_value):
    """The batch rows through the graphs (B = len(order), each row at its own position), every
    step fed the float32 reference run's mu, previous patch and noise: each step's error is then
    that step's alone (the cache holds the reference's patches too)."""
    B = len(order)
    cache = G.empty_cache(B)
    cond0, pos = [], []
    for b, key in enumerate(order):
        tmask, feat, fmask = graph_inputs(tok_ids[key], n_text[key], prompt_patches[key], G.P, G.D)
        _, _, c = G.prefill(tok_ids[key], tmask, feat, fmask)
        for name in cache:
            cache[name][b] = c[name][0]
        cond0.append(feat[-1])
        pos.append(len(tok_ids[key]))
    out = {key: {"patch": [], "next_mu": [], "next_stop": []} for key in order}
    for i in range(n_steps):
        mu = np.stack([runs[k]["mu"][i] for k in order])
        cond = np.stack([cond0[b] if i == 0 else runs[k]["latents"][i - 1] for b, k in enumerate(order)])
        z = np.stack([runs[k]["noise"][i][0] for k in order])
        patch, nmu, nstop, cache = G.step(mu, cond, z, cfg_value, pos, cache)
        for b, key in enumerate(order):
            out[key]["patch"].append(patch[b])
            out[key]["next_mu"].append(nmu[b])
            out[key]["next_stop"].append(nstop[b])
        pos = [p + 1 for p in pos]
    return {key: {q: np.stack(v) for q, v in d.items()} for key, d in out.items()}


def precision_quantities(runs, got, order, n_steps):
    """[(name, want, {variant: got}, per_step)] over every variant in got
    ({variant: {text, prompt: e2e dict, tf: {row: teacher-forced dict}}})."""
    qs = []
    for key in ("text", "prompt"):
        r = runs[key]
        qs.append(("prefill mu (%s)" % key, r["mu"][0], {v: g[key]["mu"][0] for v, g in got.items()}, False))
        qs.append(("prefill stop logits (%s)" % key, r["stop"][0], {v: g[key]["stop"][0] for v, g in got.items()}, False))
    for q, src in (("patch", "latents"), ("next_mu", "mu"), ("next_stop", "stop")):
        lo = 0 if q == "patch" else 1
        want = np.stack([runs[k][src][lo:lo + n_steps] for k in order], axis=1)        # [steps, rows, ...]
        qs.append(("step %s, teacher-forced (%d rows x %d steps)" % (q, len(order), n_steps), want,
                   {v: np.stack([g["tf"][k][q] for k in order], axis=1) for v, g in got.items()}, True))
    for key in ("text", "prompt"):
        r = runs[key]
        for q, label in (("mu", "mu, every patch"), ("stop", "stop logits, every patch"), ("latents", "latents"),
                         ("audio", "audio")):
            qs.append(("e2e %s (%s)" % (label, key), r[q], {v: g[key][q] for v, g in got.items()}, q != "audio"))
    return qs


def judge(name, want, got, factor, per_step):
    """Errors of every variant; ours passes when its RMS error is at most factor times the
    reference float16's (else bfloat16's, where float16's is not finite)."""
    row = {v: errors(g, want) for v, g in got.items()}
    if per_step:
        row["rms_by_step"] = {v: per_step_rms(g, want) for v, g in got.items()}
    yard = next((v for v in ("fp16", "bf16") if v in row and row[v].get("rms") is not None), None)
    res = {"errors": row, "yardstick": yard}
    c = row.get("ours")
    if c is None:
        res["verdict"] = "not run"
        return res
    if c.get("rms") is None:
        res.update(verdict="FAIL", why="%d NaN/Inf of %d" % (c.get("nonfinite", 0), c["values"]) if c.get("nonfinite")
                   else "shape %s, reference %s" % (c.get("shape"), c.get("reference_shape")))
        return res
    if yard is None:
        res.update(verdict="FAIL", why="no finite reference float16 or bfloat16 run to judge against")
        return res
    allowed = factor * max(row[yard]["rms"], FP16_ROUNDOFF * c["reference_rms"])
    res.update(ratio=c["rms"] / max(row[yard]["rms"], 1e-30), allowed_rms=allowed)
    if "f16io" in row and row["f16io"].get("rms"):
        res["ratio_to_float16_storage"] = c["rms"] / row["f16io"]["rms"]
    if c["values"] < MIN_JUDGED_VALUES:
        res["verdict"] = "info"
    else:
        res["verdict"] = "ok" if c["rms"] <= allowed else "FAIL"
        if res["verdict"] == "FAIL":
            res["why"] = "RMS error %.3g is %.2fx the reference %s's %.3g" % (
                c["rms"], res["ratio"], "float16" if yard == "fp16" else "bfloat16", row[yard]["rms"])
    return res


def precision_table(results):
    fmt = lambda x: "-" if x is None else "%.3g" % x      # noqa: E731
    cos = lambda x: "-" if x is None else "%.6f" % x      # noqa: E731
    rows = [("quantity / against the reference in float32", "max abs", "rel max", "rms", "rel rms", "cosine", "")]
    for name, res in results.items():
        rows.append((name, "", "", "", "", "", ""))
        for v, label in VARIANTS:
            e = res["errors"].get(v)
            if e is None:
                continue
            note = ""
            if v == "ours":
                note = res["verdict"] if "ratio" not in res else "%.2fx %s: %s" % (
                    res["ratio"], LETTER[res["yardstick"]], res["verdict"])
                if "ratio_to_float16_storage" in res:
                    note += " (%.2fx (d))" % res["ratio_to_float16_storage"]
            if e.get("nonfinite"):
                note = ("%d NaN/Inf; " % e["nonfinite"]) + note
            rows.append(("  " + label, fmt(e.get("max_abs")), fmt(e.get("rel")), fmt(e.get("rms")), fmt(e.get("rel_rms")),
                         cos(e.get("cosine")), note))
    w = [max(len(r[i]) for r in rows) for i in range(7)]
    return "\n".join("  ".join(c.ljust(w[i]) if i in (0, 6) else c.rjust(w[i]) for i, c in enumerate(r)).rstrip()
                     for r in rows)


def magnitude_lines(mag):
    lines = ["largest |value| in the reference (float32, these runs), against float16's %g:" % FP16_MAX]
    for g, kinds in mag["groups"].items():
        lines.append("  %-12s %s" % (g, ", ".join("%s %.3g (%s)" % (k, v["max"], v["module"])
                                                  for k, v in sorted(kinds.items()))))
    top = mag["largest"]
    if top["module"] is not None:
        lines.append("  largest: %.4g at %s (%s); float16's range is %s" % (
            top["max"], top["module"], top["kind"],
            "%.3gx that" % top["float16_headroom"] if top["float16_headroom"] else "EXCEEDED or not finite"))
    return lines


# ---------------------------------------------------------------------------------------------
# Report


def diff(got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return {"shape": list(got.shape), "reference_shape": list(want.shape), "tolerance_rel": tol, "pass": False}
    d = float(np.abs(got - want).max()) if got.size else 0.0
    ref = float(np.abs(want).max()) if want.size else 0.0
    r = d / max(ref, 1e-30)
    return {"max_abs_diff": d, "max_rel_diff": r, "reference_abs_max": ref, "tolerance_rel": tol, "pass": bool(r <= tol)}


def table(checks):
    rows = [("quantity", "max abs diff", "max rel diff", "tol (rel)", "")]
    for k, v in checks.items():
        if "max_rel_diff" in v:
            rows.append((k, "%.3g" % v["max_abs_diff"], "%.3g" % v["max_rel_diff"], "%g" % v["tolerance_rel"],
                         "ok" if v["pass"] else "FAIL"))
        else:
            rows.append((k, "-", "-", "-", "ok" if v.get("pass") else "FAIL"))
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)) for r in rows)


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", required=True, help="VoxCPM's src/voxcpm copy (.ref)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--report", required=True)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--full", dest="full", action="store_true", default=True, help="VoxCPM 1.5's sizes (default)")
    size.add_argument("--tiny", dest="full", action="store_false")
    ap.add_argument("--device", default="cpu", help="the reference's device (cpu, cuda)")
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                    help="the export's; float16 measures its error against the reference's own in bfloat16 and float16")
    ap.add_argument("--factor", type=float, default=2.0,
                    help="float16: ours passes where its RMS error is at most this times the reference float16's")
    ap.add_argument("--export-device", help="scripts/voxcpm/export.py's --device (default cpu; cuda with --dtype float16)")
    ap.add_argument("--export-checks", action="store_true",
                    help="float16: keep scripts/voxcpm/export.py's own checks (float32 parity covers them; they cost a minute)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--patches", type=int, help="patches end to end (default: 8 full, 12 tiny)")
    ap.add_argument("--steps", type=int, help="batched steps (default 4)")
    ap.add_argument("--fsq-margin", type=float, default=1e-4)
    ap.add_argument("--draws", type=int, default=40, help="at most this many input draws per run (FSQ margin)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-ort", action="store_true", help="skip the export and every graph run (reference side only)")
    ap.add_argument("--reuse", action="store_true", help="keep WORK/model and WORK/export from an earlier run")
    ap.add_argument("--test-shims", action="store_true",
                    help="stand-ins for einops, transformers, safetensors and SDPA (CPU tests with torch 1.13 only)")
    a = ap.parse_args()

    half = a.dtype == "float16"
    if a.export_device is None:
        a.export_device = "cuda" if half else "cpu"
    if a.test_shims:
        vref.install_test_shims()
    vref.install(a.reference)
    import torch
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")
    from . import tokenizer as voxcpm_tokenizer

    n_e2e = a.patches or (8 if a.full else 12)
    n_steps = a.steps or 4
    if n_steps + 1 > n_e2e:
        ap.error("--steps must be below --patches")
    model_dir = os.path.join(a.work, "model")
    out_dir = os.path.join(a.work, "export" if not half else "export-float16")
    os.makedirs(model_dir, exist_ok=True)
    timings = {}
    commit_file = os.path.join(a.reference, "VOXCPM_COMMIT")
    report = {"model": "VoxCPM 1.5 sizes" if a.full else "tiny", "torch": torch.__version__,
              "reference": vref.INFO.get("package"), "device": a.device,
              "reference_commit": open(commit_file).read().strip() if os.path.exists(commit_file) else None}
    if half:
        report.update({"dtype": "float16", "factor": a.factor})

    # 1. build and save
    saved = None
    if not (a.reuse and os.path.exists(os.path.join(model_dir, "model.safetensors"))):
        voxcpm_tokenizer.write_tiny_tokenizer(model_dir)
        from transformers import LlamaTokenizerFast
        vocab = len(LlamaTokenizerFast.from_pretrained(model_dir))
        cfg = config_json(a.full, max(vocab, 128))
        log("building the reference's modules (%s) on %s" % (report["model"], a.device))
        saved = build_and_save(torch, model_dir, cfg, a.device, a.seed)
        timings["build_and_save"] = round(time.time() - T0, 1)
        log("published-format checkpoint in %s" % model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)

    # 2. export
    if not a.no_ort and not (a.reuse and os.path.exists(os.path.join(out_dir, "pipeline.yaml"))):
        t = time.time()
        # float16: the exporter's checks are float32 PyTorch ones (what the float32 run covers) and a
        # float16 ONNX Runtime one that only prints; skipping them keeps the full run short.
        rc = run_module(__package__ + ".export", [model_dir, out_dir,
                                                  "--dtype", a.dtype, "--device", a.export_device,
                                                  "--max-positions", "256"]
                        + (["--no-check"] if half and not a.export_checks else [])).returncode
        timings["export"] = round(time.time() - t, 1)
        if rc != 0:
            report.update({"pass": False, "error": "scripts/voxcpm/export.py exited %d" % rc, "seconds": timings})
            with open(a.report, "w") as f:
                json.dump(report, f, indent=2)
            print("FAIL: scripts/voxcpm/export.py exited %d (report %s)" % (rc, a.report))
            sys.exit(1)
        log("exported in %.0f s" % timings["export"])

    # 3. the reference, loaded back
    t = time.time()
    m = vref.load_model(model_dir, a.device, dtype="float32", optimize=False)
    timings["reload"] = round(time.time() - t, 1)
    report["pydantic"] = vref.INFO.get("pydantic")
    if vref.INFO.get("test_shims"):
        report["test_shims"] = vref.INFO["test_shims"]
    checks = {}
    if saved is not None:
        checks["reload (weights as saved)"] = reload_check(torch, m, *saved)
        del saved
    timesteps, cfg_value = 10, float(cfg["dit_config"]["cfm_config"].get("inference_cfg_rate", 2.0))
    G = None
    if not a.no_ort:
        import onnxruntime
        report["onnxruntime"] = onnxruntime.__version__
        t = time.time()
        try:
            G = Graphs(out_dir, a.threads)
        except Exception as e:     # a float16 kernel the CPU provider lacks, say
            fail_ort(report, a, timings, "opening the graphs", e)
        timings["sessions"] = round(time.time() - t, 1)
        gen = G.pipe.get("generation", {})
        timesteps, cfg_value = int(gen.get("timesteps", timesteps)), float(gen.get("cfg_value", cfg_value))
        for key, want in (("patch_size", m.patch_size), ("feat_dim", m.feat_dim), ("chunk_size", m.chunk_size)):
            if int(G.pipe[key]) != int(want):
                raise SystemExit("pipeline.yaml %s = %s, the model's is %s" % (key, G.pipe[key], want))
        if int(G.pipe["tokenizer"]["audio_start"]) != m.audio_start_token:
            raise SystemExit("pipeline.yaml tokenizer.audio_start != %d" % m.audio_start_token)
    ref = Reference(torch, m, timesteps, cfg_value)
    P, D = ref.P, ref.D
    report.update({"patches_end_to_end": n_e2e, "batched_steps": n_steps, "timesteps": timesteps,
                   "cfg_value": cfg_value, "fsq_margin_required": a.fsq_margin})

    # The requests. Short texts keep the CPU graphs of the full model fast.
    target = "Hello world, this is a parity test."
    prompt_text, prompt_target = "A voice prompt.", "Then the target text."
    third = "Good morning."
    clip_samples = int(2.6 * ref.patch_len)           # left-padded to 3 patches

    def noises(seed, n):
        return torch.randn(n, 1, D, P, generator=torch.Generator().manual_seed(seed))

    mag = Magnitudes(torch, m) if half else None
    if mag:
        mag.on = True
    t = time.time()
    runs = {}
    runs["text"] = draw(ref, torch, a.seed, a.fsq_margin, a.draws,
                        lambda s: dict(ref.generate(target, None, n_e2e, noises(s, n_e2e)), seed=s))

    def prompted(s):
        clip = prompt_audio(torch, s, clip_samples, m.sample_rate)
        cache = ref.prompt_cache(prompt_text, clip)
        run = ref.generate(prompt_target, cache, n_e2e, noises(s + 1, n_e2e))
        run.update(seed=s, clip=clip, cache=cache)
        return run
    runs["prompt"] = draw(ref, torch, a.seed + 7, a.fsq_margin, a.draws, prompted)
    runs["third"] = draw(ref, torch, a.seed + 13, a.fsq_margin, a.draws,
                         lambda s: dict(ref.generate(third, None, n_steps + 1, noises(s, n_steps + 1)), seed=s))
    timings["reference_runs"] = round(time.time() - t, 1)
    if mag:
        mag.on = False
        mag.remove()
    report["fsq"] = {k: {"margin": r["fsq_margin"], "draws": r["draws"]} for k, r in runs.items()}
    log("reference runs done; FSQ margins %s" % {k: "%.2g (%d draws)" % (r["fsq_margin"], r["draws"]) for k, r in runs.items()})

    # Reference-only: the cached steps against an uncached forward.
    for key, tgt, cache in (("text", target, None), ("prompt", prompt_target, runs["prompt"]["cache"])):
        mu_u, stop_u = ref.uncached(tgt, cache, runs[key]["latents"])
        checks["reference cached vs uncached mu (%s)" % key] = diff(runs[key]["mu"], mu_u, 1e-4)
        checks["reference cached vs uncached stop (%s)" % key] = diff(runs[key]["stop"], stop_u, 1e-4)

    # Reference-only: its decode of the text run's latents (used below), and the prompt's encode.
    pad_clip = left_pad(torch, runs["prompt"]["clip"], ref.patch_len)
    ref_dec = ref.decode(runs["text"]["latents"])
    ref_enc = ref.encode(pad_clip.unsqueeze(0))
    prompt_latents = runs["prompt"]["cache"]["audio_feat"].float().numpy()
    checks["reference encode vs build_prompt_cache"] = diff(ref_enc.reshape(-1, P, D), prompt_latents, 1e-6)
    report["audio_abs_max"] = {"text": float(np.abs(runs["text"]["audio"]).max()),
                               "text_rms": float(np.sqrt((runs["text"]["audio"] ** 2).mean()))}

    if G is not None:
        t = time.time()
        # VAE encoder and decoder on the same inputs as the reference's.
        got_enc = G.encode(pad_clip.numpy())
        checks["vae_encoder latent"] = diff(got_enc, ref_enc, 1e-4)
        checks["vae_decoder patch by patch vs whole"] = diff(G.decode_stream(runs["text"]["latents"]), ref_dec, 1e-4)

        tok_ids = {"text": ref.ids(target, None), "prompt": ref.ids(prompt_target, runs["prompt"]["cache"]),
                   "third": ref.ids(third, None)}
        n_text = {"text": len(tok_ids["text"]), "third": len(tok_ids["third"]),
                  "prompt": len(tok_ids["prompt"]) - prompt_latents.shape[0]}
        prompt_patches = {"text": None, "third": None, "prompt": got_enc.reshape(-1, P, D)}
        report["sequence_lengths"] = {k: len(v) for k, v in tok_ids.items()}

    if G is not None and not half:
        # End to end, B = 1.
        for key in ("text", "prompt"):
            r = runs[key]
            mus, stops, patches = graph_run(G, tok_ids[key], n_text[key], prompt_patches[key], r["noise"], cfg_value)
            checks["prefill mu (%s)" % key] = diff(mus[0], r["mu"][0], 1e-4)
            checks["prefill stop logits (%s)" % key] = diff(stops[0], r["stop"][0], 1e-4)
            checks["e2e mu, every patch (%s)" % key] = diff(mus, r["mu"], 1e-3)
            checks["e2e stop logits, every patch (%s)" % key] = diff(stops, r["stop"], 1e-3)
            checks["e2e latents (%s)" % key] = diff(patches, r["latents"], 1e-3)
            prime = prompt_patches[key][-G.context_patches:] if prompt_patches[key] is not None else None
            checks["e2e audio (%s)" % key] = diff(G.decode_stream(patches, prime), r["audio"], 1e-3)
        timings["graphs_e2e"] = round(time.time() - t, 1)

        # A batch of three rows at different positions, n_steps steps; each row against its
        # reference run alone (the same noise).
        t = time.time()
        order = ["text", "prompt", "third"]
        B = len(order)
        cache = G.empty_cache(B)
        mu = np.zeros((B, m.feat_decoder.estimator.config.hidden_size), np.float32)
        cond = np.zeros((B, P, D), np.float32)
        pos = []
        for b, key in enumerate(order):
            tmask, feat, fmask = graph_inputs(tok_ids[key], n_text[key], prompt_patches[key], P, D)
            mu_b, _, c = G.prefill(tok_ids[key], tmask, feat, fmask)
            for name in cache:
                cache[name][b] = c[name][0]
            mu[b], cond[b] = mu_b, feat[-1]
            pos.append(len(tok_ids[key]))
        report["batch_positions_at_first_step"] = list(pos)
        worst = {"patch": [], "next_mu": [], "next_stop": []}
        per_row = {}
        for i in range(n_steps):
            z = np.stack([runs[k]["noise"][i][0] for k in order])
            patch, nmu, nstop, cache = G.step(mu, cond, z, cfg_value, pos, cache)
            for b, key in enumerate(order):
                r = runs[key]
                row = per_row.setdefault(key, {"patch": [], "next_mu": [], "next_stop": []})
                row["patch"].append((patch[b], r["latents"][i]))
                row["next_mu"].append((nmu[b], r["mu"][i + 1]))
                row["next_stop"].append((nstop[b], r["stop"][i + 1]))
            mu, cond = nmu, patch
            pos = [p + 1 for p in pos]
        for key, row in per_row.items():
            for q, pairs in row.items():
                worst[q].append(diff(np.stack([g for g, _ in pairs]), np.stack([w for _, w in pairs]), 1e-4))
        for q, ds in worst.items():
            d = max(ds, key=lambda x: x["max_rel_diff"])
            d = dict(d, rows={k: {"max_abs_diff": x["max_abs_diff"], "max_rel_diff": x["max_rel_diff"]}
                              for k, x in zip(order, ds)})
            checks["batched steps %s (%d rows x %d steps)" % (q, B, n_steps)] = d
        timings["graphs_batch"] = round(time.time() - t, 1)

    precision, lines = None, []
    if half:
        order = ["text", "prompt", "third"]
        targets = {"text": target, "prompt": prompt_target, "third": third}
        caches = {"text": None, "prompt": runs["prompt"]["cache"], "third": None}
        # The teacher-forced steps' machinery on the float32 reference itself: it must give back
        # its own run (a batched solve and an uncached forward, so within float32 noise).
        tf = {k: ref.teacher_forced(targets[k], caches[k], runs[k], n_steps) for k in order}
        for q, src, lo in (("patch", "latents", 0), ("next_mu", "mu", 1), ("next_stop", "stop", 1)):
            checks["reference teacher-forced steps vs its run: %s" % q] = diff(
                np.stack([tf[k][q] for k in order]), np.stack([runs[k][src][lo:lo + n_steps] for k in order]), 1e-4)
        got = {}
        t = time.time()
        for v, dtype in (("bf16", "bfloat16"), ("fp16", "float16")):
            log("the reference in %s on %s" % (dtype, a.device))
            try:
                m_lo = vref.load_model(model_dir, a.device, dtype=dtype, optimize=False)
                with (cpu_low_precision(torch) if a.test_shims and a.device == "cpu" else contextlib.nullcontext()):
                    got[v] = variant_runs(torch, Reference(torch, m_lo, timesteps, cfg_value), runs, targets, caches,
                                          order, n_steps)
            except Exception as e:
                report.setdefault("errors", {})["reference " + dtype] = "%s: %s" % (type(e).__name__, e)
                log("the reference in %s failed: %s: %s" % (dtype, type(e).__name__, e))
            m_lo = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        with float16_storage(torch, m):
            got["f16io"] = variant_runs(torch, ref, runs, targets, caches, order, n_steps)
        timings["reference_variants"] = round(time.time() - t, 1)
        if G is not None:
            t = time.time()
            try:
                ours = {}
                for key in ("text", "prompt"):
                    r = runs[key]
                    mus, stops, patches = graph_run(G, tok_ids[key], n_text[key], prompt_patches[key], r["noise"], cfg_value)
                    prime = prompt_patches[key][-G.context_patches:] if prompt_patches[key] is not None else None
                    ours[key] = {"mu": mus, "stop": stops, "latents": patches, "audio": G.decode_stream(patches, prime)}
                ours["tf"] = graph_teacher_forced(G, order, tok_ids, n_text, prompt_patches, runs, n_steps, cfg_value)
            except Exception as e:
                fail_ort(report, a, timings, "running the graphs", e)
            got["ours"] = ours
            timings["graphs_float16"] = round(time.time() - t, 1)
        precision = {name: judge(name, want, g, a.factor, per)
                     for name, want, g, per in precision_quantities(runs, got, order, n_steps)}
        report["precision"] = precision
        report["magnitudes"] = mag.summary()
        lines = [""] + magnitude_lines(report["magnitudes"])
        for name in ("e2e latents (text)", "e2e latents (prompt)", "step patch, teacher-forced (3 rows x %d steps)" % n_steps):
            steps = precision[name]["errors"].get("rms_by_step", {})
            lines.append("%s, RMS error by %s: %s" % (name, "step" if "step" in name else "patch", "; ".join(
                "%s %s" % (LETTER[v], " ".join("%.2g" % x for x in steps[v]) if steps.get(v) else "-")
                for v, _ in VARIANTS if v in steps)))
        bad = {k: r for k, r in precision.items() if r["verdict"] == "FAIL"}
        # Without the reference's own float16 run there is no yardstick the verdict may rest on.
        report["precision_pass"] = not bad and "ours" in got and "fp16" in got
        yards = " or ".join(sorted({"float16" if r["yardstick"] == "fp16" else "bfloat16"
                                    for r in precision.values() if r.get("yardstick")}, reverse=True))
        if bad:
            lines.append("FAIL (float16): ours is not within %gx of the reference's own %s error: %s" % (
                a.factor, yards, "; ".join("%s: %s" % (k, r.get("why")) for k, r in bad.items())))
        elif "ours" in got and "fp16" in got:
            worst = max((r for r in precision.values() if r["verdict"] == "ok"), key=lambda r: r["ratio"], default=None)
            lines.append("float16 verdict: ours within %gx of the reference's own %s error at every judged quantity"
                         "%s; no NaN/Inf" % (a.factor, yards, "" if worst is None else " (worst %.2fx)" % worst["ratio"]))
        elif "ours" in got:
            lines.append("FAIL (float16): the reference did not run in float16, so ours is not judged")
        else:
            lines.append("float16: ours not run (--no-ort); the reference's own bfloat16 and float16 errors above")
        if "errors" in report:
            lines.append("float16: %s" % "; ".join("%s failed (%s)" % kv for kv in report["errors"].items()))

    report["checks"] = checks
    report["pass"] = (all(v.get("pass") for v in checks.values())
                      and (precision is None or report["precision_pass"] or a.no_ort))
    timings["total"] = round(time.time() - T0, 1)
    report["seconds"] = timings
    with open(a.report, "w") as f:
        json.dump(report, f, indent=2)
    print(table(checks))
    if precision is not None:
        print()
        print(precision_table(precision))
        print("\n".join(lines))
    print("%s; %s; report %s (%.0f s)" % ("PASS" if report["pass"] else "FAIL", report["model"], a.report, timings["total"]))
    if a.no_ort:
        print("(--no-ort: the export and the graphs were not run)")
    sys.exit(0 if report["pass"] else 1)


def fail_ort(report, a, timings, what, e):
    """The graphs could not be opened or run (ONNX Runtime's CPU provider lacks a float16 kernel,
    say): a report that says so, and exit 1."""
    import onnxruntime
    msg = "ONNX Runtime %s (CPU) failed %s: %s: %s" % (onnxruntime.__version__, what, type(e).__name__,
                                                       str(e).splitlines()[0][:400] if str(e) else "")
    timings["total"] = round(time.time() - T0, 1)
    report.update({"pass": False, "error": msg, "seconds": timings})
    with open(a.report, "w") as f:
        json.dump(report, f, indent=2)
    print("FAIL: %s (report %s)" % (msg, a.report))
    sys.exit(1)


if __name__ == "__main__":
    main()
