"""CosyVoice3's networks as voxmux exports them: the LM, the flow (encoder and one guided Euler step
of the DiT) and the HiFT vocoder, written against the published checkpoints' parameter names
(`llm.pt`, `flow.pt`, `hift.pt` of CosyVoice3-0.5B load into them with every key used), with the
stage I/O of docs/pipeline.md.

The dimensions come from the model's own `cosyvoice3.yaml` and `CosyVoice-BlankEN/config.json`
(load_config). Behaviour follows CosyVoice's inference code (FunAudioLLM/CosyVoice:
cosyvoice/llm/llm.py CosyVoice3LM, cosyvoice/flow/flow.py CausalMaskedDiffWithDiT,
cosyvoice/flow/flow_matching.py CausalConditionalCFM, cosyvoice/flow/DiT, cosyvoice/hifigan
CausalHiFTGenerator); docs/cosyvoice3.md lists where voxmux's graphs differ and why.

Works with torch 1.13 (Debian's python3-torch, what CI has) and 2.x.
"""

import json
import math
import os
import re
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..common.layers import RMSNorm, rotate_half
from ..common.ort_ops import GroupQueryAttentionOp

# ---------------------------------------------------------------------------------------------
# Configuration


def _yaml_loader():
    """A YAML loader for hyperpyyaml files that keeps each tag's arguments (a mapping, sequence or
    scalar) and drops the tag: cosyvoice3.yaml is read for numbers only, nothing is constructed."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def any_tag(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    Loader.add_multi_constructor("!", any_tag)
    return Loader


def _resolve(value, top):
    """hyperpyyaml's `!ref <name>` and `<a> * <b>` arithmetic over top-level keys."""
    if isinstance(value, dict):
        return {k: _resolve(v, top) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, top) for v in value]
    if isinstance(value, str) and "<" in value:
        expr = re.sub(r"<([A-Za-z0-9_]+)>", lambda m: repr(_resolve(top[m.group(1)], top)), value)
        try:
            return eval(expr, {"__builtins__": {}}, {})  # numbers and + - * / only
        except Exception:
            return expr
    return value


@dataclass
class LMConfig:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    rms_eps: float
    rope_theta: float
    text_vocab: int
    speech_tokens: int          # speech_token_size: ids 0..n-1 are speech, n..n+199 are control
    sampling: dict = field(default_factory=dict)

    @property
    def sos(self):
        return self.speech_tokens + 0

    @property
    def task_id(self):
        return self.speech_tokens + 2


@dataclass
class FlowConfig:
    vocab: int
    mel: int
    spk_dim: int
    token_mel_ratio: int
    lookahead: int
    lookahead_channels: int
    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_mult: float
    cfg_rate: float
    schedule: str
    steps: int = 10
    chunk_frames: int = 50      # static_chunk_size: the streaming mask's chunk, in frames
    left_chunks: int = -1       # num_decoding_left_chunks: -1, every earlier chunk visible


@dataclass
class HiFTConfig:
    in_channels: int
    base_channels: int
    nb_harmonics: int
    sample_rate: int
    nsf_alpha: float
    nsf_sigma: float
    voiced_threshold: float
    upsample_rates: list
    upsample_kernels: list
    n_fft: int
    hop_len: int
    resblock_kernels: list
    resblock_dilations: list
    source_kernels: list
    source_dilations: list
    lrelu_slope: float
    audio_limit: float
    look_right: int
    f0_channels: int

    @property
    def hop(self):
        return math.prod(self.upsample_rates) * self.hop_len


@dataclass
class Config:
    sample_rate: int
    token_rate: int
    lm: LMConfig
    flow: FlowConfig
    hift: HiFTConfig


def load_config(model_dir):
    """Reads the published directory's cosyvoice3.yaml and CosyVoice-BlankEN/config.json."""
    with open(os.path.join(model_dir, "cosyvoice3.yaml")) as f:
        import yaml
        top = yaml.load(f, Loader=_yaml_loader())
    top = _resolve(top, top)
    with open(os.path.join(model_dir, "CosyVoice-BlankEN", "config.json")) as f:
        qwen = json.load(f)
    llm, flow, hift = top["llm"], top["flow"], top["hift"]
    dec, est = flow["decoder"], flow["decoder"]["estimator"]
    cfm = dec["cfm_params"]
    cfm = cfm.get("content", cfm)
    heads = qwen["num_attention_heads"]
    lm = LMConfig(
        hidden=qwen["hidden_size"], layers=qwen["num_hidden_layers"], heads=heads,
        kv_heads=qwen.get("num_key_value_heads", heads),
        head_dim=qwen.get("head_dim") or qwen["hidden_size"] // heads,
        mlp=qwen["intermediate_size"], rms_eps=float(qwen.get("rms_norm_eps", 1e-6)),
        rope_theta=float(qwen.get("rope_theta", 10000.0)), text_vocab=qwen["vocab_size"],
        speech_tokens=int(llm["speech_token_size"]),
        sampling={k: llm.get("sampling", {}).get(k) for k in ("top_p", "top_k", "win_size", "tau_r")})
    fl = FlowConfig(
        vocab=int(flow["vocab_size"]), mel=int(flow["output_size"]), spk_dim=int(flow["spk_embed_dim"]),
        token_mel_ratio=int(flow["token_mel_ratio"]), lookahead=int(flow["pre_lookahead_len"]),
        lookahead_channels=int(flow["pre_lookahead_layer"]["channels"]), dim=int(est["dim"]),
        depth=int(est["depth"]), heads=int(est["heads"]), dim_head=int(est["dim_head"]),
        ff_mult=float(est["ff_mult"]), cfg_rate=float(cfm["inference_cfg_rate"]),
        schedule=str(cfm.get("t_scheduler", "linear")),
        chunk_frames=int(est.get("static_chunk_size", 50)),
        left_chunks=int(est.get("num_decoding_left_chunks", -1)))
    istft = hift["istft_params"]
    hf = HiFTConfig(
        in_channels=int(hift["in_channels"]), base_channels=int(hift["base_channels"]),
        nb_harmonics=int(hift["nb_harmonics"]), sample_rate=int(hift["sampling_rate"]),
        nsf_alpha=float(hift["nsf_alpha"]), nsf_sigma=float(hift["nsf_sigma"]),
        voiced_threshold=float(hift["nsf_voiced_threshold"]),
        upsample_rates=list(hift["upsample_rates"]), upsample_kernels=list(hift["upsample_kernel_sizes"]),
        n_fft=int(istft["n_fft"]), hop_len=int(istft["hop_len"]),
        resblock_kernels=list(hift["resblock_kernel_sizes"]),
        resblock_dilations=[list(d) for d in hift["resblock_dilation_sizes"]],
        source_kernels=list(hift["source_resblock_kernel_sizes"]),
        source_dilations=[list(d) for d in hift["source_resblock_dilation_sizes"]],
        lrelu_slope=float(hift["lrelu_slope"]), audio_limit=float(hift["audio_limit"]),
        look_right=int(hift.get("conv_pre_look_right", 4)),
        f0_channels=int(hift["f0_predictor"].get("cond_channels", 512)))
    return Config(sample_rate=int(top["sample_rate"]), token_rate=int(top["token_frame_rate"]),
                  lm=lm, flow=fl, hift=hf)


