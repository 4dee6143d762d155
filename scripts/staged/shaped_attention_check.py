"""Exports the CosyVoice3-shaped pipeline for checking the DiT's attention forms against each other
on a GPU (ONNX Runtime's CPU Attention kernel has no rotary, so scripts/staged/shaped_export.py's
float32 CPU checks cannot cover --dit-attention qkv).

The random DiT's attention is nearly uniform, which would hide a wrong RoPE, so the q and k
projections are scaled x4 here: the attention is peaked and positions matter. Variants:

  qkv      one Attention operator (projection, RoPE in the kernel, attention)
  split    MatMul, Split, two RotaryEmbedding and MultiHeadAttention
  control  split with RoPE theta 1e6 instead of 1e4: must differ from split, which shows the
           comparison can see a RoPE mistake

Then `MODELS="/tmp/a-split /tmp/a-qkv /tmp/a-control" scripts/verify-gpu.sh compare` sends the same
request to each and prints each one's difference from the first.

  usage: python3 -m scripts.staged.shaped_attention_check OUT_DIR qkv|split|control
"""

import os
import sys

import torch

from . import shaped_export as ex
from . import shaped_net as cs

QK_GAIN = 4.0


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("qkv", "split", "control"):
        sys.exit(__doc__.split("\n\n")[-1].strip())
    out, variant = sys.argv[1], sys.argv[2]
    models = cs.build()
    est = models.flow_estimator
    with torch.no_grad():
        for b in est.blocks:
            b.to_qkv.weight[: 2 * cs.DIT_DIM] *= QK_GAIN
        if variant == "control":
            cos, sin = cs.rope_cache(cs.DIT_ROPE_POSITIONS, cs.DIT_HEAD_DIM, 1e6, torch.float32)
            est.rope_cos.copy_(cos)
            est.rope_sin.copy_(sin)
    models = models.to("cuda", torch.float16)
    cs.use_fused(models, True)
    est.shared_time = True
    est.skip_norms = models.lm.skip_norms = True
    cs.use_qkv_attention(est, variant == "qkv")
    os.makedirs(out, exist_ok=True)
    ex.export_all(models, out, torch.float16, "cuda", 17, True, "concat")
    ex.log("wrote %s" % ex.write_manifest(out, "float16", "concat"))


if __name__ == "__main__":
    main()
