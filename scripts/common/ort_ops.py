"""ONNX Runtime's contrib operators as PyTorch functions the exporters trace (scripts/voxcpm/net.py,
scripts/cosyvoice3/net.py): forward only gives tracing the shapes, symbolic writes the operator.
What each one computes is checked by the exporter running the graph against the family's plain
PyTorch.

Works with torch 1.13 (Debian's python3-torch) and 2.x.
"""

import torch


class GroupQueryAttentionOp(torch.autograd.Function):
    """Decoder attention over a key/value cache written in place, exported as com.microsoft
    GroupQueryAttention with RoPE inside (do_rotary, rotate-half: Qwen2's and MiniCPM's layout)
    from the cos/sin tables. Each row's length comes from seqlens_k (its length after this run,
    minus one); when the caller binds past and present to the same memory the new keys are
    appended in place, so a decode step copies no cache (docs/pipeline.md, "The shared cache")."""

    @staticmethod
    def forward(ctx, q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache, heads, kv_heads):
        return q.clone(), past_k.clone(), past_v.clone()

    @staticmethod
    def symbolic(g, q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache, heads, kv_heads):
        out, pk, pv = g.op("com.microsoft::GroupQueryAttention", q, k, v, past_k, past_v, seqlens_k,
                           total_len, cos_cache, sin_cache, num_heads_i=heads, kv_num_heads_i=kv_heads,
                           do_rotary_i=1, rotary_interleaved_i=0, outputs=3)
        out.setType(q.type())
        pk.setType(past_k.type())
        pv.setType(past_v.type())
        return out, pk, pv


class GroupQueryAttentionNoRopeOp(torch.autograd.Function):
    """GroupQueryAttentionOp without rotary: for attention whose positions carry no RoPE."""

    @staticmethod
    def forward(ctx, q, k, v, past_k, past_v, seqlens_k, total_len, heads, kv_heads):
        return q.clone(), past_k.clone(), past_v.clone()

    @staticmethod
    def symbolic(g, q, k, v, past_k, past_v, seqlens_k, total_len, heads, kv_heads):
        out, pk, pv = g.op("com.microsoft::GroupQueryAttention", q, k, v, past_k, past_v, seqlens_k,
                           total_len, num_heads_i=heads, kv_num_heads_i=kv_heads, outputs=3)
        out.setType(q.type())
        pk.setType(past_k.type())
        pv.setType(past_v.type())
        return out, pk, pv
