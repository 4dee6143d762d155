"""The server side of the CosyVoice3 parity checks (scripts/cosyvoice3/server_parity.py), on
synthetic data: the manifest rewrite on the tiny export's own manifest, SSE decoding, and the
streaming report's comparison and verdict."""

import base64
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ..common.paths import REPO
from ..cosyvoice3 import server_parity as sp

MANIFEST = os.path.join(REPO, "models", "tiny-cosyvoice3", "pipeline.yaml")
SCRIPT = os.path.join(REPO, "scripts", "cosyvoice3", "server_parity.py")   # run as the shell scripts run it


@pytest.fixture(scope="module")
def manifest():
    if not os.path.exists(MANIFEST):
        pytest.skip("models/tiny-cosyvoice3 is not there")
    with open(MANIFEST) as f:
        return f.read()


def section(text, name):
    out, inside = {}, False
    for line in text.splitlines():
        if line and not line.startswith(" "):
            inside = line.startswith(name + ":")
        elif inside and line.startswith("  ") and not line.startswith("   "):
            k, _, v = line.strip().partition(":")
            out[k] = v.strip()
    return out


def test_manifest_greedy_forced_length(manifest):
    got = sp.rewrite_manifest(manifest, chunk_flow=True)
    lm = section(got, "lm")
    assert "sampling" not in lm
    assert lm["min_tokens_per_text_token"] == "20" and lm["max_tokens_per_text_token"] == "20"
    # Everything else is the export's, the chunk-causal flow and the streaming schedule included.
    assert section(got, "flow") == section(manifest, "flow")
    assert section(got, "streaming") == section(manifest, "streaming")
    kept = [ln for ln in manifest.splitlines() if not ln.startswith(("  sampling:", "  min_tokens_per_text_token:"))]
    assert [ln for ln in got.splitlines() if not ln.startswith("  min_tokens_per_text_token:")] == kept


def test_manifest_one_chunk(manifest):
    got = sp.rewrite_manifest(manifest, chunk_tokens=4000)
    assert section(got, "streaming")["chunk_tokens"] == "[4000]"
    assert section(got, "streaming")["context_tokens"] == section(manifest, "streaming")["context_tokens"]


def test_manifest_refusals(manifest):
    no_chunk = "".join(ln for ln in manifest.splitlines(keepends=True)
                       if not ln.startswith(("  chunk_step:", "  kv_width:")))
    sp.rewrite_manifest(no_chunk)   # fine without --chunk-flow
    with pytest.raises(ValueError, match=r"flow\.chunk_step, flow\.kv_width .*--chunk-flow"):
        sp.rewrite_manifest(no_chunk, chunk_flow=True)
    with pytest.raises(ValueError, match="max_tokens_per_text_token is 10"):
        sp.rewrite_manifest(manifest.replace("max_tokens_per_text_token: 20", "max_tokens_per_text_token: 10"))
    with pytest.raises(ValueError, match="lm.min_tokens_per_text_token"):
        sp.rewrite_manifest(manifest.replace("  min_tokens_per_text_token: 2\n", ""))
    # A key of the same name in another section is not the LM's.
    moved = manifest.replace("  min_tokens_per_text_token: 2\n", "").replace(
        "streaming:\n", "streaming:\n  min_tokens_per_text_token: 2\n")
    with pytest.raises(ValueError, match="lm.min_tokens_per_text_token"):
        sp.rewrite_manifest(moved)


