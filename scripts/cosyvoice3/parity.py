"""Checks voxmux's CosyVoice3 export against CosyVoice's own implementation, stage by stage and
end to end, with random weights.

    usage: python3 -m scripts.cosyvoice3.parity --reference DIR --work DIR --report FILE [--tiny]

--reference is a folder holding a checkout of FunAudioLLM/CosyVoice (its `cosyvoice/` package and
`examples/libritts/cosyvoice3/conf/cosyvoice3.yaml`), x-transformers' `x_transformers.py`, and the
Qwen2 tokenizer files (`qwen2/vocab.json`, `merges.txt`, `tokenizer_config.json`). None of it is
part of voxmux: bring it in a git-ignored folder (docs/cosyvoice3.md, "Parity").

The script
1. instantiates the reference's own modules (CosyVoice3LM around a Qwen2ForCausalLM,
   CausalMaskedDiffWithDiT with its CausalConditionalCFM and DiT, CausalHiFTGenerator) with the
   sizes of CosyVoice3's cosyvoice3.yaml (--tiny: scripts/cosyvoice3/make_tiny.py's sizes) and random
   weights, and saves them as the published files (llm.pt, flow.pt, hift.pt) in WORK/model;
2. saves the noise the reference drew at construction (the flow's starting noise, HiFT's sine
   noise table), and runs scripts/cosyvoice3/export.py on WORK/model with that noise;
3. compares, with ONNX Runtime on the CPU against the reference in float32 on the CPU:
   - LM logits over a whole prompt (an uncached forward, see below) and for cached decode steps;
   - the flow's mel for the same tokens, prompt, speaker embedding and noise;
   - HiFT's waveform for the same mel;
   - end to end: greedy tokens from the reference LM, its mel and waveform (CosyVoice3Model's
     token2wav path, non-streaming) against the exported graphs chained as voxmux's engine runs
     them, and writes the tokens, text ids and waveform to WORK/e2e for a check through the
     server (docs/cosyvoice3.md).
The report (JSON) gives every difference and its tolerance; the script exits 1 if one is over.

Reference behaviour worked around, as the reference's own notes say:
- its cached LM step passes a one-position attention mask that transformers >= 4.53 pads with
  zeros, so cached logits are wrong: the reference side here always runs an uncached forward;
- HiFT's inference moves its F0 predictor to float64, as voxmux's graph computes it, but sums the
  source's phase in float32 where the graph sums it in float64: voiced frames at high pitch differ
  by the reference's rounding, and the tolerance for the waveform reflects that.
"""

import argparse
import importlib.util
import json
import os
import re
import sys
import time
import types

import numpy as np
import torch

from ..common.paths import run_module
from . import net
from .server_parity import TOKENS_PER_TEXT_TOKEN

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Importing the reference


