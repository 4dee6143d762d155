"""VoxCPM 1.5's networks as voxmux exports them (docs/voxcpm.md), written against the published
checkpoint's parameter names: model.safetensors and audiovae.pth of openbmb/VoxCPM1.5 load into
them with every key used, and config.json gives every size.

Behaviour follows OpenBMB/VoxCPM's v1 inference code (src/voxcpm/model/voxcpm.py VoxCPMModel,
modules/minicpm4, locenc, locdit, layers/scalar_quantization_layer.py, audiovae/audio_vae.py).
The export wrappers at the end (PrefillGraph, StepGraph, VAEDecoderStream, VAEEncoder) are the
graphs of the contract; the reference-style functions (plain_prefill, plain_step, cfm_solve) are
the same computation written the reference's way, which the exporter checks the graphs against.

Kept in float32 whatever the export dtype: RMSNorm's variance, rotary, softmax, the FSQ's tanh
and rounding, the flow solve's state and guidance, and the whole AudioVAE.

Works with torch 1.13 (Debian's python3-torch) and 2.x; needs nothing else but numpy.
"""

import copy
import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..common.layers import RMSNorm
from ..common.ort_ops import GroupQueryAttentionNoRopeOp, GroupQueryAttentionOp

# ---------------------------------------------------------------------------------------------
# Configuration (the reference's pydantic schema: VoxCPMConfig, MiniCPM4Config, CfmConfig,
# AudioVAEConfig; a key the schema defaults may be absent, a required one may not)


@dataclass
class TransformerConfig:
    """One MiniCPM-4 stack: the base LM, or the residual LM, LocEnc or DiT made from its copy."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_short: list
    rope_long: list
    rope_original: int
    use_mup: bool
    scale_emb: float
    scale_depth: float
    no_rope: bool

    @property
    def residual_scale(self):
        return self.scale_depth / math.sqrt(self.layers) if self.use_mup else 1.0


@dataclass
class VAEConfig:
    encoder_dim: int
    encoder_rates: list
    latent_dim: int
    decoder_dim: int
    decoder_rates: list
    depthwise: bool
    sample_rate: int
    use_noise_block: bool

    @property
    def chunk_size(self):
        return int(np.prod(self.encoder_rates))


@dataclass
class Config:
    lm: TransformerConfig
    residual: TransformerConfig
    encoder: TransformerConfig
    dit: TransformerConfig
    patch_size: int
    feat_dim: int
    fsq_latent: int
    fsq_scale: float
    max_length: int
    dtype: str
    cfg_rate: float
    mean_mode: bool
    vae: VAEConfig


class ConfigError(Exception):
    pass


def _req(d, key, where):
    if key not in d:
        raise ConfigError("config.json: %s.%s is required" % (where, key))
    return d[key]


def _lm_config(d):
    w = "lm_config"
    rs = _req(d, "rope_scaling", w)
    if not isinstance(rs, dict):
        raise ConfigError("config.json: lm_config.rope_scaling must be an object")
    heads = int(_req(d, "num_attention_heads", w))
    hidden = int(_req(d, "hidden_size", w))
    for k in ("bos_token_id", "eos_token_id", "scale_emb", "dim_model_base", "scale_depth", "rope_theta"):
        _req(d, k, w)
    kv_channels = d.get("kv_channels")
    return TransformerConfig(
        hidden=hidden, intermediate=int(_req(d, "intermediate_size", w)),
        layers=int(_req(d, "num_hidden_layers", w)), heads=heads,
        kv_heads=int(_req(d, "num_key_value_heads", w)),
        head_dim=int(kv_channels) if kv_channels else hidden // heads,
        vocab=int(_req(d, "vocab_size", w)), eps=float(_req(d, "rms_norm_eps", w)),
        rope_theta=float(d["rope_theta"]), max_position_embeddings=int(_req(d, "max_position_embeddings", w)),
        rope_short=[float(x) for x in _req(rs, "short_factor", w + ".rope_scaling")],
        rope_long=[float(x) for x in _req(rs, "long_factor", w + ".rope_scaling")],
        rope_original=int(_req(rs, "original_max_position_embeddings", w + ".rope_scaling")),
        use_mup=bool(d.get("use_mup", True)), scale_emb=float(d["scale_emb"]),
        scale_depth=float(d["scale_depth"]), no_rope=bool(d.get("no_rope", False)))


def _derived(lm, sub, default_layers):
    """The reference's copy of lm_config with hidden, ffn, heads, layers and kv_channels replaced
    (VoxCPMEncoderConfig / VoxCPMDitConfig defaults) and no vocabulary."""
    c = copy.deepcopy(lm)
    c.hidden = int(sub.get("hidden_dim", 1024))
    c.intermediate = int(sub.get("ffn_dim", 4096))
    c.heads = int(sub.get("num_heads", 16))
    c.layers = int(sub.get("num_layers", default_layers))
    kv = sub.get("kv_channels")
    c.head_dim = int(kv) if kv else c.hidden // c.heads
    c.vocab = 0
    return c


def parse_config(raw):
    arch = str(raw.get("architecture", "voxcpm")).lower()
    if arch != "voxcpm":
        raise ConfigError("config.json: architecture %r is not VoxCPM 1/1.5 (voxcpm)" % arch)
    lm = _lm_config(_req(raw, "lm_config", "config"))
    res = copy.deepcopy(lm)
    res.layers = int(raw.get("residual_lm_num_layers", 6))
    res.vocab = 0
    enc = _derived(lm, _req(raw, "encoder_config", "config"), 4)
    dit_raw = _req(raw, "dit_config", "config")
    dit = _derived(lm, dit_raw, 4)
    cfm = _req(dit_raw, "cfm_config", "dit_config")
    if cfm.get("solver", "euler") != "euler":
        raise ConfigError("config.json: dit_config.cfm_config.solver %r: only euler is implemented" % cfm["solver"])
    v = raw.get("audio_vae_config") or {}
    vae = VAEConfig(encoder_dim=int(v.get("encoder_dim", 128)),
                    encoder_rates=[int(x) for x in v.get("encoder_rates", [2, 5, 8, 8])],
                    latent_dim=int(v.get("latent_dim", 64)), decoder_dim=int(v.get("decoder_dim", 1536)),
                    decoder_rates=[int(x) for x in v.get("decoder_rates", [8, 8, 5, 2])],
                    depthwise=bool(v.get("depthwise", True)), sample_rate=int(v.get("sample_rate", 16000)),
                    use_noise_block=bool(v.get("use_noise_block", False)))
    if vae.use_noise_block:
        raise ConfigError("config.json: audio_vae_config.use_noise_block: the decoder's noise blocks draw "
                          "random noise per call; not supported")
    for c, name in ((lm, "lm_config"), (enc, "encoder_config"), (dit, "dit_config")):
        if c.heads % c.kv_heads:
            raise ConfigError("config.json: %s: %d heads are not a multiple of %d key/value heads"
                              % (name, c.heads, c.kv_heads))
        if not c.no_rope and len(c.rope_short) not in (1, c.head_dim // 2):
            raise ConfigError("config.json: %s: rope_scaling factors have %d entries, head_dim/2 is %d"
                              % (name, len(c.rope_short), c.head_dim // 2))
    return Config(lm=lm, residual=res, encoder=enc, dit=dit, patch_size=int(raw.get("patch_size", 2)),
                  feat_dim=int(raw.get("feat_dim", 64)), fsq_latent=int(raw.get("scalar_quantization_latent_dim", 256)),
                  fsq_scale=float(raw.get("scalar_quantization_scale", 9)), max_length=int(raw.get("max_length", 4096)),
                  dtype=str(raw.get("dtype", "bfloat16")), cfg_rate=float(cfm.get("inference_cfg_rate", 1.0)),
                  mean_mode=bool(raw.get("dit_mean_mode", False)), vae=vae)


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return parse_config(json.load(f))


# ---------------------------------------------------------------------------------------------
# Checkpoint files: safetensors read and written here (no safetensors package), weight norm folded


_ST_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "F64": (np.float64, 8), "BF16": (None, 2),
              "I64": (np.int64, 8), "I32": (np.int32, 4)}


def read_safetensors(path):
    """{name: float32 (or integer) tensor}; bfloat16 is widened exactly (its bits are float32's top
    16)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()   # offsets count from the end of the header
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dt = spec["dtype"]
        if dt not in _ST_DTYPES:
            raise SystemExit("%s: %s has dtype %s, which this reader does not know" % (path, name, dt))
        a, b = spec["data_offsets"]
        raw = data[a:b]
        if dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[dt][0]).newbyteorder("<"))
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32)
        out[name] = torch.from_numpy(arr.reshape(spec["shape"]).copy())
    return out


