"""Times the benchmark model's flow DiT (one Euler step with guidance: the estimator at twice the
batch) in PyTorch, eager and under torch.compile, to calibrate what ONNX Runtime reaches on the
same GPU (docs/benchmarks/RESULTS.md, "What bounds throughput"), and what the DiT's matrix
products and attention cost on their own: the floor that any kernels built around cuBLAS and
PyTorch's attention would stand on.

    usage: python3 -m scripts.staged.shaped_flow_compile [--parts] [--unmasked] [--mode MODE] [--no-eager]
                                                         [--no-compile] [BATCHxFRAMES ...]   (default: 32x232 64x72)

    --parts      also time the step's 88 matrix products alone (one CUDA graph of torch.mm into
                 buffers made beforehand) and its 22 attentions alone, with the padding mask
                 and without it (flash attention)
    --unmasked   the DiT's attention without the padding mask (wrong wherever a batch pads; it
                 says what a kernel without one could do)
    --mode       torch.compile's mode (default: its default; e.g. max-autotune-no-cudagraphs)

Random weights (scripts/staged/shaped_net.py), float16, every frame real (mask of ones; unless
--unmasked, the attention still takes it as a mask, as ONNX Runtime's does). TFLOP/s counts 0.39
GFLOP per frame per DiT pass (model.md); "audio s/s" is frames ÷ 50 per second of work over the
10 steps of a flow run, context frames included. Needs torch with CUDA; compiling takes 30–60 s
per shape (several minutes with max-autotune).
"""

import argparse
import time

import torch
import torch.nn.functional as F

from . import shaped_net as cs

GFLOP_PER_FRAME_PASS = 0.39
FRAMES_PER_SECOND = 50
STEPS = 10


def ms_per_call(f, n=10):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.time() - t0) / n * 1000


def graphed(f):
    """f captured once as a CUDA graph (after a warm-up on a side stream); returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f()
    return g.replay


def line(what, B, F_, ms, tflop=None):
    audio = B * F_ / FRAMES_PER_SECOND / (STEPS * ms / 1000)
    rate = f", {tflop / ms * 1000:.0f} TFLOP/s" if tflop else ""
    print(f"{what:<34} {B}x{F_}: {ms:6.2f} ms/step{rate}, {audio:5.0f} audio s/s", flush=True)


def parts(B, F_):
    """The step's matrix products alone, and its attentions alone."""
    M, D, H = 2 * B * F_, cs.DIT_DIM, cs.DIT_FF_MULT * cs.DIT_DIM
    dev, dt = "cuda", torch.half
    x = torch.randn(M, D, device=dev, dtype=dt)
    h = torch.randn(M, H, device=dev, dtype=dt)
    qkv, out, ffo = (torch.empty(M, n, device=dev, dtype=dt) for n in (3 * D, D, D))
    ffi = torch.empty(M, H, device=dev, dtype=dt)
    w = [[torch.randn(i, o, device=dev, dtype=dt) * 0.02 for i, o in ((D, 3 * D), (D, D), (D, H), (H, D))]
         for _ in range(cs.DIT_DEPTH)]

    def gemms():
        for wq, wo, wi, wf in w:
            torch.mm(x, wq, out=qkv)
            torch.mm(x, wo, out=out)
            torch.mm(x, wi, out=ffi)
            torch.mm(h, wf, out=ffo)
    tflop = 2 * M * cs.DIT_DEPTH * (3 * D * D + D * D + 2 * D * H) / 1e12
    line("matrix products alone (cuBLAS)", B, F_, ms_per_call(graphed(gemms)), tflop)

    q, k, v = (torch.randn(2 * B, cs.DIT_HEADS, F_, cs.DIT_HEAD_DIM, device=dev, dtype=dt) for _ in range(3))
    bias = torch.zeros(2 * B, 1, 1, F_, device=dev, dtype=dt)
    for name, mask in (("attention alone, masked", bias), ("attention alone, no mask", None)):
        def attend(mask=mask):
            for _ in range(cs.DIT_DEPTH):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        line(name, B, F_, ms_per_call(graphed(attend)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["32x232", "64x72"])
    ap.add_argument("--parts", action="store_true")
    ap.add_argument("--unmasked", action="store_true")
    ap.add_argument("--mode", default=None)
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes]
    torch.manual_seed(0)
    est = cs.FlowEstimator().cuda().half().eval()
    for b in est.blocks:
        b.sdpa = True
        b.unmasked = a.unmasked
    tag = ("unmasked " if a.unmasked else "") + (a.mode or "default")
    for B, F_ in shapes:
        x = torch.randn(2 * B, cs.MEL_BINS, F_, device="cuda", dtype=torch.half)
        mu = torch.randn_like(x)
        mask = torch.ones(2 * B, 1, F_, device="cuda", dtype=torch.half)
        t = torch.full((2 * B,), 0.3, device="cuda", dtype=torch.half)
        tflop = 2 * B * F_ * GFLOP_PER_FRAME_PASS / 1000
        with torch.inference_mode():
            if a.parts:
                parts(B, F_)
            if not a.no_eager:
                line("eager" + (" unmasked" if a.unmasked else ""), B, F_, ms_per_call(lambda: est(x, mask, mu, t)), tflop)
            if not a.no_compile:
                c = torch.compile(est, mode=a.mode)
                t0 = time.time()
                c(x, mask, mu, t)
                print(f"compile ({tag}) took {time.time() - t0:.0f} s", flush=True)
                line(f"compile ({tag})", B, F_, ms_per_call(lambda: c(x, mask, mu, t)), tflop)


if __name__ == "__main__":
    main()
