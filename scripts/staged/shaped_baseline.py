"""The baseline voxmux is measured against: the CosyVoice3-0.5B-shaped model in PyTorch eager
mode, one request at a time per worker, the way CosyVoice's own servers run it.

    usage: python3 -m scripts.staged.shaped_baseline --model-dir DIR [--port 8081] [--workers 1] [--device cuda]

DIR is what scripts/staged/shaped_export.py wrote: pipeline.yaml (token bounds, flow steps,
guidance, chunk schedule) and weights.pt (the same weights as the ONNX graphs; without it the
modules are rebuilt from the manifest's seed). The server answers the same API as voxmux's router
for what the benchmark sends (scripts/common/baseline_http.py):

    POST /v1/audio/speech {"input": "...", "response_format": "pcm"|"wav", "model", "voice"}
         -> 200, 16-bit mono 24 kHz audio streamed chunk by chunk (chunked transfer encoding)
    GET  /healthz, /readyz
    GET  /metrics   voxmux_gpu_memory_used_bytes / voxmux_gpu_utilization_ratio per GPU, when
                    NVML (pynvml) is importable

Each of --workers processes owns a copy of the model on the GPU and synthesizes one request at a
time: its LM thread generates speech tokens (greedy, KV cache grown by concatenation, like a
Hugging Face decoder) on its own CUDA stream while the main thread turns every finished chunk of
tokens into mel (10 Euler steps of the DiT with classifier-free guidance, batch 2) and audio (the
vocoder), as CosyVoice's model.py does with its llm_job thread. Requests beyond the workers wait in
a queue. Only the Python standard library and torch are used.
"""

import argparse
import os
import sys

from ..common import baseline_http as web


# ---------------------------------------------------------------------------------------------
# Manifest


def _scalar(v):
    v = v.strip()
    if v.startswith("[") and v.endswith("]"):
        return [_scalar(x) for x in v[1:-1].split(",") if x.strip()]
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v.strip("'\"")


def read_manifest(path):
    """Reads the flat two-level pipeline.yaml the exporter writes (PyYAML when installed)."""
    try:
        import yaml
        with open(path) as f:
            return yaml.safe_load(f)
    except ImportError:
        pass
    out, section = {}, None
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            key, _, value = line.strip().partition(":")
            if not line.startswith(" "):
                if value.strip():
                    out[key] = _scalar(value)
                    section = None
                else:
                    section = out.setdefault(key, {})
            elif section is not None:
                section[key] = _scalar(value)
    return out


class Settings:
    def __init__(self, m):
        lm, flow, st = m["lm"], m["flow"], m["streaming"]
        self.sample_rate = int(m["sample_rate"])
        self.dtype = m.get("dtype", "float32")
        self.offset = int(m["tokenizer"]["offset"])
        self.bos = int(m["tokenizer"]["bos"])
        self.sos = int(lm["sos"])
        self.speech_vocab = int(lm["speech_vocab"])
        self.speech_token_offset = int(lm["speech_token_offset"])
        self.min_tpc = float(lm["min_tokens_per_char"])
        self.max_tpc = float(lm["max_tokens_per_char"])
        self.max_tokens = int(lm.get("max_tokens", 4000))
        self.mel_bins = int(flow["mel_bins"])
        self.fpt = int(flow.get("frames_per_token", 2))
        self.steps = int(flow["steps"])
        self.cfg = float(flow["cfg_strength"])
        self.hop = int(m["vocoder"]["hop"])
        self.chunks = [int(c) for c in st["chunk_tokens"]]
        self.context = int(st["context_tokens"])

    def bounds(self, text):
        """Speech-token bounds for text, as voxmux's engine computes them (per character)."""
        chars = len(text)
        hi = min(max(int(chars * self.max_tpc + 0.5), 1), self.max_tokens)
        return min(int(chars * self.min_tpc), hi), hi

    def chunk_size(self, i):
        return self.chunks[i] if i < len(self.chunks) else self.chunks[-1]


# ---------------------------------------------------------------------------------------------
# Eager pipeline (runs inside a worker process)


