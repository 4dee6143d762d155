"""Builds the tiny random-weight staged TTS model in models/tiny/.

    usage: python3 -m scripts.staged.make_tiny [OUT_DIR]      (OUT_DIR defaults to models/tiny)

Writes lm.onnx, flow_encoder.onnx, flow_estimator.onnx, flow_step.onnx and vocoder.onnx, following the stage I/O
contract in docs/pipeline.md with the manifest values of the `tiny` model (pipeline.yaml is written
by hand, not by this script). The weights are random, so the audio is noise, but the graph structure
is the real thing: a grouped-query-attention decoder with an explicit KV cache, a masked
flow-matching encoder and estimator, and a causal, bias-free HiFi-GAN-style vocoder.

It also writes lm_shared.onnx: the same LM with the same weights (copied from lm.onnx, no new random
draws), but with its KV cache in ONNX Runtime's shared-buffer form: fixed-size past_key.N /
past_value.N [B, 2, max_positions, 16] that present_key.N / present_value.N alias, updated in place
by the contrib op com.microsoft.GroupQueryAttention. Its inputs are input_ids, seqlens_k (int32 [B]:
cached + T - 1 per row) and total_sequence_length (int32 scalar); a token's position is its cache
index, derived from seqlens_k in the graph, so there is no position_ids or attention_mask input.

And flow_step.onnx: one Euler step of the flow with classifier-free guidance around the estimator
graph (the same weights, from the same random draws): x_next = x + dt * ((1 + cfg) * v(x, mu) -
cfg * v(x, 0)), both passes in one estimator call of batch 2B, with inputs x, mask, mu, t [B],
dt [1] and cfg [1] (docs/pipeline.md).

Needs only the `onnx` and `numpy` packages (Debian: python3-onnx, python3-numpy); graphs are built
by hand with onnx.helper. The output is deterministic: the same onnx version writes byte-identical
files on every run (fixed seed, no timestamps, fixed producer fields).
"""

import copy
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..common.paths import REPO

OPSET = 17
IR_VERSION = 8
SEED = 1234
# The name this script had when models/tiny was committed: a new one would change every graph's bytes.
PRODUCER = "voxmux scripts/gen_tiny_model.py"
PRODUCER_VERSION = "1"

# Manifest values of the tiny model (docs/pipeline.md).
TEXT_VOCAB = 259        # ids 0 pad, 1 bos, 2 sos, 3..258 bytes (offset 3)
SPEECH_VOCAB = 64       # speech tokens 0..63; LM input id = 259 + token
LM_VOCAB = TEXT_VOCAB + SPEECH_VOCAB   # 323
D_MODEL = 64
LAYERS = 2
Q_HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
GROUP = Q_HEADS // KV_HEADS            # query heads per kv head
MLP_HIDDEN = 256
MEL_BINS = 80
FRAMES_PER_TOKEN = 2
FLOW_EMB = 64
FLOW_HIDDEN = 128
HOP = 480               # 8 * 6 * 10

assert Q_HEADS * HEAD_DIM == D_MODEL
assert Q_HEADS % KV_HEADS == 0

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
INT32 = TensorProto.INT32