# ---------------------------------------------------------------------------------------------
# Checkpoints


def fold_weight_norm(state):
    """Replaces weight-normed pairs with their product: `X.parametrizations.weight.original0/1`
    (torch.nn.utils.parametrizations) or `X.weight_g/weight_v` (the older hook), norm over every
    axis but 0, as PyTorch's weight_norm with dim=0."""
    out = {}
    for k, v in state.items():
        for g_suffix, v_suffix in ((".parametrizations.weight.original0", ".parametrizations.weight.original1"),
                                   (".weight_g", ".weight_v")):
            if k.endswith(g_suffix):
                base = k[: -len(g_suffix)]
                w = state[base + v_suffix]
                norm = w.norm(dim=tuple(range(1, w.dim())), keepdim=True)
                out[base + ".weight"] = v * w / norm
                break
            if k.endswith(v_suffix):
                break
        else:
            out[k] = v
    return out


def load_checkpoint(path):
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # torch < 1.13.1 has no weights_only
        state = torch.load(path, map_location="cpu")
    return {k[len("generator."):] if k.startswith("generator.") else k: v for k, v in state.items()}


def load_into(module, state, name, ignore=()):
    """Loads state into module; every parameter must be present and every key used (or ignored).
    Rotary frequency buffers may be absent: they are a function of the config."""
    own = module.state_dict()
    state = dict(state)
    for k, v in own.items():
        if k.endswith("inv_freq") and k not in state:
            state[k] = v
    missing = [k for k in own if k not in state]
    unused = [k for k in state if k not in own and not any(k.startswith(p) for p in ignore)]
    if missing or unused:
        raise SystemExit("%s: the checkpoint does not match CosyVoice3's %s network: missing %s, "
                         "unexpected %s" % (name, name, missing[:8], unused[:8]))
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise SystemExit("%s: %s has shape %s, the config gives %s" % (name, k, tuple(state[k].shape), tuple(v.shape)))
    module.load_state_dict({k: state[k] for k in own}, strict=True)


# ---------------------------------------------------------------------------------------------
# LM