def test_manifest_command(tmp_path, manifest):
    dst = tmp_path / "m.yaml"
    subprocess.run([sys.executable, SCRIPT, "manifest", MANIFEST, str(dst),
                    "--chunk-flow"], cwd=REPO, check=True)
    assert dst.read_text() == sp.rewrite_manifest(manifest, chunk_flow=True)
    bad = tmp_path / "bad.yaml"
    bad.write_text(manifest.replace("  chunk_step: flow_chunk.onnx\n", ""))
    r = subprocess.run([sys.executable, SCRIPT, "manifest", str(bad),
                        str(tmp_path / "out.yaml"), "--chunk-flow"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0 and "flow.chunk_step" in r.stderr and not (tmp_path / "out.yaml").exists()


def pcm16(x):
    """What voxmux's router sends (router/audio/pcm.go)."""
    return np.round(np.clip(np.asarray(x, np.float64), -1, 1) * 32767).astype("<i2").tobytes()


def write_sse(path, audio, deltas, done=True):
    with open(path, "w") as f:
        at = 0
        for n in deltas:
            b = base64.b64encode(pcm16(audio[at:at + n])).decode()
            f.write('data: {"type":"speech.audio.delta","audio":"%s"}\n\n' % b)
            at += n
        if done:
            f.write('data: {"type":"speech.audio.done","usage":{"input_tokens":1,"output_tokens":2,"total_tokens":3}}\n\n')


def test_read_sse(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.9, 0.9, 1000)
    write_sse(tmp_path / "a.sse", x, [300, 200, 500])
    got, deltas = sp.read_sse(str(tmp_path / "a.sse"))
    assert deltas == [300, 200, 500]
    assert np.abs(got - x).max() <= 0.5 / 32767 + 1e-12     # the decode matches the encoding
    write_sse(tmp_path / "b.sse", x, [1000], done=False)
    with pytest.raises(ValueError, match="no speech.audio.done"):
        sp.read_sse(str(tmp_path / "b.sse"))
    with open(tmp_path / "c.sse", "w") as f:
        f.write('data: {"type":"error","error":{"message":"synthesis failed after audio was sent"}}\n\n')
    with pytest.raises(ValueError, match="synthesis failed"):
        sp.read_sse(str(tmp_path / "c.sse"))


def stream_work(tmp_path, cosy, early=None):
    """A WORK folder as parity_stream --e2e and parity_stream_server.sh leave it: a reference of four
    emits whose last differs between the two references, and the server's two SSE answers."""
    rng = np.random.default_rng(1)
    counts = [34560, 24000, 48000, 4800]
    n = sum(counts)
    ref = (0.3 * np.sin(np.arange(n) * 0.05) * rng.uniform(0.5, 1, n)).astype(np.float32)
    causal = ref.copy()
    causal[-counts[-1]:] += 0.01 * rng.standard_normal(counts[-1]).astype(np.float32)
    e2e = tmp_path / "e2e"
    e2e.mkdir(exist_ok=True)
    ref.tofile(e2e / "reference_stream_audio.f32")
    causal.tofile(e2e / "reference_stream_causal_audio.f32")
    ends = [40, 90, 190, 200]
    emits = [{"tokens": [s, e], "samples": c, "finalize": i == 3}
             for i, (s, e, c) in enumerate(zip([0] + ends[:-1], ends, counts))]
    (e2e / "reference_stream_emits.json").write_text(json.dumps({"emits": emits}))
    write_sse(e2e / "stream-cosyvoice-cpu.sse", cosy(ref, causal), [n // 4, n // 4, n - n // 2])
    write_sse(e2e / "stream-early-cpu.sse", (early or cosy)(ref, causal), [3840, n - 3840])
    return ref, causal, counts


def test_stream_pass(tmp_path):
    rng = np.random.default_rng(2)
    ref, causal, counts = stream_work(tmp_path, lambda r, c: c + rng.uniform(-2e-5, 2e-5, c.size),
                                      early=lambda r, c: c + 0.02 * (np.arange(c.size) < 4000))
    res = sp.compare_stream(str(tmp_path), "cpu")
    assert res["pass"]
    c = res["cosyvoice"]
    assert c["samples"] == ref.size and c["server_deltas_samples"] == [ref.size // 4, ref.size // 4, ref.size - ref.size // 2]
    assert c["vs_reference_causal_final"]["max_abs_diff"] < 2e-5 + 0.5 / 32767 + 1e-9
    rows = c["vs_reference"]["per_emit"]
    assert [r["sample_range"] for r in rows] == [[0, 34560], [34560, 58560], [58560, 106560], [106560, 111360]]
    assert [r["finalize"] for r in rows] == [False, False, False, True]
    assert all(r["max_abs_diff"] < 1e-4 for r in rows[:-1]) and rows[-1]["max_abs_diff"] > 1e-2
    # early is measured, not bounded: its first chunk is off by 0.02 and the run still passes.
    e = res["early"]["vs_reference_causal_final"]["per_emit"]
    assert e[0]["max_abs_diff"] > 0.019 and e[1]["max_abs_diff"] < 1e-4


@pytest.mark.parametrize("fault", ["one emit off", "last emit off", "short", "full attention copied"])
def test_stream_fail(tmp_path, fault):
    def cosy(r, c):
        x = c.copy()
        if fault == "one emit off":
            x[40000] += 1e-4     # three 16-bit steps, in the second emit
        elif fault == "last emit off":
            x[-10] += 1e-4
        elif fault == "short":
            x = x[:-480]
        else:
            x = r.copy()         # the reference's own last emit: not the chunk-causal flow's
        return x
    stream_work(tmp_path, cosy)
    res = sp.compare_stream(str(tmp_path), "cpu")
    assert not res["pass"]


def test_stream_command(tmp_path):
    rng = np.random.default_rng(3)
    stream_work(tmp_path, lambda r, c: c + rng.uniform(-1e-5, 1e-5, c.size))
    rep = tmp_path / "report"
    rep.mkdir()
    cmd = [sys.executable, SCRIPT, "stream", str(tmp_path), "cpu", str(rep)]
    assert subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL).returncode == 0
    res = json.loads((rep / "server-stream-cpu.json").read_text())
    assert res["pass"] and res["tolerance_steps"] == sp.STREAM_TOL_STEPS
    stream_work(tmp_path, lambda r, c: c + 1e-3)
    assert subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL).returncode == 1


def test_whole(tmp_path):
    rng = np.random.default_rng(4)
    ref = (0.5 * rng.standard_normal(5000)).clip(-0.99, 0.99).astype(np.float32)
    (tmp_path / "e2e").mkdir()
    ref.tofile(tmp_path / "e2e" / "reference_audio.f32")
    (tmp_path / "e2e" / "whole-cuda.pcm").write_bytes(pcm16(ref))
    (tmp_path / "e2e" / "chunked-cuda.pcm").write_bytes(pcm16(ref + 0.01))
    res = sp.compare_whole(str(tmp_path), "cuda")
    assert res["whole"]["samples"] == 5000 and res["whole"]["max_abs_diff"] <= 0.5 / 32767 + 1e-9
    assert 0.0099 < res["chunked"]["max_abs_diff"] < 0.0101


def test_sse_request():
    r = sp.sse_request({"model": "cosyvoice3", "voice": "stream", "input": "x", "response_format": "pcm", "stream": True})
    assert r == {"model": "cosyvoice3", "voice": "stream", "input": "x", "response_format": "pcm", "stream": True,
                 "stream_format": "sse"}