class GraphBuilder:
    """Collects nodes and initializers with readable, unique names."""

    def __init__(self, rng):
        self.rng = rng
        self.nodes = []
        self.inits = []
        self.names = set()

    def _unique(self, name):
        if name in self.names:
            raise ValueError("duplicate name " + name)
        self.names.add(name)
        return name

    def init(self, name, array):
        name = self._unique(name)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const_i64(self, name, values):
        return self.init(name, np.array(values, dtype=np.int64))

    def const_f32(self, name, values):
        return self.init(name, np.array(values, dtype=np.float32))

    def weight(self, name, shape, fan_in, gain=1.0):
        w = self.rng.standard_normal(shape) * (gain / np.sqrt(fan_in))
        return self.init(name, w.astype(np.float32))

    def op(self, op_type, name, inputs, n_out=1, out=None, **attrs):
        """Adds node `name`; its outputs are `name` (or `name:i`) unless `out` names them."""
        name = self._unique(name)
        if out is None:
            out = [name] if n_out == 1 else ["%s:%d" % (name, i) for i in range(n_out)]
            for o in out[1:] if n_out == 1 else out:
                self._unique(o)
        elif isinstance(out, str):
            out = [out]
        self.nodes.append(helper.make_node(op_type, inputs, out, name=name, **attrs))
        return out[0] if len(out) == 1 else out

    # Small composites.

    def linear(self, name, x, d_in, d_out, bias=True):
        w = self.weight(name + ".weight", (d_in, d_out), d_in)
        y = self.op("MatMul", name + "/matmul", [x, w])
        if bias:
            b = self.init(name + ".bias", np.zeros(d_out, np.float32))
            y = self.op("Add", name + "/add_bias", [y, b])
        return y

    def conv1d(self, name, x, c_in, c_out, k, pad=0, dilation=1, bias=True, gain=1.0,
               causal=False):
        """Conv1d, same length: `pad` both sides, or causal: (k-1)*dilation on the left only."""
        w = self.weight(name + ".weight", (c_out, c_in, k), c_in * k, gain)
        inputs = [x, w]
        if bias:
            inputs.append(self.init(name + ".bias",
                                    (self.rng.standard_normal(c_out) * 0.02).astype(np.float32)))
        pads = [(k - 1) * dilation, 0] if causal else [pad, pad]
        return self.op("Conv", name + "/conv", inputs, kernel_shape=[k], pads=pads,
                       dilations=[dilation], strides=[1])

    def conv_transpose1d(self, name, x, c_in, c_out, stride, gain=1.0):
        # kernel == stride: every input frame maps onto its own `stride` output samples.
        w = self.weight(name + ".weight", (c_in, c_out, stride), c_in, gain)
        return self.op("ConvTranspose", name + "/conv_transpose", [x, w],
                       kernel_shape=[stride], strides=[stride], pads=[0, 0])

    def layer_norm(self, name, x, dim):
        g = self.init(name + ".weight", np.ones(dim, np.float32))
        b = self.init(name + ".bias", np.zeros(dim, np.float32))
        return self.op("LayerNormalization", name + "/layer_norm", [x, g, b], axis=-1,
                       epsilon=1e-5)

    def gelu(self, name, x):
        """Sigmoid approximation of GELU: x * sigmoid(1.702 x) (opset 17 has no Gelu)."""
        k = self.const_f32(name + "/k", 1.702)
        s = self.op("Mul", name + "/scale", [x, k])
        s = self.op("Sigmoid", name + "/sigmoid", [s])
        return self.op("Mul", name + "/gate", [x, s])

    def silu(self, name, x):
        s = self.op("Sigmoid", name + "/sigmoid", [x])
        return self.op("Mul", name + "/gate", [x, s])

    def model(self, graph_name, doc, inputs, outputs, extra_opsets=()):
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, self.inits,
                                  doc_string=doc)
        opsets = [helper.make_opsetid("", OPSET)]
        opsets += [helper.make_opsetid(domain, version) for domain, version in extra_opsets]
        m = helper.make_model(graph, opset_imports=opsets,
                              producer_name=PRODUCER, producer_version=PRODUCER_VERSION,
                              doc_string=doc)
        m.ir_version = IR_VERSION
        m.model_version = 1
        onnx.checker.check_model(m, full_check=True)
        return m


def tensor(name, elem, shape, doc):
    return helper.make_tensor_value_info(name, elem, shape, doc_string=doc)


# ---------------------------------------------------------------------------------------------
# LM


