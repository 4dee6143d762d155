"""Checks voxmux's chunk-causal flow (flow_chunk.onnx, docs/cosyvoice3.md "Chunk-causal flow")
against CosyVoice3's own streaming flow, with random weights.

    usage: python3 -m scripts.cosyvoice3.parity_stream --reference DIR --work DIR --report FILE [--tiny]

--reference is what scripts/cosyvoice3/parity.py takes (a CosyVoice checkout, x_transformers.py,
the Qwen2 tokenizer files). The script builds the reference's CausalMaskedDiffWithDiT with the
sizes of cosyvoice3.yaml (--tiny: make_tiny's) and random weights, saves the published files,
exports them with --chunk-flow and the reference's own flow noise, and then, for a 5 s random
voice and 300 random speech tokens:

1. the reference streamed as CosyVoice3Model.tts streams it (the first hop padded so that the voice
   prompt and it end on a 50-frame boundary, hops of 25, 50 and then 100 tokens, each emit a
   flow.inference(streaming=True, finalize=False) over every token so far with the 3 look-ahead
   tokens, the last one finalize=True), against its own flow.inference(streaming=True) over the
   whole utterance: what the streamed mel must equal;
2. voxmux's flow on CosyVoice's boundaries (mu from flow_encoder.onnx over the voice's and the
   request's tokens; the voice's kept chunks computed from the voice alone, as the engine keeps
   them per voice; then each emit a flow_chunk.onnx segment from the cache), against 1, per emit
   and end to end, with ONNX Runtime on the CPU and with the PyTorch network;
3. voxmux's default schedule: a first segment of 8 tokens, before its 50-frame chunk is complete
   (its difference from the reference is measured, not bounded), then every chunk boundary, each
   of which must equal 1.

The report (JSON) gives each difference and the tolerance; the script exits 1 if one is over.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from ..common.paths import run_module
from . import chunkflow, net, parity

TOL_REL = 1e-3     # relative to the reference mel's largest magnitude, as parity.py's flow_mel
HOP, MAX_HOP, SCALE = 25, 100, 2      # CosyVoice3Model: token_hop_len, token_max_hop_len, stream_scale_factor


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def reference_stream(flow, vtoks, tokens, vmel, vemb):
    """CosyVoice3Model.tts(stream=True)'s flow calls; returns [(first token, mel)] per emit."""
    la = flow.pre_lookahead_len
    pad = int(np.ceil(len(vtoks) / HOP) * HOP - len(vtoks))
    hop, offset, out = HOP, 0, []

    def call(toks, finalize):
        with torch.no_grad():
            mel, _ = flow.inference(
                token=torch.tensor([toks]), token_len=torch.tensor([len(toks)]),
                prompt_token=torch.tensor([vtoks], dtype=torch.int64).reshape(1, -1),
                prompt_token_len=torch.tensor([len(vtoks)]), prompt_feat=torch.from_numpy(vmel).unsqueeze(0),
                prompt_feat_len=torch.tensor([vmel.shape[0]]),
                embedding=torch.from_numpy(vemb).reshape(1, -1), streaming=True, finalize=finalize)
        return mel[0].numpy()
    while True:
        this = hop + pad if offset == 0 else hop
        if len(tokens) - offset < this + la:
            break
        mel = call(tokens[:offset + this + la], False)
        out.append((offset, mel[:, offset * 2:]))
        offset += this
        hop = min(MAX_HOP, hop * SCALE)
    mel = call(tokens, True)
    out.append((offset, mel[:, offset * 2:]))
    return out


class OrtStep:
    """flow_chunk.onnx behind net.ChunkFlowStep's call."""

    def __init__(self, sess):
        self.s = sess

    def __call__(self, *args):
        from .export import CHUNK_INPUTS
        feeds = {n: a.numpy() for n, a in zip(CHUNK_INPUTS, args)}
        return tuple(torch.from_numpy(o) for o in self.s.run(None, feeds))


def ours(flow, step, cfg, mu_all, mu_voice, cond, emb, noise, P, ends):
    """The engine's algorithm: the voice's kept chunks from the voice alone, then one segment
    per end (frames from the voice prompt's first); returns [(first frame, mel)] per segment."""
    V = chunkflow.voice_frames(cfg.flow, P)
    voice = chunkflow.CachedFlow(flow, mu_voice, cond[:P], emb, noise, step=step)
    if V:
        voice.run(V)
    c = chunkflow.CachedFlow(flow, mu_all, cond, emb, noise, step=step)
    c.seed(voice.kv, voice.xs, voice.done)
    out, emitted = [], P
    for e in ends:
        mel = c.run(e, final=e == ends[-1]).numpy()
        from_ = e - mel.shape[1]
        out.append((emitted, mel[:, emitted - from_:]))
        emitted = e
    return out