def install_reference(ref):
    """Makes `cosyvoice` importable from the checkout, with the few imports its model classes need
    and inference never uses replaced: omegaconf's DictConfig, Matcha-TTS's BASECFM (a base class
    whose constructor only stores its arguments), the class registry of upsample_encoder, and
    x-transformers, of which the DiT uses RotaryEmbedding and apply_rotary_pos_emb: those two are
    taken from x_transformers.py's own source."""
    pkg = os.path.join(ref, "cosyvoice")
    spec = importlib.util.spec_from_file_location("cosyvoice", os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cosyvoice"] = mod
    spec.loader.exec_module(mod)

    oc = types.ModuleType("omegaconf")

    class DictConfig(dict):
        def __getattr__(self, k):
            return self[k]
    oc.DictConfig = DictConfig
    sys.modules["omegaconf"] = oc

    class BASECFM(torch.nn.Module):
        def __init__(self, n_feats, cfm_params, n_spks=1, spk_emb_dim=128):
            super().__init__()
            self.n_feats, self.n_spks, self.spk_emb_dim = n_feats, n_spks, spk_emb_dim
            self.solver = cfm_params.solver
            self.sigma_min = getattr(cfm_params, "sigma_min", 1e-4)
            self.estimator = None
    for name in ("matcha", "matcha.models", "matcha.models.components"):
        sys.modules[name] = types.ModuleType(name)
    fm = types.ModuleType("matcha.models.components.flow_matching")
    fm.BASECFM = BASECFM
    sys.modules["matcha.models.components.flow_matching"] = fm

    cu = types.ModuleType("cosyvoice.utils.class_utils")
    for n in ("COSYVOICE_EMB_CLASSES", "COSYVOICE_SUBSAMPLE_CLASSES", "COSYVOICE_ATTENTION_CLASSES",
              "COSYVOICE_ACTIVATION_CLASSES"):
        setattr(cu, n, {})
    sys.modules["cosyvoice.utils.class_utils"] = cu

    src = open(os.path.join(ref, "x_transformers.py")).read()
    ns = {}
    exec("from __future__ import annotations\nimport torch\nfrom torch import nn, arange, stack, cat, is_tensor\n"
         "from torch.nn import Module\nfrom torch.amp import autocast\nfrom einops import rearrange\n"
         "def exists(v):\n    return v is not None\n", ns)
    for name in ("class RotaryEmbedding", "def rotate_half", "def apply_rotary_pos_emb"):
        m = re.search(r"^(@autocast[^\n]*\n)?%s\b.*?(?=^\S)" % re.escape(name), src, re.S | re.M)
        if not m:
            raise SystemExit("x_transformers.py: %s not found" % name)
        exec(m.group(0), ns)
    for name in ("x_transformers", "x_transformers.x_transformers"):
        mod = types.ModuleType(name)
        mod.RotaryEmbedding = ns["RotaryEmbedding"]
        mod.apply_rotary_pos_emb = ns["apply_rotary_pos_emb"]
        sys.modules[name] = mod


def build_reference(cfg):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from cosyvoice.llm.llm import CosyVoice3LM, Qwen2Encoder
    from cosyvoice.utils.common import ras_sampling
    from cosyvoice.flow.flow import CausalMaskedDiffWithDiT
    from cosyvoice.flow.flow_matching import CausalConditionalCFM
    from cosyvoice.flow.DiT.dit import DiT
    from cosyvoice.transformer.upsample_encoder import PreLookaheadLayer
    from cosyvoice.hifigan.generator import CausalHiFTGenerator
    from cosyvoice.hifigan.f0_predictor import CausalConvRNNF0Predictor
    from omegaconf import DictConfig

    c = cfg.lm
    qcfg = Qwen2Config(vocab_size=c.text_vocab, hidden_size=c.hidden, intermediate_size=c.mlp,
                       num_hidden_layers=c.layers, num_attention_heads=c.heads,
                       num_key_value_heads=c.kv_heads, rms_norm_eps=c.rms_eps, rope_theta=c.rope_theta,
                       tie_word_embeddings=True, max_position_embeddings=32768)
    enc = Qwen2Encoder.__new__(Qwen2Encoder)
    torch.nn.Module.__init__(enc)
    enc.model = Qwen2ForCausalLM(qcfg)
    lm = CosyVoice3LM(llm_input_size=c.hidden, llm_output_size=c.hidden, speech_token_size=c.speech_tokens,
                      llm=enc, sampling=ras_sampling)
    f = cfg.flow
    cfm = DictConfig(sigma_min=1e-6, solver="euler", t_scheduler=f.schedule, training_cfg_rate=0.2,
                     inference_cfg_rate=f.cfg_rate, reg_loss_type="l1")
    est = DiT(dim=f.dim, depth=f.depth, heads=f.heads, dim_head=f.dim_head, ff_mult=f.ff_mult,
              mel_dim=f.mel, mu_dim=f.mel, spk_dim=f.mel, out_channels=f.mel,
              static_chunk_size=25 * f.token_mel_ratio, num_decoding_left_chunks=-1)
    decoder = CausalConditionalCFM(in_channels=240, cfm_params=cfm, n_spks=1, spk_emb_dim=f.mel, estimator=est)
    flow = CausalMaskedDiffWithDiT(input_size=f.mel, output_size=f.mel, spk_embed_dim=f.spk_dim,
                                   output_type="mel", vocab_size=f.vocab, input_frame_rate=cfg.token_rate,
                                   only_mask_loss=True, token_mel_ratio=f.token_mel_ratio,
                                   pre_lookahead_len=f.lookahead,
                                   pre_lookahead_layer=PreLookaheadLayer(in_channels=f.mel, channels=f.lookahead_channels,
                                                                         pre_lookahead_len=f.lookahead),
                                   decoder=decoder)
    h = cfg.hift
    hift = CausalHiFTGenerator(
        in_channels=h.in_channels, base_channels=h.base_channels, nb_harmonics=h.nb_harmonics,
        sampling_rate=h.sample_rate, nsf_alpha=h.nsf_alpha, nsf_sigma=h.nsf_sigma,
        nsf_voiced_threshold=h.voiced_threshold, upsample_rates=h.upsample_rates,
        upsample_kernel_sizes=h.upsample_kernels, istft_params={"n_fft": h.n_fft, "hop_len": h.hop_len},
        resblock_kernel_sizes=h.resblock_kernels, resblock_dilation_sizes=h.resblock_dilations,
        source_resblock_kernel_sizes=h.source_kernels, source_resblock_dilation_sizes=h.source_dilations,
        lrelu_slope=h.lrelu_slope, audio_limit=h.audio_limit, conv_pre_look_right=h.look_right,
        f0_predictor=CausalConvRNNF0Predictor(num_class=1, in_channels=h.in_channels, cond_channels=h.f0_channels))
    # Training leaves the DiT's modulation and HiFT's weights far from their initial values;
    # defaults would give near-zero activations that compare trivially. Scale them up.
    with torch.no_grad():
        for p in flow.parameters():
            if p.dim() >= 2:
                p.mul_(1.5)
        for name, p in hift.named_parameters():
            if name.endswith("original1") or (p.dim() == 3 and "source_downs" in name):
                p.normal_(0.0, 0.05)
    return lm.eval(), flow.eval(), hift.eval()


def save_published(model_dir, cfg_yaml, qwen_dir, cfg, lm, flow, hift):
    os.makedirs(os.path.join(model_dir, "CosyVoice-BlankEN"), exist_ok=True)
    with open(cfg_yaml) as src, open(os.path.join(model_dir, "cosyvoice3.yaml"), "w") as dst:
        dst.write(src.read())
    c = cfg.lm
    with open(os.path.join(model_dir, "CosyVoice-BlankEN", "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": c.hidden,
                   "intermediate_size": c.mlp, "num_hidden_layers": c.layers,
                   "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
                   "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta, "vocab_size": c.text_vocab,
                   "tie_word_embeddings": True}, f, indent=2)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        with open(os.path.join(qwen_dir, name), "rb") as src, \
                open(os.path.join(model_dir, "CosyVoice-BlankEN", name), "wb") as dst:
            dst.write(src.read())
    torch.save(lm.state_dict(), os.path.join(model_dir, "llm.pt"))
    torch.save(flow.state_dict(), os.path.join(model_dir, "flow.pt"))
    torch.save(hift.state_dict(), os.path.join(model_dir, "hift.pt"))


# ---------------------------------------------------------------------------------------------
# Comparisons


def snr_db(got, want):
    """want's signal-to-noise ratio in dB, got - want being the noise."""
    return float(10 * np.log10((want ** 2).sum() / max(((got - want) ** 2).sum(), 1e-30)))


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    d = np.abs(got - want).max()
    return float(d), float(d / max(np.abs(want).max(), 1e-12))


def ort_session(path, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ref_hidden(lm, emb):
    """The reference LM's last hidden states over a whole sequence, uncached (Qwen2Encoder.forward)."""
    out = lm.llm(emb, torch.tensor([emb.shape[1]]))
    return out[0]


def unified_prompt(cfg, text_ids, voice_tokens):
    V = cfg.lm.text_vocab
    return [V + cfg.lm.sos] + list(text_ids) + [V + cfg.lm.task_id] + [V + t for t in voice_tokens]


def ref_embed(lm, cfg, ids):
    V = cfg.lm.text_vocab
    parts = []
    for i in ids:
        if i >= V:
            parts.append(lm.speech_embedding.weight[i - V].reshape(1, 1, -1))
        else:
            parts.append(lm.llm.model.model.embed_tokens(torch.tensor([[i]])))
    return torch.cat(parts, dim=1)


def lm_graph(sess, cfg, ids, past=None, start=0):
    c = cfg.lm
    T = len(ids)
    feeds = {"input_ids": np.array([ids], np.int64),
             "position_ids": np.arange(start, start + T, dtype=np.int64)[None],
             "attention_mask": np.ones((1, start + T), np.int64)}
    for i in range(c.layers):
        for kind, j in (("key", 0), ("value", 1)):
            feeds["past_%s.%d" % (kind, i)] = (past[2 * i + j] if past is not None
                                               else np.zeros((1, c.kv_heads, 0, c.head_dim), np.float32))
    outs = sess.run(None, feeds)
    return outs[0][0], outs[1:]


def compare_lm(report, sess, lm, cfg, prompt, forced):
    """Logits at every position of prompt+forced: one prefill of the whole sequence, and a prefill
    of the prompt followed by one cached step per forced token, against the uncached reference."""
    V, n = cfg.lm.text_vocab, cfg.lm.speech_tokens
    seq = prompt + [V + t for t in forced]
    with torch.no_grad():
        h = ref_hidden(lm, ref_embed(lm, cfg, seq))
        ref = lm.llm_decoder(h)[0].double().numpy()                              # [T, n+200]
    top = ref[:, n:].max(-1, keepdims=True)
    want = np.concatenate([ref[:, :n], np.log(np.exp(ref[:, n:] - top).sum(-1, keepdims=True)) + top], axis=-1)
    got, _ = lm_graph(sess, cfg, seq)
    d, r = rel(got, want)
    report["lm_prefill_logits"] = {"positions": len(seq), "max_abs_diff": d, "max_rel_diff": r,
                                   "argmax_equal": bool((got.argmax(-1) == want.argmax(-1)).all())}
    logits, past = lm_graph(sess, cfg, prompt)
    rows = [logits[-1]]
    pos = len(prompt)
    for t in forced[:-1]:
        step, past = lm_graph(sess, cfg, [V + t], past, pos)
        rows.append(step[-1])
        pos += 1
    got = np.stack(rows)
    d, r = rel(got, want[len(prompt) - 1:len(seq) - 1])
    report["lm_decode_logits"] = {"steps": len(rows), "max_abs_diff": d, "max_rel_diff": r,
                                  "argmax_equal": bool((got.argmax(-1) == want[len(prompt) - 1:len(seq) - 1].argmax(-1)).all())}


def request_prompt(cfg, reference, out_dir, voice, text):
    """The LM prompt of a request for text in the export's voice, as CosyVoice3's frontend makes it
    (the voice's instruction, <|endofprompt|>, its transcript and the text, then its speech
    tokens); returns it, the text's ids, and the voice's (tokens, mel, embedding)."""
    from transformers import Qwen2Tokenizer
    qdir = os.path.join(reference, "qwen2")
    tok = Qwen2Tokenizer(os.path.join(qdir, "vocab.json"), os.path.join(qdir, "merges.txt"))
    vtext, vtoks, vmel, vemb = read_voice(out_dir, voice, cfg.flow.mel, cfg.flow.spk_dim)
    head, _, tail = vtext.partition("<|endofprompt|>")
    prompt_text = tok.encode(head) + [151646] + tok.encode(tail)
    text_ids = tok.encode(text)
    return unified_prompt(cfg, prompt_text + text_ids, vtoks), text_ids, (vtoks, vmel, vemb)


def greedy_tokens(lm, cfg, prompt, n):
    """The reference LM's n greedy speech tokens after prompt, end of speech banned throughout:
    what voxmux's engine makes with no lm.sampling and min = max tokens per text token
    (server_parity.rewrite_manifest). Each step is an uncached forward (module docstring)."""
    seq, gen = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            h = ref_hidden(lm, ref_embed(lm, cfg, seq))
            logits = lm.llm_decoder(h[:, -1])[0]
            t = int(logits[:cfg.lm.speech_tokens].argmax())
            gen.append(t)
            seq.append(cfg.lm.text_vocab + t)
    return gen


def write_e2e(work, request, tokens, files):
    """WORK/e2e for a check through the server: the request, the reference's tokens (tokens.i64)
    and its arrays (name -> float32 array)."""
    e2e = os.path.join(work, "e2e")
    os.makedirs(e2e, exist_ok=True)
    np.array(tokens, np.int64).tofile(os.path.join(e2e, "tokens.i64"))
    for name, arr in files.items():
        np.asarray(arr, np.float32).astype("<f4").tofile(os.path.join(e2e, name))
    with open(os.path.join(e2e, "request.json"), "w") as f:
        json.dump(request, f)
    return e2e


def time_span(cfg):
    t = torch.linspace(0, 1, cfg.flow.steps + 1, dtype=torch.float32)
    if cfg.flow.schedule == "cosine":
        t = 1 - torch.cos(t * 0.5 * torch.pi)
    return t.numpy()


def flow_graphs(enc, step, cfg, prompt_tokens, tokens, prompt_mel, embedding, noise):
    """voxmux's flow for one whole utterance: encoder, then the guided Euler steps."""
    toks = np.array([list(prompt_tokens) + list(tokens)], np.int64)
    N = toks.shape[1]
    mu = enc.run(["mu"], {"speech_tokens": toks, "token_mask": np.ones((1, 1, N), np.float32)})[0]
    Fr = mu.shape[2]
    P = prompt_mel.shape[0]
    cond = np.zeros((1, cfg.flow.mel, Fr), np.float32)
    cond[0, :, :P] = prompt_mel.T
    x = noise[:Fr].T[None].astype(np.float32).copy()
    mask = np.ones((1, 1, Fr), np.float32)
    ts = time_span(cfg)
    for k in range(cfg.flow.steps):
        x = step.run(["x_next"], {"x": x, "mask": mask, "mu": mu, "t": np.array([ts[k]], np.float32),
                                  "dt": np.array([ts[k + 1] - ts[k]], np.float32),
                                  "cfg": np.array([cfg.flow.cfg_rate], np.float32), "cond": cond,
                                  "embedding": embedding[None].astype(np.float32)})[0]
    return x[:, :, P:]


def ref_flow(flow, prompt_tokens, tokens, prompt_mel, embedding):
    with torch.no_grad():
        mel, _ = flow.inference(
            token=torch.tensor([tokens]), token_len=torch.tensor([len(tokens)]),
            prompt_token=torch.tensor([prompt_tokens], dtype=torch.int64).reshape(1, -1),
            prompt_token_len=torch.tensor([len(prompt_tokens)]),
            prompt_feat=torch.from_numpy(prompt_mel).reshape(1, -1, prompt_mel.shape[-1] if prompt_mel.size else 80),
            prompt_feat_len=torch.tensor([prompt_mel.shape[0]]),
            embedding=torch.from_numpy(embedding).reshape(1, -1), streaming=False, finalize=True)
    return mel.numpy()


def vocoder_graph(voc, cfg, mel):
    H = cfg.hift.nb_harmonics + 1
    audio, _ = voc.run(None, {"mel": mel.astype(np.float32), "phase": np.zeros((1, H), np.float32),
                              "phase_at": np.zeros(1, np.int64), "sample_offset": np.zeros(1, np.int64)})
    return audio


def ref_vocoder(hift, mel):
    with torch.no_grad():
        audio, _ = hift.inference(speech_feat=torch.from_numpy(mel), finalize=True)
    hift.float()  # inference leaves the F0 predictor in float64
    return audio.float().numpy()


def read_voice(out_dir, name, mel_bins, spk_dim):
    d = os.path.join(out_dir, "voices", name)
    import yaml
    v = yaml.safe_load(open(os.path.join(d, "voice.yaml")))
    toks = list(v.get("speech_tokens") or [])
    mel = (np.fromfile(os.path.join(d, v["mel"]), "<f4").reshape(-1, mel_bins) if "mel" in v
           else np.zeros((0, mel_bins), np.float32))
    emb = np.fromfile(os.path.join(d, v["embedding"]), "<f4") if "embedding" in v else np.zeros(spk_dim, np.float32)
    return v["text"], toks, mel, emb


def reference_config(reference, work, tiny):
    """The reference's cosyvoice3.yaml (tiny: make_tiny's) and its Config, written under work."""
    cfg_yaml = os.path.join(reference, "examples/libritts/cosyvoice3/conf/cosyvoice3.yaml")
    if tiny:
        from . import make_tiny
        cfg_yaml = os.path.join(work, "tiny.yaml")
        with open(cfg_yaml, "w") as f:
            f.write(make_tiny.YAML)
        os.makedirs(os.path.join(work, "tinycfg", "CosyVoice-BlankEN"), exist_ok=True)
        with open(os.path.join(work, "tinycfg", "cosyvoice3.yaml"), "w") as f:
            f.write(make_tiny.YAML)
        with open(os.path.join(work, "tinycfg", "CosyVoice-BlankEN", "config.json"), "w") as f:
            json.dump(make_tiny.QWEN_CONFIG, f)
        return cfg_yaml, net.load_config(os.path.join(work, "tinycfg"))
    os.makedirs(os.path.join(work, "cfg", "CosyVoice-BlankEN"), exist_ok=True)
    with open(os.path.join(work, "cfg", "cosyvoice3.yaml"), "w") as f:
        f.write(open(cfg_yaml).read())
    with open(os.path.join(work, "cfg", "CosyVoice-BlankEN", "config.json"), "w") as f:
        json.dump({"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                   "num_attention_heads": 14, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
                   "rope_theta": 1000000.0, "vocab_size": 151936}, f)   # Qwen2-0.5B
    return cfg_yaml, net.load_config(os.path.join(work, "cfg"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--threads", type=int, default=16)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    install_reference(a.reference)
    model_dir = os.path.join(a.work, "model")
    out_dir = os.path.join(a.work, "out")
    os.makedirs(model_dir, exist_ok=True)
    cfg_yaml, cfg = reference_config(a.reference, a.work, a.tiny)
    log("building the reference's modules")
    torch.manual_seed(1234)
    lm, flow, hift = build_reference(cfg)
    save_published(model_dir, cfg_yaml, os.path.join(a.reference, "qwen2"), cfg, lm, flow, hift)
    flow_noise = flow.decoder.rand_noise[0].t().contiguous().numpy()               # [frames, 80]
    hift_noise = hift.m_source.l_sin_gen.sine_waves[0, :240000].contiguous().numpy()  # [samples, 9]
    flow_noise.astype("<f4").tofile(os.path.join(a.work, "flow_noise.f32"))
    hift_noise.astype("<f4").tofile(os.path.join(a.work, "hift_noise.f32"))
    log("published-format checkpoint written (%.0f s); exporting" % (time.time() - t0))
    run_module(__package__ + ".export", [model_dir, out_dir,
                                         "--flow-noise", os.path.join(a.work, "flow_noise.f32"),
                                         "--hift-noise", os.path.join(a.work, "hift_noise.f32"),
                                         "--random-voice", "bench:5"], check=True)
    log("exported (%.0f s); comparing" % (time.time() - t0))

    report = {"model": "tiny" if a.tiny else "CosyVoice3-0.5B sizes", "torch": torch.__version__}
    import onnxruntime
    report["onnxruntime"] = onnxruntime.__version__
    lm_s = ort_session(os.path.join(out_dir, "lm.onnx"), a.threads)
    enc_s = ort_session(os.path.join(out_dir, "flow_encoder.onnx"), a.threads)
    step_s = ort_session(os.path.join(out_dir, "flow_step.onnx"), a.threads)
    voc_s = ort_session(os.path.join(out_dir, "vocoder.onnx"), a.threads)

    text = "Hello world."
    prompt, text_ids, (vtoks, vmel, vemb) = request_prompt(cfg, a.reference, out_dir, "bench", text)

    # LM: teacher-forced speech tokens after the prompt.
    g = torch.Generator().manual_seed(5)
    forced = torch.randint(0, cfg.lm.speech_tokens, (12,), generator=g).tolist()
    compare_lm(report, lm_s, lm, cfg, prompt, forced)
    log("lm:", report["lm_prefill_logits"], report["lm_decode_logits"])

    # Flow and vocoder on the same random tokens, with the voice prompt.
    tokens = torch.randint(0, cfg.flow.vocab, (60,), generator=g).tolist()
    want_mel = ref_flow(flow, vtoks, tokens, vmel, vemb)
    got_mel = flow_graphs(enc_s, step_s, cfg, vtoks, tokens, vmel, vemb, flow_noise)
    d, r = rel(got_mel, want_mel)
    report["flow_mel"] = {"frames": int(want_mel.shape[2]), "prompt_frames": int(vmel.shape[0]),
                          "max_abs_diff": d, "max_rel_diff": r, "ref_abs_max": float(np.abs(want_mel).max())}
    log("flow:", report["flow_mel"])
    want_audio = ref_vocoder(hift, want_mel)
    got_audio = vocoder_graph(voc_s, cfg, want_mel)
    d, r = rel(got_audio, want_audio)
    report["vocoder_audio"] = {"samples": int(want_audio.shape[1]), "max_abs_diff": d, "max_rel_diff": r,
                               "ref_abs_max": float(np.abs(want_audio).max()),
                               "snr_db": snr_db(got_audio, want_audio)}
    log("vocoder:", report["vocoder_audio"])

    # End to end: greedy tokens, then token2wav.
    n = TOKENS_PER_TEXT_TOKEN * len(text_ids)
    gen = greedy_tokens(lm, cfg, prompt, n)
    want_mel = ref_flow(flow, vtoks, gen, vmel, vemb)
    want_audio = ref_vocoder(hift, want_mel)
    got_gen = []
    logits, past = lm_graph(lm_s, cfg, prompt)
    pos = len(prompt)
    for _ in range(n):
        t = int(logits[-1][:cfg.lm.speech_tokens].argmax())
        got_gen.append(t)
        logits, past = lm_graph(lm_s, cfg, [cfg.lm.text_vocab + t], past, pos)
        pos += 1
    got_audio = vocoder_graph(voc_s, cfg, flow_graphs(enc_s, step_s, cfg, vtoks, got_gen, vmel, vemb, flow_noise))
    d, r = rel(got_audio, want_audio)
    report["end_to_end_graphs"] = {"text": text, "tokens": n, "tokens_equal": got_gen == gen,
                                   "samples": int(want_audio.shape[1]), "max_abs_diff": d, "max_rel_diff": r,
                                   "snr_db": snr_db(got_audio, want_audio)}
    log("end to end:", report["end_to_end_graphs"])
    write_e2e(a.work, {"model": "cosyvoice3", "voice": "bench", "input": text, "response_format": "pcm"}, gen,
              {"reference_audio.f32": want_audio})

    tol = {"lm_prefill_logits": 1e-3, "lm_decode_logits": 1e-3, "flow_mel": 1e-3, "vocoder_audio": 1e-2,
           "end_to_end_graphs": 1e-2}
    report["tolerances_rel"] = tol
    report["pass"] = all(report[k]["max_rel_diff"] <= v for k, v in tol.items()) and report["end_to_end_graphs"]["tokens_equal"]
    report["seconds"] = round(time.time() - t0, 1)
    with open(a.report, "w") as f:
        json.dump(report, f, indent=2)
    log(json.dumps(report, indent=2))
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