def build_lm(rng):
    g = GraphBuilder(rng)
    B, T, P, S = "batch", "seq", "past_seq", "total_seq"

    inputs = [
        tensor("input_ids", INT64, [B, T], "token ids: text ids 0..258, speech token k as 259+k"),
        tensor("position_ids", INT64, [B, T], "absolute 0-based positions of input_ids"),
        tensor("attention_mask", INT64, [B, S],
               "1 for real positions, 0 for padding, over past and new positions (P+T)"),
    ]
    outputs = [tensor("logits", FLOAT, [B, T, SPEECH_VOCAB + 1],
                      "next-token scores; index 64 is end of speech")]
    for n in range(LAYERS):
        inputs.append(tensor("past_key.%d" % n, FLOAT, [B, KV_HEADS, P, HEAD_DIM],
                             "key cache of layer %d; P may be 0" % n))
        inputs.append(tensor("past_value.%d" % n, FLOAT, [B, KV_HEADS, P, HEAD_DIM],
                             "value cache of layer %d; P may be 0" % n))
        outputs.append(tensor("present_key.%d" % n, FLOAT, [B, KV_HEADS, S, HEAD_DIM],
                              "concat(past_key.%d, new keys) along axis 2" % n))
        outputs.append(tensor("present_value.%d" % n, FLOAT, [B, KV_HEADS, S, HEAD_DIM],
                              "concat(past_value.%d, new values) along axis 2" % n))

    # Token embedding + sinusoidal position embedding computed from position_ids.
    emb = g.init("embed_tokens.weight",
                 rng.standard_normal((LM_VOCAB, D_MODEL)).astype(np.float32))
    h = g.op("Gather", "embed_tokens/gather", [emb, "input_ids"], axis=0)
    half = D_MODEL // 2
    inv_freq = g.const_f32("pos_emb/inv_freq",
                           10000.0 ** (-np.arange(half, dtype=np.float64) / half))
    pos = g.op("Cast", "pos_emb/cast", ["position_ids"], to=FLOAT)
    pos = g.op("Unsqueeze", "pos_emb/unsqueeze", [pos, g.const_i64("pos_emb/axes", [-1])])
    ang = g.op("Mul", "pos_emb/angles", [pos, inv_freq])                     # [B,T,32]
    sin = g.op("Sin", "pos_emb/sin", [ang])
    cos = g.op("Cos", "pos_emb/cos", [ang])
    pe = g.op("Concat", "pos_emb/concat", [sin, cos], axis=-1)               # [B,T,64]
    h = g.op("Add", "embed/add_positions", [h, pe])

    # Attention bias [B,1,1,T,S]: 0 where allowed, -1e9 where not.
    # allowed[b,t,j] = attention_mask[b,j] == 1 and j <= P + t.
    p_len = g.op("Shape", "mask/past_len", ["past_key.0"], start=2, end=3)   # [1]
    t_len = g.op("Shape", "mask/new_len", ["input_ids"], start=1, end=2)     # [1]
    s_len = g.op("Add", "mask/total_len", [p_len, t_len])
    p_scalar = g.op("Squeeze", "mask/past_len_scalar", [p_len])
    s_scalar = g.op("Squeeze", "mask/total_len_scalar", [s_len])
    zero = g.const_i64("mask/zero", 0)
    one = g.const_i64("mask/one", 1)
    key_pos = g.op("Range", "mask/key_positions", [zero, s_scalar, one])     # [S]
    query_pos = g.op("Range", "mask/query_positions", [p_scalar, s_scalar, one])  # [T]: P+t
    key_row = g.op("Unsqueeze", "mask/key_row", [key_pos, g.const_i64("mask/axes0", [0])])
    query_col = g.op("Unsqueeze", "mask/query_col", [query_pos, g.const_i64("mask/axes1", [1])])
    causal = g.op("LessOrEqual", "mask/causal", [key_row, query_col])       # [T,S]
    real = g.op("Equal", "mask/real", ["attention_mask", one])               # [B,S]
    real = g.op("Unsqueeze", "mask/real_5d", [real, g.const_i64("mask/axes123", [1, 2, 3])])
    allowed = g.op("And", "mask/allowed", [real, causal])                    # [B,1,1,T,S]
    attn_bias = g.op("Where", "mask/bias", [allowed, g.const_f32("mask/allowed_value", 0.0),
                                            g.const_f32("mask/masked_value", -1e9)])

    q_shape = g.const_i64("attn/q_shape", [0, 0, KV_HEADS, GROUP, HEAD_DIM])
    kv_shape = g.const_i64("attn/kv_shape", [0, 0, KV_HEADS, HEAD_DIM])
    merge_shape = g.const_i64("attn/merge_shape", [0, 0, D_MODEL])
    group_axis = g.const_i64("attn/group_axis", [2])
    q_scale = g.const_f32("attn/q_scale", 1.0 / np.sqrt(HEAD_DIM))

    for n in range(LAYERS):
        L = "layers.%d" % n
        x = g.layer_norm(L + ".input_norm", h, D_MODEL)
        q = g.linear(L + ".attn.q_proj", x, D_MODEL, Q_HEADS * HEAD_DIM, bias=False)
        k = g.linear(L + ".attn.k_proj", x, D_MODEL, KV_HEADS * HEAD_DIM, bias=False)
        v = g.linear(L + ".attn.v_proj", x, D_MODEL, KV_HEADS * HEAD_DIM, bias=False)
        # Query head h = kv_head * GROUP + g: [B,T,Hkv,G,Dh] -> [B,Hkv,G,T,Dh]
        q = g.op("Reshape", L + ".attn/q_split_heads", [q, q_shape])
        q = g.op("Transpose", L + ".attn/q_transpose", [q], perm=[0, 2, 3, 1, 4])
        q = g.op("Mul", L + ".attn/q_scale", [q, q_scale])
        k = g.op("Reshape", L + ".attn/k_split_heads", [k, kv_shape])
        k = g.op("Transpose", L + ".attn/k_transpose", [k], perm=[0, 2, 1, 3])   # [B,Hkv,T,Dh]
        v = g.op("Reshape", L + ".attn/v_split_heads", [v, kv_shape])
        v = g.op("Transpose", L + ".attn/v_transpose", [v], perm=[0, 2, 1, 3])
        k_all = g.op("Concat", L + ".attn/present_key", ["past_key.%d" % n, k], axis=2,
                     out="present_key.%d" % n)                                  # [B,Hkv,S,Dh]
        v_all = g.op("Concat", L + ".attn/present_value", ["past_value.%d" % n, v], axis=2,
                     out="present_value.%d" % n)
        # Grouped-query attention: each kv head broadcasts over its GROUP query heads.
        k_t = g.op("Transpose", L + ".attn/k_all_transpose", [k_all], perm=[0, 1, 3, 2])
        k_t = g.op("Unsqueeze", L + ".attn/k_expand_group", [k_t, group_axis])   # [B,Hkv,1,Dh,S]
        v_g = g.op("Unsqueeze", L + ".attn/v_expand_group", [v_all, group_axis])  # [B,Hkv,1,S,Dh]
        scores = g.op("MatMul", L + ".attn/scores", [q, k_t])                    # [B,Hkv,G,T,S]
        scores = g.op("Add", L + ".attn/add_mask", [scores, attn_bias])
        probs = g.op("Softmax", L + ".attn/softmax", [scores], axis=-1)
        ctx = g.op("MatMul", L + ".attn/context", [probs, v_g])                  # [B,Hkv,G,T,Dh]
        ctx = g.op("Transpose", L + ".attn/context_transpose", [ctx], perm=[0, 3, 1, 2, 4])
        ctx = g.op("Reshape", L + ".attn/merge_heads", [ctx, merge_shape])       # [B,T,64]
        o = g.linear(L + ".attn.o_proj", ctx, Q_HEADS * HEAD_DIM, D_MODEL, bias=False)
        h = g.op("Add", L + "/attn_residual", [h, o])

        x = g.layer_norm(L + ".post_attention_norm", h, D_MODEL)
        x = g.linear(L + ".mlp.up_proj", x, D_MODEL, MLP_HIDDEN)
        x = g.gelu(L + ".mlp.act", x)
        x = g.linear(L + ".mlp.down_proj", x, MLP_HIDDEN, D_MODEL)
        h = g.op("Add", L + "/mlp_residual", [h, x])

    h = g.layer_norm("final_norm", h, D_MODEL)
    w = g.weight("lm_head.weight", (D_MODEL, SPEECH_VOCAB + 1), D_MODEL)
    b = g.init("lm_head.bias", np.zeros(SPEECH_VOCAB + 1, np.float32))
    y = g.op("MatMul", "lm_head/matmul", [h, w])
    g.op("Add", "lm_head/add_bias", [y, b], out="logits")

    doc = ("voxmux tiny LM (random weights): decoder-only transformer, d_model 64, 2 layers, "
           "4 query heads over 2 kv heads (grouped-query attention), head_dim 16, pre-LayerNorm "
           "blocks, sinusoidal positions from position_ids, explicit KV cache "
           "(present = concat(past, new) on axis 2). Vocabulary 323 = 259 text ids + 64 speech "
           "tokens; logits over 64 speech tokens + end of speech (index 64).")
    return g.model("voxmux_tiny_lm", doc, inputs, outputs)