class EagerPipeline:
    def __init__(self, model_dir, device, settings):
        import torch
        from . import shaped_net as cs
        self.torch, self.cs, self.s = torch, cs, settings
        self.device = torch.device(device)
        self.dtype = torch.float16 if settings.dtype == "float16" else torch.float32
        weights = os.path.join(model_dir, "weights.pt")
        models = cs.Models()
        if os.path.exists(weights):
            state = torch.load(weights, map_location="cpu", weights_only=True)
            models.load_state_dict(state["state_dict"])
        else:
            models = cs.build()
        cs.use_sdpa(models, True)
        self.m = models.eval().to(device=self.device, dtype=self.dtype)
        self.lm_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    # LM: greedy decoding with a growing KV cache, one sequence.
    def tokens(self, text, emit):
        torch, cs, s = self.torch, self.cs, self.s
        prompt = [s.bos] + [b + s.offset for b in text.encode("utf-8")] + [s.sos]
        lo, hi = s.bounds(text)
        dev = self.device
        past = [torch.zeros(1, cs.LM_KV_HEADS, 0, cs.LM_HEAD_DIM, device=dev, dtype=self.dtype)] * (2 * cs.LM_LAYERS)
        web.greedy_decode(torch, self.m.lm, prompt, past, lo, hi, s.speech_vocab,
                          lambda tok: tok + s.speech_token_offset, emit, dev)

    def flow(self, tokens, noise):
        """Mel [80, frames] for tokens, starting from noise [80, frames]."""
        torch, s = self.torch, self.s
        toks = torch.tensor([tokens], device=self.device)
        frames = len(tokens) * s.fpt
        tmask = torch.ones(1, 1, len(tokens), device=self.device, dtype=self.dtype)
        fmask = torch.ones(2, 1, frames, device=self.device, dtype=self.dtype)
        mu = self.m.flow_encoder(toks, tmask)
        mu2 = torch.cat([mu, torch.zeros_like(mu)])            # conditional and unconditional
        x = noise.unsqueeze(0).to(self.dtype)
        dt = 1.0 / s.steps
        for step in range(s.steps):
            t = torch.full((2,), step * dt, device=self.device, dtype=self.dtype)
            v = self.m.flow_estimator(torch.cat([x, x]), fmask, mu2, t)
            if s.cfg > 0:
                v = (1 + s.cfg) * v[:1] - s.cfg * v[1:]
            else:
                v = v[:1]
            x = x + dt * v
        return x[0]

    def synthesize(self, text, voice, emit_pcm):
        """Streams text's audio: emit_pcm(float32 tensor on the CPU) once per chunk. The model has
        one voice: voice is ignored."""
        torch, s = self.torch, self.s
        st, cond, th = web.lm_thread(torch, self.lm_stream, lambda emit: self.tokens(text, emit))
        gen = torch.Generator(device=self.device).manual_seed(0)
        noise = torch.empty(s.mel_bins, 0, device=self.device)
        flowed, chunk, prev_mel = 0, 0, None
        try:
            with torch.inference_mode():
                while True:
                    with cond:
                        while True:
                            if st["error"] is not None:
                                raise RuntimeError("LM failed: %r" % st["error"])
                            n, size = len(st["tokens"]), s.chunk_size(chunk)
                            if st["done"] and n - flowed <= size:
                                end, last = n, True
                                break
                            if n - flowed > size:  # a chunk leaves when more tokens follow it
                                end, last = flowed + size, False
                                break
                            cond.wait()
                        toks = st["tokens"][:end]
                    if end > flowed:
                        start = max(0, flowed - s.context)
                        f1 = end * s.fpt
                        if noise.shape[1] < f1:  # each frame's noise is drawn once
                            more = torch.randn(s.mel_bins, f1 - noise.shape[1], generator=gen, device=self.device)
                            noise = torch.cat([noise, more], dim=1)
                        mel = self.flow(toks[start:end], noise[:, start * s.fpt:f1])
                        mel = mel[:, (flowed - start) * s.fpt:]
                        ctx_frames = 0 if prev_mel is None else min(s.context * s.fpt, prev_mel.shape[1])
                        voc_in = mel if ctx_frames == 0 else torch.cat([prev_mel[:, prev_mel.shape[1] - ctx_frames:], mel], dim=1)
                        audio = self.m.vocoder(voc_in.unsqueeze(0))[0, ctx_frames * s.hop:]
                        prev_mel = mel
                        emit_pcm(audio.float().cpu())
                    flowed, chunk = end, chunk + 1
                    if last:
                        return
        finally:
            th.join()

    def warmup(self):
        self.synthesize("Warm up the kernels, please.", None, lambda pcm: None)


def load_pipeline(model_dir, device):
    """A worker's model (baseline_http.worker_main calls it in the worker process)."""
    settings = Settings(read_manifest(os.path.join(model_dir, "pipeline.yaml")))
    return EagerPipeline(model_dir, device, settings)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="folder with pipeline.yaml and weights.pt")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--workers", type=int, default=1, help="processes, each with its own model copy")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    if a.workers < 1:
        ap.error("--workers must be at least 1")
    settings = Settings(read_manifest(os.path.join(a.model_dir, "pipeline.yaml")))
    print("loading %d worker(s) on %s ..." % (a.workers, a.device), flush=True)
    broker = web.Broker(load_pipeline, (a.model_dir, a.device), a.workers)
    return web.serve(broker, a.host, a.port, settings.sample_rate)


if __name__ == "__main__":
    sys.exit(main())
