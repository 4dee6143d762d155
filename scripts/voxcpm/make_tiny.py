"""Makes a VoxCPM 1.5 model directory in the published format, with random weights.

    usage: python3 -m scripts.voxcpm.make_tiny OUT_DIR [--full] [--seed N]

OUT_DIR gets what openbmb/VoxCPM1.5 ships and scripts/voxcpm/export.py reads: config.json (the
reference's schema: lm_config, patch_size, feat_dim, residual_lm_num_layers,
scalar_quantization_latent_dim, scalar_quantization_scale, encoder_config, dit_config with its
cfm_config, audio_vae_config, max_length, dtype, architecture), model.safetensors (bfloat16, the
published parameter names: base_lm.*, residual_lm.*, feat_encoder.*, feat_decoder.estimator.*,
fsq_layer.*, the projections and the stop head), audiovae.pth (a float32 state dict, every
convolution weight-normed as torch.nn.utils.weight_norm stores it: weight_g, weight_v) and a
tokenizer in MiniCPM's format (scripts/voxcpm/tokenizer.py; audio start/end at ids 101/102).

The tiny sizes: LMs of 64 channels (4 heads, 2 key/value heads of 16), 2 base and 2 residual
layers, a LocEnc of 32 and a DiT of 96 channels (2 layers each), an FSQ of 16; the VAE keeps the
published rates (a hop of 1764 samples at 44.1 kHz, 64 latent values a frame, patches of 4) with
8 and 32 channels. Its LongRoPE uses the long factors (max_position_embeddings twice the
original), so the scaled cos/sin path is exercised. Its audio is noise; its graphs are the real
thing's.

--full writes the sizes assumed for the published VoxCPM 1.5 (the config as best known: a
MiniCPM-4 0.5B base LM of 1024 channels, 24 layers, 16 heads, 2 key/value heads, vocabulary
73448, LongRoPE over 32768 positions; 8 residual layers; LocEnc and DiT of 1024 channels and 8
layers; FSQ 256 at scale 9; AudioVAE encoder 64 / decoder 2048 channels, rates [2,3,6,7,7] and
[7,7,6,3,2]), random weights in bfloat16, for benchmarks where the published weights are not at
hand (about 1.6 GB; a few minutes). The exporter reads every size from config.json, so the real
checkpoint needs none of these numbers.

Needs torch and numpy (Debian: python3-torch, python3-numpy).
"""

import argparse
import json
import math
import os
import sys

import torch

from . import net
from .tokenizer import write_tiny_tokenizer


def factors(n, top):
    """A smooth rising LongRoPE factor curve of n entries from about 1 to top."""
    return [round(1.0 + (top - 1.0) / (1.0 + math.exp(-(i - 0.55 * n) / (0.12 * n))), 6) for i in range(n)]


def cfm_config():
    return {"sigma_min": 1e-06, "solver": "euler", "t_scheduler": "log-norm", "inference_cfg_rate": 2.0}