def build_lm_shared(lm):
    """lm.onnx's function with a shared-buffer KV cache updated by com.microsoft.GroupQueryAttention.

    Takes every weight from the built lm.onnx model `lm` (same names, same bytes), so it draws no
    random numbers. Differences from lm.onnx are only in the cache handling:
      - past_key.N/past_value.N are [B, 2, max_positions, 16] buffers holding each row's positions
        0..cached-1 with no gaps; present_key.N/present_value.N have the same shape and are meant to
        be bound to the same buffers (ORT's "past_present_share_buffer": the new keys and values are
        written in place at positions cached..cached+T-1).
      - a token's position is its cache index: cached + t, with cached = seqlens_k + 1 - T per row,
        except on a first prompt (T == total_sequence_length), where it is t, as in ORT's own
        GroupQueryAttention (right-padded rows keep their real tokens at 0..len-1).
      - GroupQueryAttention masks by seqlens_k (causal, keys 0..seqlens_k[b]); do_rotary=0, since
        lm.onnx has no rotary embedding: its positions are sinusoidal embeddings added to the token
        embedding, which this graph computes the same way from the derived positions.
    """
    weights = {t.name: numpy_helper.to_array(t) for t in lm.graph.initializer}
    g = GraphBuilder(None)

    def w(name):
        return g.init(name, weights[name])

    B, T, M = "batch", "seq", "max_positions"
    inputs = [
        tensor("input_ids", INT64, [B, T], "token ids: text ids 0..258, speech token k as 259+k"),
        tensor("seqlens_k", INT32, [B],
               "per row: (positions already in its cache + T) - 1"),
        tensor("total_sequence_length", INT32, [],
               "max over rows of (positions already in the cache + T)"),
    ]
    outputs = [tensor("logits", FLOAT, [B, T, SPEECH_VOCAB + 1],
                      "next-token scores; index 64 is end of speech")]
    for n in range(LAYERS):
        inputs.append(tensor("past_key.%d" % n, FLOAT, [B, KV_HEADS, M, HEAD_DIM],
                             "key cache buffer of layer %d; row b holds positions "
                             "0..seqlens_k[b]-T" % n))
        inputs.append(tensor("past_value.%d" % n, FLOAT, [B, KV_HEADS, M, HEAD_DIM],
                             "value cache buffer of layer %d" % n))
        outputs.append(tensor("present_key.%d" % n, FLOAT, [B, KV_HEADS, M, HEAD_DIM],
                              "past_key.%d with the new keys written at their positions; bind "
                              "to the same buffer as past_key.%d" % (n, n)))
        outputs.append(tensor("present_value.%d" % n, FLOAT, [B, KV_HEADS, M, HEAD_DIM],
                              "past_value.%d with the new values written at their positions; "
                              "bind to the same buffer as past_value.%d" % (n, n)))

    # Positions [B,T]: first prompt t, otherwise seqlens_k + 1 - T + t.
    t_len = g.op("Shape", "positions/new_len", ["input_ids"], start=1, end=2)       # [1]
    t_scalar = g.op("Squeeze", "positions/new_len_scalar", [t_len])
    zero = g.const_i64("positions/zero", 0)
    one = g.const_i64("positions/one", 1)
    steps = g.op("Range", "positions/steps", [zero, t_scalar, one])                # [T]: t
    seqlens = g.op("Cast", "positions/seqlens_k_i64", ["seqlens_k"], to=INT64)
    seqlens = g.op("Unsqueeze", "positions/seqlens_k_col",
                   [seqlens, g.const_i64("positions/axes1", [1])])                 # [B,1]
    total = g.op("Add", "positions/row_total", [seqlens, one])                      # cached + T
    cached = g.op("Sub", "positions/row_cached", [total, t_len])                    # [B,1]
    total_len = g.op("Cast", "positions/total_len", ["total_sequence_length"], to=INT64)
    first = g.op("Equal", "positions/first_prompt", [t_scalar, total_len])
    start = g.op("Where", "positions/start", [first, zero, cached])                 # [B,1]
    position_ids = g.op("Add", "positions/position_ids", [start, steps])            # [B,T]

    # Token embedding + sinusoidal position embedding, exactly as in lm.onnx.
    h = g.op("Gather", "embed_tokens/gather", [w("embed_tokens.weight"), "input_ids"], axis=0)
    pos = g.op("Cast", "pos_emb/cast", [position_ids], to=FLOAT)
    pos = g.op("Unsqueeze", "pos_emb/unsqueeze", [pos, w("pos_emb/axes")])
    ang = g.op("Mul", "pos_emb/angles", [pos, w("pos_emb/inv_freq")])               # [B,T,32]
    sin = g.op("Sin", "pos_emb/sin", [ang])
    cos = g.op("Cos", "pos_emb/cos", [ang])
    pe = g.op("Concat", "pos_emb/concat", [sin, cos], axis=-1)                      # [B,T,64]
    h = g.op("Add", "embed/add_positions", [h, pe])

    def layer_norm(name, x):
        return g.op("LayerNormalization", name + "/layer_norm",
                    [x, w(name + ".weight"), w(name + ".bias")], axis=-1, epsilon=1e-5)

    def linear(name, x, bias=True):
        y = g.op("MatMul", name + "/matmul", [x, w(name + ".weight")])
        if bias:
            y = g.op("Add", name + "/add_bias", [y, w(name + ".bias")])
        return y

    for n in range(LAYERS):
        L = "layers.%d" % n
        x = layer_norm(L + ".input_norm", h)
        q = linear(L + ".attn.q_proj", x, bias=False)                              # [B,T,64]
        k = linear(L + ".attn.k_proj", x, bias=False)                              # [B,T,32]
        v = linear(L + ".attn.v_proj", x, bias=False)                              # [B,T,32]
        # Query head h uses kv head h // GROUP, as in lm.onnx (h = kv_head * GROUP + g).
        ctx = g.op("GroupQueryAttention", L + ".attn/group_query_attention",
                   [q, k, v, "past_key.%d" % n, "past_value.%d" % n, "seqlens_k",
                    "total_sequence_length"],
                   out=[L + ".attn/context", "present_key.%d" % n, "present_value.%d" % n],
                   domain="com.microsoft", num_heads=Q_HEADS, kv_num_heads=KV_HEADS,
                   scale=float(1.0 / np.sqrt(HEAD_DIM)), do_rotary=0)[0]              # [B,T,64]
        o = linear(L + ".attn.o_proj", ctx, bias=False)
        h = g.op("Add", L + "/attn_residual", [h, o])

        x = layer_norm(L + ".post_attention_norm", h)
        x = linear(L + ".mlp.up_proj", x)
        s = g.op("Mul", L + ".mlp.act/scale", [x, w(L + ".mlp.act/k")])
        s = g.op("Sigmoid", L + ".mlp.act/sigmoid", [s])
        x = g.op("Mul", L + ".mlp.act/gate", [x, s])
        x = linear(L + ".mlp.down_proj", x)
        h = g.op("Add", L + "/mlp_residual", [h, x])

    h = layer_norm("final_norm", h)
    y = g.op("MatMul", "lm_head/matmul", [h, w("lm_head.weight")])
    g.op("Add", "lm_head/add_bias", [y, w("lm_head.bias")], out="logits")

    doc = ("voxmux tiny LM (random weights), shared-buffer KV cache: the same function and "
           "weights as lm.onnx, with attention by com.microsoft.GroupQueryAttention over "
           "fixed-size cache buffers [B, 2, max_positions, 16] that present_* alias "
           "(past_present_share_buffer). Inputs input_ids, seqlens_k (cached + T - 1 per row), "
           "total_sequence_length; positions are cache indices (cached + t), so there is no "
           "position_ids or attention_mask input. No rotary embedding (do_rotary=0): sinusoidal "
           "positions are added to the token embedding, as in lm.onnx.")
    return g.model("voxmux_tiny_lm_shared", doc, inputs, outputs,
                   extra_opsets=[("com.microsoft", 1)])


