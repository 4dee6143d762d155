#!/usr/bin/env python3
"""Times the benchmark model's flow DiT (one Euler step with guidance: the estimator at twice the
batch) in PyTorch, eager and under torch.compile, to calibrate what ONNX Runtime reaches on the
same GPU (docs/benchmarks/RESULTS.md, "How far 1000× is, measured").

    usage: scripts/flow_torch_compile.py [BATCHxFRAMES ...]   (default: 32x232 64x72)

Random weights (cosyvoice_shaped.py), float16, every frame real (mask of ones; the attention
still takes it as a mask, as ONNX Runtime's does). TFLOP/s counts 0.39 GFLOP per frame per DiT
pass (model.md). Needs torch with CUDA; compiling takes 30–60 s per shape.
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cosyvoice_shaped as cs  # noqa: E402

GFLOP_PER_FRAME_PASS = 0.39


def ms_per_call(f, n=10):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.time() - t0) / n * 1000


def main():
    shapes = [tuple(int(v) for v in a.split("x")) for a in sys.argv[1:]] or [(32, 232), (64, 72)]
    torch.manual_seed(0)
    est = cs.FlowEstimator().cuda().half().eval()
    for b in est.blocks:
        b.sdpa = True
    for B, F in shapes:
        x = torch.randn(2 * B, cs.MEL_BINS, F, device="cuda", dtype=torch.half)
        mu = torch.randn_like(x)
        mask = torch.ones(2 * B, 1, F, device="cuda", dtype=torch.half)
        t = torch.full((2 * B,), 0.3, device="cuda", dtype=torch.half)
        tflop = 2 * B * F * GFLOP_PER_FRAME_PASS / 1000
        with torch.inference_mode():
            e = ms_per_call(lambda: est(x, mask, mu, t))
            print(f"eager   {B}x{F} frames (CFG batch {2 * B}): {e:.1f} ms/step, {tflop / e * 1000:.0f} TFLOP/s", flush=True)
            c = torch.compile(est)
            t0 = time.time()
            c(x, mask, mu, t)
            print(f"compile took {time.time() - t0:.0f} s", flush=True)
            m = ms_per_call(lambda: c(x, mask, mu, t))
            print(f"compile {B}x{F}: {m:.1f} ms/step, {tflop / m * 1000:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