class Qwen2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden, c.heads * c.head_dim, bias=True)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=True)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=True)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)

    def forward(self, h, cos, sin, bias, past_k, past_v):
        c = self.c
        B = h.shape[0]
        q = self.q_proj(h).reshape(B, -1, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(h).reshape(B, -1, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(h).reshape(B, -1, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_all = torch.cat([past_k, k], dim=2)
        v_all = torch.cat([past_v, v], dim=2)
        group = c.heads // c.kv_heads
        qg = q.reshape(B, c.kv_heads, -1, c.head_dim)                     # [B,kv,group*T,d]
        scores = torch.matmul(qg, k_all.transpose(2, 3)).to(torch.float32) / math.sqrt(c.head_dim)
        S = scores.shape[-1]
        scores = scores.reshape(B, c.kv_heads, group, -1, S) + bias       # bias [B,1,1,T,S]
        probs = torch.softmax(scores, dim=-1).to(qg.dtype).reshape(B, c.kv_heads, -1, S)
        ctx = torch.matmul(probs, v_all).reshape(B, c.heads, -1, c.head_dim).transpose(1, 2)
        return self.o_proj(ctx.reshape(B, -1, c.heads * c.head_dim)), k_all, v_all


class Qwen2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.mlp, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.mlp, bias=False)
        self.down_proj = nn.Linear(c.mlp, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Qwen2Attention(c)
        self.mlp = Qwen2MLP(c)
        self.input_layernorm = RMSNorm(c.hidden, c.rms_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.rms_eps)

    def forward(self, h, cos, sin, bias, past_k, past_v):
        a, k, v = self.self_attn(self.input_layernorm(h), cos, sin, bias, past_k, past_v)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class Qwen2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.text_vocab, c.hidden)
        self.layers = nn.ModuleList(Qwen2Layer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.rms_eps)


class _Qwen2ForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = Qwen2Model(c)


class _Qwen2Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = _Qwen2ForCausalLM(c)


MASKED = 1e9


class CosyVoice3LM(nn.Module):
    """llm.pt's network. forward(input_ids, position_ids, attention_mask, past_key.0, past_value.0,
    ...) -> (logits float32 [B,T,speech_tokens+1], present_key.0, present_value.0, ...).

    Input ids are one id space: a text id t (Qwen2's vocabulary) is t; speech-table id s (speech
    tokens, then sos, end of speech, task id, ...) is text_vocab + s. Logits are the speech tokens'
    and one end-of-speech entry, the log-sum-exp of the 200 ids after them, any of which stops the
    reference's generation."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.llm = _Qwen2Encoder(c)
        self.llm_decoder = nn.Linear(c.hidden, c.speech_tokens + 200, bias=False)
        self.speech_embedding = nn.Embedding(c.speech_tokens + 200, c.hidden)

    @property
    def qwen(self):
        return self.llm.model.model

    def embed(self, ids):
        V = self.c.text_vocab
        speech = ids >= V
        text = self.qwen.embed_tokens(torch.where(speech, torch.zeros_like(ids), ids))
        sp = self.speech_embedding(torch.where(speech, ids - V, torch.zeros_like(ids)))
        return torch.where(speech.unsqueeze(-1), sp, text)

    def forward(self, input_ids, position_ids, attention_mask, *past):
        c = self.c
        h = self.embed(input_ids)
        past_len, T = past[0].shape[2], input_ids.shape[1]
        total = attention_mask.shape[1]
        key = torch.arange(total, device=h.device)
        query = torch.arange(T, device=h.device) + past_len
        causal = key.unsqueeze(0) <= query.unsqueeze(1)
        real = attention_mask.unsqueeze(1).unsqueeze(1).unsqueeze(1) == 1
        bias = (torch.logical_and(real, causal).to(torch.float32) - 1.0) * MASKED
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=h.device) / c.head_dim))
        freqs = position_ids.to(torch.float32).unsqueeze(-1) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(h.dtype).unsqueeze(1), emb.sin().to(h.dtype).unsqueeze(1)
        presents = []
        for i, layer in enumerate(self.qwen.layers):
            h, k, v = layer(h, cos, sin, bias, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        return (self.logits(self.qwen.norm(h)), *presents)

    def logits(self, h):
        """The speech tokens' logits and end of speech in place of the first stop id; written
        without a Concat of unequal parts, which ONNX Runtime's CUDA graphs cannot replay."""
        n = self.c.speech_tokens
        logits = self.llm_decoder(h).to(torch.float32)
        end = torch.logsumexp(logits[..., n:], dim=-1, keepdim=True)
        last = torch.zeros(n + 1, dtype=torch.float32, device=h.device)
        last[n] = 1.0
        head = logits[..., :n + 1]
        return head + last * (end - logits[..., n:n + 1])


class SharedCacheLM(nn.Module):
    """CosyVoice3LM with the shared cache contract (docs/pipeline.md, lm.cache: shared):
    forward(input_ids, seqlens_k, total_sequence_length, past_key.0, past_value.0, ...)
    -> (logits, present_key.0, present_value.0, ...), presents the shape of the pasts."""

    def __init__(self, lm, max_positions):
        super().__init__()
        self.lm = lm
        c = lm.c
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        freqs = torch.arange(max_positions, dtype=torch.float32).unsqueeze(-1) * inv
        self.register_buffer("rope_cos", freqs.cos(), persistent=False)
        self.register_buffer("rope_sin", freqs.sin(), persistent=False)

    def forward(self, input_ids, seqlens_k, total_len, *past):
        lm, c = self.lm, self.lm.c
        h = lm.embed(input_ids)
        cos, sin = self.rope_cos.to(h.dtype), self.rope_sin.to(h.dtype)
        presents = []
        for i, layer in enumerate(lm.qwen.layers):
            at = layer.self_attn
            x = layer.input_layernorm(h)
            ctx, pk, pv = GroupQueryAttentionOp.apply(at.q_proj(x), at.k_proj(x), at.v_proj(x), past[2 * i],
                                                      past[2 * i + 1], seqlens_k, total_len, cos, sin,
                                                      c.heads, c.kv_heads)
            presents += [pk, pv]
            h = h + at.o_proj(ctx)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return (lm.logits(lm.qwen.norm(h)), *presents)


# ---------------------------------------------------------------------------------------------
# Flow


class PreLookaheadLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.lookahead = c.lookahead
        self.conv1 = nn.Conv1d(c.mel, c.lookahead_channels, kernel_size=c.lookahead + 1)
        self.conv2 = nn.Conv1d(c.lookahead_channels, c.mel, kernel_size=3)

    def forward(self, x):
        """x [B,N,C] -> [B,N,C]; token n reads tokens n..n+lookahead (zeros past the input)."""
        h = F.pad(x.transpose(1, 2), (0, self.lookahead))
        h = F.leaky_relu(self.conv1(h))
        h = self.conv2(F.pad(h, (2, 0)))
        return h.transpose(1, 2) + x


class FlowEncoder(nn.Module):
    """forward(tokens [B,N] int64, token_mask [B,1,N]) -> mu [B,mel,N*ratio], zero at padding."""

    def __init__(self, flow):
        super().__init__()
        self.flow = flow

    def forward(self, tokens, token_mask):
        f = self.flow
        mask = token_mask.transpose(1, 2).to(f.input_embedding.weight.dtype)
        emb = f.input_embedding(torch.clamp(tokens, min=0)) * mask
        h = f.pre_lookahead_layer(emb)
        r = f.c.token_mel_ratio
        h = (h * mask).unsqueeze(2).expand(-1, -1, r, -1).reshape(h.shape[0], -1, h.shape[-1])
        return h.transpose(1, 2).to(torch.float32)   # the contract's mu is float32


class TimestepEmbedding(nn.Module):
    def __init__(self, dim, freq_dim=256):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t):
        half = self.freq_dim // 2
        e = math.log(10000) / (half - 1)
        e = torch.exp(torch.arange(half, device=t.device).float() * -e)
        e = 1000 * t.unsqueeze(1) * e.unsqueeze(0)
        return self.time_mlp(torch.cat((e.sin(), e.cos()), dim=-1).to(t.dtype))


class CausalConvPositionEmbedding(nn.Module):
    def __init__(self, dim, kernel_size=31, groups=16):
        super().__init__()
        self.k = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x):
        x = F.pad(x.transpose(1, 2), (self.k - 1, 0))
        x = F.pad(self.conv1(x), (self.k - 1, 0))
        return self.conv2(x).transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.proj = nn.Linear(c.mel * 2 + c.mel + c.mel, c.dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(c.dim)

    def forward(self, x, cond, mu, spks):
        spks = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        x = self.proj(torch.cat([x, cond, mu, spks], dim=-1))
        return self.conv_pos_embed(x) + x


class RotaryEmbedding(nn.Module):
    """x-transformers' rotary embedding as the DiT uses it: inv_freq over dim_head channels,
    interleaved pairs, applied to the first dim_head channels of q and k before heads are split."""

    def __init__(self, dim):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)))