def write_safetensors(path, tensors, dtype="BF16"):
    """Writes float tensors as dtype (BF16: rounded to nearest, as torch's conversion does)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if dtype == "BF16":
            raw = t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
        elif dtype == "F32":
            raw = t.to(torch.float32).numpy().astype("<f4").tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)   # the format pads the header so the data is 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def torch_load(path):
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # torch < 1.13.1 has no weights_only
        state = torch.load(path, map_location="cpu")
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def fold_weight_norm(state, where):
    """X.weight_g and X.weight_v (torch.nn.utils.weight_norm, dim 0) become X.weight = g * v / |v|,
    the norm over every axis but the first, as the hook computes it."""
    out = {}
    for k, v in state.items():
        if k.endswith(".weight_g"):
            base = k[: -len(".weight_g")]
            if base + ".weight_v" not in state:
                raise SystemExit("%s: %s has no %s.weight_v" % (where, k, base))
            w = state[base + ".weight_v"].float()
            norm = w.norm(dim=tuple(range(1, w.dim())), keepdim=True)
            out[base + ".weight"] = v.float() * w / norm
        elif k.endswith(".weight_v"):
            if k[: -len(".weight_v")] + ".weight_g" not in state:
                raise SystemExit("%s: %s has no matching weight_g" % (where, k))
        else:
            out[k] = v
    return out


def load_strict(module, state, where):
    """Loads state into module: every parameter present, every key used, every shape equal; an
    error names the keys."""
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise SystemExit("%s does not match the network config.json describes: %d missing %s, %d unexpected %s"
                         % (where, len(missing), missing[:10], len(unexpected), unexpected[:10]))
    bad = ["%s %s (config: %s)" % (k, tuple(state[k].shape), tuple(v.shape))
           for k, v in own.items() if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise SystemExit("%s: shapes differ from config.json's: %s" % (where, "; ".join(bad[:10])))
    module.load_state_dict({k: state[k].to(own[k].dtype) for k in own}, strict=True)


def load_model(model_dir, cfg=None, log=None):
    """(VoxCPM, AudioVAE, cfg) from a published directory, float32 and in eval mode."""
    log = log or (lambda *a: print(*a, file=sys.stderr, flush=True))
    cfg = cfg or load_config(model_dir)
    model = VoxCPM(cfg)
    path = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(path):
        state = read_safetensors(path)
    elif os.path.isfile(os.path.join(model_dir, "pytorch_model.bin")):
        path = os.path.join(model_dir, "pytorch_model.bin")
        state = torch_load(path)
    else:
        raise SystemExit("%s: no model.safetensors (or pytorch_model.bin)" % model_dir)
    vae_in_model = {k[len("audio_vae."):]: v for k, v in state.items() if k.startswith("audio_vae.")}
    state = {k: v for k, v in state.items() if not k.startswith("audio_vae.")}
    load_strict(model, state, os.path.basename(path))
    vae = AudioVAE(cfg.vae)
    vpath = None
    for name in ("audiovae.safetensors", "audiovae.pth"):   # the reference's order
        if os.path.isfile(os.path.join(model_dir, name)):
            vpath = os.path.join(model_dir, name)
            break
    if vpath:
        vstate = read_safetensors(vpath) if vpath.endswith(".safetensors") else torch_load(vpath)
        if vae_in_model:
            log("  %s's audio_vae.* keys are not used: %s is the AudioVAE" % (os.path.basename(path), os.path.basename(vpath)))
    elif vae_in_model:
        vpath, vstate = path + " (audio_vae.*)", vae_in_model
    else:
        raise SystemExit("%s: no audiovae.pth (or audiovae.safetensors)" % model_dir)
    load_strict(vae, fold_weight_norm(vstate, vpath), os.path.basename(vpath))
    return model.eval(), vae.eval(), cfg


# ---------------------------------------------------------------------------------------------
# MiniCPM-4


def longrope_half(c, positions):
    """MiniCPM's LongRoPE at positions 0..positions-1 as (cos, sin) [positions, head_dim/2],
    float32, scaled: the reference builds its table for max_position_embeddings, so the long
    factors apply when that exceeds the original length, at every position."""
    d = c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2).float() / d))
    scale = c.max_position_embeddings / c.rope_original
    scaling = math.sqrt(1 + math.log(scale) / math.log(c.rope_original))
    ext = torch.tensor(c.rope_long if c.max_position_embeddings > c.rope_original else c.rope_short,
                       dtype=torch.float32)
    freqs = torch.outer(torch.arange(positions).float(), 1.0 / ext) * inv
    return freqs.cos() * scaling, freqs.sin() * scaling


def rotate(x, cos, sin, h):
    """Rotate-half RoPE with half-width tables (GroupQueryAttention's layout) of width h, in
    float32. (h is given, not read from x: a traced shape would put shape arithmetic in the graph.)"""
    dt = x.dtype
    x = x.float()
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(dt)


def attend(q, k, v, c, S, rope, causal):
    """Attention of S tokens among themselves. q [N,S,heads*d], k/v [N,S,kv*d] -> [N,S,heads*d].
    Query head h reads key head h // (heads/kv) (SDPA's enable_gqa). A key head's G query heads
    are stacked as G*S rows of one matrix, so both matmuls have the same batch dimensions [N,KV]
    on each side: ONNX Runtime's CUDA MatMul runs that as one strided batched GEMM, where a
    batch that broadcasts (the query's G against the key's 1) goes through cuBLAS's pointer-array
    GEMM, whose pointers it stages in host memory per run, which a CUDA graph's replay reads
    stale (NaN)."""
    H, KV, d = c.heads, c.kv_heads, c.head_dim
    G = H // KV
    q = q.reshape(-1, S, KV, G, d).permute(0, 2, 3, 1, 4)          # [N,KV,G,S,d]
    k = k.reshape(-1, S, KV, d).permute(0, 2, 1, 3)                 # [N,KV,S,d]
    v = v.reshape(-1, S, KV, d).permute(0, 2, 1, 3)
    if rope is not None:
        cos, sin = rope[0].to(q.device), rope[1].to(q.device)
        q, k = rotate(q, cos, sin, d // 2), rotate(k, cos, sin, d // 2)
    q = q.reshape(-1, KV, G * S, d)                                 # row g*S+i: head g, token i
    scores = torch.matmul(q * (1.0 / math.sqrt(d)), k.transpose(-1, -2)).float()
    if causal:
        mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril().repeat(G, 1)
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(p, v).reshape(-1, KV, G, S, d)              # [N,KV,G,S,d]
    return out.permute(0, 3, 1, 2, 4).reshape(-1, S, H * d)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.q_proj = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden, c.eps)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.eps)


def _scaled(x, s):
    return x if s == 1.0 else x * s


class MiniCPM(nn.Module):
    """MiniCPMModel: embed_tokens (with a vocabulary), layers, norm. forward runs S tokens among
    themselves (LocEnc, DiT, and the plain form of the LMs the exporter checks against);
    the LMs' graphs run through shared_cache_forward."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        if c.vocab > 0:
            self.embed_tokens = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.eps)

    def forward(self, h, S, rope, causal):
        c = self.c
        s = c.residual_scale
        for layer in self.layers:
            a = layer.self_attn
            x = layer.input_layernorm(h)
            h = h + _scaled(a.o_proj(attend(a.q_proj(x), a.k_proj(x), a.v_proj(x), c, S, rope, causal)), s)
            h = h + _scaled(layer.mlp(layer.post_attention_layernorm(h)), s)
        return self.norm(h)


