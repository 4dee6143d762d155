"""Checks voxmux's chunk-causal flow (flow_chunk.onnx, docs/cosyvoice3.md "Chunk-causal flow")
against CosyVoice3's own streaming flow, with random weights.

    usage: python3 -m scripts.cosyvoice3.parity_stream --reference DIR --work DIR --report FILE [--tiny] [--e2e]

--reference is what scripts/cosyvoice3/parity.py takes (a CosyVoice checkout, x_transformers.py,
the Qwen2 tokenizer files). The script builds the reference's CausalMaskedDiffWithDiT with the
sizes of cosyvoice3.yaml (--tiny: make_tiny's) and random weights, saves the published files,
exports them with --chunk-flow and the reference's own flow noise, and then, for a 5 s random
voice and 300 random speech tokens:

1. the reference streamed as CosyVoice3Model.tts streams it (the first hop padded so that the voice
   prompt and it end on a 50-frame boundary, hops of 25, 50 and then 100 tokens, each emit a
   flow.inference(streaming=True, finalize=False) over every token so far with the 3 look-ahead
   tokens, the last one finalize=True; tts's own last call runs with full attention, which --e2e
   measures), against its own flow.inference(streaming=True) over the whole utterance: what the
   streamed mel must equal;
2. voxmux's flow on CosyVoice's boundaries (mu from flow_encoder.onnx over the voice's and the
   request's tokens; the voice's kept chunks computed from the voice alone, as the engine keeps
   them per voice; then each emit a flow_chunk.onnx segment from the cache), against 1, per emit
   and end to end, with ONNX Runtime on the CPU and with the PyTorch network;
3. voxmux's default schedule: a first segment of 8 tokens, before its 50-frame chunk is complete
   (its difference from the reference is measured, not bounded), then every chunk boundary, each
   of which must equal 1.

With --e2e (docs/benchmarks/2026-12-07-cosyvoice3-stream-parity, "Through the server") it also
exports a second random voice (E2E_VOICE), takes the reference LM's greedy tokens for one request
(--text) as parity.py's end-to-end check does, and runs CosyVoice3Model.token2wav as
tts(stream=True) calls it over them: the flow emits of 1 (the last one with full attention, as tts
runs it, and again under the chunk-causal mask), and at each emit HiFT over all the mel so far. It
writes WORK/e2e (request.json, tokens.i64, reference_stream_audio.f32,
reference_stream_causal_audio.f32, reference_stream_emits.json) for
scripts/cosyvoice3/parity_stream_server.sh, and the report's "e2e" section.

The report (JSON) gives each difference and the tolerance; the script exits 1 if one is over (the
e2e section is measured here and bounded through the server).
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

# The end-to-end request (--e2e): a 4.4 s random voice, 110 tokens, so that CosyVoice pads its first
# hop (to 40 tokens) to end on a chunk boundary; 10 text tokens make 200 speech tokens, emitted at
# 40, 90 and 190 tokens and finalized at 200.
E2E_VOICE = "stream:4.4"
E2E_TEXT = "The quick brown fox jumps over the lazy dog."
SILENT_TOKENS = (1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323)   # CosyVoice3Model.silent_tokens
TOL_REL = 1e-3     # relative to the reference mel's largest magnitude, as parity.py's flow_mel
HOP, MAX_HOP, SCALE = 25, 100, 2      # CosyVoice3Model: token_hop_len, token_max_hop_len, stream_scale_factor


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def reference_stream(flow, vtoks, tokens, vmel, vemb, final_streaming=True):
    """CosyVoice3Model.tts(stream=True)'s flow calls; returns [(first token, mel)] per emit.
    tts makes its last call (finalize=True) without passing stream, so that one runs with full
    attention (streaming=False): final_streaming=False reproduces that; True runs it under the
    chunk-causal mask like the others, which is what the whole streaming=True run equals."""
    la = flow.pre_lookahead_len
    pad = int(np.ceil(len(vtoks) / HOP) * HOP - len(vtoks))
    hop, offset, out = HOP, 0, []

    def call(toks, finalize, streaming=True):
        with torch.no_grad():
            mel, _ = flow.inference(
                token=torch.tensor([toks]), token_len=torch.tensor([len(toks)]),
                prompt_token=torch.tensor([vtoks], dtype=torch.int64).reshape(1, -1),
                prompt_token_len=torch.tensor([len(vtoks)]), prompt_feat=torch.from_numpy(vmel).unsqueeze(0),
                prompt_feat_len=torch.tensor([vmel.shape[0]]),
                embedding=torch.from_numpy(vemb).reshape(1, -1), streaming=streaming, finalize=finalize)
        return mel[0].numpy()
    while True:
        this = hop + pad if offset == 0 else hop
        if len(tokens) - offset < this + la:
            break
        mel = call(tokens[:offset + this + la], False)
        out.append((offset, mel[:, offset * 2:]))
        offset += this
        hop = min(MAX_HOP, hop * SCALE)
    mel = call(tokens, True, final_streaming)
    out.append((offset, mel[:, offset * 2:]))
    return out


def stream_hift(hift, mels):
    """CosyVoice3Model.token2wav's vocoder over the emits' mels: at each emit HiFT over all the
    mel so far (finalize=False trims its look-ahead frames and last samples; the last emit
    finalizes), keeping the samples past those emitted before. Returns the audio and each emit's
    number of samples."""
    so_far, out, counts = None, [], []
    for i, m in enumerate(mels):
        m = torch.from_numpy(np.ascontiguousarray(m, np.float32)).unsqueeze(0)
        so_far = m if so_far is None else torch.cat([so_far, m], dim=2)
        with torch.no_grad():
            speech, _ = hift.inference(speech_feat=so_far, finalize=i == len(mels) - 1)
        new = speech[0, sum(counts):].float().numpy()
        out.append(new)
        counts.append(int(new.size))
    hift.float()  # inference leaves the F0 predictor in float64
    return np.concatenate(out), counts


def max_silent_run(tokens):
    run = best = 0
    for t in tokens:
        run = run + 1 if t in SILENT_TOKENS else 0
        best = max(best, run)
    return best


def stream_e2e(a, cfg, lm, flow, hift, out_dir):
    """The reference's streamed audio of one request, for parity_stream_server.sh: the reference
    LM's greedy tokens (as parity.py's end-to-end check makes them), then CosyVoice3Model's
    streamed token2wav over them, written to WORK/e2e. Returns the report's "e2e" section."""
    voice = E2E_VOICE.partition(":")[0]
    prompt, text_ids, (vtoks, vmel, vemb) = parity.request_prompt(cfg, a.reference, out_dir, voice, a.text)
    n = parity.TOKENS_PER_TEXT_TOKEN * len(text_ids)
    t0 = time.time()
    tokens = parity.greedy_tokens(lm, cfg, prompt, n)
    log("e2e: %d greedy tokens (%.0f s)" % (n, time.time() - t0))
    literal = reference_stream(flow, vtoks, tokens, vmel, vemb, final_streaming=False)
    causal = reference_stream(flow, vtoks, tokens, vmel, vemb)
    audio, counts = stream_hift(hift, [m for _, m in literal])
    causal_audio, causal_counts = stream_hift(hift, [m for _, m in causal])
    whole = parity.ref_vocoder(hift, np.concatenate([m for _, m in causal], axis=1)[None])[0]
    ends = [o for o, _ in literal[1:]] + [len(tokens)]
    emits = [{"tokens": [o, e], "frames": int(m.shape[1]), "samples": c, "finalize": i == len(literal) - 1}
             for i, ((o, m), e, c) in enumerate(zip(literal, ends, counts))]
    assert counts == causal_counts and sum(counts) == whole.size, (counts, causal_counts, whole.size)
    request = {"model": "cosyvoice3", "voice": voice, "input": a.text, "response_format": "pcm", "stream": True}
    e2e = parity.write_e2e(a.work, request, tokens, {"reference_stream_audio.f32": audio,
                                                     "reference_stream_causal_audio.f32": causal_audio})
    with open(os.path.join(e2e, "reference_stream_emits.json"), "w") as f:
        json.dump({"voice_tokens": len(vtoks), "tokens": len(tokens), "emits": emits}, f, indent=2)
    last = emits[-1]["samples"]
    return {
        "text": a.text, "voice": E2E_VOICE, "text_tokens": len(text_ids), "speech_tokens": n,
        "voice_tokens": len(vtoks), "emits": emits,
        "max_silent_token_run": max_silent_run(tokens),
        # CosyVoice's last flow call (full attention) against the chunk-causal one, relative to the
        # streamed mel's largest magnitude, and the audio both give.
        "last_emit_full_attention_vs_causal_mel_rel": float(np.abs(literal[-1][1] - causal[-1][1]).max()
                                                            / np.abs(np.concatenate([m for _, m in causal], 1)).max()),
        "last_emit_full_attention_vs_causal_audio": {
            "samples": last, "max_abs_diff": float(np.abs(audio[-last:] - causal_audio[-last:]).max()),
            "snr_db": parity.snr_db(audio[-last:], causal_audio[-last:])},
        "before_last_emit_equal": bool(np.array_equal(audio[:-last], causal_audio[:-last])),
        # HiFT streamed emit by emit against one run over the same mel: the reference's own
        # streaming error (measured, not bounded).
        "streamed_hift_vs_whole": {"max_abs_diff": float(np.abs(causal_audio - whole).max()),
                                   "snr_db": parity.snr_db(causal_audio, whole)},
    }


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
    ap.add_argument("--e2e", action="store_true",
                    help="also write WORK/e2e: one request's greedy tokens and the reference's streamed audio")
    ap.add_argument("--text", default=E2E_TEXT, help="the --e2e request's text (one sentence)")
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
                                         "--random-voice", "bench:5"]
               + (["--random-voice", E2E_VOICE] if a.e2e else []), check=True)
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
    if a.e2e:
        report["e2e"] = stream_e2e(a, cfg, lm, flow, hift, out_dir)
        log(json.dumps(report["e2e"], indent=2))
    report["seconds"] = round(time.time() - t0, 1)
    with open(a.report, "w") as f:
        json.dump(report, f, indent=2)
    log(json.dumps(report["summary"], indent=2))
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