def rotate_interleaved(x):
    x2 = x.reshape(*x.shape[:-1], -1, 2)
    return torch.stack((-x2[..., 1], x2[..., 0]), dim=-1).reshape(x.shape)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        inner = c.heads * c.dim_head
        self.heads = c.heads
        self.to_q = nn.Linear(c.dim, inner)
        self.to_k = nn.Linear(c.dim, inner)
        self.to_v = nn.Linear(c.dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, c.dim), nn.Dropout(0.0)])

    def forward(self, x, bias, cos, sin, frame_mask):
        B = x.shape[0]
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        # cos and sin span all channels (1 and 0 past the rotary ones): the partial rotation without
        # a Concat of unequal parts, which ONNX Runtime's CUDA graphs cannot replay.
        q = q * cos + rotate_interleaved(q) * sin
        k = k * cos + rotate_interleaved(k) * sin
        qh, kh, vh = (t.reshape(B, -1, self.heads, t.shape[-1] // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(qh, kh.transpose(2, 3)) / math.sqrt(qh.shape[-1]) + bias
        out = torch.matmul(torch.softmax(scores, dim=-1), vh)
        out = out.transpose(1, 2).reshape(B, -1, q.shape[-1])
        return self.to_out[0](out) * frame_mask


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim, n):
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * n)


def layer_norm(x, dim):
    """LayerNorm without affine parameters (explicit ones and zeros: torch 1.13 exports an
    absent weight as an empty input, which ONNX's checker refuses)."""
    one = torch.ones(dim, dtype=x.dtype, device=x.device)
    return F.layer_norm(x, (dim,), one, torch.zeros_like(one), eps=1e-6)


class FeedForward(nn.Module):
    def __init__(self, dim, mult):
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
                                nn.Dropout(0.0), nn.Linear(inner, dim))

    def forward(self, x):
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dim = c.dim
        self.attn_norm = AdaLayerNormZero(c.dim, 6)
        self.attn = Attention(c)
        self.ff = FeedForward(c.dim, c.ff_mult)

    def forward(self, x, t, bias, cos, sin, frame_mask):
        e = self.attn_norm.linear(F.silu(t))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(e, 6, dim=1)
        norm = layer_norm(x, self.dim) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        x = x + gate_msa.unsqueeze(1) * self.attn(norm, bias, cos, sin, frame_mask)
        norm = layer_norm(x, self.dim) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * self.ff(norm)


class DiT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dim = c.dim
        self.inner = c.heads * c.dim_head
        self.time_embed = TimestepEmbedding(c.dim)
        self.input_embed = InputEmbedding(c)
        self.rotary_embed = RotaryEmbedding(c.dim_head)
        self.transformer_blocks = nn.ModuleList(DiTBlock(c) for _ in range(c.depth))
        self.norm_out = AdaLayerNormZero(c.dim, 2)
        self.proj_out = nn.Linear(c.dim, c.mel)

    def rope(self, pos, dtype):
        """cos and sin [..., inner] in dtype for absolute frame positions pos [...] (int64):
        interleaved pairs over the first dim_head channels, 1 and 0 past them."""
        freqs = pos.to(self.rotary_embed.inv_freq.dtype).unsqueeze(-1) * self.rotary_embed.inv_freq
        freqs = torch.stack((freqs, freqs), dim=-1).reshape(*pos.shape, -1).to(dtype)
        rest = self.inner - freqs.shape[-1]
        return F.pad(freqs.cos(), (0, rest), value=1.0), F.pad(freqs.sin(), (0, rest), value=0.0)

    def forward(self, x, mask, mu, t, spks, cond, chunk=0):
        """All [B,C,F] channel-major as the reference's estimator; mask [B,1,F]; t [B]; spks [B,C].
        chunk > 0 is CosyVoice's streaming mask: frame i sees frame j when j // chunk <= i // chunk."""
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        Fr = x.shape[1]
        t = self.time_embed(t)
        x = self.input_embed(x, cond, mu, spks)
        cos, sin = self.rope(torch.arange(Fr, device=x.device), x.dtype)
        # Additive key mask [B,1,1,F]; -30000 removes a key in float16, where -1e9 overflows.
        big = MASKED if x.dtype == torch.float32 else 30000.0
        keep = mask.to(torch.float32).unsqueeze(1)                                # [B,1,1,F]
        if chunk > 0:
            blk = torch.arange(Fr, device=x.device) // chunk
            keep = keep * (blk.unsqueeze(0) <= blk.unsqueeze(1)).to(torch.float32)  # [B,1,F,F]
        bias = ((keep - 1.0) * big).to(x.dtype)
        frame_mask = mask.transpose(1, 2).to(x.dtype)                             # [B,F,1]
        for block in self.transformer_blocks:
            x = block(x, t, bias, cos, sin, frame_mask)
        return self.out(x, t)

    def out(self, x, t):
        e = self.norm_out.linear(F.silu(t))
        scale, shift = torch.chunk(e, 2, dim=1)
        x = layer_norm(x, self.dim) * (1 + scale)[:, None, :] + shift[:, None, :]
        return self.proj_out(x).transpose(1, 2)


