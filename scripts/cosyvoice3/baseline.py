"""The eager baseline for CosyVoice3 itself: a published CosyVoice3 model directory in PyTorch eager
mode, streamed the way CosyVoice's own code streams it (cosyvoice/cli/model.py CosyVoice3Model),
one request at a time per worker.

    usage: python3 -m scripts.cosyvoice3.baseline --model-dir DIR --voices DIR [--port 8081] [--workers 1]
                                                  [--device cuda] [--dtype float16|float32]
                                                  [--byte-fallback]
                                                  [--min-tokens-per-text-token R]

--model-dir is the directory as released (cosyvoice3.yaml, llm.pt, flow.pt, hift.pt,
CosyVoice-BlankEN/); the networks are scripts/cosyvoice3/net.py's, loaded as
scripts/cosyvoice3/export.py loads them. --voices is an exported pipeline's voices/ folder
(voices/NAME/voice.yaml: text, speech_tokens, mel, embedding), so both servers speak with the same
prompts. --dtype is the LM's and the flow's (the vocoder runs in float32). The API is
scripts/common/baseline_http.py's; a request without "voice" gets `default`.

Per request, as the reference does:
- text: Qwen2's tokenizer (transformers' Qwen2Tokenizer over the model's vocab.json and
  merges.txt), <|endofprompt|> as its id; --byte-fallback instead maps UTF-8 bytes to ids below
  256, for a smoke test where transformers is not installed. No text normalization or splitting.
- LM thread, on its own CUDA stream: the prompt [sos, voice text + text, task id, voice speech
  tokens], greedy decoding with a KV cache grown by concatenation; end of speech is not allowed
  before 2 tokens per text token (--min-tokens-per-text-token, CosyVoice's min_token_text_ratio:
  the benchmark sets it as it sets voxmux's lm_min_tokens_per_text_token), decoding stops at 20.
  Past 5 silent tokens in a row, further silent ones are dropped, as llm_job drops them.
- main thread: whenever hop + 3 look-ahead tokens past the last chunk exist (hop: 25, plus what
  aligns the voice's prompt tokens to 25 for the first chunk; then doubled up to 100), the flow runs
  over the voice's prompt tokens and ALL tokens so far (FlowEncoder, 10 guided Euler steps on the
  cosine schedule, the reference's seed-0 noise by frame), the chunk's new mel is appended, and
  HiFT runs over the whole mel so far; the audio past what was sent, except the last 8 frames'
  (the F0 predictor's 3 look-ahead frames, conv_pre's 4, the inverse STFT's last), is sent. After
  the last token the flow runs once more with no look-ahead and the rest of the audio is sent.
  That recomputation over the whole history is what the reference's token2wav does.

Differences from the reference, all in the baseline's favour or without cost: the main thread
waits on a condition instead of polling every 100 ms; the hop restarts at 25 for every request
(the reference keeps the grown hop on the model object, so its later requests start at 100); the
DiT attends over every frame (the reference's streaming chunk mask costs the same in eager mode).
"""

import argparse
import math
import os
import sys

from ..common import baseline_http as web

ENDOFPROMPT = 151646           # <|endofprompt|> in CosyVoice3's tokenizer
MIN_TOKENS_PER_TEXT_TOKEN = 2
MAX_TOKENS_PER_TEXT_TOKEN = 20
HOP_TOKENS = 25                # token_hop_len: the flow's training chunk
MAX_HOP_TOKENS = 100           # token_max_hop_len; the hop doubles up to it (stream_scale_factor 2)
HELD_FRAMES = 8                # audio frames a non-final chunk holds back (see above)
FLOW_NOISE_FRAMES = 50 * 300   # CausalConditionalCFM's rand_noise
SILENT_TOKENS = {1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323}   # CosyVoice3Model.silent_tokens
MAX_SILENT_TOKENS = 5
WARMUP_TEXT = "Warm up the kernels, please."


class Tokenizer:
    def __init__(self, model_dir, byte_fallback):
        self.qwen = None
        try:
            from transformers import Qwen2Tokenizer
        except ImportError:
            if not byte_fallback:
                raise SystemExit("transformers is not importable: install it for CosyVoice3's tokenizer "
                                 "(or pass --byte-fallback for a smoke test)")
            return
        d = os.path.join(model_dir, "CosyVoice-BlankEN")
        self.qwen = Qwen2Tokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"))

    def encode(self, text):
        ids = []
        for i, part in enumerate(text.split("<|endofprompt|>")):
            if i:
                ids.append(ENDOFPROMPT)
            if part:
                ids += self.qwen.encode(part) if self.qwen is not None else list(part.encode("utf-8"))
        return ids


class Voice:
    def __init__(self, text_ids, tokens, mel, embedding):
        self.text_ids, self.tokens, self.mel, self.embedding = text_ids, tokens, mel, embedding


def voice_names(voices_dir):
    return sorted(n for n in os.listdir(voices_dir) if os.path.exists(os.path.join(voices_dir, n, "voice.yaml")))