# ---------------------------------------------------------------------------------------------
# VoxCPM's parts


class LocEnc(nn.Module):
    """VoxCPMLocEnc: a special token then in_proj of each latent frame of a patch, through a
    bidirectional MiniCPM; the special token's output. The sequence is laid out by padding and
    adding, not a Concat of unequal parts (which ONNX Runtime's CUDA graphs replayed as NaN)."""

    def __init__(self, c, feat_dim, patch_size):
        super().__init__()
        self.P = patch_size
        self.special_token = nn.Parameter(torch.randn(1, 1, 1, c.hidden))
        self.in_proj = nn.Linear(feat_dim, c.hidden, bias=True)
        self.encoder = MiniCPM(c)
        self.rope = None if c.no_rope else longrope_half(c, patch_size + 1)

    def special_row(self):
        """The special token at position 0 of P+1 zero rows: [1,P+1,hidden]. The graphs take it
        as a constant made at export, so no Pad of a constant is left for ONNX Runtime to fold."""
        return F.pad(self.special_token.reshape(1, 1, -1), (0, 0, 0, self.P))

    def encode(self, x, special=None):
        """x [N,P,D] -> [N,hidden]."""
        P = self.P
        h = F.pad(self.in_proj(x), (0, 0, 1, 0)) + (self.special_row() if special is None else special)
        return self.encoder(h, P + 1, self.rope, causal=False)[:, 0]

    def forward(self, x, special=None):
        """x [B,T,P,D] -> [B,T,hidden]."""
        out = self.encode(x.reshape(-1, self.P, x.shape[-1]), special)
        return out.reshape(x.shape[0], x.shape[1], out.shape[-1])


def sinusoid(t, dim, scale=1000.0):
    """SinusoidalPosEmb: t [N] -> [N, dim] in t's type, the reference's order of operations."""
    half = dim // 2
    e = math.log(10000) / (half - 1)
    e = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -e)
    e = scale * t.unsqueeze(1) * e.unsqueeze(0)
    return torch.cat((e.sin(), e.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim, bias=True)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(dim, dim, bias=True)

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))

    def float_forward(self, x):
        """The same in float32 whatever the module's dtype (for constants baked at export)."""
        h = F.linear(x.float(), self.linear_1.weight.float(), self.linear_1.bias.float())
        return F.linear(F.silu(h), self.linear_2.weight.float(), self.linear_2.bias.float())