class _CFM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.estimator = DiT(c)


class CosyVoice3Flow(nn.Module):
    """flow.pt's network: the token embedding, speaker projection, look-ahead layer and DiT."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.input_embedding = nn.Embedding(c.vocab, c.mel)
        self.spk_embed_affine_layer = nn.Linear(c.spk_dim, c.mel)
        self.pre_lookahead_layer = PreLookaheadLayer(c)
        self.decoder = _CFM(c)

    def speaker(self, embedding):
        # Normalized in float32: float16 flushes normalize's epsilon to zero, and a voice without
        # an embedding (zeros) would give 0/0.
        e = F.normalize(embedding.to(torch.float32), dim=1)
        return self.spk_embed_affine_layer(e.to(self.spk_embed_affine_layer.weight.dtype))

    def time_span(self):
        t = torch.linspace(0, 1, self.c.steps + 1, dtype=torch.float32)
        if self.c.schedule == "cosine":
            t = 1 - torch.cos(t * 0.5 * math.pi)
        return t


class FlowStep(nn.Module):
    """One guided Euler step: forward(x, mask, mu, t, dt, cfg, cond, embedding) -> x_next.
    The unconditional pass zeroes mu, the speaker and cond, as the reference's solver does.
    chunk > 0 runs the DiT under CosyVoice's streaming mask (DiT.forward)."""

    def __init__(self, flow, chunk=0):
        super().__init__()
        self.flow = flow
        self.chunk = chunk

    def forward(self, x, mask, mu, t, dt, cfg, cond, embedding):
        dtype = self.flow.spk_embed_affine_layer.weight.dtype
        spks = self.flow.speaker(embedding)
        xd, maskd, mud, condd = x.to(dtype), mask.to(dtype), mu.to(dtype), cond.to(dtype)
        X = torch.cat([xd, xd], dim=0)
        M = torch.cat([maskd, maskd], dim=0)
        MU = torch.cat([mud, torch.zeros_like(mud)], dim=0)
        T = torch.cat([t, t], dim=0).to(dtype)
        S = torch.cat([spks, torch.zeros_like(spks)], dim=0)
        C = torch.cat([condd, torch.zeros_like(condd)], dim=0)
        v = self.flow.decoder.estimator(X, M, MU, T, S, C, chunk=self.chunk).to(torch.float32)
        B = x.shape[0]
        vc, vu = v[:B], v[B:]
        return (x + dt * ((1.0 + cfg) * vc - cfg * vu)) * mask


def conv_context(flow):
    """Frames before a frame that the DiT's causal position convolutions read (two of kernel k)."""
    return 2 * (flow.decoder.estimator.input_embed.conv_pos_embed.k - 1)


