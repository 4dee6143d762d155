"""PyTorch modules with the shapes of CosyVoice3-0.5B and random weights, for benchmarking.

The four graphs follow voxmux's stage contract (docs/pipeline.md) exactly, so the exporter
(scripts/staged/shaped_export.py) can write them as ONNX for voxmux, and the baseline server
(scripts/staged/shaped_baseline.py) can run the very same modules in PyTorch eager mode:

- SpeechLM: a Qwen2.5-0.5B-shaped decoder (hidden 896, 24 layers, 14 query heads over 2 KV heads,
  head_dim 64, SiLU-gated MLP 4864, RMSNorm, RoPE theta 1e6 from position_ids, q/k/v biases),
  one embedding table for text bytes and speech tokens, logits over 6561 speech tokens + end of
  speech, KV cache as explicit inputs and outputs.
- FlowEncoder: CosyVoice3's token front end: speech-token embedding (6561 x 80), the
  pre-lookahead convolution block (80 -> 1024 -> 80, 3 tokens of lookahead), then each token
  repeated to 2 mel frames (25 Hz tokens -> 50 Hz mel).
- FlowEstimator: a DiT (dim 1024, depth 22, 16 heads of 64, feed-forward x2, AdaLN-Zero
  modulation from the flow time, rotary positions, causal convolutional position embedding),
  velocity over 80 mel bins; attention masks padded frames as keys.
- Vocoder: a HiFi-GAN generator shaped like CosyVoice3's HiFT (512 base channels, upsampling
  x8 x5 x3 with kernels 16/11/7, multi-receptive-field blocks with kernels 3/7/11 and dilations
  1/3/5), and a learned x4 synthesis layer in place of HiFT's iSTFT (n_fft 16, hop 4): 480
  samples per mel frame at 24 kHz. Every convolution is causal and bias-free, so zero padding
  never changes real samples (exact batch invariance), and chunked vocoding with enough left
  context equals a whole run.

Sources and deviations are in docs/benchmarks/model.md. The weights are random (fixed seed), so
the audio is noise; the work per request is the real thing.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..common import layers
from ..common.layers import rms_norm, rotate_half
from ..common.ort_ops import GroupQueryAttentionOp

SEED = 20250805

# Tokenizer ("bytes", docs/pipeline.md): 0 pad, 1 bos, 2 sos, byte b -> b + 3.
PAD, BOS, SOS = 0, 1, 2
TEXT_OFFSET = 3
TEXT_VOCAB = 259
SPEECH_VOCAB = 6561                    # CosyVoice3 speech_token_size (FSQ codebook)
SPEECH_TOKEN_OFFSET = TEXT_VOCAB       # LM input id of speech token k is 259 + k
LM_VOCAB = TEXT_VOCAB + SPEECH_VOCAB   # 6820 input ids
END_OF_SPEECH = SPEECH_VOCAB           # index of end of speech in the logits

# Qwen2.5-0.5B (config.json).
LM_HIDDEN = 896
LM_LAYERS = 24
LM_Q_HEADS = 14
LM_KV_HEADS = 2
LM_HEAD_DIM = 64
LM_GROUP = LM_Q_HEADS // LM_KV_HEADS
LM_MLP = 4864
LM_RMS_EPS = 1e-6
LM_ROPE_THETA = 1000000.0
LM_ROPE_POSITIONS = 16384     # RotaryEmbedding's table: prompt plus speech tokens stay below it

# CosyVoice3 flow (cosyvoice3.yaml: CausalMaskedDiffWithDiT, PreLookaheadLayer, DiT).
MEL_BINS = 80
TOKEN_RATE = 25
FRAMES_PER_TOKEN = 2
FLOW_EMBED = 80
LOOKAHEAD_CHANNELS = 1024
LOOKAHEAD_TOKENS = 3
DIT_DIM = 1024
DIT_DEPTH = 22
DIT_HEADS = 16
DIT_HEAD_DIM = 64
DIT_FF_MULT = 2
DIT_TIME_FREQS = 256
DIT_POS_KERNEL = 31
DIT_POS_GROUPS = 16
DIT_ROPE_POSITIONS = 16384    # frames of one flow run (a chunk with its context) stay below it

# CosyVoice3 HiFT (cosyvoice3.yaml: CausalHiFTGenerator).
SAMPLE_RATE = 24000
VOC_BASE_CHANNELS = 512
VOC_UPSAMPLE_RATES = (8, 5, 3)
VOC_UPSAMPLE_KERNELS = (16, 11, 7)
VOC_RESBLOCK_KERNELS = (3, 7, 11)
VOC_RESBLOCK_DILATIONS = (1, 3, 5)
VOC_SYNTH_CHANNELS = 18     # HiFT's conv_post writes n_fft + 2 = 18 channels (magnitude, phase)
VOC_SYNTH_KERNEL = 16       # HiFT's iSTFT: n_fft 16 ...
VOC_SYNTH_HOP = 4           # ... hop 4
HOP = 480                   # 8 * 5 * 3 * 4 samples per mel frame
AUDIO_LIMIT = 0.99          # HiFT's audio_limit

assert LM_Q_HEADS * LM_HEAD_DIM == LM_HIDDEN
assert DIT_HEADS * DIT_HEAD_DIM == DIT_DIM
assert math.prod(VOC_UPSAMPLE_RATES) * VOC_SYNTH_HOP == HOP == SAMPLE_RATE // (TOKEN_RATE * FRAMES_PER_TOKEN)

# Additive attention bias of a masked position (scores are float32 here).
MASKED = 1e9


def rope_cos_sin(positions, head_dim, theta, dtype):
    """cos and sin [B, 1, T, head_dim] for int64 positions [B, T] (or [1, T])."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=positions.device) / head_dim))
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)


# ---------------------------------------------------------------------------------------------
# Fused operators for export
#
# ONNX Runtime has fused kernels for the transformer pieces of these graphs (its contrib operators):
# an attention that never materialises the score matrix, RoPE, RMSNorm and tanh-GELU in one kernel
# each. Spelled out in plain ONNX, each of them is several kernels with a trip through GPU memory
# between them, and a decode step or a small flow chunk is bound by how many kernels it launches.
# Each Function below computes the same arithmetic in PyTorch (what tracing and the eager baseline
# run) and exports as the fused operator. The results are the same up to float rounding
# (docs/benchmarks/model.md).

MS_DOMAIN = "com.microsoft"
# An additive attention bias that removes a key in float16 (exp(-30000) is 0; -1e9 overflows).
MASKED_FUSED = 30000.0