# ---------------------------------------------------------------------------------------------
# Flow


def upsample_frames(g, name, x, shape_of):
    """Repeat-interleave the last axis FRAMES_PER_TOKEN times: [B,C,N] -> [B,C,N*FPT]."""
    x = g.op("Unsqueeze", name + "/unsqueeze", [x, g.const_i64(name + "/axes", [3])])
    # Target shape [B,C,N,FPT] = Shape(x)[:3] ++ [FPT]; Expand broadcasts the trailing 1.
    shp = g.op("Shape", name + "/shape", [shape_of])
    shp = g.op("Concat", name + "/expand_shape",
               [shp, g.const_i64(name + "/repeats", [FRAMES_PER_TOKEN])], axis=0)
    x = g.op("Expand", name + "/expand", [x, shp])
    return g.op("Reshape", name + "/reshape", [x, g.const_i64(name + "/merge_shape", [0, 0, -1])])


def build_flow_encoder(rng):
    g = GraphBuilder(rng)
    B, N, F = "batch", "tokens", "frames"
    inputs = [
        tensor("speech_tokens", INT64, [B, N], "speech tokens 0..63 (no offset)"),
        tensor("token_mask", FLOAT, [B, 1, N], "1 for real tokens, 0 for padding"),
    ]
    outputs = [tensor("mu", FLOAT, [B, MEL_BINS, F],
                      "conditioning, F = 2 * tokens; exactly zero at padded frames")]

    emb = g.init("embed.weight", rng.standard_normal((SPEECH_VOCAB, FLOW_EMB)).astype(np.float32))
    x = g.op("Gather", "embed/gather", [emb, "speech_tokens"], axis=0)      # [B,N,64]
    x = g.op("Transpose", "embed/transpose", [x], perm=[0, 2, 1])           # [B,64,N]
    x = g.op("Mul", "embed/mask", [x, "token_mask"])
    x = g.conv1d("encoder.conv", x, FLOW_EMB, FLOW_EMB, 3, pad=1)
    x = g.silu("encoder.act", x)
    x = g.op("Mul", "encoder/mask", [x, "token_mask"])
    x = upsample_frames(g, "upsample", x, x)                                # [B,64,2N]
    frame_mask = upsample_frames(g, "upsample_mask", "token_mask", "token_mask")  # [B,1,2N]
    x = g.conv1d("proj", x, FLOW_EMB, MEL_BINS, 1)
    g.op("Mul", "proj/mask", [x, frame_mask], out="mu")

    doc = ("voxmux tiny flow encoder (random weights): speech tokens -> conditioning mu. "
           "Embedding 64x64, masked Conv1d k3 + SiLU, repeat-interleave each token to 2 mel "
           "frames, Conv1d k1 to 80 mel bins, masked so padded frames are exactly zero.")
    return g.model("voxmux_tiny_flow_encoder", doc, inputs, outputs)