class ChunkFlowStep(nn.Module):
    """One guided Euler step over new frames under CosyVoice's streaming mask, given the keys and
    values of every earlier frame (docs/cosyvoice3.md, "Chunk-causal flow"):

    forward(x, mask, mu, cond, start, t, dt, cfg, embedding, past_kv) -> (x_next, present_kv)

    x, mu, cond [B,mel,C+N]: C = conv_context(flow) frames before the new ones (x as it entered
      this step), then N new frames; mask [B,1,C+N] is 1 for frames that exist (0 for context
      before frame 0 and for padding after a row's new frames);
    start [B] int64: the absolute frame (from the voice prompt's first) of the first new frame;
    past_kv [B,P,L,4,inner], P >= 1: frames 0..start-1 of each row at this step, per layer
      (keys of the conditional and unconditional passes, then their values, after the rotary
      embedding); frames from start on are ignored;
    x_next [B,mel,N]; present_kv [B,N,L,4,inner]: the new frames' keys and values, to append.

    A frame at absolute position i sees every past frame and the new frames j with
    j // chunk <= i // chunk: over frames that start on a chunk boundary this is the reference's
    streaming mask (num_decoding_left_chunks -1), so feeding back every complete chunk's
    present_kv computes what one run over the whole sequence computes."""

    def __init__(self, flow):
        super().__init__()
        if flow.c.left_chunks >= 0:
            raise ValueError("num_decoding_left_chunks %d: the cached flow needs every earlier chunk "
                             "visible (-1)" % flow.c.left_chunks)
        self.flow = flow
        self.chunk = flow.c.chunk_frames
        self.context = conv_context(flow)

    def forward(self, x, mask, mu, cond, start, t, dt, cfg, embedding, past_kv):
        flow, est = self.flow, self.flow.decoder.estimator
        dtype = flow.spk_embed_affine_layer.weight.dtype
        B, Cx = x.shape[0], self.context
        spks = flow.speaker(embedding)
        xd, maskd, mud, condd = x.to(dtype), mask.to(dtype), mu.to(dtype), cond.to(dtype)
        X = torch.cat([xd, xd], dim=0).transpose(1, 2)
        MU = torch.cat([mud, torch.zeros_like(mud)], dim=0).transpose(1, 2)
        COND = torch.cat([condd, torch.zeros_like(condd)], dim=0).transpose(1, 2)
        S = torch.cat([spks, torch.zeros_like(spks)], dim=0)
        M = torch.cat([maskd, maskd], dim=0).transpose(1, 2)                       # [2B,W,1]
        T = est.time_embed(torch.cat([t, t], dim=0).to(dtype))
        ie = est.input_embed
        S = S.unsqueeze(1).expand(-1, X.shape[1], -1)
        # Absent context frames are zeros before each convolution, as the convolutions' own
        # padding before frame 0; present ones make the window's first outputs wrong, but the new
        # frames read none of those.
        h = ie.proj(torch.cat([X, COND, MU, S], dim=-1)) * M
        pe = ie.conv_pos_embed
        g = pe.conv1(F.pad(h.transpose(1, 2), (pe.k - 1, 0))) * M.transpose(1, 2)
        g = pe.conv2(F.pad(g, (pe.k - 1, 0))).transpose(1, 2)
        h = (g + h)[:, Cx:]
        N = h.shape[1]

        pos = start.unsqueeze(1) + torch.arange(N, device=x.device).unsqueeze(0)   # [B,N]
        cos, sin = est.rope(torch.cat([pos, pos], dim=0), dtype)
        big = MASKED if dtype == torch.float32 else 30000.0
        P = past_kv.shape[1]
        past_keep = (torch.arange(P, device=x.device).unsqueeze(0) < start.unsqueeze(1)).to(torch.float32)
        blk = torch.div(pos, self.chunk, rounding_mode="floor")
        new = mask[:, 0, Cx:].to(torch.float32)                                   # [B,N]
        new_keep = new.unsqueeze(1) * (blk.unsqueeze(1) <= blk.unsqueeze(2)).to(torch.float32)
        bias_past = ((torch.cat([past_keep, past_keep], 0) - 1.0) * big).reshape(2 * B, 1, 1, P).to(dtype)
        bias_new = ((torch.cat([new_keep, new_keep], 0) - 1.0) * big).unsqueeze(1).to(dtype)
        frame_mask = M[:, Cx:]
        inner = est.inner
        presents = []
        for i, block in enumerate(est.transformer_blocks):
            layer = past_kv[:, :, i].to(dtype)                                     # [B,P,4,inner]
            pk = layer[:, :, 0:2].permute(2, 0, 1, 3).reshape(2 * B, P, inner)
            pv = layer[:, :, 2:4].permute(2, 0, 1, 3).reshape(2 * B, P, inner)
            h, k, v = cached_block(block, h, T, cos, sin, frame_mask, pk, pv, bias_past, bias_new)
            kv = torch.cat([k.reshape(2, B, N, inner), v.reshape(2, B, N, inner)], dim=0)
            presents.append(kv.permute(1, 2, 0, 3))                                # [B,N,4,inner]
        vel = est.out(h, T).to(torch.float32)
        vc, vu = vel[:B], vel[B:]
        xn, mn = x[:, :, Cx:], mask[:, :, Cx:]
        return (xn + dt * ((1.0 + cfg) * vc - cfg * vu)) * mn, torch.stack(presents, dim=2)


def cached_block(block, x, t, cos, sin, frame_mask, pk, pv, bias_past, bias_new):
    """DiTBlock.forward for new frames x over past keys pk and values pv [2B,P,inner]; returns the
    block's output and the new frames' keys and values [2B,N,inner]."""
    e = block.attn_norm.linear(F.silu(t))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(e, 6, dim=1)
    norm = layer_norm(x, block.dim) * (1 + scale_msa[:, None]) + shift_msa[:, None]
    at = block.attn
    q, k, v = at.to_q(norm), at.to_k(norm), at.to_v(norm)
    q = q * cos + rotate_interleaved(q) * sin
    k = k * cos + rotate_interleaved(k) * sin
    B, H = x.shape[0], at.heads

    def heads(a):
        return a.reshape(B, a.shape[1], H, a.shape[-1] // H).transpose(1, 2)
    qh = heads(q)
    scale = 1.0 / math.sqrt(qh.shape[-1])
    # One softmax over past and new keys, written as two parts so the graph has no Concat of
    # unequal parts (ONNX Runtime's CUDA graphs cannot replay one).
    sp = torch.matmul(qh, heads(pk).transpose(2, 3)) * scale + bias_past
    sn = torch.matmul(qh, heads(k).transpose(2, 3)) * scale + bias_new
    m = torch.maximum(sp.amax(dim=-1, keepdim=True), sn.amax(dim=-1, keepdim=True))
    ep, en = torch.exp(sp - m), torch.exp(sn - m)
    den = ep.sum(dim=-1, keepdim=True) + en.sum(dim=-1, keepdim=True)
    out = (torch.matmul(ep, heads(pv)) + torch.matmul(en, heads(v))) / den
    out = out.transpose(1, 2).reshape(B, -1, q.shape[-1])
    x = x + gate_msa.unsqueeze(1) * (at.to_out[0](out) * frame_mask)
    norm = layer_norm(x, block.dim) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return x + gate_mlp.unsqueeze(1) * block.ff(norm), k, v


# ---------------------------------------------------------------------------------------------
# HiFT vocoder


def causal_conv(conv, x, left=None, right=0):
    """A Conv1d with zero padding: left defaults to (kernel-1)*dilation."""
    if left is None:
        left = (conv.kernel_size[0] - 1) * conv.dilation[0]
    return conv(F.pad(x, (left, right)))


class Snake(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x):
        a = self.alpha.unsqueeze(0).unsqueeze(-1)
        return x + (1.0 / (a + 1e-9)) * torch.pow(torch.sin(x * a), 2)


class ResBlock(nn.Module):
    def __init__(self, ch, k, dilations):
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(ch, ch, k, dilation=d) for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(ch, ch, k) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(ch) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(ch) for _ in dilations)

    def forward(self, x):
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = causal_conv(c2, a2(causal_conv(c1, a1(x)))) + x
        return x