def load_voice(d, cfg, tok, device, dtype):
    """voice.yaml as the exporter writes it; mel.f32 is frame-major [frames][mel], embedding.f32
    [spk_dim], both float32 little-endian."""
    import numpy as np
    import torch
    import yaml
    with open(os.path.join(d, "voice.yaml")) as f:
        v = yaml.safe_load(f)
    tokens = [int(t) for t in v.get("speech_tokens") or []]
    mel = np.zeros((0, cfg.flow.mel), np.float32)
    if v.get("mel"):
        mel = np.fromfile(os.path.join(d, v["mel"]), "<f4").reshape(-1, cfg.flow.mel)
    emb = np.zeros(cfg.flow.spk_dim, np.float32)
    if v.get("embedding"):
        emb = np.fromfile(os.path.join(d, v["embedding"]), "<f4").reshape(cfg.flow.spk_dim)
    # As the reference's frontend: exactly token_mel_ratio prompt frames per prompt token.
    r = cfg.flow.token_mel_ratio
    n = min(len(tokens), mel.shape[0] // r)
    tokens, mel = tokens[:n], mel[:n * r]
    return Voice(tok.encode(str(v.get("text") or "")), tokens,
                 torch.from_numpy(mel.T.copy()).unsqueeze(0).to(device, dtype),
                 torch.from_numpy(emb.copy()).unsqueeze(0).to(device))


class CosyVoice3Pipeline:
    def __init__(self, model_dir, voices_dir, device, dtype, byte_fallback,
                 min_tokens_per_text_token=MIN_TOKENS_PER_TEXT_TOKEN):
        import torch
        self.min_ratio = min_tokens_per_text_token
        from . import net
        from .export import HIFT_NOISE_SAMPLES, HIFT_NOISE_SEED, load_models
        self.torch = torch
        self.device = torch.device(device)
        self.dtype = torch.float16 if dtype == "float16" else torch.float32
        self.cfg = cfg = net.load_config(model_dir)
        lm, flow, hift = load_models(model_dir, cfg)
        g = torch.Generator().manual_seed(HIFT_NOISE_SEED)   # the exporter's sine-noise table
        hift.set_noise(torch.rand(HIFT_NOISE_SAMPLES, cfg.hift.nb_harmonics + 1, generator=g))
        self.lm = lm.to(self.device, self.dtype)
        self.flow = flow.to(self.device, self.dtype)
        self.hift = hift.to(self.device)
        self.encoder, self.step = net.FlowEncoder(self.flow), net.FlowStep(self.flow)
        ts = flow.time_span().tolist()
        self.t = [torch.tensor([ts[k]], device=self.device) for k in range(cfg.flow.steps)]
        self.dt = [torch.tensor([ts[k + 1] - ts[k]], device=self.device) for k in range(cfg.flow.steps)]
        self.cfg_rate = torch.tensor([cfg.flow.cfg_rate], device=self.device)
        # CausalConditionalCFM's noise: seed 0, [1, mel, 15000], frame f of a call gets column f.
        g = torch.Generator().manual_seed(0)
        self.noise = torch.randn([1, cfg.flow.mel, FLOW_NOISE_FRAMES], generator=g).to(self.device)
        self.tok = Tokenizer(model_dir, byte_fallback)
        self.voices = {n: load_voice(os.path.join(voices_dir, n), cfg, self.tok, self.device, self.dtype)
                       for n in voice_names(voices_dir)}
        self.lm_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def tokens(self, prompt, n_text, emit):
        """Greedy speech tokens after prompt (unified ids, CosyVoice3LM.forward), one emit each."""
        torch, c = self.torch, self.cfg.lm
        dev = self.device
        lo, hi = int(self.min_ratio * n_text), MAX_TOKENS_PER_TEXT_TOKEN * n_text
        past = [torch.zeros(1, c.kv_heads, 0, c.head_dim, device=dev, dtype=self.dtype)] * (2 * c.layers)
        web.greedy_decode(torch, self.lm, prompt, past, lo, hi, c.speech_tokens,
                          lambda tok: c.text_vocab + tok, emit, dev)

    def mel(self, voice, tokens, last):
        """The flow over the voice's prompt tokens and tokens: mel [1, mel, frames] after the
        prompt's; a chunk that is not the last reads its final lookahead tokens as context only."""
        torch, fc = self.torch, self.cfg.flow
        toks = torch.tensor([voice.tokens + tokens], device=self.device)
        N = toks.shape[1]
        mu = self.encoder(toks, torch.ones(1, 1, N, device=self.device, dtype=self.dtype))
        if not last:
            mu = mu[:, :, :(N - fc.lookahead) * fc.token_mel_ratio]
        F = mu.shape[2]
        if F > FLOW_NOISE_FRAMES:
            raise ValueError("%d mel frames: more than the flow's noise (%d)" % (F, FLOW_NOISE_FRAMES))
        P = voice.mel.shape[2]
        cond = torch.zeros(1, fc.mel, F, device=self.device, dtype=self.dtype)
        cond[:, :, :P] = voice.mel
        mask = torch.ones(1, 1, F, device=self.device)
        x = self.noise[:, :, :F]
        for k in range(fc.steps):
            x = self.step(x, mask, mu, self.t[k], self.dt[k], self.cfg_rate, cond, voice.embedding)
        return x[:, :, P:]

    def vocode(self, mel):
        torch = self.torch
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        phase = torch.zeros(1, self.cfg.hift.nb_harmonics + 1, device=self.device)
        return self.hift(mel.float(), phase, zero, zero)[0][0]

    def synthesize(self, text, voice_name, emit_pcm):
        """Streams text's audio in the voice: emit_pcm(float32 tensor on the CPU) once per chunk."""
        torch = self.torch
        c, fc = self.cfg.lm, self.cfg.flow
        voice = self.voices[voice_name]
        text_ids = self.tok.encode(text)
        V = c.text_vocab
        prompt = ([V + c.sos] + voice.text_ids + text_ids + [V + c.task_id] + [V + t for t in voice.tokens])

        def produce(emit):
            silent = 0

            def emit_spoken(tok):  # more than MAX_SILENT_TOKENS silent tokens in a row are dropped
                nonlocal silent
                silent = silent + 1 if tok in SILENT_TOKENS else 0
                if silent <= MAX_SILENT_TOKENS:
                    emit(tok)
            self.tokens(prompt, len(text_ids), emit_spoken)

        st, cond, th = web.lm_thread(torch, self.lm_stream, produce)
        hop = HOP_TOKENS
        pad = math.ceil(len(voice.tokens) / hop) * hop - len(voice.tokens)
        offset, sent, mels = 0, 0, []
        samples_per_frame = self.cfg.hift.hop
        try:
            with torch.inference_mode():
                while True:
                    this_hop = hop + pad if offset == 0 else hop
                    with cond:
                        while True:
                            if st["error"] is not None:
                                raise RuntimeError("LM failed: %r" % st["error"])
                            n = len(st["tokens"])
                            if n - offset >= this_hop + fc.lookahead:
                                last = False
                                toks = st["tokens"][:offset + this_hop + fc.lookahead]
                                break
                            if st["done"]:
                                last = True
                                toks = list(st["tokens"])
                                break
                            cond.wait()
                    if not toks:
                        return
                    mels.append(self.mel(voice, toks, last)[:, :, offset * fc.token_mel_ratio:])
                    whole = torch.cat(mels, dim=2)
                    audio = self.vocode(whole)
                    end = audio.shape[0] if last else (whole.shape[2] - HELD_FRAMES) * samples_per_frame
                    if end > sent:
                        emit_pcm(audio[sent:end].cpu())
                        sent = end
                    if last:
                        return
                    offset += this_hop
                    hop = min(MAX_HOP_TOKENS, hop * 2)
        finally:
            th.join()

    def warmup(self):
        for name in self.voices:
            self.synthesize(WARMUP_TEXT, name, lambda pcm: None)


def load_pipeline(model_dir, voices_dir, device, dtype, byte_fallback, min_ratio=MIN_TOKENS_PER_TEXT_TOKEN):
    """A worker's model (baseline_http.worker_main calls it in the worker process)."""
    return CosyVoice3Pipeline(model_dir, voices_dir, device, dtype, byte_fallback, min_ratio)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="a published CosyVoice3 model directory")
    ap.add_argument("--voices", required=True, help="an exported pipeline's voices/ folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--workers", type=int, default=1, help="processes, each with its own model copy")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16",
                    help="the LM's and the flow's (the vocoder runs in float32)")
    ap.add_argument("--byte-fallback", action="store_true",
                    help="without transformers, map text bytes to ids below 256 (smoke tests only)")
    ap.add_argument("--min-tokens-per-text-token", type=float, default=MIN_TOKENS_PER_TEXT_TOKEN, metavar="R",
                    help="speech tokens per text token before end of speech is allowed (CosyVoice's "
                         "min_token_text_ratio, %d; at most %d)" % (MIN_TOKENS_PER_TEXT_TOKEN, MAX_TOKENS_PER_TEXT_TOKEN))
    a = ap.parse_args()
    if a.workers < 1:
        ap.error("--workers must be at least 1")
    if not 0 <= a.min_tokens_per_text_token <= MAX_TOKENS_PER_TEXT_TOKEN:
        ap.error("--min-tokens-per-text-token %g: must be from 0 to %d"
                 % (a.min_tokens_per_text_token, MAX_TOKENS_PER_TEXT_TOKEN))
    voices = voice_names(a.voices)
    if "default" not in voices:
        ap.error("%s has no voice `default` (default/voice.yaml)" % a.voices)
    from . import net
    rate = net.load_config(a.model_dir).sample_rate
    print("loading %d worker(s) on %s (%s; voices %s) ..." % (a.workers, a.device, a.dtype, ", ".join(voices)), flush=True)
    broker = web.Broker(load_pipeline, (a.model_dir, a.voices, a.device, a.dtype, a.byte_fallback,
                                        a.min_tokens_per_text_token), a.workers)
    return web.serve(broker, a.host, a.port, rate, set(voices), "default")


if __name__ == "__main__":
    sys.exit(main())