def build_flow_estimator(rng):
    g = GraphBuilder(rng)
    B, F = "batch", "frames"
    inputs = [
        tensor("x", FLOAT, [B, MEL_BINS, F], "current sample"),
        tensor("mask", FLOAT, [B, 1, F], "1 for real frames, 0 for padding"),
        tensor("mu", FLOAT, [B, MEL_BINS, F], "conditioning from the encoder (zeros: unconditional)"),
        tensor("t", FLOAT, [B], "flow time in [0, 1)"),
    ]
    outputs = [tensor("velocity", FLOAT, [B, MEL_BINS, F], "dx/dt; exactly zero at padded frames")]

    # Time embedding: sinusoidal(1000 t) -> Linear -> SiLU -> Linear, broadcast over frames.
    half = 32
    freqs = g.const_f32("time_emb/freqs",
                        1000.0 * 10000.0 ** (-np.arange(half, dtype=np.float64) / half))
    tt = g.op("Unsqueeze", "time_emb/unsqueeze", ["t", g.const_i64("time_emb/axes1", [1])])
    ang = g.op("Mul", "time_emb/angles", [tt, freqs])                       # [B,32]
    temb = g.op("Concat", "time_emb/concat",
                [g.op("Sin", "time_emb/sin", [ang]), g.op("Cos", "time_emb/cos", [ang])], axis=1)
    temb = g.linear("time_emb.fc1", temb, 2 * half, FLOW_HIDDEN)
    temb = g.silu("time_emb.act", temb)
    temb = g.linear("time_emb.fc2", temb, FLOW_HIDDEN, FLOW_HIDDEN)
    temb = g.op("Unsqueeze", "time_emb/broadcast_frames",
                [temb, g.const_i64("time_emb/axes2", [2])])                 # [B,128,1]

    xin = g.op("Concat", "input/concat", ["x", "mu"], axis=1)               # [B,160,F]
    xin = g.op("Mul", "input/mask", [xin, "mask"])
    h = g.conv1d("block1.conv", xin, 2 * MEL_BINS, FLOW_HIDDEN, 3, pad=1)
    h = g.op("Add", "block1/add_time", [h, temb])
    h = g.silu("block1.act", h)
    h = g.op("Mul", "block1/mask", [h, "mask"])
    h = g.conv1d("block2.conv", h, FLOW_HIDDEN, FLOW_HIDDEN, 3, pad=1)
    h = g.silu("block2.act", h)
    h = g.op("Mul", "block2/mask", [h, "mask"])
    h = g.conv1d("out.conv", h, FLOW_HIDDEN, MEL_BINS, 1)
    g.op("Mul", "out/mask", [h, "mask"], out="velocity")

    doc = ("voxmux tiny flow-matching estimator (random weights): velocity field v(x, mu, t). "
           "Concat(x, mu) masked, Conv1d k3 160->128 + time embedding, SiLU, mask, Conv1d k3 "
           "128->128, SiLU, mask, Conv1d k1 128->80, mask. Masking after every layer makes real "
           "frames independent of zero padding.")
    return g.model("voxmux_tiny_flow_estimator", doc, inputs, outputs)