def rope_cache(positions, head_dim, theta, dtype):
    """cos and sin caches [positions, head_dim/2], as ONNX Runtime's RotaryEmbedding takes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.arange(positions, dtype=torch.float32).unsqueeze(-1) * inv_freq
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


class RotaryOp(torch.autograd.Function):
    """RoPE (rotate-half) of x [B,T,heads*head_dim] at position_ids [B,T] (or [1]: an offset
    for positions 0..T-1); exported as com.microsoft RotaryEmbedding (interleaved=0)."""

    @staticmethod
    def forward(ctx, x, position_ids, cos_cache, sin_cache, num_heads):
        B, T, _ = x.shape
        if position_ids.dim() == 1:
            pos = (position_ids[0] + torch.arange(T, device=x.device)).unsqueeze(0)
        else:
            pos = position_ids
        cos = torch.cat((cos_cache[pos], cos_cache[pos]), dim=-1).unsqueeze(2)   # [B|1,T,1,D]
        sin = torch.cat((sin_cache[pos], sin_cache[pos]), dim=-1).unsqueeze(2)
        xh = x.reshape(B, T, num_heads, -1)
        half = xh.shape[-1] // 2
        return (xh * cos + rotate_half(xh, half) * sin).reshape(B, T, -1)

    @staticmethod
    def symbolic(g, x, position_ids, cos_cache, sin_cache, num_heads):
        y = g.op(MS_DOMAIN + "::RotaryEmbedding", x, position_ids, cos_cache, sin_cache,
                 interleaved_i=0, num_heads_i=num_heads)
        y.setType(x.type())
        return y


class AttentionOp(torch.autograd.Function):
    """Softmax attention of q, k, v [B,F,heads*64] with an additive bias [B,1,F,F]; exported as
    com.microsoft MultiHeadAttention (fused kernels on CUDA). The bias goes in as input 3 here;
    fix_attention_inputs() moves it to MultiHeadAttention's attention_bias slot (input 5)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, num_heads):
        B, F_, _ = q.shape
        qh, kh, vh = (t.reshape(B, F_, num_heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias)
        return out.transpose(1, 2).reshape(B, F_, -1)

    @staticmethod
    def symbolic(g, q, k, v, bias, num_heads):
        y = g.op(MS_DOMAIN + "::MultiHeadAttention", q, k, v, bias, num_heads_i=num_heads)
        y.setType(q.type())
        return y


class QKVAttentionOp(torch.autograd.Function):
    """The DiT's whole self-attention before the output projection in one operator: the q/k/v
    projection of h [B,F,D] (weight [D,3D], bias [3D]), RoPE (rotate-half, theta 10000) of q and
    k at positions 0..F-1, and softmax attention with an additive bias [B,1,F,F]. Exported as
    com.microsoft Attention with do_rotary: one cuBLAS product, one kernel that adds the bias,
    rotates q and k and lays them out for the memory-efficient attention kernel, and that kernel;
    the split form (AttentionOp) spends an Add, a Split and two RotaryEmbedding passes over the
    [B,F,3D] product on the same. The bias goes in as input 3 here; fix_attention_inputs() moves
    it to Attention's attention_bias slot (input 5)."""

    @staticmethod
    def forward(ctx, h, weight, bias, attn_bias, cos_cache, sin_cache, num_heads):
        B, F_, D = h.shape
        q, k, v = (torch.matmul(h, weight) + bias).split(D, dim=-1)
        pos = torch.zeros(1, dtype=torch.int64, device=h.device)
        q = RotaryOp.forward(None, q, pos, cos_cache, sin_cache, num_heads)
        k = RotaryOp.forward(None, k, pos, cos_cache, sin_cache, num_heads)
        return AttentionOp.forward(None, q, k, v, attn_bias, num_heads)

    @staticmethod
    def symbolic(g, h, weight, bias, attn_bias, cos_cache, sin_cache, num_heads):
        # RoPE's table is computed in the kernel (theta 10000, rotate-half: what the DiT uses).
        y = g.op(MS_DOMAIN + "::Attention", h, weight, bias, attn_bias, num_heads_i=num_heads,
                 do_rotary_i=1)
        y.setType(h.type())
        return y


class FastGeluOp(torch.autograd.Function):
    """tanh-approximated GELU of x (+ bias [D], added in the same kernel); exported as
    com.microsoft FastGelu."""

    @staticmethod
    def forward(ctx, x, bias=None):
        return F.gelu(x if bias is None else x + bias, approximate="tanh")

    @staticmethod
    def symbolic(g, x, bias=None):
        y = g.op(MS_DOMAIN + "::FastGelu", x) if bias is None else g.op(MS_DOMAIN + "::FastGelu", x, bias)
        y.setType(x.type())
        return y


class SkipLayerNormOp(torch.autograd.Function):
    """A residual step and the norm after it in one kernel: s = x + skip + bias, returns
    (layer_norm(s) * gamma + beta, s); gamma, beta and bias [D]. Exported as com.microsoft
    SkipLayerNormalization (outputs 1 and 2, statistics the CUDA kernel does not write, are left
    out by fix_norm_outputs)."""

    @staticmethod
    def forward(ctx, x, skip, gamma, beta, bias, eps):
        s = x + skip + bias
        return F.layer_norm(s, (s.shape[-1],), gamma, beta, eps), s

    @staticmethod
    def symbolic(g, x, skip, gamma, beta, bias, eps):
        y, _, _, s = g.op(MS_DOMAIN + "::SkipLayerNormalization", x, skip, gamma, beta, bias,
                          epsilon_f=eps, outputs=4)
        y.setType(x.type())
        s.setType(x.type())
        return y, s


class SkipRMSNormOp(torch.autograd.Function):
    """The same for RMSNorm: s = x + skip, returns (rms_norm(s) * weight, s), statistics in
    float32. Exported as com.microsoft SkipSimplifiedLayerNormalization."""

    @staticmethod
    def forward(ctx, x, skip, weight, eps):
        s = x + skip
        return rms_norm(s, weight, eps), s

    @staticmethod
    def symbolic(g, x, skip, weight, eps):
        y, _, _, s = g.op(MS_DOMAIN + "::SkipSimplifiedLayerNormalization", x, skip, weight,
                          epsilon_f=eps, outputs=4)
        y.setType(x.type())
        s.setType(x.type())
        return y, s


class RMSNormOp(torch.autograd.Function):
    """RMSNorm with a weight, statistics in float32; exported as ONNX Runtime's
    SimplifiedLayerNormalization (which ONNX Runtime defines in the default domain)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        return rms_norm(x, weight, eps)

    @staticmethod
    def symbolic(g, x, weight, eps):
        y = g.op("SimplifiedLayerNormalization", x, weight, axis_i=-1, epsilon_f=eps, stash_type_i=1)
        y.setType(x.type())
        return y


class ReshapeOp(torch.autograd.Function):
    """Reshape with ONNX's own conventions (0 keeps the input's size on that axis, -1 infers one);
    exported as one Reshape with a constant shape. A traced x.reshape(B, ...) with B read from a
    shape costs Shape, Gather, Unsqueeze and Concat kernels on every run."""

    @staticmethod
    def forward(ctx, x, shape):
        return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(shape)])

    @staticmethod
    def symbolic(g, x, shape):
        return g.op("Reshape", x, g.op("Constant", value_t=torch.tensor(shape, dtype=torch.int64)))


SKIP_NORMS = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")


def fix_norm_outputs(model):
    """Leaves out the mean and inverse deviation of the skip norms (outputs 1 and 2): nothing
    reads them and ONNX Runtime's CUDA kernels do not write them."""
    dropped = set()
    for node in model.graph.node:
        if node.domain == MS_DOMAIN and node.op_type in SKIP_NORMS:
            for i in (1, 2):
                if i < len(node.output) and node.output[i]:
                    dropped.add(node.output[i])
                    node.output[i] = ""
    keep = [v for v in model.graph.value_info if v.name not in dropped]
    del model.graph.value_info[:]
    model.graph.value_info.extend(keep)
    return len(dropped)