class _Upsample(nn.Conv1d):
    """Nearest upsampling, then a causal convolution."""

    def __init__(self, cin, cout, k, u):
        super().__init__(cin, cout, k)
        self.u = u

    def forward(self, x):
        x = x.unsqueeze(-1).expand(-1, -1, -1, self.u).reshape(x.shape[0], x.shape[1], -1)
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class _Downsample(nn.Conv1d):
    def __init__(self, cin, cout, k, u):
        super().__init__(cin, cout, k, stride=u)
        self.u = u

    def forward(self, x):
        return super().forward(F.pad(x, (self.u - 1, 0)))


class _F0Predictor(nn.Module):
    def __init__(self, c):
        super().__init__()
        ch = c.f0_channels
        self.condnet = nn.Sequential(
            nn.Conv1d(c.in_channels, ch, 4), nn.ELU(), nn.Conv1d(ch, ch, 3), nn.ELU(),
            nn.Conv1d(ch, ch, 3), nn.ELU(), nn.Conv1d(ch, ch, 3), nn.ELU(), nn.Conv1d(ch, ch, 3), nn.ELU())
        self.classifier = nn.Linear(ch, 1)

    def features(self, mel):
        """The classifier's input [B,F,ch], in float64."""
        x = elu64(conv64(self.condnet[0], mel.to(torch.float64), 0, 3))
        for i in range(2, len(self.condnet), 2):
            x = elu64(conv64(self.condnet[i], x, self.condnet[i].kernel_size[0] - 1, 0))
        return x.transpose(1, 2)

    def forward(self, mel):
        """F0 [B,F] in Hz: computed in float64, as CosyVoice's inference runs the predictor, and
        given in mel's dtype. In float32 a frame's F0 would round differently in runs of
        different lengths, and its phase (hop·F0/sample_rate turns a frame, summed) with it."""
        w, b = self.classifier.weight.to(torch.float64), self.classifier.bias.to(torch.float64)
        return torch.abs(torch.matmul(self.features(mel), w.t()) + b).squeeze(-1).to(mel.dtype)


def conv64(conv, x, left, right):
    """conv (a Conv1d of stride 1 and dilation 1) over x [B,C,F] in float64, padded with zeros, as
    a matrix product of the k shifted copies of x: ONNX Runtime's CPU provider has no float64 Conv."""
    k = conv.kernel_size[0]
    x = F.pad(x, (left, right))
    n = x.shape[-1] - (k - 1)
    cols = torch.cat([x[:, :, j:j + n] for j in range(k)], dim=1)               # [B, k*C, n]
    w = conv.weight.to(torch.float64).permute(0, 2, 1).reshape(conv.weight.shape[0], -1)   # [out, k*C]
    return torch.matmul(w, cols) + conv.bias.to(torch.float64).unsqueeze(-1)


def elu64(x):
    """ELU (alpha 1), written out: ONNX Runtime's CPU provider has Elu in float32 only."""
    return torch.where(x > 0, x, torch.exp(torch.clamp(x, max=0.0)) - 1.0)