def build_flow_step(estimator):
    """The estimator's nodes on doubled inputs, then guidance and the Euler update."""
    g = GraphBuilder(None)
    B, F = "batch", "frames"
    inputs = [
        tensor("x", FLOAT, [B, MEL_BINS, F], "current sample"),
        tensor("mask", FLOAT, [B, 1, F], "1 for real frames, 0 for padding"),
        tensor("mu", FLOAT, [B, MEL_BINS, F], "conditioning from the encoder"),
        tensor("t", FLOAT, [B], "flow time in [0, 1), the same for every item"),
        tensor("dt", FLOAT, [1], "step size"),
        tensor("cfg", FLOAT, [1], "guidance strength"),
    ]
    outputs = [tensor("x_next", FLOAT, [B, MEL_BINS, F], "x after the step; zero at padded frames")]
    # Conditional and unconditional passes as one batch of 2B: [x; x], [mu; 0].
    rename = {n: "cfg/" + n for n in ("x", "mask", "mu", "t")}
    for n in ("x", "mask", "t"):
        g.op("Concat", "cfg/concat_" + n, [n, n], out=rename[n], axis=0)
    zeros = g.op("Sub", "cfg/zeros", ["mu", "mu"])
    g.op("Concat", "cfg/concat_mu", ["mu", zeros], out=rename["mu"], axis=0)
    rename["velocity"] = "cfg/velocity"
    for init in estimator.graph.initializer:
        g.inits.append(init)
        g.names.add(init.name)
    for node in estimator.graph.node:
        n = copy.deepcopy(node)
        n.input[:] = [rename.get(i, i) for i in n.input]
        n.output[:] = [rename.get(o, o) for o in n.output]
        g.nodes.append(n)
        g.names.add(n.name)
    # v(x, mu) is the first B rows, v(x, 0) the rest.
    b = g.op("Slice", "cfg/batch", [g.op("Shape", "cfg/shape", ["x"]), g.const_i64("cfg/zero", [0]),
                                    g.const_i64("cfg/one", [1])])
    big = g.const_i64("cfg/end", [np.iinfo(np.int64).max])
    axis = g.const_i64("cfg/axis", [0])
    vc = g.op("Slice", "cfg/v_cond", ["cfg/velocity", g.const_i64("cfg/start", [0]), b, axis])
    vu = g.op("Slice", "cfg/v_uncond", ["cfg/velocity", b, big, axis])
    one_plus = g.op("Add", "update/one_plus_cfg", ["cfg", g.const_f32("update/one", [1.0])])
    v = g.op("Sub", "update/guided", [g.op("Mul", "update/cond", [vc, one_plus]),
                                      g.op("Mul", "update/uncond", [vu, "cfg"])])
    g.op("Add", "update/euler", ["x", g.op("Mul", "update/scale", [v, "dt"])], out="x_next")
    doc = ("voxmux tiny flow step (random weights, the estimator's): one Euler step with "
           "classifier-free guidance, x + dt * ((1 + cfg) * v(x, mu) - cfg * v(x, 0)), both passes "
           "in one estimator call of batch 2B.")
    return g.model("voxmux_tiny_flow_step", doc, inputs, outputs)


