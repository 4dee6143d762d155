"""Makes a tiny CosyVoice3 model directory in the published format, with random weights.

    usage: python3 -m scripts.cosyvoice3.make_tiny OUT_DIR [--full] [--qwen-files DIR] [--pitch LOW:HIGH]

OUT_DIR gets what Fun-CosyVoice3-0.5B ships and scripts/cosyvoice3/export.py reads: cosyvoice3.yaml
(hyperpyyaml, the published file's structure and keys with small sizes), llm.pt, flow.pt and hift.pt
(state dicts under the published parameter names; HiFT's convolutions weight-normed as
torch.nn.utils.parametrizations stores them), CosyVoice-BlankEN/ (a Qwen2 config.json and the
Qwen2 tokenizer files from instance/text/testdata/qwen2), and stand-ins for the two voice-prompt
networks with the published graphs' inputs and outputs: speech_tokenizer_v3.onnx (feats float32
[1, 128, T] and feats_length int32 [1] -> int32 tokens [1, T/4] in [0, 6561)) and campplus.onnx
(float32 [1, T, 80] -> float32 [1, 192]). The network sizes are small (an LM of 32
channels, a DiT of 32, a HiFT of 32 base channels); the vocabularies, the mel bins, the hop and the
vocoder's rates are CosyVoice3's, so ids, frames and samples line up with the real model. Its
audio is noise; its graphs and manifest are the real thing's.

--full writes CosyVoice3-0.5B's own sizes instead (a 0.5B Qwen2 LM, the 22-layer DiT of 1024
channels, HiFT of 512): a checkpoint of the real network with random weights, for benchmarks where
the published weights are not at hand (about 3.4 GB in float32, half a minute to write).

--pitch LOW:HIGH makes HiFT voiced: its F0 predictor gives LOW to HIGH Hz over the mel that the
exporter's vocoder check runs (export.check_mel), and its sine source carries through to the audio
as a trained one's does, so that the check exercises the source's phase. Without it the tiny
HiFT's F0 is below its voicing threshold.

--qwen-files takes the Qwen2 tokenizer files (vocab.json, merges.txt, tokenizer_config.json) from
DIR instead of unpacking instance/text/testdata/qwen2's.

Needs torch and PyYAML (Debian: python3-torch, python3-yaml) and the zstd command (unless
--qwen-files).
"""

import json
import os
import subprocess
import sys

import torch

from ..common.paths import REPO
from . import net

QWEN_FILES = os.path.join(REPO, "instance", "text", "testdata", "qwen2")

YAML = """\
# set random seed, so that you may reproduce your result.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]

# fixed params
sample_rate: 24000
llm_input_size: 32
llm_output_size: 32
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2

# stream related params
chunk_size: 25 # streaming inference chunk size, in token
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: 32
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: 32
            depth: 2
            heads: 2
            dim_head: 16
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: 32
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: 16
"""

QWEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "vocab_size": 151936, "hidden_act": "silu",
}

# HiFT's convolutions that the reference wraps in weight_norm (parametrizations in the file).
WEIGHT_NORMED = ("f0_predictor.condnet.", "conv_pre.", "ups.", "resblocks.", "source_resblocks.", "conv_post.")


def weight_normed(state):
    out = {}
    for k, v in state.items():
        if k.endswith(".weight") and k.startswith(WEIGHT_NORMED) and v.dim() == 3:
            base = k[: -len(".weight")]
            g = v.norm(dim=(1, 2), keepdim=True)
            out[base + ".parametrizations.weight.original0"] = g
            out[base + ".parametrizations.weight.original1"] = v.clone()
        else:
            out[k] = v
    return out


# CosyVoice3-0.5B's sizes: its cosyvoice3.yaml and Qwen2-0.5B's config.json.
FULL_SIZES = [("llm_input_size: 32", "llm_input_size: 896"), ("llm_output_size: 32", "llm_output_size: 896"),
              ("        channels: 32", "        channels: 1024"), ("            dim: 32", "            dim: 1024"),
              ("            depth: 2", "            depth: 22"), ("            heads: 2", "            heads: 16"),
              ("            dim_head: 16", "            dim_head: 64"), ("    base_channels: 32", "    base_channels: 512"),
              ("        cond_channels: 16", "        cond_channels: 512")]
FULL_QWEN = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2}


class TinySpeechTokenizer(torch.nn.Module):
    """Whisper log-mel frames (100 Hz) -> one token per 4 frames (25 Hz), as the published
    speech_tokenizer_v3.onnx: two channels of a strided convolution, each quantized to 81 levels,
    make a token in [0, 81 * 81 = 6561). Frames past feats_length give token 0."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(128, 2, kernel_size=4, stride=4)

    def forward(self, feats, feats_length):
        h = torch.sigmoid(self.conv(feats) * 4.0)                      # [1, 2, T/4]
        q = torch.clamp(torch.floor(h * 81.0), 0.0, 80.0)
        tok = q[:, 0] * 81.0 + q[:, 1]                                 # [1, T/4]
        n = torch.div(feats_length, 4, rounding_mode="floor").to(torch.float32)
        idx = torch.arange(tok.shape[1], dtype=torch.float32)[None]
        return (tok * (idx < n[:, None]).to(torch.float32)).to(torch.int32)


class TinyCampplus(torch.nn.Module):
    """Kaldi fbank [1, T, 80] -> a 192-value speaker embedding: a projection averaged over time."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(80, 192)

    def forward(self, x):
        return torch.tanh(self.proj(x)).mean(dim=1)