class LocDiT(nn.Module):
    """VoxCPMLocDiT: [mu + t_emb + dt_emb, cond_proj(cond), in_proj(x)] through a bidirectional
    MiniCPM, out_proj over the last P tokens."""

    def __init__(self, c, feat_dim, patch_size):
        super().__init__()
        self.c = c
        self.P = patch_size
        self.in_proj = nn.Linear(feat_dim, c.hidden, bias=True)
        self.cond_proj = nn.Linear(feat_dim, c.hidden, bias=True)
        self.out_proj = nn.Linear(c.hidden, feat_dim, bias=True)
        self.time_mlp = TimestepEmbedding(c.hidden)
        self.delta_time_mlp = TimestepEmbedding(c.hidden)
        self.decoder = MiniCPM(c)
        self.rope = None if c.no_rope else longrope_half(c, 2 * patch_size + 1)

    def time_embedding(self, t, dt):
        """time_mlp(sin(t)) + delta_time_mlp(sin(dt)) in float32 for Python floats t, dt: [hidden]."""
        H = self.c.hidden
        st = sinusoid(torch.tensor([t], dtype=torch.float32), H)
        sdt = sinusoid(torch.tensor([dt], dtype=torch.float32), H)
        dev = self.in_proj.weight.device
        return (self.time_mlp.float_forward(st.to(dev)) + self.delta_time_mlp.float_forward(sdt.to(dev)))[0]

    def forward(self, x, mu, t, cond, dt):
        """The reference's form: x [N,D,P], mu [N,H], t [N], cond [N,D,P], dt [N] -> [N,D,P]."""
        P = self.P
        x = self.in_proj(x.transpose(1, 2))
        cond = self.cond_proj(cond.transpose(1, 2))
        te = self.time_mlp(sinusoid(t.float(), self.c.hidden).to(x.dtype))
        te = te + self.delta_time_mlp(sinusoid(dt.float(), self.c.hidden).to(x.dtype))
        h = torch.cat([(mu + te).unsqueeze(1), cond, x], dim=1)
        h = self.decoder(h, 2 * P + 1, self.rope, causal=False)
        return self.out_proj(h[:, P + 1:]).transpose(1, 2)


class _CFM(nn.Module):
    """UnifiedCFM's parameters: its estimator."""

    def __init__(self, estimator):
        super().__init__()
        self.estimator = estimator


class ScalarQuantization(nn.Module):
    """ScalarQuantizationLayer at inference: in_proj, tanh, round(x * scale) / scale, out_proj;
    tanh and rounding in float32."""

    def __init__(self, dim, latent, scale):
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(dim, latent)
        self.out_proj = nn.Linear(latent, dim)

    def forward(self, x):
        h = torch.tanh(self.in_proj(x).float())
        h = torch.round(h * self.scale) / self.scale
        return self.out_proj(h.to(x.dtype))