# ---------------------------------------------------------------------------------------------
# Vocoder


def build_vocoder(rng):
    g = GraphBuilder(rng)
    B, F, S = "batch", "frames", "samples"
    inputs = [tensor("mel", FLOAT, [B, MEL_BINS, F], "mel frames; padded frames are zero")]
    outputs = [tensor("audio", FLOAT, [B, S], "samples in [-1, 1] at 24000 Hz, S = 480 * frames")]

    # Every convolution is causal (left padding only) and bias-free, and LeakyReLU/Tanh map 0
    # to 0. Then an output sample depends only on its own and earlier mel frames, and a zero
    # frame whose past is all zero stays exactly zero through every layer. So zero padding on
    # the right (or on the left) of a batch item changes none of its real samples, and chunked
    # runs with enough left context (the receptive field is about 7 frames) equal a full run.
    # With centred (non-causal) kernels neither holds: padded frames next to real ones turn
    # non-zero after the first conv and leak back into the real frames.
    # Gains: He-style for the LeakyReLU layers; the last conv is scaled down so that N(0,1)
    # mel input gives audio of RMS ~0.1 rather than saturating the Tanh.
    lrelu = dict(alpha=0.1)
    gain = np.sqrt(2.0)
    x = g.conv1d("conv_pre", "mel", MEL_BINS, 64, 7, bias=False, gain=gain, causal=True)
    x = g.op("LeakyRelu", "conv_pre/lrelu", [x], **lrelu)
    x = g.conv_transpose1d("ups.0", x, 64, 32, 8, gain=gain)               # x8
    x = g.op("LeakyRelu", "ups.0/lrelu", [x], **lrelu)
    r = g.conv1d("resblock.convs1", x, 32, 32, 3, dilation=1, bias=False, gain=gain,
                 causal=True)
    r = g.op("LeakyRelu", "resblock.convs1/lrelu", [r], **lrelu)
    r = g.conv1d("resblock.convs2", r, 32, 32, 3, dilation=3, bias=False, gain=0.5,
                 causal=True)
    x = g.op("Add", "resblock/residual", [x, r])
    x = g.conv_transpose1d("ups.1", x, 32, 16, 6, gain=gain)               # x6
    x = g.op("LeakyRelu", "ups.1/lrelu", [x], **lrelu)
    x = g.conv_transpose1d("ups.2", x, 16, 8, 10, gain=gain)               # x10
    x = g.op("LeakyRelu", "ups.2/lrelu", [x], **lrelu)
    x = g.conv1d("conv_post", x, 8, 1, 7, bias=False, gain=0.1, causal=True)
    x = g.op("Tanh", "conv_post/tanh", [x])
    g.op("Squeeze", "output/squeeze_channel", [x, g.const_i64("output/axes", [1])], out="audio")

    doc = ("voxmux tiny vocoder (random weights): HiFi-GAN-style mel -> waveform, hop 480 = "
           "8*6*10, 24000 Hz. Every convolution is causal and bias-free and LeakyReLU/Tanh map "
           "0 to 0, so zero mel frames give exactly zero audio and zero padding of a batch "
           "item leaves its real samples bit-for-bit unchanged.")
    return g.model("voxmux_tiny_vocoder", doc, inputs, outputs)


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    out_dir = argv[1] if len(argv) == 2 else os.path.join(REPO, "models", "tiny")
    os.makedirs(out_dir, exist_ok=True)

    rng = np.random.default_rng(SEED)
    lm = build_lm(rng)
    encoder = build_flow_encoder(rng)
    estimator = build_flow_estimator(rng)
    models = [
        ("lm.onnx", lm),
        ("flow_encoder.onnx", encoder),
        ("flow_estimator.onnx", estimator),
        ("vocoder.onnx", build_vocoder(rng)),
        ("lm_shared.onnx", build_lm_shared(lm)),   # after the others: draws no random numbers
        ("flow_step.onnx", build_flow_step(estimator)),   # neither: the estimator's weights
    ]
    for fname, m in models:
        path = os.path.join(out_dir, fname)
        data = m.SerializeToString(deterministic=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        # Re-check what was written (from bytes: check_model(path, full_check=True) would
        # write inferred shapes back into the file).
        with open(path, "rb") as f:
            onnx.checker.check_model(f.read(), full_check=True)
        print("wrote %s (%d bytes)" % (path, len(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
