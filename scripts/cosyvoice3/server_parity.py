"""The server side of the CosyVoice3 parity checks: the manifest a parity server runs, and the
comparison of the audio `voxmux serve` answered with the reference's. It needs numpy alone and
imports nothing of the scripts package (whose import asks for torch and onnx), so that
scripts/cosyvoice3/parity_server.sh and parity_stream_server.sh run it as a file where the server
runs:

    python3 scripts/cosyvoice3/server_parity.py manifest IN OUT [--chunk-tokens N] [--chunk-flow]
    python3 scripts/cosyvoice3/server_parity.py sse-request IN OUT
    python3 scripts/cosyvoice3/server_parity.py whole WORK PROVIDER REPORT_DIR
    python3 scripts/cosyvoice3/server_parity.py stream WORK PROVIDER REPORT_DIR

`manifest` rewrites an export's pipeline.yaml for a deterministic request: greedy decoding (no
lm.sampling) and exactly TOKENS_PER_TEXT_TOKEN speech tokens per text token (the minimum raised to
the maximum, so end of speech is banned until the count is reached, as the reference's greedy run
bans it); --chunk-tokens makes the streaming schedule one chunk; --chunk-flow refuses a manifest
without the chunk-causal flow (flow.chunk_step and its keys). `sse-request` turns a request into
its `stream_format: sse` form, whose deltas give the server's own chunking. `whole` and `stream`
write server-PROVIDER.json and server-stream-PROVIDER.json (below).
"""

import argparse
import base64
import json
import os
import sys

import numpy as np

# The reference's greedy run makes this many speech tokens per text token: lm.max_tokens_per_text_token
# in CosyVoice3's manifest (its max_token_text_ratio).
TOKENS_PER_TEXT_TOKEN = 20

# voxmux's pcm is round(x · 32767) (router/audio/pcm.go): decoded by the same scale, a sample is
# within half a step of the float the engine made.
PCM_SCALE = 32767.0
STEP = 1.0 / PCM_SCALE

# What the streamed audio may differ from the reference's by: half a step of rounding, and 1.5 steps
# of float difference, 100 times the export's end-to-end difference from the reference in float32
# (4e-7, docs/benchmarks/2026-11-25-cosyvoice3-parity) and 300 times below what a frame of mel
# computed under another mask or a misplaced emit gives (1e-2 and more).
STREAM_TOL_STEPS = 2

CHUNK_FLOW_KEYS = ("chunk_step", "chunk_frames", "conv_context_frames", "kv_layers", "kv_width")


def rewrite_manifest(text, chunk_tokens=None, chunk_flow=False, per_text_token=TOKENS_PER_TEXT_TOKEN):
    """pipeline.yaml's text for the parity server (module docstring). Raises ValueError naming a
    key the export should have written and did not."""
    out, seen = [], set()
    section = None
    for line in text.splitlines(keepends=True):
        if line[:1] not in ("", " ", "#", "\n"):
            section = line.partition(":")[0]
        key = line.strip().partition(":")[0] if line.startswith("  ") and not line.startswith("   ") else None
        if section == "lm" and key == "sampling":
            seen.add("lm.sampling")
            continue
        if section == "lm" and key == "min_tokens_per_text_token":
            seen.add("lm.min_tokens_per_text_token")
            line = "  min_tokens_per_text_token: %g\n" % per_text_token
        elif section == "lm" and key == "max_tokens_per_text_token":
            seen.add("lm.max_tokens_per_text_token")
            v = float(line.partition(":")[2])
            if v != per_text_token:
                raise ValueError("lm.max_tokens_per_text_token is %g; the reference's greedy run makes %d a text token"
                                 % (v, per_text_token))
        elif section == "streaming" and key == "chunk_tokens":
            seen.add("streaming.chunk_tokens")
            if chunk_tokens is not None:
                line = "  chunk_tokens: [%d]\n" % chunk_tokens
        elif section == "flow" and key in CHUNK_FLOW_KEYS:
            seen.add("flow." + key)
        out.append(line)
    need = ["lm.min_tokens_per_text_token", "lm.max_tokens_per_text_token"]
    if chunk_tokens is not None:
        need.append("streaming.chunk_tokens")
    if chunk_flow:
        need += ["flow." + k for k in CHUNK_FLOW_KEYS]
    missing = [k for k in need if k not in seen]
    if missing:
        raise ValueError("the manifest has no %s%s" % (", ".join(missing),
                                                       " (export with --chunk-flow)" if chunk_flow else ""))
    return "".join(out)


def sse_request(req):
    r = dict(req)
    r.update({"stream": True, "stream_format": "sse", "response_format": "pcm"})
    return r


def read_pcm(path):
    return np.fromfile(path, "<i2").astype(np.float64) / PCM_SCALE


