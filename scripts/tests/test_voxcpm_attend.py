"""VoxCPM's attention among a patch's tokens (net.attend), written so that ONNX Runtime's CUDA
MatMul runs it as strided batched GEMMs that a CUDA graph can capture, against plain grouped
attention (each key head repeated for its query heads); and the exporter's check that finds a
MatMul whose batch dimensions broadcast."""

import math
from types import SimpleNamespace

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch
from onnx import TensorProto, helper

from ..voxcpm import export, net


def plain_attention(q, k, v, c, S, rope, causal):
    """Grouped attention with the key and value heads repeated: [N,S,H*d]."""
    H, KV, d = c.heads, c.kv_heads, c.head_dim
    q = q.reshape(-1, S, H, d).transpose(1, 2)
    k = k.reshape(-1, S, KV, d).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    v = v.reshape(-1, S, KV, d).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    if rope is not None:
        q, k = net.rotate(q, rope[0], rope[1], d // 2), net.rotate(k, rope[0], rope[1], d // 2)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(-1, S, H * d)


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_rope", [False, True])
def test_attend_equals_plain_grouped_attention(heads, kv_heads, causal, with_rope):
    c = SimpleNamespace(heads=heads, kv_heads=kv_heads, head_dim=16)
    N, S, d = 3, 9, c.head_dim
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    q = torch.randn(N, S, heads * d, generator=g)
    k = torch.randn(N, S, kv_heads * d, generator=g)
    v = torch.randn(N, S, kv_heads * d, generator=g)
    rope = None
    if with_rope:
        f = torch.outer(torch.arange(S).float(), torch.rand(d // 2, generator=g))
        rope = (f.cos(), f.sin())
    got = net.attend(q, k, v, c, S, rope, causal)
    want = plain_attention(q, k, v, c, S, rope, causal)
    assert got.shape == (N, S, heads * d)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()


def matmul_model(a, b):
    """A model of one MatMul of an input shaped a (a dimension given as a string is symbolic) and
    b: an input's shape, or a weight's values (a numpy array)."""
    inputs, weights = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a)], []
    if isinstance(b, np.ndarray):
        weights.append(onnx.numpy_helper.from_array(b, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b))
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], "g", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("a,b,flagged", [
    (["N", 2, 3, 9, 16], ["N", 2, 1, 16, 9], True),    # the query's groups against one key head
    ([9, 16], ["N", 16, 9], True),                      # batch on the right only
    (["N", 2, 27, 16], ["N", 2, 16, 9], False),         # attend's layout
    (["N", 9, 16], [16, 32], False),                    # a projection
    (["N", 4, 16], ["N", 16, 4], False),
])
def test_broadcast_matmuls(a, b, flagged):
    assert export.broadcast_matmuls(matmul_model(a, b)) == (["mm"] if flagged else [])


def test_check_capturable_refuses_a_broadcast_matmul(tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(matmul_model(["N", 2, 3, 9, 16], ["N", 2, 1, 16, 9]), path)
    with pytest.raises(SystemExit, match="MatMul with broadcast batch dimensions"):
        export.check_capturable(path, parts=False)


def test_broadcast_matmuls_reads_large_weights_by_their_dimensions():
    # A weight over the size whose values are dropped before shape inference, broadcast over the
    # query's groups: only its dimensions tell.
    w = np.zeros((3, 2, 1, 128, 256), np.float32)
    assert export.broadcast_matmuls(matmul_model(["N", 2, 3, 9, 128], w)) == ["mm"]
    assert export.broadcast_matmuls(matmul_model(["N", 2, 1, 9, 128], w)) == []
