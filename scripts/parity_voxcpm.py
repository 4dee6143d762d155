#!/usr/bin/env python3
"""Checks voxmux's VoxCPM 1.5 export against OpenBMB/VoxCPM's own implementation, graph by graph
and end to end, with random weights.

    usage: scripts/parity_voxcpm.py --reference .ref --work DIR --report OUT.json
                                    [--full|--tiny] [--device cpu|cuda] [--no-ort] [--reuse]

--reference is a copy of VoxCPM's `src/voxcpm` package (scripts/fetch_voxcpm_reference.sh puts
one in the git-ignored .ref/); scripts/voxcpm_reference.py imports it. Needs torch >= 2, numpy,
transformers (LlamaTokenizerFast), safetensors, einops, tqdm, pyyaml, onnxruntime (CPU); not
pydantic.

1. Builds the reference's VoxCPMModel (v1, model/voxcpm.py) and AudioVAE with VoxCPM 1.5's sizes
   (--full; --tiny: a few layers of width 64) and random weights, and saves them as the published
   directory WORK/model: config.json, model.safetensors (bfloat16), audiovae.pth (float32,
   weight-normed convolutions as weight_g/weight_v) and the tiny tokenizer of
   scripts/voxcpm_tokenizer.py.
2. Runs scripts/export_voxcpm.py WORK/model WORK/export --dtype float32.
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

Rounding in the scalar quantizer (FSQ: round(9 * tanh(x)) / 9 after the base LM) turns a 1e-6
difference into a whole quantization step where a value lies on a rounding boundary. The inputs
(noise, prompt audio) are therefore drawn again, on the reference alone, until every value that
matters lies at least --fsq-margin (default 1e-4, ten times the expected float32 difference)
from a boundary; the margins and the number of draws are in the report.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import voxcpm_reference as vref  # noqa: E402

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
        with torch.inference_mode():
            feats = torch.zeros(1, T + n - 1, self.P, self.D)
            if k:
                feats[0, T - k:T] = cache["audio_feat"].float()
            feats[0, T:] = torch.from_numpy(latents[:n - 1])
            tokens = torch.tensor([ids + [0] * (n - 1)], device=m.device)
            amask = torch.zeros(1, T + n - 1, 1, device=m.device)
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
    ap.add_argument("--export-device", default="cpu", help="export_voxcpm.py's --device")
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

    if a.test_shims:
        vref.install_test_shims()
    vref.install(a.reference)
    import torch
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")
    import voxcpm_tokenizer

    n_e2e = a.patches or (8 if a.full else 12)
    n_steps = a.steps or 4
    if n_steps + 1 > n_e2e:
        ap.error("--steps must be below --patches")
    model_dir = os.path.join(a.work, "model")
    out_dir = os.path.join(a.work, "export")
    os.makedirs(model_dir, exist_ok=True)
    timings = {}
    commit_file = os.path.join(a.reference, "VOXCPM_COMMIT")
    report = {"model": "VoxCPM 1.5 sizes" if a.full else "tiny", "torch": torch.__version__,
              "reference": vref.INFO.get("package"), "device": a.device,
              "reference_commit": open(commit_file).read().strip() if os.path.exists(commit_file) else None}

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
        rc = subprocess.run([sys.executable, os.path.join(HERE, "export_voxcpm.py"), model_dir, out_dir,
                             "--dtype", "float32", "--device", a.export_device, "--max-positions", "256"]).returncode
        timings["export"] = round(time.time() - t, 1)
        if rc != 0:
            report.update({"pass": False, "error": "export_voxcpm.py exited %d" % rc, "seconds": timings})
            with open(a.report, "w") as f:
                json.dump(report, f, indent=2)
            print("FAIL: export_voxcpm.py exited %d (report %s)" % (rc, a.report))
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
        G = Graphs(out_dir, a.threads)
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

        # End to end, B = 1.
        tok_ids = {"text": ref.ids(target, None), "prompt": ref.ids(prompt_target, runs["prompt"]["cache"]),
                   "third": ref.ids(third, None)}
        n_text = {"text": len(tok_ids["text"]), "third": len(tok_ids["third"]),
                  "prompt": len(tok_ids["prompt"]) - prompt_latents.shape[0]}
        prompt_patches = {"text": None, "third": None, "prompt": got_enc.reshape(-1, P, D)}
        report["sequence_lengths"] = {k: len(v) for k, v in tok_ids.items()}
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

    report["checks"] = checks
    report["pass"] = all(v.get("pass") for v in checks.values())
    timings["total"] = round(time.time() - T0, 1)
    report["seconds"] = timings
    with open(a.report, "w") as f:
        json.dump(report, f, indent=2)
    print(table(checks))
    print("%s; %s; report %s (%.0f s)" % ("PASS" if report["pass"] else "FAIL", report["model"], a.report, timings["total"]))
    if a.no_ort:
        print("(--no-ort: the export and the graphs were not run)")
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
