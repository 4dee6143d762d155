"""The eager baseline for VoxCPM 1.5: a published model directory run by OpenBMB/VoxCPM's own code
(VoxCPMModel from a copy of its src/voxcpm, scripts/voxcpm/reference.py), streaming the way its
generate_with_prompt_cache_streaming streams, one request at a time per worker.

    usage: python3 -m scripts.voxcpm.baseline --model-dir DIR [--reference .ref] [--voices DIR]
                                              [--port 8083] [--workers 1] [--device cuda]
                                              [--dtype bfloat16|float16|float32] [--max-patches N]
                                              [--ignore-stop] [--optimize auto|on|off]

--model-dir is the directory as released (config.json, model.safetensors, audiovae.pth,
tokenizer files); --reference the VoxCPM copy (scripts/voxcpm/fetch_reference.sh). --voices is an
exported pipeline's voices/ folder (voices/NAME/voice.yaml with `text` and the clip's latents,
latents.f32, frame-major [frames][feat_dim]), so both servers prompt with the same latents; the
voice `default` (and any request without a voice) has no prompt. --dtype is the networks' (the
reference's default is its config's, bfloat16; the AudioVAE runs in float32 as the reference
has it). The API is scripts/common/baseline_http.py's, 16-bit PCM at the model's 44.1 kHz.

Per request, as VoxCPM.generate(streaming=True) does with its defaults (no text normalization,
no denoiser, no badcase retry, which streaming does not allow): newlines and runs of whitespace
become one space; _generate_with_prompt_cache with the voice's prompt cache
({prompt_text, audio_feat}), 10 timesteps, guidance 2.0, min_len 2, and at most
int(target_text_tokens * 6 + 10) patches (the reference's own bound) and at most --max-patches
(4096 without it). Each yield (one patch: the reference decodes its last 3 patches and keeps the
last patch's samples) is sent as it comes.

--ignore-stop sets min_len to the cap, so that every request runs to its length bound: random
weights' stop head stops rows at random, and a benchmark against voxmux needs both servers to
generate the same number of patches (voxmux's generation.min_len and max_len set the same way;
scripts/verify-gpu.sh voxbench does both).

--optimize: the reference's optimize() (torch.compile, mode reduce-overhead, of the LMs' cached
step, the local encoder and the DiT) where it works: `auto` (default) compiles and warms up, and
falls back to eager if that fails; `off` is plain eager.
"""

import argparse
import os
import re
import sys

from ..common import baseline_http as web
from ..common.paths import REPO
from . import reference as vref

TIMESTEPS = 10
CFG_VALUE = 2.0
MIN_LEN = 2
MAX_LEN = 4096            # VoxCPM.generate's default
WARMUP_TEXT = "Warm up the kernels, please."


def voice_names(voices_dir):
    if not voices_dir:
        return ["default"]
    names = sorted(n for n in os.listdir(voices_dir) if os.path.exists(os.path.join(voices_dir, n, "voice.yaml")))
    return names if "default" in names else ["default"] + names