def read_sse(path):
    """The pcm of an SSE response and the number of samples in each delta; raises ValueError on an
    error event or a stream without speech.audio.done."""
    parts, done = [], False
    with open(path) as f:
        for line in f:
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[len("data: "):])
            if ev.get("type") == "speech.audio.delta":
                parts.append(base64.b64decode(ev["audio"]))
            elif ev.get("type") == "speech.audio.done":
                done = True
            else:
                raise ValueError("%s: %s" % (path, line.strip()))
    if not done:
        raise ValueError("%s: the stream has no speech.audio.done" % path)
    raw = b"".join(parts)
    pcm = np.frombuffer(raw, "<i2").astype(np.float64) / PCM_SCALE
    return pcm, [len(p) // 2 for p in parts]


def diff(got, want):
    """max abs diff and SNR (want's power over the difference's, dB) over the common length."""
    n = min(got.size, want.size)
    d = got[:n] - np.asarray(want[:n], np.float64)
    if n == 0:
        return {"max_abs_diff": 0.0, "snr_db": None}
    w = float((np.asarray(want[:n], np.float64) ** 2).sum())
    return {"max_abs_diff": float(np.abs(d).max()),
            "max_abs_diff_steps": round(float(np.abs(d).max()) / STEP, 2),
            "snr_db": float(10 * np.log10(max(w, 1e-30) / max(float((d ** 2).sum()), 1e-30)))}


def per_emit(got, want, emits):
    """diff over each reference emit's samples (emits: [{"samples": n, ...}] in order)."""
    rows, at = [], 0
    for i, e in enumerate(emits):
        n = e["samples"]
        row = {"emit": i, "sample_range": [at, at + n], "finalize": e.get("finalize", False)}
        if "tokens" in e:
            row["tokens"] = e["tokens"]
        row.update(diff(got[at:at + n], want[at:at + n]) if at < got.size else {"max_abs_diff": None, "snr_db": None})
        rows.append(row)
        at += n
    return rows


def compare_whole(work, provider):
    """The non-streaming check (parity_server.sh): the whole and chunked runs against the
    reference's non-streaming token2wav."""
    ref = np.fromfile(os.path.join(work, "e2e", "reference_audio.f32"), "<f4")
    res = {"provider": provider, "reference_samples": int(ref.size),
           "note": "voxmux answers 16-bit PCM, round(x * 32767), decoded by the same scale: "
                   "a difference of 1/32767 (3.1e-5) is one quantization step"}
    for name in ("whole", "chunked"):
        got = read_pcm(os.path.join(work, "e2e", "%s-%s.pcm" % (name, provider)))
        res[name] = dict(samples=int(got.size), **diff(got, ref))
    return res


def compare_stream(work, provider):
    """server-stream-PROVIDER.json: the `flow_chunk_emit: cosyvoice` and `early` runs against the
    reference's streamed token2wav (reference_stream_audio.f32, CosyVoice3Model.tts(stream=True),
    whose last flow call runs with full attention) and against the same with that call under the
    chunk-causal mask (reference_stream_causal_audio.f32), over the whole utterance and over each
    of the reference's emits. Passes when the cosyvoice run has the reference's length, is within
    STREAM_TOL_STEPS of the causal-final reference everywhere and of the reference on every emit
    before the last."""
    e2e = os.path.join(work, "e2e")
    ref = np.fromfile(os.path.join(e2e, "reference_stream_audio.f32"), "<f4")
    causal = np.fromfile(os.path.join(e2e, "reference_stream_causal_audio.f32"), "<f4")
    with open(os.path.join(e2e, "reference_stream_emits.json")) as f:
        emits = json.load(f)["emits"]
    if sum(e["samples"] for e in emits) != ref.size or causal.size != ref.size:
        raise ValueError("%s: the emits' samples (%d) and the two references' (%d, %d) do not agree"
                         % (e2e, sum(e["samples"] for e in emits), ref.size, causal.size))
    tol = STREAM_TOL_STEPS * STEP
    res = {"provider": provider, "reference_samples": int(ref.size),
           "reference_emits": emits,
           "note": "voxmux answers 16-bit PCM, round(x * 32767), decoded by the same scale: "
                   "a difference of 1/32767 (3.1e-5) is one quantization step",
           "tolerance_abs": tol, "tolerance_steps": STREAM_TOL_STEPS,
           "checked": "flow_chunk_emit cosyvoice: same length as the reference; within the tolerance of "
                      "reference_stream_causal_audio everywhere and of reference_stream_audio on every "
                      "emit before the last (CosyVoice's last flow call runs with full attention); "
                      "early: measured, not bounded"}
    for emit in ("cosyvoice", "early"):
        got, deltas = read_sse(os.path.join(e2e, "stream-%s-%s.sse" % (emit, provider)))
        res[emit] = {"samples": int(got.size), "server_deltas_samples": deltas,
                     "vs_reference": dict(diff(got, ref), per_emit=per_emit(got, ref, emits)),
                     "vs_reference_causal_final": dict(diff(got, causal), per_emit=per_emit(got, causal, emits))}
    c = res["cosyvoice"]
    before_last = [r["max_abs_diff"] for r in c["vs_reference"]["per_emit"][:-1]]
    res["pass"] = bool(c["samples"] == ref.size
                       and c["vs_reference_causal_final"]["max_abs_diff"] <= tol
                       and all(d is not None and d <= tol for d in before_last))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest")
    m.add_argument("src")
    m.add_argument("dst")
    m.add_argument("--chunk-tokens", type=int)
    m.add_argument("--chunk-flow", action="store_true")
    r = sub.add_parser("sse-request")
    r.add_argument("src")
    r.add_argument("dst")
    for name in ("whole", "stream"):
        c = sub.add_parser(name)
        c.add_argument("work")
        c.add_argument("provider")
        c.add_argument("report_dir")
    a = ap.parse_args(argv)
    if a.cmd == "manifest":
        with open(a.src) as f:
            text = f.read()
        try:
            text = rewrite_manifest(text, a.chunk_tokens, a.chunk_flow)
        except ValueError as e:
            sys.exit("%s: %s" % (a.src, e))
        with open(a.dst, "w") as f:
            f.write(text)
        return 0
    if a.cmd == "sse-request":
        with open(a.src) as f:
            req = json.load(f)
        with open(a.dst, "w") as f:
            json.dump(sse_request(req), f)
        return 0
    res = compare_whole(a.work, a.provider) if a.cmd == "whole" else compare_stream(a.work, a.provider)
    name = "server-%s.json" if a.cmd == "whole" else "server-stream-%s.json"
    with open(os.path.join(a.report_dir, name % a.provider), "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2))
    return 0 if res.get("pass", True) else 1


if __name__ == "__main__":
    sys.exit(main())