class VoxCPM(nn.Module):
    """model.safetensors' network (VoxCPMModel without its AudioVAE)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        lm, P, D = cfg.lm, cfg.patch_size, cfg.feat_dim
        self.base_lm = MiniCPM(cfg.lm)
        self.residual_lm = MiniCPM(cfg.residual)
        self.feat_encoder = LocEnc(cfg.encoder, D, P)
        self.feat_decoder = _CFM(LocDiT(cfg.dit, D, P))
        self.fsq_layer = ScalarQuantization(lm.hidden, cfg.fsq_latent, cfg.fsq_scale)
        self.enc_to_lm_proj = nn.Linear(cfg.encoder.hidden, lm.hidden)
        self.lm_to_dit_proj = nn.Linear(lm.hidden, cfg.dit.hidden)
        self.res_to_dit_proj = nn.Linear(lm.hidden, cfg.dit.hidden)
        self.stop_proj = nn.Linear(lm.hidden, lm.hidden)
        self.stop_head = nn.Linear(lm.hidden, 2, bias=False)

    @property
    def text_scale(self):
        """The reference scales text embeddings by scale_emb only with use_mup."""
        return self.cfg.lm.scale_emb if self.cfg.lm.use_mup else 1.0

    def mu_of(self, lm_hidden, res_hidden):
        return self.lm_to_dit_proj(lm_hidden) + self.res_to_dit_proj(res_hidden)

    def stop_of(self, lm_hidden):
        return self.stop_head(F.silu(self.stop_proj(lm_hidden)))


# ---------------------------------------------------------------------------------------------
# The flow solve (UnifiedCFM.forward / solve_euler at inference)


def cfm_schedule(timesteps, sway=1.0):
    """The solve as the reference runs it in float32: [(t, dt, zero)] for each Euler step, the
    values float32's. t_span is sway-sampled; cfg-zero-star's first max(1, int(0.04 * (timesteps
    + 1))) steps have zero velocity (the state does not move), the rest call the DiT."""
    span = torch.linspace(1, 0, timesteps + 1, dtype=torch.float32)
    span = span + sway * (torch.cos(math.pi / 2 * span) - 1 + span)
    zero_steps = max(1, int((timesteps + 1) * 0.04))
    steps = []
    t, dt = span[0], span[0] - span[1]
    for step in range(1, timesteps + 1):
        steps.append((float(t), float(dt), step <= zero_steps))
        t = t - dt
        if step < timesteps:
            dt = t - span[step + 1]
    return steps


def guidance(pos, neg, cfg_value):
    """cfg-zero-star: the unconditional velocity scaled by its optimal projection, then guided.
    pos/neg [B,...] float32, cfg_value [B]."""
    axes = tuple(range(1, pos.dim()))
    st = (pos * neg).sum(axes, keepdim=True) / ((neg * neg).sum(axes, keepdim=True) + 1e-8)
    cfg = cfg_value.reshape([-1] + [1] * (pos.dim() - 1))
    return neg * st + cfg * (pos - neg * st)


def cfm_solve(est, mu, cond, z, timesteps, cfg_value, mean_mode=False):
    """solve_euler the reference's way: mu [B,H], cond [B,D,P], z [B,D,P] (float32), cfg_value [B]
    -> x [B,D,P] float32. The guidance batch is doubled with mu zeroed in its second half."""
    dt_ = next(est.parameters()).dtype
    x = z.float()
    B = x.shape[0]
    for t, dt, zero in cfm_schedule(timesteps):
        if not zero:
            x_in = torch.cat([x, x]).to(dt_)
            mu_in = torch.cat([mu.to(dt_), torch.zeros_like(mu).to(dt_)])
            t_in = torch.full((2 * B,), t, dtype=torch.float32, device=x.device)
            dt_in = torch.full((2 * B,), dt if mean_mode else 0.0, dtype=torch.float32, device=x.device)
            cond_in = torch.cat([cond, cond]).to(dt_)
            v = est(x_in, mu_in, t_in, cond_in, dt_in).float()
            x = x - dt * guidance(v[:B], v[B:], cfg_value)
    return x


# ---------------------------------------------------------------------------------------------
# Reference-style generation (no cache: every LM step runs the whole sequence so far)


def plain_prefill(m, text_ids, text_mask, feat, feat_mask):
    """VoxCPMModel._inference's prefill for one request. Returns the state plain_step continues
    from: {base_in, res_in, lm_hidden, res_hidden, mu, stop}."""
    dt_ = m.stop_head.weight.dtype
    T = text_ids.shape[1]
    feat_embed = m.enc_to_lm_proj(m.feat_encoder(feat.to(dt_)))
    tm, fm = text_mask.to(dt_).unsqueeze(-1), feat_mask.to(dt_).unsqueeze(-1)
    combined = tm * m.base_lm.embed_tokens(text_ids) * m.text_scale + fm * feat_embed
    lm_rope = None if m.cfg.lm.no_rope else reference_rope(m.cfg.lm, T)
    enc = m.base_lm(combined, T, lm_rope, causal=True)
    enc = m.fsq_layer(enc) * fm + enc * tm
    res_in = enc + fm * feat_embed
    res = m.residual_lm(res_in, T, None if m.cfg.residual.no_rope else reference_rope(m.cfg.residual, T), causal=True)
    s = {"base_in": combined, "res_in": res_in, "lm_hidden": enc[:, -1], "res_hidden": res[:, -1]}
    s["mu"] = m.mu_of(s["lm_hidden"], s["res_hidden"]).float()
    s["stop"] = m.stop_of(s["lm_hidden"]).float()
    return s


def plain_step(m, s, cond, noise, cfg_value, timesteps):
    """One patch of _inference's loop from state s (advanced in place): cond [B,P,D], noise
    [B,D,P] -> (patch [B,P,D], next mu, next stop logits)."""
    est = m.feat_decoder.estimator
    x = cfm_solve(est, s["mu"], cond.transpose(1, 2), noise, timesteps, cfg_value, m.cfg.mean_mode)
    patch = x.transpose(1, 2)
    dt_ = m.stop_head.weight.dtype
    curr = m.enc_to_lm_proj(m.feat_encoder(patch.to(dt_).unsqueeze(1)))[:, 0]
    s["base_in"] = torch.cat([s["base_in"], curr.unsqueeze(1)], dim=1)
    n = s["base_in"].shape[1]
    h = m.base_lm(s["base_in"], n, None if m.cfg.lm.no_rope else reference_rope(m.cfg.lm, n), causal=True)[:, -1]
    s["lm_hidden"] = m.fsq_layer(h)
    s["res_in"] = torch.cat([s["res_in"], (s["lm_hidden"] + curr).unsqueeze(1)], dim=1)
    rc = m.cfg.residual
    s["res_hidden"] = m.residual_lm(s["res_in"], n, None if rc.no_rope else reference_rope(rc, n), causal=True)[:, -1]
    s["mu"] = m.mu_of(s["lm_hidden"], s["res_hidden"]).float()
    s["stop"] = m.stop_of(s["lm_hidden"]).float()
    return patch, s["mu"], s["stop"]


def reference_rope(c, n):
    """LongRoPE the way MiniCPMLongRoPE builds it (full-width emb = cat(freqs, freqs)), returned in
    rotate()'s half-width form after checking the halves agree: an independent derivation of the
    table the graphs use."""
    d = c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2).float() / d))
    long = c.max_position_embeddings > c.rope_original
    ext = torch.tensor(c.rope_long if long else c.rope_short, dtype=torch.float32)
    freqs = torch.mul(torch.outer(torch.arange(n).float(), 1.0 / ext), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    f = math.sqrt(1 + math.log(c.max_position_embeddings / c.rope_original) / math.log(c.rope_original))
    cos, sin = emb.cos() * f, emb.sin() * f
    assert torch.equal(cos[:, : d // 2], cos[:, d // 2:])
    return cos[:, : d // 2], sin[:, : d // 2]


# ---------------------------------------------------------------------------------------------
# The shared, in-place cache (docs/pipeline.md "The shared cache") through ONNX Runtime's
# com.microsoft GroupQueryAttention (ort_ops)


# True: the wrappers compute GroupQueryAttention's result in PyTorch (gqa_torch), writing the
# caches in place; the exporter sets it False while tracing.
EMULATE_GQA = True


def gqa_torch(q, k, v, past_k, past_v, seqlens_k, total_len, cos, sin, heads, kv_heads):
    """What GroupQueryAttention computes with past and present sharing memory: row b's S new
    tokens sit at positions seqlens_k[b]+1-S .. seqlens_k[b], are rotated there, written into the
    cache, and attend causally to positions 0 .. their own. When total_len is S (a first prompt),
    every row's tokens sit at positions 0 .. S-1 whatever its length: rows right-padded to S, each
    token attending causally, so a row's tokens before its length see no padding (the padding's
    own outputs and cache entries are not read)."""
    B, S, _ = q.shape
    d = past_k.shape[-1]
    G = heads // kv_heads
    first = int(total_len) == S
    out = torch.empty_like(q)
    for b in range(B):
        L = S if first else int(seqlens_k[b]) + 1
        start = L - S
        qb = q[b].reshape(S, heads, d).transpose(0, 1)
        kb = k[b].reshape(S, kv_heads, d).transpose(0, 1)
        vb = v[b].reshape(S, kv_heads, d).transpose(0, 1)
        if cos is not None:
            c, s = cos[start:L].float(), sin[start:L].float()
            qb, kb = rotate(qb, c, s, d // 2), rotate(kb, c, s, d // 2)
        past_k[b, :, start:L] = kb
        past_v[b, :, start:L] = vb
        keys, vals = past_k[b, :, :L].unsqueeze(1), past_v[b, :, :L].unsqueeze(1)   # [KV,1,L,d]
        sc = torch.matmul(qb.reshape(kv_heads, G, S, d) * (1.0 / math.sqrt(d)), keys.transpose(-1, -2)).float()
        pos = torch.arange(start, L, device=q.device).unsqueeze(1)
        sc = sc.masked_fill(torch.arange(L, device=q.device).unsqueeze(0) > pos, float("-inf"))
        o = torch.matmul(torch.softmax(sc, -1).to(vals.dtype), vals)                    # [KV,G,S,d]
        out[b] = o.reshape(heads, S, d).transpose(0, 1).reshape(S, heads * d)
    return out, past_k, past_v


def shared_cache_forward(lm, h, seqlens_k, total_len, caches, rope):
    """lm's layers over h [B,S,hidden] with its caches (past_key.0, past_value.0, ...) ->
    (normed hidden [B,S,hidden], presents)."""
    c = lm.c
    s = c.residual_scale
    presents = []
    for i, layer in enumerate(lm.layers):
        a = layer.self_attn
        x = layer.input_layernorm(h)
        args = (a.q_proj(x), a.k_proj(x), a.v_proj(x), caches[2 * i], caches[2 * i + 1], seqlens_k)
        if EMULATE_GQA:
            ctx, pk, pv = gqa_torch(*args, total_len, *(rope if rope else (None, None)), c.heads, c.kv_heads)
        elif rope:
            ctx, pk, pv = GroupQueryAttentionOp.apply(*args, total_len, rope[0], rope[1], c.heads, c.kv_heads)
        else:
            ctx, pk, pv = GroupQueryAttentionNoRopeOp.apply(*args, total_len, c.heads, c.kv_heads)
        presents += [pk, pv]
        h = h + _scaled(a.o_proj(ctx), s)
        h = h + _scaled(layer.mlp(layer.post_attention_layernorm(h)), s)
    return lm.norm(h), presents


def cache_names(cfg):
    """(past names, present names): the base LM's then the residual LM's, key then value by layer."""
    past, present = [], []
    for prefix, n in (("", cfg.lm.layers), ("res_", cfg.residual.layers)):
        for i in range(n):
            past += ["%spast_key.%d" % (prefix, i), "%spast_value.%d" % (prefix, i)]
            present += ["%spresent_key.%d" % (prefix, i), "%spresent_value.%d" % (prefix, i)]
    return past, present


class _SharedCacheGraph(nn.Module):
    def __init__(self, model, max_positions, dtype):
        super().__init__()
        self.m = model
        self.dtype = dtype
        # GroupQueryAttention's cos_cache/sin_cache: half-width, scaled, one row per cache position,
        # in the cache's type. Plain attributes, so a module cast cannot touch them.
        self.ropes = []
        for c in (model.cfg.lm, model.cfg.residual):
            self.ropes.append(None if c.no_rope else tuple(t.to(dtype) for t in longrope_half(c, max_positions)))
        with torch.no_grad():
            self.special = model.feat_encoder.special_row().detach().float().cpu().clone()

    def _special(self, device):
        return self.special.to(device, self.dtype)

    def _rope(self, i, device):
        r = self.ropes[i]
        return None if r is None else (r[0].to(device), r[1].to(device))

    def lms(self, base_in, res_fn, seqlens_k, total_len, caches):
        nb = 2 * self.m.cfg.lm.layers
        dev = base_in.device
        enc, pb = shared_cache_forward(self.m.base_lm, base_in, seqlens_k, total_len, caches[:nb], self._rope(0, dev))
        enc, res_in = res_fn(enc)
        res, pr = shared_cache_forward(self.m.residual_lm, res_in, seqlens_k, total_len, caches[nb:], self._rope(1, dev))
        return enc, res, pb + pr


class PrefillGraph(_SharedCacheGraph):
    """prefill.onnx: forward(text_ids, text_mask, feat, feat_mask, seqlens_k, total_sequence_length,
    *caches) -> (mu, stop_logits, *presents), as VoxCPMModel._inference's prefill, for a batch of
    prompts right-padded to T (total_sequence_length T: GroupQueryAttention's first prompts, each
    row of its own length seqlens_k[b] + 1). Each row's outputs are taken at its own last
    position."""

    def forward(self, text_ids, text_mask, feat, feat_mask, seqlens_k, total_len, *caches):
        m, dt_ = self.m, self.dtype
        feat_embed = m.enc_to_lm_proj(m.feat_encoder(feat.to(dt_), self._special(feat.device)))
        tm, fm = text_mask.to(dt_).unsqueeze(-1), feat_mask.to(dt_).unsqueeze(-1)
        text_embed = m.base_lm.embed_tokens(text_ids)
        if m.text_scale != 1.0:
            text_embed = text_embed * m.text_scale
        combined = tm * text_embed + fm * feat_embed

        def after_base(enc):
            enc = m.fsq_layer(enc) * fm + enc * tm
            return enc, enc + fm * feat_embed

        enc, res, presents = self.lms(combined, after_base, seqlens_k, total_len, caches)
        last = seqlens_k.long().reshape(-1, 1, 1).expand(-1, 1, enc.shape[-1])
        lm_hidden, res_hidden = enc.gather(1, last)[:, 0], res.gather(1, last)[:, 0]
        return (m.mu_of(lm_hidden, res_hidden).float(), m.stop_of(lm_hidden).float(), *presents)


class StepGraph(_SharedCacheGraph):
    """step.onnx: forward(mu, cond, noise, cfg_value, seqlens_k, total_sequence_length, *caches)
    -> (patch, next_mu, next_stop_logits, *presents). The whole flow solve (timesteps baked in,
    unrolled), LocEnc, enc_to_lm_proj, one base-LM step, FSQ, one residual-LM step, the
    projections and the stop head.

    The DiT's 2P+1-token sequence is laid out by Pad and Add and the guidance batch by
    broadcasting over a leading axis of 2 (conditional, then mu zeroed): no Concat of unequal
    parts. The time embeddings are constants computed in float32 at export."""

    def __init__(self, model, max_positions, dtype, timesteps):
        super().__init__(model, max_positions, dtype)
        self.timesteps = timesteps
        est = model.feat_decoder.estimator
        self.steps = []
        with torch.no_grad():
            for t, dt, zero in cfm_schedule(timesteps):
                if not zero:   # a zero-velocity step leaves the state where it is
                    self.steps.append((dt, est.time_embedding(t, dt if model.cfg.mean_mode else 0.0).cpu()))
        self.halves = torch.tensor([1.0, 0.0]).reshape(2, 1, 1)

    def forward(self, mu, cond, noise, cfg_value, seqlens_k, total_len, *caches):
        m, dt_ = self.m, self.dtype
        est = m.feat_decoder.estimator
        P, D, H = m.cfg.patch_size, m.cfg.feat_dim, m.cfg.dit.hidden
        dev = mu.device
        x = noise.transpose(1, 2)                                           # [B,P,D] float32
        around = F.pad(est.cond_proj(cond.to(dt_)), (0, 0, 1, P))           # cond at tokens 1..P
        mu2 = mu.to(dt_).unsqueeze(0) * self.halves.to(dev, dt_)            # [2,B,H]
        cfg = cfg_value.reshape(-1, 1, 1)
        for dt, temb in self.steps:
            seq = around + F.pad(est.in_proj(x.to(dt_)), (0, 0, P + 1, 0))  # x at tokens P+1..2P
            first = (mu2 + temb.to(dev, dt_)).unsqueeze(2)                  # [2,B,1,H]
            seq2 = seq.unsqueeze(0) + F.pad(first, (0, 0, 0, 2 * P))        # [2,B,2P+1,H]
            h = est.decoder(seq2.reshape(-1, 2 * P + 1, H), 2 * P + 1, est.rope, causal=False)
            v = est.out_proj(h[:, P + 1:]).float().reshape(2, -1, P, D)
            x = x - dt * guidance(v[0], v[1], cfg)
        patch = x
        curr = m.enc_to_lm_proj(m.feat_encoder.encode(patch.to(dt_), self._special(dev)))   # [B,hidden]
        lm_hidden = []

        def after_base(h):
            q = m.fsq_layer(h)
            lm_hidden.append(q)
            return q, q + curr.unsqueeze(1)

        _, res, presents = self.lms(curr.unsqueeze(1), after_base, seqlens_k, total_len, caches)
        lm_h, res_h = lm_hidden[0][:, 0], res[:, 0]
        return (patch, m.mu_of(lm_h, res_h).float(), m.stop_of(lm_h).float(), *presents)


# ---------------------------------------------------------------------------------------------
# AudioVAE (causal convolutions; weight norm folded at load)


class _Before(torch.autograd.Function):
    """torch.cat([st, x], dim=-1), st of n samples, exported as two Pads and an Add (adding zeros
    is exact), the Pads' amounts constants: x's length is the export's (the VAE decoder is
    exported for one patch of frames). ONNX Runtime's CUDA Concat of unequal parts reads a table
    it stages in host memory, which a CUDA graph's replay reads stale (the step's and
    CosyVoice3's Concats replayed NaN), and the VAE decoder is captured per batch size
    (lm_cuda_graph on). Amounts computed from x's shape (Shape, Concat) would be host nodes, and
    ONNX Runtime refuses to capture a session that has any. torch's own export of F.pad computes
    even constant amounts at run time from the input's shape."""

    @staticmethod
    def forward(ctx, st, x, n, rank, length):
        return F.pad(st, (0, length)) + F.pad(x, (n, 0))

    @staticmethod
    def symbolic(g, st, x, n, rank, length):
        right = g.op("Pad", st, g.op("Constant", value_t=_pads(rank, 0, length)))
        left = g.op("Pad", x, g.op("Constant", value_t=_pads(rank, n, 0)))
        return g.op("Add", right, left)