def write_voice_networks(out):
    """The two voice-prompt stand-ins, exported as the published graphs' input/output layout."""
    torch.manual_seed(20251126)
    tok, cam = TinySpeechTokenizer().eval(), TinyCampplus().eval()
    T = 400
    exports = [
        (tok, (torch.randn(1, 128, T), torch.tensor([T], dtype=torch.int32)), "speech_tokenizer_v3.onnx",
         ["feats", "feats_length"], ["indices"], {"feats": {2: "T"}, "indices": {1: "N"}}),
        (cam, (torch.randn(1, T, 80),), "campplus.onnx", ["input"], ["output"], {"input": {1: "T"}}),
    ]
    with torch.no_grad():
        for module, args, name, inputs, outputs, axes in exports:
            kwargs = dict(input_names=inputs, output_names=outputs, dynamic_axes=axes, opset_version=17,
                          do_constant_folding=True)
            path = os.path.join(out, name)
            try:
                torch.onnx.export(module, args, path, dynamo=False, **kwargs)
            except TypeError:
                torch.onnx.export(module, args, path, **kwargs)  # torch without the dynamo= argument


def set_pitch(hift, cfg, low, high):
    """Sets the F0 predictor's output layer so that F0 spans [low, high] Hz over the exporter's
    check mel, and strengthens the source's merge of the harmonics (default-initialized, it
    passes a twentieth of the sines' amplitude on)."""
    from . import export
    with torch.no_grad():
        cls = hift.f0_predictor.classifier
        wx = hift.f0_predictor.features(export.check_mel(cfg)) @ cls.weight[0].double()   # [1, F]
        centre, half = float(wx.max() + wx.min()) / 2, float(wx.max() - wx.min()) / 2
        scale = (high - low) / 2 / half
        cls.weight.mul_(scale)
        cls.bias.fill_((high + low) / 2 - centre * scale)
        hift.m_source.l_linear.weight.mul_(20.0)


def pop_option(argv, name):
    if name not in argv:
        return None
    i = argv.index(name)
    value = argv[i + 1] if i + 1 < len(argv) else None
    if not value:
        raise SystemExit(__doc__)
    del argv[i:i + 2]
    return value


def parse_pitch(value):
    try:
        low, high = (float(v) for v in value.split(":"))
    except ValueError:
        raise SystemExit("--pitch %r: expected LOW:HIGH in Hz, such as 200:1000" % value)
    if not 10 < low < high:
        raise SystemExit("--pitch %r: want 10 < LOW < HIGH (HiFT's voicing threshold is 10 Hz)" % value)
    return low, high


def main():
    argv = sys.argv[1:]
    qwen_files = pop_option(argv, "--qwen-files")
    pitch = pop_option(argv, "--pitch")
    pitch = parse_pitch(pitch) if pitch is not None else None
    args = [a for a in argv if a != "--full"]
    if len(args) != 1:
        raise SystemExit(__doc__)
    out = args[0]
    full = "--full" in argv
    yaml_text, qwen = YAML, dict(QWEN_CONFIG)
    if full:
        for small, big in FULL_SIZES:
            assert small in yaml_text, small
            yaml_text = yaml_text.replace(small, big)
        qwen.update(FULL_QWEN)
    qdir = os.path.join(out, "CosyVoice-BlankEN")
    os.makedirs(qdir, exist_ok=True)
    with open(os.path.join(out, "cosyvoice3.yaml"), "w") as f:
        f.write(yaml_text)
    with open(os.path.join(qdir, "config.json"), "w") as f:
        json.dump(qwen, f, indent=2)
    for name in ("vocab.json", "merges.txt"):
        with open(os.path.join(qdir, name), "wb") as f:
            if qwen_files:
                with open(os.path.join(qwen_files, name), "rb") as src:
                    f.write(src.read())
            else:
                subprocess.run(["zstd", "-dc", os.path.join(QWEN_FILES, name + ".zst")], stdout=f, check=True)
    with open(os.path.join(qwen_files or QWEN_FILES, "tokenizer_config.json")) as src, \
            open(os.path.join(qdir, "tokenizer_config.json"), "w") as dst:
        dst.write(src.read())

    cfg = net.load_config(out)
    torch.manual_seed(20251125)
    lm = net.CosyVoice3LM(cfg.lm)
    flow = net.CosyVoice3Flow(cfg.flow)
    hift = net.CosyVoice3HiFT(cfg.hift)
    # Default initializations give a small network outputs of reasonable size; scale them so the
    # DiT's gates and HiFT's convolutions pass signal on as trained weights do. At full size the
    # defaults stay: scaled, the 22-layer DiT overflows float16.
    with torch.no_grad():
        if full:
            flow_scale = 1.0
        else:
            flow_scale = 1.5
        for p in flow.parameters():
            if p.dim() >= 2:
                p.mul_(flow_scale)
        for p in hift.parameters():
            if p.dim() == 3 and not full:
                p.normal_(0.0, 0.05)
    if pitch:
        set_pitch(hift.eval(), cfg, *pitch)
    llm_state = dict(lm.state_dict())
    llm_state["llm.model.lm_head.weight"] = llm_state["llm.model.model.embed_tokens.weight"]
    torch.save(llm_state, os.path.join(out, "llm.pt"))
    torch.save(flow.state_dict(), os.path.join(out, "flow.pt"))
    torch.save(weight_normed(hift.state_dict()), os.path.join(out, "hift.pt"))
    write_voice_networks(out)
    print("wrote %s" % out, file=sys.stderr)


if __name__ == "__main__":
    main()