def tiny_config(vocab):
    hd = 16
    return {
        "architecture": "voxcpm",
        "lm_config": {
            "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 64, "intermediate_size": 128,
            "max_position_embeddings": 65536, "num_attention_heads": 4, "num_hidden_layers": 2,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
            "rope_scaling": {"type": "longrope", "long_factor": factors(hd // 2, 8.0),
                             "short_factor": factors(hd // 2, 2.0), "original_max_position_embeddings": 32768},
            "vocab_size": vocab, "use_mup": False, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4,
            "rope_theta": 10000.0,
        },
        "patch_size": 4, "feat_dim": 64, "residual_lm_num_layers": 2,
        "scalar_quantization_latent_dim": 16, "scalar_quantization_scale": 9,
        "encoder_config": {"hidden_dim": 32, "ffn_dim": 64, "num_heads": 2, "num_layers": 2},
        "dit_config": {"hidden_dim": 96, "ffn_dim": 192, "num_heads": 6, "num_layers": 2, "cfm_config": cfm_config()},
        "audio_vae_config": {"encoder_dim": 8, "encoder_rates": [2, 3, 6, 7, 7], "latent_dim": 64, "decoder_dim": 32,
                             "decoder_rates": [7, 7, 6, 3, 2], "depthwise": True, "sample_rate": 44100,
                             "use_noise_block": False},
        "max_length": 4096, "dtype": "bfloat16",
    }


def full_config():
    hd = 64
    return {
        "architecture": "voxcpm",
        "lm_config": {
            "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 1024, "intermediate_size": 4096,
            "max_position_embeddings": 32768, "num_attention_heads": 16, "num_hidden_layers": 24,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
            "rope_scaling": {"type": "longrope", "long_factor": factors(hd // 2, 31.0),
                             "short_factor": factors(hd // 2, 31.0), "original_max_position_embeddings": 32768},
            "vocab_size": 73448, "use_mup": False, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4,
            "rope_theta": 10000.0,
        },
        "patch_size": 4, "feat_dim": 64, "residual_lm_num_layers": 8,
        "scalar_quantization_latent_dim": 256, "scalar_quantization_scale": 9,
        "encoder_config": {"hidden_dim": 1024, "ffn_dim": 4096, "num_heads": 16, "num_layers": 8},
        "dit_config": {"hidden_dim": 1024, "ffn_dim": 4096, "num_heads": 16, "num_layers": 8, "cfm_config": cfm_config()},
        "audio_vae_config": {"encoder_dim": 64, "encoder_rates": [2, 3, 6, 7, 7], "latent_dim": 64, "decoder_dim": 2048,
                             "decoder_rates": [7, 7, 6, 3, 2], "depthwise": True, "sample_rate": 44100,
                             "use_noise_block": False},
        "max_length": 4096, "dtype": "bfloat16",
    }


def tokenizer_size(out_dir):
    """One more than the largest id the written tokenizer.json holds."""
    with open(os.path.join(out_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    ids = list(tok.get("model", {}).get("vocab", {}).values()) + [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def randomize(model, g):
    """Random weights that keep activations of order one: linear weights of std gain/sqrt(fan_in)
    (the attention's q and k a little larger, so attention is peaked and a position mistake
    shows), norms near one, small biases."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("special_token"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                gain = 1.5 if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * (gain / math.sqrt(p.shape[1])))
            else:
                raise SystemExit("no initialisation for %s" % name)
        # The stop head leans towards going on, so a random model speaks for a while before it
        # stops, and sometimes does.
        w = model.stop_head.weight
        w[1] = w[0] + 0.5 * torch.randn(w.shape[1], generator=g) / math.sqrt(w.shape[1]) - 0.1


def vae_state(vae, g):
    """The VAE's state dict as the published audiovae.pth stores it: each convolution's weight as
    weight_v (direction) and weight_g (its norm over every axis but the first)."""
    out = {}
    for name, p in vae.state_dict().items():
        if name.endswith(".alpha"):
            out[name] = (1.0 + 0.1 * torch.randn(p.shape, generator=g)).abs()
        elif name.endswith(".bias"):
            out[name] = 0.01 * torch.randn(p.shape, generator=g)
        elif name.endswith(".weight"):
            base = name[: -len(".weight")]
            out[base + ".weight_v"] = torch.randn(p.shape, generator=g)
            out[base + ".weight_g"] = 0.5 + 0.5 * torch.rand([p.shape[0]] + [1] * (p.dim() - 1), generator=g)
        else:
            raise SystemExit("no initialisation for %s" % name)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--full", action="store_true", help="the published sizes (as assumed) instead of tiny ones")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    write_tiny_tokenizer(a.out_dir)
    if a.full:
        raw = full_config()
        if tokenizer_size(a.out_dir) > raw["lm_config"]["vocab_size"]:
            raise SystemExit("the tokenizer has more ids than the vocabulary")
    else:
        raw = tiny_config(-(-max(tokenizer_size(a.out_dir), 103) // 16) * 16)
    cfg = net.parse_config(raw)
    g = torch.Generator().manual_seed(a.seed)
    model = net.VoxCPM(cfg)
    randomize(model, g)
    net.write_safetensors(os.path.join(a.out_dir, "model.safetensors"), model.state_dict(), "BF16")
    del model
    vae = net.AudioVAE(cfg.vae)
    torch.save(vae_state(vae, g), os.path.join(a.out_dir, "audiovae.pth"))
    with open(os.path.join(a.out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=2)
        f.write("\n")
    print("wrote %s (%s sizes)" % (a.out_dir, "assumed published" if a.full else "tiny"), file=sys.stderr)


if __name__ == "__main__":
    main()