class _PadLast(torch.autograd.Function):
    """F.pad(x, (before, after)) on the last axis, exported as one Pad of constant amounts."""

    @staticmethod
    def forward(ctx, x, before, after, rank):
        return F.pad(x, (before, after))

    @staticmethod
    def symbolic(g, x, before, after, rank):
        return g.op("Pad", x, g.op("Constant", value_t=_pads(rank, before, after)))


def _pads(rank, before, after):
    """ONNX Pad's pads for the last axis of a tensor of rank dimensions."""
    return torch.tensor([0] * (rank - 1) + [before] + [0] * (rank - 1) + [after], dtype=torch.int64)


def before(st, x, n):
    """torch.cat([st, x], dim=-1) for st of n samples, without a Concat (_Before); an export
    fixes x's length."""
    return _Before.apply(st, x, n, x.dim(), int(x.shape[-1]))


def join_flat(parts, sizes):
    """torch.cat(parts, dim=1) of [B, sizes[i]] parts without a Concat of unequal parts (_Before):
    adjacent pairs padded into place and added, level by level, so each value is copied about
    log2(len(parts)) times rather than once per part. sizes are Python ints: every pad is a
    constant."""
    parts, sizes = list(parts), list(sizes)
    while len(parts) > 1:
        nparts, nsizes = [], []
        for i in range(0, len(parts) - 1, 2):
            a, b = parts[i], parts[i + 1]
            nparts.append(_PadLast.apply(a, 0, sizes[i + 1], 2) + _PadLast.apply(b, sizes[i], 0, 2))
            nsizes.append(sizes[i] + sizes[i + 1])
        if len(parts) % 2:
            nparts.append(parts[-1])
            nsizes.append(sizes[-1])
        parts, sizes = nparts, nsizes
    return parts[0]