def compare(got, want_whole, P, ref_abs):
    rows = []
    for start, mel in got:
        w = want_whole[:, start - P:start - P + mel.shape[1]]
        rows.append({"frames": [int(start - P), int(start - P + mel.shape[1])],
                     "max_abs_diff": float(np.abs(mel - w).max()) if mel.size else 0.0,
                     "max_rel_diff": float(np.abs(mel - w).max() / ref_abs) if mel.size else 0.0})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=300)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    parity.install_reference(a.reference)
    model_dir, out_dir = os.path.join(a.work, "model"), os.path.join(a.work, "out")
    os.makedirs(model_dir, exist_ok=True)
    cfg_yaml, cfg = parity.reference_config(a.reference, a.work, a.tiny)
    torch.manual_seed(1234)
    lm, flow, hift = parity.build_reference(cfg)
    parity.save_published(model_dir, cfg_yaml, os.path.join(a.reference, "qwen2"), cfg, lm, flow, hift)
    noise = flow.decoder.rand_noise[0].t().contiguous()
    noise.numpy().astype("<f4").tofile(os.path.join(a.work, "flow_noise.f32"))
    hift_noise = hift.m_source.l_sin_gen.sine_waves[0, :240000].contiguous().numpy()
    hift_noise.astype("<f4").tofile(os.path.join(a.work, "hift_noise.f32"))
    run_module(__package__ + ".export", [model_dir, out_dir, "--chunk-flow",
                                         "--flow-noise", os.path.join(a.work, "flow_noise.f32"),
                                         "--hift-noise", os.path.join(a.work, "hift_noise.f32"),
                                         "--random-voice", "bench:5"], check=True)
    log("exported (%.0f s); comparing" % (time.time() - t0))

    _, vtoks, vmel, vemb = parity.read_voice(out_dir, "bench", cfg.flow.mel, cfg.flow.spk_dim)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, cfg.flow.vocab, (a.tokens,), generator=g).tolist()
    with torch.no_grad():
        whole, _ = flow.inference(
            token=torch.tensor([tokens]), token_len=torch.tensor([len(tokens)]),
            prompt_token=torch.tensor([vtoks], dtype=torch.int64).reshape(1, -1),
            prompt_token_len=torch.tensor([len(vtoks)]), prompt_feat=torch.from_numpy(vmel).unsqueeze(0),
            prompt_feat_len=torch.tensor([vmel.shape[0]]), embedding=torch.from_numpy(vemb).reshape(1, -1),
            streaming=True, finalize=True)
    whole = whole[0].numpy()
    ref_abs = float(np.abs(whole).max())
    P, R = vmel.shape[0], 2 * len(tokens)
    report = {"model": "tiny" if a.tiny else "CosyVoice3-0.5B sizes", "torch": torch.__version__,
              "prompt_frames": int(P), "request_frames": int(R), "ref_abs_max": ref_abs}

    stream = reference_stream(flow, vtoks, tokens, vmel, vemb)
    report["reference_stream_vs_whole"] = compare([(P + 2 * o, m) for o, m in stream], whole, P, ref_abs)
    ends = [P + 2 * o for o, _ in stream[1:]] + [P + R]

    enc = parity.ort_session(os.path.join(out_dir, "flow_encoder.onnx"), a.threads)

    def mu_of(toks):
        t = np.array([toks], np.int64)
        m = enc.run(["mu"], {"speech_tokens": t, "token_mask": np.ones((1, 1, t.shape[1]), np.float32)})[0]
        return torch.from_numpy(m[0].T.copy())
    mu_all, mu_voice = mu_of(list(vtoks) + tokens), mu_of(list(vtoks))
    cond = torch.zeros(P + R, cfg.flow.mel)
    cond[:P] = torch.from_numpy(vmel)
    emb = torch.from_numpy(vemb)
    ours_flow = net.CosyVoice3Flow(cfg.flow)
    net.load_into(ours_flow, net.load_checkpoint(os.path.join(model_dir, "flow.pt")), "flow.pt")
    ours_flow.eval()
    onnx_step = OrtStep(parity.ort_session(os.path.join(out_dir, "flow_chunk.onnx"), a.threads))
    results = {}
    for name, step in (("onnx", onnx_step), ("torch", None)):
        got = ours(ours_flow, step, cfg, mu_all, mu_voice, cond, emb, noise, P, ends)
        results["cosyvoice_boundaries_" + name] = compare(got, whole, P, ref_abs)
    first = P + 2 * 8
    ch = cfg.flow.chunk_frames
    default_ends = [first] + list(range((first // ch + 1) * ch, P + R, ch)) + [P + R]
    got = ours(ours_flow, onnx_step, cfg, mu_all, mu_voice, cond, emb, noise, P, default_ends)
    results["default_onnx"] = compare(got, whole, P, ref_abs)
    report.update(results)

    def worst(rows):
        return max(r["max_rel_diff"] for r in rows)
    report["summary"] = {k: worst(v) for k, v in report.items() if isinstance(v, list)}
    report["summary"]["default_onnx_first_segment"] = results["default_onnx"][0]["max_rel_diff"]
    report["summary"]["default_onnx_after_first"] = worst(results["default_onnx"][1:])
    checked = ["reference_stream_vs_whole", "cosyvoice_boundaries_onnx", "cosyvoice_boundaries_torch"]
    report["tolerance_rel"] = TOL_REL
    report["pass"] = (all(report["summary"][k] <= TOL_REL for k in checked)
                      and report["summary"]["default_onnx_after_first"] <= TOL_REL)
    report["seconds"] = round(time.time() - t0, 1)
    with open(a.report, "w") as f:
        json.dump(report, f, indent=2)
    log(json.dumps(report["summary"], indent=2))
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
