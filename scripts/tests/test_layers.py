"""The shared layers (scripts/common/layers.py) against the formulae they implement, and the ONNX
Runtime operators (scripts/common/ort_ops.py) against the nodes they must export."""

import io

import onnx
import pytest
import torch

from ..common import layers, ort_ops
from ..staged import shaped_net


def reference_rms_norm(x, weight, eps):
    """RMSNorm in float64: x / sqrt(mean(x^2) + eps) * weight."""
    x64 = x.double()
    return x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rms_norm_matches_formula(eps):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 64, generator=g) * 4
    w = torch.randn(64, generator=g)
    got = layers.rms_norm(x, w, eps)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), reference_rms_norm(x, w, eps), rtol=1e-5, atol=1e-6)


def test_rms_norm_keeps_statistics_in_float32():
    # Values whose squares overflow float16 (> 65504): a float16 mean of squares would be inf.
    x = torch.full((2, 16), 300.0).to(torch.float16)
    w = torch.ones(16, dtype=torch.float16)
    got = layers.rms_norm(x, w, 1e-6)
    assert got.dtype == torch.float16
    assert torch.isfinite(got).all()
    assert torch.allclose(got.float(), torch.ones(2, 16), atol=1e-3)


def test_rms_norm_module():
    m = layers.RMSNorm(8, 1e-6)
    assert list(m.state_dict()) == ["weight"]
    assert m.weight.shape == (8,) and torch.equal(m.weight.data, torch.ones(8))
    with torch.no_grad():
        m.weight.copy_(torch.arange(8.0))
    x = torch.randn(4, 8)
    assert torch.equal(m(x), layers.rms_norm(x, m.weight, 1e-6))


def test_staged_rms_norm_fused_equals_plain():
    m = shaped_net.RMSNorm(32, 1e-6)
    with torch.no_grad():
        m.weight.normal_()
    x = torch.randn(2, 3, 32)
    plain = m(x)
    m.fused = True
    assert torch.equal(m(x), plain)


def test_rotate_half():
    x = torch.arange(2 * 8.0).reshape(2, 8)
    want = torch.tensor([[-4.0, -5, -6, -7, 0, 1, 2, 3], [-12.0, -13, -14, -15, 8, 9, 10, 11]])
    assert torch.equal(layers.rotate_half(x), want)
    assert torch.equal(layers.rotate_half(x, 4), want)
    # A rotation by 90 degrees in each (i, i + half) plane: twice is a negation.
    assert torch.equal(layers.rotate_half(layers.rotate_half(x)), -x)


def test_rope_with_rotate_half_is_a_rotation():
    # q*cos + rotate_half(q)*sin keeps each (i, i + half) pair's length (cos/sin repeated per half).
    g = torch.Generator().manual_seed(2)
    q = torch.randn(5, 16, generator=g)
    angle = torch.randn(5, 8, generator=g)
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    r = q * cos + layers.rotate_half(q) * sin
    pair_len = q[:, :8] ** 2 + q[:, 8:] ** 2
    assert torch.allclose(r[:, :8] ** 2 + r[:, 8:] ** 2, pair_len, atol=1e-5)


class _GQA(torch.nn.Module):
    def forward(self, q, k, v, past_k, past_v, seqlens_k, total_len, cos, sin):
        return ort_ops.GroupQueryAttentionOp.apply(q, k, v, past_k, past_v, seqlens_k, total_len,
                                                   cos, sin, 4, 2)


def test_group_query_attention_exports_one_contrib_node():
    B, T, D, P = 1, 3, 16, 32
    args = (torch.randn(B, T, 4 * D), torch.randn(B, T, 2 * D), torch.randn(B, T, 2 * D),
            torch.zeros(B, 2, P, D), torch.zeros(B, 2, P, D), torch.tensor([T - 1], dtype=torch.int32),
            torch.tensor(T, dtype=torch.int32), torch.randn(P, D // 2), torch.randn(P, D // 2))
    f = io.BytesIO()
    torch.onnx.export(_GQA(), args, f, opset_version=17,
                      custom_opsets={"com.microsoft": 1},
                      input_names=["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len", "cos", "sin"],
                      output_names=["out", "present_k", "present_v"])
    m = onnx.load_from_string(f.getvalue())
    [node] = [n for n in m.graph.node if n.op_type == "GroupQueryAttention"]
    assert node.domain == "com.microsoft"
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1, "rotary_interleaved": 0}
    assert list(node.input) == ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len", "cos", "sin"]
    assert len(node.output) == 3