def load_voice(d, patch_size, feat_dim):
    """voice.yaml as the exporter writes it -> the reference's prompt cache, or None (no prompt)."""
    import numpy as np
    import torch
    import yaml
    with open(os.path.join(d, "voice.yaml")) as f:
        v = yaml.safe_load(f) or {}
    name = v.get("latents") or ("latents.f32" if os.path.exists(os.path.join(d, "latents.f32")) else None)
    if not name:
        return None
    lat = np.fromfile(os.path.join(d, name), "<f4")
    frames = lat.size // feat_dim
    if lat.size != frames * feat_dim or frames % patch_size:
        raise ValueError("%s: %d floats are not whole patches of %dx%d" % (d, lat.size, patch_size, feat_dim))
    feat = torch.from_numpy(lat.reshape(frames // patch_size, patch_size, feat_dim).copy())
    return {"prompt_text": str(v.get("text") or ""), "audio_feat": feat}


class VoxCPMPipeline:
    def __init__(self, reference, model_dir, voices_dir, device, dtype, max_patches, ignore_stop, optimize):
        vref.install(reference)
        import torch
        self.torch = torch
        self.max_len = min(MAX_LEN, max_patches) if max_patches else MAX_LEN
        self.min_len = self.max_len if ignore_stop else MIN_LEN
        self.optimize = optimize
        self.args = (model_dir, device, dtype)
        self.m = self._load(optimize != "off")
        self.voices = {}
        for n in voice_names(voices_dir):
            d = os.path.join(voices_dir, n) if voices_dir else None
            self.voices[n] = load_voice(d, self.m.patch_size, self.m.feat_dim) if d and os.path.isdir(d) else None

    def _load(self, optimize):
        model_dir, device, dtype = self.args
        m = vref.load_model(model_dir, device, dtype=dtype, optimize=optimize)
        vref.model_module().tqdm = lambda it, **_: it   # no progress bar per request
        return m

    def synthesize(self, text, voice, emit_pcm):
        text = re.sub(r"\s+", " ", text.replace("\n", " ")).strip()
        gen = self.m.generate_with_prompt_cache_streaming(
            target_text=text, prompt_cache=self.voices[voice], min_len=self.min_len, max_len=self.max_len,
            inference_timesteps=TIMESTEPS, cfg_value=CFG_VALUE)
        try:
            for audio, _, _ in gen:
                emit_pcm(audio.reshape(-1).float().cpu())
        finally:
            gen.close()

    def warmup(self):
        try:
            for name in self.voices:
                self.synthesize(WARMUP_TEXT, name, lambda pcm: None)
        except Exception as e:
            if self.optimize != "auto":
                raise
            print("torch.compile failed in warm-up (%s: %s); running eager" % (type(e).__name__, e), file=sys.stderr, flush=True)
            del self.m
            if self.torch.cuda.is_available():
                self.torch.cuda.empty_cache()
            self.optimize = "off"
            self.m = self._load(False)
            for name in self.voices:
                self.synthesize(WARMUP_TEXT, name, lambda pcm: None)
        compiled = hasattr(self.m, "_feat_encoder_raw")     # set by optimize() once it compiled
        print("worker warm (%s)" % ("torch.compile" if compiled else "eager"), file=sys.stderr, flush=True)


def load_pipeline(*args):
    """A worker's model (baseline_http.worker_main calls it in the worker process)."""
    return VoxCPMPipeline(*args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="a published VoxCPM 1.5 model directory")
    ap.add_argument("--reference", default=os.path.join(REPO, ".ref"),
                    help="VoxCPM's src/voxcpm copy (default: the repository's .ref)")
    ap.add_argument("--voices", help="an exported pipeline's voices/ folder (default: only `default`, no prompt)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8083)
    ap.add_argument("--workers", type=int, default=1, help="processes, each with its own model copy")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="default: config.json's (bfloat16)")
    ap.add_argument("--max-patches", type=int, help="at most this many patches per request (160 ms each)")
    ap.add_argument("--ignore-stop", action="store_true", help="every request runs to its length bound")
    ap.add_argument("--optimize", choices=["auto", "on", "off"], default="auto")
    a = ap.parse_args()
    if a.workers < 1:
        ap.error("--workers must be at least 1")
    if a.max_patches is not None and a.max_patches < 1:
        ap.error("--max-patches must be at least 1")
    vref.install(a.reference)          # fails here, not in the workers, when the copy is missing
    voices = voice_names(a.voices)
    import json
    with open(os.path.join(a.model_dir, "config.json")) as f:
        rate = int((json.load(f).get("audio_vae_config") or {}).get("sample_rate", 44100))
    print("loading %d worker(s) on %s (%s; voices %s; max patches %s%s) ..."
          % (a.workers, a.device, a.dtype or "config dtype", ", ".join(voices), a.max_patches or MAX_LEN,
             ", stop ignored" if a.ignore_stop else ""), flush=True)
    broker = web.Broker(load_pipeline, (a.reference, a.model_dir, a.voices, a.device, a.dtype, a.max_patches,
                                        a.ignore_stop, a.optimize), a.workers)
    return web.serve(broker, a.host, a.port, rate, set(voices), "default")


if __name__ == "__main__":
    sys.exit(main())