def fix_attention_inputs(model):
    """Puts the attention bias of AttentionOp and QKVAttentionOp (their fourth input) in the
    operators' attention_bias slot, input 5, with the two between left empty: MultiHeadAttention
    (query, key, value, bias, key_padding_mask, attention_bias), Attention (input, weights, bias,
    mask_index, past, attention_bias)."""
    n = 0
    for node in model.graph.node:
        if node.domain == MS_DOMAIN and node.op_type in ("MultiHeadAttention", "Attention") and len(node.input) == 4:
            a, b, c, attn_bias = node.input
            del node.input[:]
            node.input.extend([a, b, c, "", "", attn_bias])
            n += 1
    return n


def conv1d_as_matmul(x, conv, left, right):
    """conv (an nn.Conv1d, any groups) over channels-last x [B,T,C_in] padded with left/right
    zeros in time, as one Gather and one batched MatMul: [B,T_out,C_out], channels-last.

    The exported graph then has no Conv node. ONNX Runtime plans a cuDNN convolution again
    whenever its input shape changes, which a server's batches do on nearly every run, and its
    grouped kernels are slow at these shapes; a gather of the K shifted frames feeding cuBLAS
    does the same arithmetic at any shape with no planning."""
    B, G = x.shape[0], conv.groups
    c_out, c_in_g, K = conv.weight.shape
    c_out_g = c_out // G
    xp = F.pad(x, (0, 0, left, right))                                             # [B,Tp,C_in]
    t_out = xp.shape[1] - K + 1
    xg = xp.reshape(B, xp.shape[1], G, c_in_g).permute(2, 0, 1, 3)                 # [G,B,Tp,Ci]
    # Frame indices t + k. Counted on the device from the data's own length rather than with
    # arange(t_out): ONNX Runtime computes a shape-derived Range on the CPU and copies it to the
    # GPU on every run, and a graph with such a copy cannot be captured as a CUDA graph
    # (docs/pipeline.md, the flow's step graph). Float32 counts are exact to 2^24 frames.
    n = torch.cumsum(torch.zeros_like(xp[0, :, 0], dtype=torch.float32) + 1.0, 0)   # 1..Tp
    first = (n if K == 1 else n[:1 - K]).to(torch.int64) - 1                       # 0..T_out-1
    idx = (first.unsqueeze(1) + torch.arange(K, device=x.device).unsqueeze(0)).reshape(-1)  # [T_out*K]
    cols = torch.index_select(xg, 2, idx).reshape(G, B * t_out, K * c_in_g)        # [G,B*T,K*Ci]
    # w[g, k*Ci + i, o] = weight[g*Co + o, i, k]; constant-folded into one initializer.
    w = conv.weight.reshape(G, c_out_g, c_in_g, K).permute(0, 3, 2, 1).reshape(G, K * c_in_g, c_out_g)
    y = torch.matmul(cols, w).reshape(G, B, t_out, c_out_g).permute(1, 2, 0, 3).reshape(B, t_out, c_out)
    return y if conv.bias is None else y + conv.bias


def use_fused(models, on=True):
    """Switches the LM and the DiT to the fused operators above, and the flow's convolutions to
    matrix products (exports); eager runs keep them off."""
    for m in models.modules():
        if hasattr(m, "fused"):
            m.fused = on


# ---------------------------------------------------------------------------------------------
# LM