class _Source(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.l_linear = nn.Linear(c.nb_harmonics + 1, 1)


class CosyVoice3HiFT(nn.Module):
    """hift.pt's network with a window's source phase passed in and out (docs/cosyvoice3.md).

    forward(mel [B,C,F], phase [B,H], phase_at [B] int64, sample_offset [B] int64)
    -> (audio [B, F*hop], phase_out [B,F,H]).

    The reference's sine source has a phase that runs over the whole utterance (a cumulative sum
    of each frame's F0, held for the frame) and noise from a table drawn once; here the phase, in
    turns, through frame phase_at-1 comes in (0 for a stream's first window), phase_out is each
    frame's phase in turns reduced to [0, 1), and the noise is table[(sample_offset + n) mod
    len(table)].

    The phase is summed in float64: a frame advances it by hop·F0/sample_rate turns (180 for the
    9th harmonic of 1 kHz), so a float32 sum drifts by thousandths of a turn within a window, and
    a window's audio would depend on where the window starts."""

    def __init__(self, c, noise_samples=240000):
        super().__init__()
        self.c = c
        H = c.nb_harmonics + 1
        ch = c.base_channels
        self.f0_predictor = _F0Predictor(c)
        self.m_source = _Source(c)
        self.conv_pre = nn.Conv1d(c.in_channels, ch, c.look_right + 1)
        self.ups = nn.ModuleList(_Upsample(ch // 2 ** i, ch // 2 ** (i + 1), k, u)
                                 for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernels)))
        rates = [1] + c.upsample_rates[::-1][:-1]
        cum = [math.prod(rates[:i + 1]) for i in range(len(rates))][::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (u, k, d) in enumerate(zip(cum, c.source_kernels, c.source_dilations)):
            cout = ch // 2 ** (i + 1)
            self.source_downs.append(nn.Conv1d(c.n_fft + 2, cout, 1) if u == 1 else _Downsample(c.n_fft + 2, cout, u * 2, u))
            self.source_resblocks.append(ResBlock(cout, k, d))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            for k, d in zip(c.resblock_kernels, c.resblock_dilations):
                self.resblocks.append(ResBlock(ch // 2 ** (i + 1), k, d))
        self.conv_post = nn.Conv1d(ch // 2 ** len(self.ups), c.n_fft + 2, 7)
        n = torch.arange(c.n_fft, dtype=torch.float64)
        window = 0.5 - 0.5 * torch.cos(2 * math.pi * n / c.n_fft)   # scipy's periodic hann
        self.register_buffer("window", window.float(), persistent=False)
        bins = c.n_fft // 2 + 1
        k = torch.arange(bins, dtype=torch.float64).unsqueeze(1)
        ang = 2 * math.pi * k * n.unsqueeze(0) / c.n_fft                                  # [bins, n_fft]
        # STFT as a strided convolution: real parts, then imaginary (-sin).
        stft = torch.cat([torch.cos(ang), -torch.sin(ang)], dim=0) * window
        self.register_buffer("stft_kernel", stft.float().unsqueeze(1), persistent=False)  # [2*bins,1,n_fft]
        # Inverse real FFT of one frame times the window, as a transposed convolution.
        coef = torch.full((bins, 1), 2.0, dtype=torch.float64)
        coef[0] = coef[-1] = 1.0
        inv = torch.cat([coef * torch.cos(ang), -coef * torch.sin(ang)], dim=0) / c.n_fft * window
        self.register_buffer("istft_kernel", inv.float().unsqueeze(1), persistent=False)  # [2*bins,1,n_fft]
        self.register_buffer("window_sq", (window ** 2).float().reshape(1, 1, -1), persistent=False)
        self.register_buffer("harmonics", torch.arange(1, H + 1, dtype=torch.float32), persistent=False)
        self.register_buffer("noise", torch.zeros(noise_samples, H), persistent=False)

    def set_noise(self, table):
        self.noise = table.reshape(-1, self.c.nb_harmonics + 1).to(torch.float32).contiguous()

    def phase(self, f0, phase, phase_at):
        """Each frame's phase in turns, in [0, 1), [B,F,H], continuing `phase` [B,H] given before
        frame phase_at."""
        B = f0.shape[0]
        f64 = torch.float64
        fn = f0.unsqueeze(-1).to(f64) * self.harmonics.to(f64)                   # [B,F,H]
        # Turns a frame; whole turns dropped (the reference drops whole cycles a sample, which a
        # whole number of samples a frame makes whole turns).
        step = fn * self.c.hop / self.c.sample_rate
        step = step - torch.floor(step)
        cs = torch.cumsum(step, dim=1)
        idx = phase_at.reshape(B, 1, 1).expand(B, 1, step.shape[-1])
        before = (torch.gather(cs, 1, idx) - torch.gather(step, 1, idx)).reshape(B, 1, -1)
        turns = phase.to(f64).unsqueeze(1) + (cs - before)
        return (turns - torch.floor(turns)).to(f0.dtype)

    def source(self, f0, phase, phase_at, sample_offset):
        """The harmonic source [B,1,F*hop] and each frame's phase in turns (self.phase)."""
        c = self.c
        hop = c.hop
        B, Fr = f0.shape
        turns = self.phase(f0, phase, phase_at)
        ang = turns * (2 * math.pi)
        sines = torch.sin(ang).unsqueeze(2).expand(B, Fr, hop, -1).reshape(B, Fr * hop, -1) * c.nsf_alpha
        uv = (f0 > c.voiced_threshold).to(torch.float32)
        uv = uv.unsqueeze(2).expand(B, Fr, hop).reshape(B, Fr * hop, 1)
        n = torch.arange(Fr * hop, device=f0.device).unsqueeze(0) + sample_offset.unsqueeze(1)
        table = self.noise[torch.remainder(n, self.noise.shape[0])]               # [B,L,H]
        amp = uv * c.nsf_sigma + (1 - uv) * c.nsf_alpha / 3
        sw = sines * uv + amp * table
        s = torch.tanh(self.m_source.l_linear(sw))                                # [B,L,1]
        return s.transpose(1, 2), turns

    def stft(self, s):
        pad = self.c.n_fft // 2
        x = F.pad(s, (pad, pad), mode="reflect")
        return F.conv1d(x, self.stft_kernel, stride=self.c.hop_len)

    def istft(self, spec_real, spec_imag):
        c = self.c
        frames = torch.cat([spec_real, spec_imag], dim=1)
        y = F.conv_transpose1d(frames, self.istft_kernel, stride=c.hop_len)
        ones = torch.ones_like(spec_real[:, :1, :])
        env = F.conv_transpose1d(ones, self.window_sq, stride=c.hop_len)
        pad = c.n_fft // 2
        L = y.shape[-1]
        return (y[:, :, pad:L - pad] / env[:, :, pad:L - pad]).squeeze(1)

    def decode(self, mel, s):
        c = self.c
        s_stft = self.stft(s)
        x = causal_conv(self.conv_pre, mel, left=0, right=c.look_right)
        n = len(c.resblock_kernels)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, c.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            si = self.source_resblocks[i](self.source_downs[i](s_stft))
            x = x + si
            xs = None
            for j in range(n):
                r = self.resblocks[i * n + j](x)
                xs = r if xs is None else xs + r
            x = xs / n
        x = self.conv_post(F.pad(F.leaky_relu(x), (6, 0)))
        bins = c.n_fft // 2 + 1
        mag = torch.clamp(torch.exp(x[:, :bins, :]), max=1e2)
        ph = torch.sin(x[:, bins:, :])
        audio = self.istft(mag * torch.cos(ph), mag * torch.sin(ph))
        return torch.clamp(audio, -c.audio_limit, c.audio_limit)

    def forward(self, mel, phase, phase_at, sample_offset):
        f0 = self.f0_predictor(mel)
        s, phase_out = self.source(f0, phase, phase_at, sample_offset)
        return self.decode(mel, s), phase_out


# F0 of a frame depends on this many frames before it (four left-causal convolutions of kernel 3).
F0_LEFT_FRAMES = 8