class CausalConv(nn.Module):
    """CausalConv1d: `left` zeros before the input (the reference pads 2 * padding). stream()
    carries the last `left` input samples instead (stride 1 only)."""

    def __init__(self, cin, cout, kernel, stride=1, dilation=1, groups=1, left=0, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cout, cin // groups, kernel))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.cin, self.stride, self.dilation, self.groups, self.left = cin, stride, dilation, groups, left

    def forward(self, x):
        return F.conv1d(F.pad(x, (self.left, 0)), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def stream(self, x, st):
        if self.left == 0:
            return F.conv1d(x, self.weight, self.bias, 1, 0, self.dilation, self.groups)
        assert self.stride == 1
        xs = before(st.take(self.cin, self.left), x, self.left)
        st.put(xs[..., -self.left:])
        return F.conv1d(xs, self.weight, self.bias, 1, 0, self.dilation, self.groups)


class CausalConvT(nn.Module):
    """CausalTransposeConv1d (kernel 2s, stride s; the padding arguments only trim): the first
    L * s samples of the full transposed convolution, so output block j reads input frames j and
    j - 1. stream() carries the previous input frame."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cin, cout, 2 * stride))
        self.bias = nn.Parameter(torch.zeros(cout))
        self.cin, self.stride = cin, stride
        self.trim = 2 * math.ceil(stride / 2) - stride % 2   # 2 * padding - output_padding

    def forward(self, x):
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride)[..., : -self.trim]

    def stream(self, x, st):
        assert self.trim == self.stride
        xs = before(st.take(self.cin, 1), x, 1)
        st.put(x[..., -1:])
        s = self.stride
        return F.conv_transpose1d(xs, self.weight, self.bias, s)[..., s:-s]


class Snake(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x):
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)

    def stream(self, x, st):
        return self(x)


class Tanh(nn.Module):
    def forward(self, x):
        return torch.tanh(x)

    def stream(self, x, st):
        return self(x)


class Seq(nn.Sequential):
    def stream(self, x, st):
        for mod in self:
            x = mod.stream(x, st)
        return x


class ResidualUnit(nn.Module):
    def __init__(self, dim, dilation, groups):
        super().__init__()
        pad = ((7 - 1) * dilation) // 2
        self.block = Seq(Snake(dim), CausalConv(dim, dim, 7, dilation=dilation, groups=groups, left=2 * pad),
                         Snake(dim), CausalConv(dim, dim, 1))

    def forward(self, x):
        return x + self.block(x)

    def stream(self, x, st):
        return x + self.block.stream(x, st)


class EncoderBlock(nn.Module):
    def __init__(self, dim_out, stride, groups):
        super().__init__()
        dim_in = dim_out // 2
        self.block = Seq(ResidualUnit(dim_in, 1, groups), ResidualUnit(dim_in, 3, groups), ResidualUnit(dim_in, 9, groups),
                         Snake(dim_in),
                         CausalConv(dim_in, dim_out, 2 * stride, stride=stride, left=2 * math.ceil(stride / 2)))

    def forward(self, x):
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c.encoder_dim
        blocks = [CausalConv(1, d, 7, left=6)]
        for stride in c.encoder_rates:
            d *= 2
            blocks.append(EncoderBlock(d, stride, d // 2 if c.depthwise else 1))
        self.block = Seq(*blocks)
        self.fc_mu = CausalConv(d, c.latent_dim, 3, left=2)
        self.fc_logvar = CausalConv(d, c.latent_dim, 3, left=2)   # loaded, unused at inference

    def forward(self, x):
        return self.fc_mu(self.block(x))


class DecoderBlock(nn.Module):
    def __init__(self, dim_in, dim_out, stride, groups):
        super().__init__()
        self.block = Seq(Snake(dim_in), CausalConvT(dim_in, dim_out, stride), ResidualUnit(dim_out, 1, groups),
                         ResidualUnit(dim_out, 3, groups), ResidualUnit(dim_out, 9, groups))

    def forward(self, x):
        return self.block(x)

    def stream(self, x, st):
        return self.block.stream(x, st)


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        L, ch = c.latent_dim, c.decoder_dim
        if c.depthwise:
            layers = [CausalConv(L, L, 7, groups=L, left=6), CausalConv(L, ch, 1)]
        else:
            layers = [CausalConv(L, ch, 7, left=6)]
        for i, stride in enumerate(c.decoder_rates):
            dim_in, dim_out = ch // 2 ** i, ch // 2 ** (i + 1)
            layers.append(DecoderBlock(dim_in, dim_out, stride, dim_out if c.depthwise else 1))
        layers += [Snake(dim_out), CausalConv(dim_out, 1, 7, left=6), Tanh()]
        self.model = Seq(*layers)

    def forward(self, x):
        return self.model(x)


class AudioVAE(nn.Module):
    """audiovae.pth's network: encode(audio [B,1,N]) -> mean [B,D,N/chunk]; decode(z [B,D,F]) ->
    audio [B,1,F*chunk]."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.encoder = Encoder(c)
        self.decoder = Decoder(c)

    def encode(self, audio):
        return self.encoder(audio)

    def decode(self, z):
        return self.decoder(z)


class _Recorder:
    """Collects the streaming state's layout: (channels, samples) per stateful convolution."""

    def __init__(self, ref):
        self.layout, self.ref = [], ref

    def take(self, channels, samples):
        self.layout.append((channels, samples))
        return self.ref.new_zeros(self.ref.shape[0], channels, samples)

    def put(self, t):
        pass


class _Slicer:
    """Hands each convolution its piece of the flat state. The pieces are Gathers of constant
    index ranges, not Slices: ONNX Runtime fuses Slices of one tensor into a Split, whose CUDA
    kernel stages unequal piece sizes in host memory, which a CUDA graph's replay reads stale (the
    captured VAE decoder replayed NaN)."""

    def __init__(self, state, layout):
        self.state, self.layout, self.i, self.off, self.out = state, layout, 0, 0, []

    def take(self, channels, samples):
        assert self.layout[self.i] == (channels, samples)
        n = channels * samples
        idx = torch.arange(self.off, self.off + n, device=self.state.device)
        t = self.state.index_select(1, idx).reshape(-1, channels, samples)
        self.i, self.off = self.i + 1, self.off + n
        return t

    def put(self, t):
        self.out.append(t.flatten(1))


class VAEDecoderStream(nn.Module):
    """vae_decoder.onnx: forward(latent [B,F,D], state [B,state_size]) -> (audio [B,F*chunk],
    state_out). Each causal convolution's left context (and each transposed convolution's previous
    frame) is carried in the flat state, so decoding in pieces equals decoding at once."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae
        with torch.no_grad():
            rec = _Recorder(torch.zeros(1, vae.c.latent_dim, 1, device=next(vae.parameters()).device))
            vae.decoder.model.stream(rec.ref, rec)
        self.layout = rec.layout
        self.state_size = sum(c * s for c, s in self.layout)

    def forward(self, latent, state):
        st = _Slicer(state, self.layout)
        y = self.vae.decoder.model.stream(latent.transpose(1, 2), st)
        return y[:, 0], join_flat(st.out, [c * n for c, n in self.layout])


class VAEEncoder(nn.Module):
    """vae_encoder.onnx: audio [B,N] (N a multiple of the hop) -> latent [B,N/chunk,D], the mean."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, audio):
        return self.vae.encode(audio.unsqueeze(1)).transpose(1, 2)