class RMSNorm(layers.RMSNorm):
    """The shared RMSNorm, exported as ONNX Runtime's SimplifiedLayerNormalization when fused."""

    def __init__(self, dim, eps):
        super().__init__(dim, eps)
        self.fused = False

    def forward(self, x):
        if self.fused:
            return RMSNormOp.apply(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


class LMAttention(nn.Module):
    """Grouped-query attention with the KV cache passed in and out."""

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(LM_HIDDEN, LM_Q_HEADS * LM_HEAD_DIM, bias=True)
        self.k_proj = nn.Linear(LM_HIDDEN, LM_KV_HEADS * LM_HEAD_DIM, bias=True)
        self.v_proj = nn.Linear(LM_HIDDEN, LM_KV_HEADS * LM_HEAD_DIM, bias=True)
        self.o_proj = nn.Linear(LM_Q_HEADS * LM_HEAD_DIM, LM_HIDDEN, bias=False)
        self.scale = 1.0 / math.sqrt(LM_HEAD_DIM)
        # Eager runs (the baseline) use PyTorch's fused attention; the exported graph spells the
        # same arithmetic out so every ONNX Runtime provider can run it.
        self.sdpa = False
        self.fused = False

    def forward(self, h, rope, bias, past_k, past_v):
        """rope is (cos, sin) [B,1,T,64], or with fused operators (position_ids, cos_cache,
        sin_cache)."""
        if self.fused:
            return self.forward_fused(h, rope, bias, past_k, past_v)
        cos, sin = rope
        # Reshapes take B from the input's shape and infer T (-1): traced, both stay dynamic.
        B = h.shape[0]
        q = self.q_proj(h).reshape(B, -1, LM_Q_HEADS, LM_HEAD_DIM).transpose(1, 2)    # [B,14,T,64]
        k = self.k_proj(h).reshape(B, -1, LM_KV_HEADS, LM_HEAD_DIM).transpose(1, 2)   # [B,2,T,64]
        v = self.v_proj(h).reshape(B, -1, LM_KV_HEADS, LM_HEAD_DIM).transpose(1, 2)
        q = q * cos + rotate_half(q, LM_HEAD_DIM // 2) * sin
        k = k * cos + rotate_half(k, LM_HEAD_DIM // 2) * sin
        k_all = torch.cat([past_k, k], dim=2)                                         # [B,2,S,64]
        v_all = torch.cat([past_v, v], dim=2)
        # Query head h belongs to KV head h // 7. Folding the 7 query heads of a KV head into the
        # query axis lets one plain batched matmul per KV head serve them, with no copies of K/V.
        qg = q.reshape(B, LM_KV_HEADS, -1, LM_HEAD_DIM)                                # [B,2,7T,64]
        if self.sdpa:
            mask = bias.expand(-1, -1, LM_GROUP, -1, -1).flatten(2, 3).to(qg.dtype)    # [B,1,7T,S]
            ctx = F.scaled_dot_product_attention(qg, k_all, v_all, attn_mask=mask)
        else:
            scores = torch.matmul(qg, k_all.transpose(2, 3)).to(torch.float32) * self.scale
            S = scores.shape[-1]
            scores = scores.reshape(B, LM_KV_HEADS, LM_GROUP, -1, S) + bias            # [B,2,7,T,S]
            probs = torch.softmax(scores, dim=-1).to(qg.dtype).reshape(B, LM_KV_HEADS, -1, S)
            ctx = torch.matmul(probs, v_all)                                           # [B,2,7T,64]
        ctx = ctx.reshape(B, LM_Q_HEADS, -1, LM_HEAD_DIM).transpose(1, 2)              # [B,T,14,64]
        return self.o_proj(ctx.reshape(B, -1, LM_Q_HEADS * LM_HEAD_DIM)), k_all, v_all

    def forward_fused(self, h, rope, bias, past_k, past_v):
        """The same attention in fewer kernels: one projection for q, k and v (the softmax scale
        folded into q's weights), ONNX Runtime's RotaryEmbedding, scores and softmax in the
        model's dtype with a bias that is built once for all layers."""
        position_ids, cos_cache, sin_cache = rope
        QD, KD = LM_Q_HEADS * LM_HEAD_DIM, LM_KV_HEADS * LM_HEAD_DIM
        w = torch.cat((self.q_proj.weight * self.scale, self.k_proj.weight, self.v_proj.weight))
        b = torch.cat((self.q_proj.bias * self.scale, self.k_proj.bias, self.v_proj.bias))
        q, k, v = F.linear(h, w, b).split([QD, KD, KD], dim=-1)
        q = RotaryOp.apply(q, position_ids, cos_cache, sin_cache, LM_Q_HEADS)
        k = RotaryOp.apply(k, position_ids, cos_cache, sin_cache, LM_KV_HEADS)
        k = ReshapeOp.apply(k, (0, -1, LM_KV_HEADS, LM_HEAD_DIM)).transpose(1, 2)       # [B,2,T,64]
        v = ReshapeOp.apply(v, (0, -1, LM_KV_HEADS, LM_HEAD_DIM)).transpose(1, 2)
        k_all = torch.cat([past_k, k], dim=2)                                         # [B,2,S,64]
        v_all = torch.cat([past_v, v], dim=2)
        # Query head 7g+i belongs to KV head g: [B,T,14,64] -> [B,2,7,T,64] against K and V
        # [B,2,1,S,64], broadcast over the 7 (no copies of K/V).
        qg = ReshapeOp.apply(q, (0, -1, LM_KV_HEADS, LM_GROUP, LM_HEAD_DIM)).permute(0, 2, 3, 1, 4)
        scores = torch.matmul(qg, k_all.unsqueeze(2).transpose(3, 4)) + bias          # [B,2,7,T,S]
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v_all.unsqueeze(2))          # [B,2,7,T,64]
        ctx = ReshapeOp.apply(ctx.permute(0, 3, 1, 2, 4), (0, -1, QD))                 # [B,T,896]
        return self.o_proj(ctx), k_all, v_all


class LMLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm(LM_HIDDEN, LM_RMS_EPS)
        self.self_attn = LMAttention()
        self.post_attention_layernorm = RMSNorm(LM_HIDDEN, LM_RMS_EPS)
        self.gate_proj = nn.Linear(LM_HIDDEN, LM_MLP, bias=False)
        self.up_proj = nn.Linear(LM_HIDDEN, LM_MLP, bias=False)
        self.down_proj = nn.Linear(LM_MLP, LM_HIDDEN, bias=False)
        self.fused = False

    def forward(self, h, rope, bias, past_k, past_v):
        a, k, v = self.self_attn(self.input_layernorm(h), rope, bias, past_k, past_v)
        h = h + a
        x = self.post_attention_layernorm(h)
        if self.fused:
            return h + self.mlp_fused(x), k, v
        h = h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return h, k, v

    def mlp_fused(self, x):
        """gate and up in one product, split at a constant offset."""
        g, u = F.linear(x, torch.cat((self.gate_proj.weight, self.up_proj.weight))).split(LM_MLP, dim=-1)
        return self.down_proj(F.silu(g) * u)

    def attend_shared(self, x, seqlens_k, total_len, cos_cache, sin_cache, past_k, past_v):
        """Attention of the normed x over a shared cache (GroupQueryAttentionOp), with the output
        projection."""
        at = self.self_attn
        QD, KD = LM_Q_HEADS * LM_HEAD_DIM, LM_KV_HEADS * LM_HEAD_DIM
        w = torch.cat((at.q_proj.weight, at.k_proj.weight, at.v_proj.weight))
        b = torch.cat((at.q_proj.bias, at.k_proj.bias, at.v_proj.bias))
        q, k, v = F.linear(x, w, b).split([QD, KD, KD], dim=-1)
        ctx, pk, pv = GroupQueryAttentionOp.apply(q, k, v, past_k, past_v, seqlens_k, total_len,
                                                  cos_cache, sin_cache, LM_Q_HEADS, LM_KV_HEADS)
        return at.o_proj(ctx), pk, pv

    def forward_shared(self, h, seqlens_k, total_len, cos_cache, sin_cache, past_k, past_v):
        """The fused layer over a shared cache (GroupQueryAttentionOp)."""
        a, pk, pv = self.attend_shared(self.input_layernorm(h), seqlens_k, total_len, cos_cache,
                                       sin_cache, past_k, past_v)
        h = h + a
        return h + self.mlp_fused(self.post_attention_layernorm(h)), pk, pv


def skip_norm_layers(layers, final_norm, h, attend):
    """The decoder layers with every residual add fused into the RMSNorm after it
    (SkipRMSNormOp): returns the final norm's output and the caches. attend(i, layer, x) gives
    layer i's attention output (projected) and its caches for the normed x."""
    x = RMSNormOp.apply(h, layers[0].input_layernorm.weight, LM_RMS_EPS)
    presents = []
    for i, layer in enumerate(layers):
        a, k, v = attend(i, layer, x)
        presents += [k, v]
        x, h = SkipRMSNormOp.apply(a, h, layer.post_attention_layernorm.weight, LM_RMS_EPS)
        after = layers[i + 1].input_layernorm if i + 1 < len(layers) else final_norm
        x, h = SkipRMSNormOp.apply(layer.mlp_fused(x), h, after.weight, LM_RMS_EPS)
    return x, presents


def lm_attention_bias(attention_mask, past_len, new_len):
    """[B,1,1,T,S] float32: 0 where new token t may attend slot j, -1e9 elsewhere.

    Allowed: attention_mask[b, j] == 1 and j <= past_len + t (causal over slots; positions come
    from position_ids, so padding slots never shift them).
    """
    total = attention_mask.shape[1]
    key = torch.arange(total, device=attention_mask.device)
    query = torch.arange(new_len, device=attention_mask.device) + past_len
    causal = key.unsqueeze(0) <= query.unsqueeze(1)                       # [T,S]
    real = attention_mask.unsqueeze(1).unsqueeze(1).unsqueeze(1) == 1     # [B,1,1,1,S]
    allowed = torch.logical_and(real, causal)                             # [B,1,1,T,S]
    return (allowed.to(torch.float32) - 1.0) * MASKED


class SpeechLM(nn.Module):
    """forward(input_ids, position_ids, attention_mask, past_key.0, past_value.0, ...)
    -> (logits float32 [B,T,6562], present_key.0, present_value.0, ...)."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(LM_VOCAB, LM_HIDDEN)
        self.layers = nn.ModuleList(LMLayer() for _ in range(LM_LAYERS))
        self.norm = RMSNorm(LM_HIDDEN, LM_RMS_EPS)
        self.lm_head = nn.Linear(LM_HIDDEN, SPEECH_VOCAB + 1, bias=False)
        # RotaryEmbedding's tables (fused export); not in the state dict.
        cos, sin = rope_cache(LM_ROPE_POSITIONS, LM_HEAD_DIM, LM_ROPE_THETA, torch.float32)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.fused = False
        # With fused operators: residual adds fused into the norms (skip_norm_layers).
        self.skip_norms = False

    def forward(self, input_ids, position_ids, attention_mask, *past):
        h = self.embed_tokens(input_ids)
        bias = lm_attention_bias(attention_mask, past[0].shape[2], input_ids.shape[1])
        if self.fused:
            rope = (position_ids, self.rope_cos, self.rope_sin)
            bias = ((bias / MASKED) * MASKED_FUSED).to(h.dtype)
        else:
            rope = rope_cos_sin(position_ids, LM_HEAD_DIM, LM_ROPE_THETA, h.dtype)
        if self.fused and self.skip_norms:
            x, presents = skip_norm_layers(
                self.layers, self.norm, h,
                lambda i, layer, x: layer.self_attn(x, rope, bias, past[2 * i], past[2 * i + 1]))
            return (self.lm_head(x).to(torch.float32), *presents)
        presents = []
        for i, layer in enumerate(self.layers):
            h, k, v = layer(h, rope, bias, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        logits = self.lm_head(self.norm(h)).to(torch.float32)
        return (logits, *presents)


class SharedCacheLM(nn.Module):
    """SpeechLM's export with the shared cache contract (docs/pipeline.md, lm.cache: shared):
    forward(input_ids, seqlens_k, total_sequence_length, past_key.0, past_value.0, ...)
    -> (logits float32 [B,T,6562], present_key.0, present_value.0, ...), presents the same shape
    as pasts, [B, 2, max_positions, 64]. Same weights as the SpeechLM it wraps."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, seqlens_k, total_len, *past):
        lm = self.lm
        h = lm.embed_tokens(input_ids)
        cos, sin = lm.rope_cos.to(h.dtype), lm.rope_sin.to(h.dtype)
        if lm.skip_norms:
            x, presents = skip_norm_layers(
                lm.layers, lm.norm, h,
                lambda i, layer, x: layer.attend_shared(x, seqlens_k, total_len, cos, sin,
                                                        past[2 * i], past[2 * i + 1]))
            return (lm.lm_head(x).to(torch.float32), *presents)
        presents = []
        for i, layer in enumerate(lm.layers):
            h, k, v = layer.forward_shared(h, seqlens_k, total_len, cos, sin, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        return (lm.lm_head(lm.norm(h)).to(torch.float32), *presents)


def lm_shared_input_names():
    names = ["input_ids", "seqlens_k", "total_sequence_length"]
    for n in range(LM_LAYERS):
        names += ["past_key.%d" % n, "past_value.%d" % n]
    return names


def lm_input_names():
    names = ["input_ids", "position_ids", "attention_mask"]
    for n in range(LM_LAYERS):
        names += ["past_key.%d" % n, "past_value.%d" % n]
    return names


def lm_output_names():
    names = ["logits"]
    for n in range(LM_LAYERS):
        names += ["present_key.%d" % n, "present_value.%d" % n]
    return names


# ---------------------------------------------------------------------------------------------
# Flow


def repeat_frames(x):
    """[B,C,N] -> [B,C,N*FRAMES_PER_TOKEN], each token repeated."""
    return x.unsqueeze(-1).expand(-1, -1, -1, FRAMES_PER_TOKEN).flatten(2)


class FlowEncoder(nn.Module):
    """forward(speech_tokens int64 [B,N], token_mask [B,1,N]) -> mu [B,80,2N], zero at padding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(SPEECH_VOCAB, FLOW_EMBED)
        # Pre-lookahead block: a token sees the next 3 tokens (right padding), then a causal conv.
        self.lookahead_conv = nn.Conv1d(FLOW_EMBED, LOOKAHEAD_CHANNELS, LOOKAHEAD_TOKENS + 1)
        self.out_conv = nn.Conv1d(LOOKAHEAD_CHANNELS, FLOW_EMBED, 3)
        self.fused = False

    def forward(self, speech_tokens, token_mask):
        if self.fused:
            m = token_mask.transpose(1, 2)                                              # [B,N,1]
            x = self.embed(speech_tokens) * m                                           # [B,N,80]
            y = F.leaky_relu(conv1d_as_matmul(x, self.lookahead_conv, 0, LOOKAHEAD_TOKENS), 0.01) * m
            y = ((x + conv1d_as_matmul(y, self.out_conv, 2, 0)) * m).transpose(1, 2)      # [B,80,N]
            return repeat_frames(y) * repeat_frames(token_mask)
        x = self.embed(speech_tokens).transpose(1, 2) * token_mask                    # [B,80,N]
        y = self.lookahead_conv(F.pad(x, (0, LOOKAHEAD_TOKENS)))
        y = F.leaky_relu(y, 0.01) * token_mask
        y = self.out_conv(F.pad(y, (2, 0)))
        y = (x + y) * token_mask
        return repeat_frames(y) * repeat_frames(token_mask)


def mish(x):
    return x * torch.tanh(F.softplus(x))


class TimeEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(DIT_TIME_FREQS, DIT_DIM)
        self.fc2 = nn.Linear(DIT_DIM, DIT_DIM)

    def forward(self, t, dtype):
        half = DIT_TIME_FREQS // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device)
                          * (-math.log(10000.0) / (half - 1)))
        args = (1000.0 * t.to(torch.float32)).unsqueeze(1) * freqs.unsqueeze(0)   # [B,128]
        emb = torch.cat((args.sin(), args.cos()), dim=-1).to(dtype)
        return self.fc2(F.silu(self.fc1(emb)))


class CausalPositionConv(nn.Module):
    """Two causal grouped convolutions with Mish over the frames (a convolutional position
    embedding that never looks right, so right padding cannot reach real frames)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(DIT_DIM, DIT_DIM, DIT_POS_KERNEL, groups=DIT_POS_GROUPS)
        self.conv2 = nn.Conv1d(DIT_DIM, DIT_DIM, DIT_POS_KERNEL, groups=DIT_POS_GROUPS)
        self.fused = False

    def forward(self, h, frame_mask):
        if self.fused:
            x = mish(conv1d_as_matmul(h * frame_mask, self.conv1, DIT_POS_KERNEL - 1, 0))
            x = mish(conv1d_as_matmul(x, self.conv2, DIT_POS_KERNEL - 1, 0))
            return x * frame_mask
        x = (h * frame_mask).transpose(1, 2)                                       # [B,D,F]
        x = mish(self.conv1(F.pad(x, (DIT_POS_KERNEL - 1, 0))))
        x = mish(self.conv2(F.pad(x, (DIT_POS_KERNEL - 1, 0))))
        return x.transpose(1, 2) * frame_mask


def modulated_layer_norm(norm, x, shift, scale):
    """norm(x) * (1 + scale) + shift as one LayerNormalization, for shift and scale [D] shared
    by every row of x."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight * (1 + scale), norm.bias * (1 + scale) + shift, norm.eps)


def gated_linear(linear, x, gate):
    """gate * linear(x) with the gate [D_out] folded into the weights and bias."""
    return F.linear(x, linear.weight * gate.unsqueeze(1), linear.bias * gate)


class DiTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.modulation = nn.Linear(DIT_DIM, 6 * DIT_DIM)
        # AdaLN-Zero normalises without an affine transform; unit weights and zero biases are
        # the same thing, and every exporter version writes them (some drop an absent weight).
        self.norm1 = nn.LayerNorm(DIT_DIM, eps=1e-6)
        self.norm2 = nn.LayerNorm(DIT_DIM, eps=1e-6)
        self.to_qkv = nn.Linear(DIT_DIM, 3 * DIT_DIM)
        self.to_out = nn.Linear(DIT_DIM, DIT_DIM)
        self.ff_in = nn.Linear(DIT_DIM, DIT_FF_MULT * DIT_DIM)
        self.ff_out = nn.Linear(DIT_FF_MULT * DIT_DIM, DIT_DIM)
        self.scale = 1.0 / math.sqrt(DIT_HEAD_DIM)
        self.sdpa = False
        # Timing only (scripts/staged/shaped_flow_compile.py): attention without the padding mask, which
        # lets PyTorch pick flash attention. Wrong wherever a batch pads.
        self.unmasked = False
        self.fused = False
        # With fused operators: projection, RoPE and attention as one Attention operator
        # (QKVAttentionOp) rather than MatMul, Add, Split, two RotaryEmbedding and
        # MultiHeadAttention.
        self.qkv_attention = False

    def attend_fused(self, h, rope, key_bias):
        """Self-attention of h [B,F,D] through the fused operators; rope is (position offset,
        cos_cache, sin_cache). Returns the context before the output projection."""
        pos, cos_cache, sin_cache = rope
        if self.qkv_attention:
            return QKVAttentionOp.apply(h, self.to_qkv.weight.t(), self.to_qkv.bias, key_bias,
                                        cos_cache, sin_cache, DIT_HEADS)
        q, k, v = self.to_qkv(h).split(DIT_DIM, dim=-1)                             # [B,F,1024]
        q = RotaryOp.apply(q, pos, cos_cache, sin_cache, DIT_HEADS)
        k = RotaryOp.apply(k, pos, cos_cache, sin_cache, DIT_HEADS)
        return AttentionOp.apply(q, k, v, key_bias, DIT_HEADS)

    def forward_shared_time(self, x, temb, rope, key_bias):
        """The fused block for a batch whose items share one flow time, temb [1,D]: the AdaLN
        modulation becomes LayerNormalization's scale and bias, and each gate scales its output
        projection's weights, so no element-wise pass over [B,F,D] is spent on either."""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(temb[0]).chunk(6)
        h = modulated_layer_norm(self.norm1, x, shift1, scale1)
        x = x + gated_linear(self.to_out, self.attend_fused(h, rope, key_bias), gate1)
        h = modulated_layer_norm(self.norm2, x, shift2, scale2)
        return x + gated_linear(self.ff_out, FastGeluOp.apply(self.ff_in(h)), gate2)

    def forward(self, x, temb, rope, key_bias):
        """rope is (cos, sin) [1,1,F,64], or with fused operators (position offset, cos_cache,
        sin_cache); key_bias is [B,1,1,F], or [B,1,F,F] with fused operators."""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(temb).unsqueeze(1).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        if self.fused:
            x = x + gate1 * self.to_out(self.attend_fused(h, rope, key_bias))
            h = self.norm2(x) * (1 + scale2) + shift2
            return x + gate2 * self.ff_out(FastGeluOp.apply(self.ff_in(h)))
        cos, sin = rope
        B = x.shape[0]
        qkv = self.to_qkv(h).reshape(B, -1, 3, DIT_HEADS, DIT_HEAD_DIM).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)                                                    # [B,16,F,64]
        q = q * cos + rotate_half(q, DIT_HEAD_DIM // 2) * sin
        k = k * cos + rotate_half(k, DIT_HEAD_DIM // 2) * sin
        if self.sdpa:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=None if self.unmasked else key_bias.to(q.dtype))
        else:
            scores = torch.matmul(q, k.transpose(2, 3)).to(torch.float32) * self.scale + key_bias
            ctx = torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), v)
        x = x + gate1 * self.to_out(ctx.transpose(1, 2).reshape(B, -1, DIT_DIM))
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.ff_out(F.gelu(self.ff_in(h), approximate="tanh"))


class FlowEstimator(nn.Module):
    """forward(x [B,80,F], mask [B,1,F], mu [B,80,F], t [B]) -> velocity [B,80,F], zero at padding."""

    def __init__(self):
        super().__init__()
        self.time_embed = TimeEmbedding()
        self.proj_in = nn.Linear(2 * MEL_BINS, DIT_DIM)
        self.pos_conv = CausalPositionConv()
        self.blocks = nn.ModuleList(DiTBlock() for _ in range(DIT_DEPTH))
        self.final_modulation = nn.Linear(DIT_DIM, 2 * DIT_DIM)
        self.norm_out = nn.LayerNorm(DIT_DIM, eps=1e-6)
        self.proj_out = nn.Linear(DIT_DIM, MEL_BINS)
        cos, sin = rope_cache(DIT_ROPE_POSITIONS, DIT_HEAD_DIM, 10000.0, torch.float32)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.fused = False
        # With fused operators: take the flow time of the batch's first item for all of them.
        # voxmux steps every item of a run together (the same t), and one time lets the AdaLN
        # modulation fold into the layer norms (DiTBlock.forward_shared_time).
        self.shared_time = False
        # With a shared time as well: residual adds fused into the norms (blocks_skip_norms).
        self.skip_norms = False

    def blocks_skip_norms(self, h, temb, rope, key_bias):
        """The blocks for a batch with one flow time, temb [D], in the fewest kernels ONNX
        Runtime offers: every block's modulation comes from one product up front, and one split
        hands out its norm scales and shifts, projection biases and gates; each residual add runs
        with the bias of the projection before it and the norm after it as one
        SkipLayerNormOp; ff_in's bias goes into FastGelu; the gates scale the output projections'
        weights. Returns the final norm's output. No kernel is spent on [D]-sized vectors per
        block, and ONNX Runtime has no shape arithmetic to do."""
        n, D = len(self.blocks), DIT_DIM
        mod = F.linear(temb, torch.cat([b.modulation.weight for b in self.blocks]),
                       torch.cat([b.modulation.bias for b in self.blocks])).reshape(n, 6, D)
        shift1, scale1, gate1, shift2, scale2, gate2 = mod.unbind(1)               # [n,D] each

        def stack(f):
            return torch.stack([f(b) for b in self.blocks])                         # [n,D]
        vecs = torch.cat((
            stack(lambda b: b.norm1.weight) * (1 + scale1),
            stack(lambda b: b.norm1.bias) * (1 + scale1) + shift1,
            stack(lambda b: b.norm2.weight) * (1 + scale2),
            stack(lambda b: b.norm2.bias) * (1 + scale2) + shift2,
            stack(lambda b: b.to_out.bias) * gate1,
            stack(lambda b: b.ff_out.bias) * gate2,
            gate1, gate2), dim=1)                                                   # [n, 8D]
        # Split per block, 8 at a time: ONNX Runtime's CUDA Split hands the addresses of more
        # than 32 outputs to its kernel through a host buffer, which the replay of a captured CUDA
        # graph reads again after the buffer has been reused (wrong results, no error).
        per = [row.split(D) for row in vecs.unbind(0)]                              # n of 8 [D]
        gamma1, beta1, gamma2, beta2, out_bias, ff_bias, g1, g2 = ([p[k] for p in per] for k in range(8))
        shift, scale = self.final_modulation(temb).split(D)
        gamma1 = list(gamma1) + [self.norm_out.weight * (1 + scale)]
        beta1 = list(beta1) + [self.norm_out.bias * (1 + scale) + shift]
        eps = [b.norm1.eps for b in self.blocks] + [self.norm_out.eps]

        x = h
        h = F.layer_norm(x, (D,), gamma1[0], beta1[0], eps[0])
        for i, b in enumerate(self.blocks):
            a = torch.matmul(b.attend_fused(h, rope, key_bias), b.to_out.weight.t() * g1[i])
            h, x = SkipLayerNormOp.apply(a, x, gamma2[i], beta2[i], out_bias[i], b.norm2.eps)
            f = FastGeluOp.apply(torch.matmul(h, b.ff_in.weight.t()), b.ff_in.bias)
            y = torch.matmul(f, b.ff_out.weight.t() * g2[i])
            h, x = SkipLayerNormOp.apply(y, x, gamma1[i + 1], beta1[i + 1], ff_bias[i], eps[i + 1])
        return h

    def forward(self, x, mask, mu, t):
        shared = self.fused and self.shared_time
        temb = F.silu(self.time_embed(t[:1] if shared else t, x.dtype))            # [B|1,D]
        frame_mask = mask.transpose(1, 2)                                           # [B,F,1]
        h = self.proj_in(torch.cat((x, mu), dim=1).transpose(1, 2)) * frame_mask    # [B,F,D]
        h = h + self.pos_conv(h, frame_mask)
        if self.fused:
            rope = (torch.zeros(1, dtype=torch.int64, device=x.device), self.rope_cos, self.rope_sin)
            # MultiHeadAttention takes a bias per query: [B,1,F,F], built once for all blocks.
            key_bias = ((mask - 1.0) * MASKED_FUSED).unsqueeze(1).expand(-1, -1, x.shape[2], -1)
        else:
            frames = torch.arange(x.shape[2], device=x.device).unsqueeze(0)         # [1,F]
            rope = rope_cos_sin(frames, DIT_HEAD_DIM, 10000.0, x.dtype)
            key_bias = ((mask.to(torch.float32) - 1.0) * MASKED).unsqueeze(1)       # [B,1,1,F]
        if shared and self.skip_norms:
            return self.proj_out(self.blocks_skip_norms(h, temb[0], rope, key_bias)).transpose(1, 2) * mask
        if shared:
            for block in self.blocks:
                h = block.forward_shared_time(h, temb, rope, key_bias)
            shift, scale = self.final_modulation(temb[0]).chunk(2)
            return self.proj_out(modulated_layer_norm(self.norm_out, h, shift, scale)).transpose(1, 2) * mask
        for block in self.blocks:
            h = block(h, temb, rope, key_bias)
        shift, scale = self.final_modulation(temb).unsqueeze(1).chunk(2, dim=-1)
        h = self.norm_out(h) * (1 + scale) + shift
        return self.proj_out(h).transpose(1, 2) * mask


class FlowStep(nn.Module):
    """One Euler step of the flow with classifier-free guidance, as voxmux's engine takes it on
    the host from the estimator (docs/pipeline.md): forward(x [B,80,F], mask [B,1,F],
    mu [B,80,F], t [B], dt [1], cfg [1]) -> x + dt * ((1 + cfg) * v(x, mu) - cfg * v(x, 0)), both
    passes in one estimator call of batch 2B. Float32 in and out; the estimator computes in dtype
    and the update is float32, so ten steps round like the host's. As one graph the sample, its
    conditioning and the mask can stay on the GPU for all steps of a batch, and each step can
    replay as one CUDA graph."""

    def __init__(self, estimator, dtype):
        super().__init__()
        self.est = estimator
        self.dtype = dtype

    def forward(self, x, mask, mu, t, dt, cfg):
        d = self.dtype
        xd, md, mud = x.to(d), mask.to(d), mu.to(d)
        v = self.est(torch.cat((xd, xd)), torch.cat((md, md)), torch.cat((mud, torch.zeros_like(mud))),
                     torch.cat((t, t)).to(d)).to(torch.float32)
        B = x.shape[0]
        vc, vu = v[:B], v[B:]   # slices, not chunk(): a traced chunk of a dynamic size is a sequence op
        return x + dt * ((1 + cfg) * vc - cfg * vu)


# ---------------------------------------------------------------------------------------------
# Vocoder


class CausalConv1d(nn.Conv1d):
    """Bias-free, same-length convolution padded on the left only."""

    def __init__(self, c_in, c_out, kernel, dilation=1):
        super().__init__(c_in, c_out, kernel, dilation=dilation, bias=False)
        self.left = (kernel - 1) * dilation

    def forward(self, x):
        return super().forward(F.pad(x, (self.left, 0)))


class CausalConvTranspose1d(nn.ConvTranspose1d):
    """Bias-free upsampling by `stride`; keeping the first T*stride outputs makes output n depend
    only on inputs j with j*stride <= n."""

    def __init__(self, c_in, c_out, kernel, stride):
        super().__init__(c_in, c_out, kernel, stride=stride, bias=False)
        self.up = stride

    def forward(self, x):
        return super().forward(x)[..., : x.shape[-1] * self.up]


class ResBlock(nn.Module):
    """HiFi-GAN ResBlock1: for each dilation, x += conv(lrelu(conv_d(lrelu(x))))."""

    def __init__(self, channels, kernel):
        super().__init__()
        self.convs1 = nn.ModuleList(CausalConv1d(channels, channels, kernel, d) for d in VOC_RESBLOCK_DILATIONS)
        self.convs2 = nn.ModuleList(CausalConv1d(channels, channels, kernel, 1) for _ in VOC_RESBLOCK_DILATIONS)

    def forward(self, x):
        for c1, c2 in zip(self.convs1, self.convs2):
            x = x + c2(F.leaky_relu(c1(F.leaky_relu(x, 0.1)), 0.1))
        return x


class Vocoder(nn.Module):
    """forward(mel [B,80,F]) -> audio float32 [B,F*480] in [-0.99, 0.99]."""

    def __init__(self):
        super().__init__()
        self.conv_pre = CausalConv1d(MEL_BINS, VOC_BASE_CHANNELS, 7)
        self.ups = nn.ModuleList()
        self.stages = nn.ModuleList()
        ch = VOC_BASE_CHANNELS
        for rate, kernel in zip(VOC_UPSAMPLE_RATES, VOC_UPSAMPLE_KERNELS):
            self.ups.append(CausalConvTranspose1d(ch, ch // 2, kernel, rate))
            ch //= 2
            self.stages.append(nn.ModuleList(ResBlock(ch, k) for k in VOC_RESBLOCK_KERNELS))
        self.conv_post = CausalConv1d(ch, VOC_SYNTH_CHANNELS, 7)
        self.synth = CausalConvTranspose1d(VOC_SYNTH_CHANNELS, 1, VOC_SYNTH_KERNEL, VOC_SYNTH_HOP)

    def forward(self, mel):
        x = self.conv_pre(mel)
        for up, blocks in zip(self.ups, self.stages):
            x = up(F.leaky_relu(x, 0.1))
            y = blocks[0](x)
            for b in blocks[1:]:
                y = y + b(x)
            x = y / len(blocks)
        x = self.synth(self.conv_post(F.leaky_relu(x, 0.01)))
        return torch.clamp(x, -AUDIO_LIMIT, AUDIO_LIMIT).squeeze(1).to(torch.float32)


def flow_max_batch_frames():
    """The most padded frames (items x frames) one flow run can take on ONNX Runtime's CUDA
    provider: its kernels index with 32-bit integers, and the largest intermediate of the fused
    estimator is the position convolutions' gather (conv1d_as_matmul), K x D values per frame of
    both guidance passes. Past 2^31 values the run is an illegal memory access (H200: 256 chunks
    of 232 frames, 3.8e9 values, crashed; 128 chunks, 1.9e9 values, ran). Rounded down to whole
    runs of 8 frames."""
    per_frame = 2 * DIT_POS_KERNEL * DIT_DIM
    return (2**31 - 1) // per_frame // 8 * 8


def vocoder_receptive_field_frames():
    """How many earlier mel frames an output sample can depend on (upper bound), from the
    architecture: each causal op adds its history, measured in frames at its own rate."""
    frames = (7 - 1) / 1.0                                              # conv_pre at 1 sample/frame
    rate = 1
    for up, kernel in zip(VOC_UPSAMPLE_RATES, VOC_UPSAMPLE_KERNELS):
        rate *= up
        frames += (kernel - 1 + up) / rate                             # transposed conv
        frames += max(sum((k - 1) * d + (k - 1) for d in VOC_RESBLOCK_DILATIONS)
                      for k in VOC_RESBLOCK_KERNELS) / rate             # widest MRF block
    frames += (7 - 1) / rate                                            # conv_post
    rate *= VOC_SYNTH_HOP
    frames += (VOC_SYNTH_KERNEL - 1 + VOC_SYNTH_HOP) / rate             # synthesis
    return math.ceil(frames)


# ---------------------------------------------------------------------------------------------
# Building


class Models(nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = SpeechLM()
        self.flow_encoder = FlowEncoder()
        self.flow_estimator = FlowEstimator()
        self.vocoder = Vocoder()


def _init_transformers(models, gen):
    """Linear and embedding weights as Qwen2 initialises them (normal, std 0.02), biases zero;
    the flow's token embedding at std 1 so that mu is of the order of a mel spectrogram."""
    with torch.no_grad():
        for m in list(models.lm.modules()) + list(models.flow_estimator.modules()):
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, 0.02, generator=gen)
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.zero_()
        models.flow_encoder.embed.weight.normal_(0.0, 1.0, generator=gen)


def _calibrate_vocoder(voc, gen):
    """Scales each bias-free convolution so its output has RMS 1 on Gaussian mel input (and the
    last one RMS 0.1), one layer after the other in a single pass. Random He-style weights
    otherwise grow the signal through the residual stacks until fp16 overflows or the output
    clips."""
    convs = [m for m in voc.modules() if isinstance(m, (CausalConv1d, CausalConvTranspose1d))]

    def hook(module, _inputs, out):
        target = 0.1 if module is voc.synth else 1.0
        rms = out.pow(2).mean().sqrt().clamp_min(1e-8)
        s = target / rms
        module.weight.mul_(s)
        return out * s

    handles = [c.register_forward_hook(hook) for c in convs]
    try:
        with torch.no_grad():
            voc(torch.randn(2, MEL_BINS, 64, generator=gen))
    finally:
        for h in handles:
            h.remove()


def build(seed=SEED):
    """All four modules in float32 on the CPU, deterministic for a given seed and torch version."""
    torch.manual_seed(seed)
    models = Models()
    gen = torch.Generator().manual_seed(seed)
    _init_transformers(models, gen)
    _calibrate_vocoder(models.vocoder, gen)
    return models.eval()


def use_qkv_attention(models, on=True):
    """Switches the DiT's fused attention to one Attention operator (QKVAttentionOp; exports)."""
    for m in models.modules():
        if isinstance(m, DiTBlock):
            m.qkv_attention = on


def use_sdpa(models, on=True):
    """Switches attention to torch's fused kernel (eager runs); exports keep it off."""
    for m in models.modules():
        if isinstance(m, (LMAttention, DiTBlock)):
            m.sdpa = on


def tokenize(text):
    """The "bytes" tokenizer: [bos, byte+3 ..., sos]."""
    return [BOS] + [b + TEXT_OFFSET for b in text.encode("utf-8")] + [SOS]


def count_params(module):
    return sum(p.numel() for p in module.parameters())
