"""Layers the families' networks share (scripts/cosyvoice3/net.py, scripts/voxcpm/net.py,
scripts/staged/shaped_net.py): Qwen2's and MiniCPM-4's RMSNorm and RoPE's rotate-half. Each
family's checkpoints name their parameters the same way for these (`weight` of the norm), so one
module loads all of them.

Works with torch 1.13 (Debian's python3-torch) and 2.x.
"""

import torch
import torch.nn as nn


def rms_norm(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, with the statistics in float32
    whatever x's dtype (as Hugging Face's Qwen2RMSNorm and MiniCPM's RMSNorm compute it)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rotate_half(x, half=None):
    """RoPE's rotation of the last axis in the rotate-half layout: (x1, x2) -> (-x2, x1). half
    defaults to half the axis; pass it as a constant where tracing must keep the slices static."""
    if half is None:
        half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
