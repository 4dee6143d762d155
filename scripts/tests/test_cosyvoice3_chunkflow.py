"""CosyVoice3's chunk-causal (streaming) flow on the tiny checkpoint, on the CPU in float32: the
cached chunk-by-chunk computation (net.ChunkFlowStep, chunkflow.CachedFlow) against one run over
the whole sequence under the same mask, and the step graph's export."""

import subprocess
import sys

import pytest
import torch

from ..common.paths import REPO

pytest.importorskip("yaml")

TOL = 1e-5


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    from ..cosyvoice3 import net
    d = tmp_path_factory.mktemp("tiny")
    subprocess.run([sys.executable, "-m", "scripts.cosyvoice3.make_tiny", str(d)], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cfg = net.load_config(str(d))
    f = net.CosyVoice3Flow(cfg.flow)
    net.load_into(f, net.load_checkpoint(str(d / "flow.pt")), "flow.pt")
    return f.eval()


def utterance(prompt_frames, frames, seed=0):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(frames, 80, generator=g)
    cond = torch.zeros(frames, 80)
    cond[:prompt_frames] = torch.randn(prompt_frames, 80, generator=g) - 5.0
    return mu, cond, torch.randn(192, generator=g), torch.randn(frames + 10, 80, generator=g)


def test_config_reads_the_streaming_mask(flow):
    assert (flow.c.chunk_frames, flow.c.left_chunks) == (50, -1)


@pytest.mark.parametrize("prompt_frames", [226, 200, 0])
def test_cached_chunks_equal_the_whole_run(flow, prompt_frames):
    from ..cosyvoice3 import chunkflow
    Fr = prompt_frames + 170
    mu, cond, emb, noise = utterance(prompt_frames, Fr)
    want = chunkflow.whole(flow, mu, cond, emb, noise)
    # The mask matters: full attention gives something else.
    assert (chunkflow.whole(flow, mu, cond, emb, noise, chunk=0) - want).abs().max() > 1e-2

    c = chunkflow.CachedFlow(flow, mu, cond, emb, noise)
    got = torch.zeros_like(want)
    s0 = prompt_frames // 50 * 50
    if s0:
        got[:, :s0] = c.run(s0)       # the voice prompt's complete chunks, several at once
    assert c.done == s0
    early = c.run(prompt_frames + 16)  # a first chunk before its 50 frames exist: kept nowhere
    assert c.done == s0
    ends = [e for e in range(s0 + 50, Fr, 50)] + [Fr]
    for e in ends:
        s = c.done
        got[:, s:e] = c.run(e, final=e == Fr)
    assert c.done == Fr
    assert (got - want).abs().max() < TOL
    # The early first chunk is the whole run's where its chunk is complete, not before.
    diff = (early - want[:, s0:prompt_frames + 16]).abs().max()
    assert 0 < diff < want.abs().max()


def test_seeded_from_a_voice_prompt_equals_the_whole_run(flow):
    from ..cosyvoice3 import chunkflow
    P = 250
    mu, cond, emb, noise = utterance(P, P + 120, seed=3)
    # The voice alone: its last look-ahead tokens' mu reads no request (zeros past it), so its last
    # chunk is not the voice's alone and is computed with the request.
    la = flow.c.lookahead * flow.c.token_mel_ratio
    vmu = mu[:P].clone()
    vmu[P - la:] += 1.0
    V = chunkflow.voice_frames(flow.c, P)
    assert V == 200
    voice = chunkflow.CachedFlow(flow, vmu, cond[:P], emb, noise)
    voice.run(V)
    want = chunkflow.whole(flow, mu, cond, emb, noise)
    c = chunkflow.CachedFlow(flow, mu, cond, emb, noise)
    c.seed(voice.kv, voice.xs, voice.done)
    a = c.run(P + 100)                # three chunks at once
    b = c.run(P + 120, final=True)
    assert (torch.cat([a, b], dim=1) - want[:, V:]).abs().max() < TOL


def test_batched_rows_of_different_lengths_equal_each_row_alone(flow):
    from ..cosyvoice3 import net
    c = flow.c
    step = net.ChunkFlowStep(flow)
    C, L, inner = step.context, c.depth, c.heads * c.dim_head
    g = torch.Generator().manual_seed(9)
    starts, news, pasts = [100, 50], [50, 23], [100, 50]
    W = C + max(news)
    x, mu, cond = (torch.randn(2, 80, W, generator=g) for _ in range(3))
    mask = torch.zeros(2, 1, W)
    for b, n in enumerate(news):
        mask[b, 0, :C + n] = 1
    mask[1, 0, :C - 50] = 0          # frame 50 has 50 frames before it, not C
    past = torch.randn(2, max(pasts) + 7, L, 4, inner, generator=g)
    t, dt, cfg = torch.tensor([0.3, 0.6]), torch.tensor([0.1]), torch.tensor([c.cfg_rate])
    emb = torch.randn(2, 192, generator=g)
    with torch.no_grad():
        xb, pb = step(x, mask, mu, cond, torch.tensor(starts), t, dt, cfg, emb, past)
        for b, n in enumerate(news):
            sl = slice(b, b + 1)
            xa, pa = step(x[sl, :, :C + n], mask[sl, :, :C + n], mu[sl, :, :C + n], cond[sl, :, :C + n],
                          torch.tensor(starts[b:b + 1]), t[sl], dt, cfg, emb[sl], past[sl, :pasts[b]])
            assert (xa - xb[sl, :, :n]).abs().max() < TOL
            assert (pa - pb[sl, :n]).abs().max() < TOL
            assert (xb[sl, :, n:] == 0).all()


def test_one_chunk_equals_the_full_attention_step(flow):
    from ..cosyvoice3 import net
    step = net.ChunkFlowStep(flow)
    C, N = step.context, 40
    g = torch.Generator().manual_seed(4)
    x, mu, cond = (torch.randn(1, 80, N, generator=g) for _ in range(3))
    emb = torch.randn(1, 192, generator=g)
    t, dt, cfg = torch.tensor([0.2]), torch.tensor([0.1]), torch.tensor([0.7])
    with torch.no_grad():
        want = net.FlowStep(flow)(x, torch.ones(1, 1, N), mu, t, dt, cfg, cond, emb)
        pad = torch.zeros(1, 80, C)
        got, present = step(torch.cat([pad, x], 2), torch.cat([torch.zeros(1, 1, C), torch.ones(1, 1, N)], 2),
                            torch.cat([pad, mu], 2), torch.cat([pad, cond], 2), torch.tensor([0]), t, dt, cfg, emb,
                            torch.zeros(1, 1, flow.c.depth, 4, flow.c.heads * flow.c.dim_head))
    assert (got - want).abs().max() < TOL
    assert tuple(present.shape) == (1, N, flow.c.depth, 4, flow.c.heads * flow.c.dim_head)


def test_a_left_chunk_window_is_refused(flow):
    from ..cosyvoice3 import net
    import copy
    f = copy.copy(flow)
    f.c = copy.copy(flow.c)
    f.c.left_chunks = 2
    with pytest.raises(ValueError, match="num_decoding_left_chunks 2"):
        net.ChunkFlowStep(f)
