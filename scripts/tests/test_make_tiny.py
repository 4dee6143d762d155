"""The tiny checkpoint makers (scripts/<family>/make_tiny.py), run as `make` runs them: the ONNX
ones reproduce the committed models byte for byte; the published-format ones write checkpoints
that load, every key used and every shape as the config gives it, into the family's network."""

import json
import os
import subprocess
import sys

import onnx
import pytest
import torch

from ..common.paths import REPO


def make(module, out, *args):
    subprocess.run([sys.executable, "-m", module, str(out), *args], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def same_files(got, want):
    names = sorted(os.listdir(want))
    assert sorted(os.listdir(got)) == names
    for name in names:
        with open(os.path.join(got, name), "rb") as a, open(os.path.join(want, name), "rb") as b:
            assert a.read() == b.read(), "%s differs from %s" % (os.path.join(got, name), want)


def test_staged_tiny_reproduces_models_tiny(tmp_path):
    make("scripts.staged.make_tiny", tmp_path)
    want = os.path.join(REPO, "models", "tiny")
    for name in os.listdir(want):
        if name.endswith(".onnx"):
            with open(tmp_path / name, "rb") as a, open(os.path.join(want, name), "rb") as b:
                assert a.read() == b.read(), name
    lm = onnx.load(str(tmp_path / "lm.onnx"))
    assert [i.name for i in lm.graph.input][:3] == ["input_ids", "position_ids", "attention_mask"]


def test_piper_tiny_reproduces_models_tiny_piper(tmp_path):
    make("scripts.piper.make_tiny", tmp_path)
    same_files(tmp_path, os.path.join(REPO, "models", "tiny-piper"))


def test_piper_tiny_vits_reproduces_models_tiny_piper_vits(tmp_path):
    make("scripts.piper.make_tiny_vits", tmp_path)
    same_files(tmp_path, os.path.join(REPO, "models", "tiny-piper-vits"))


def dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_cosyvoice3_tiny_loads_into_the_network(tmp_path):
    pytest.importorskip("yaml")
    from ..cosyvoice3 import export, net
    make("scripts.cosyvoice3.make_tiny", tmp_path)
    for name in ("cosyvoice3.yaml", "llm.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN/config.json",
                 "CosyVoice-BlankEN/vocab.json", "CosyVoice-BlankEN/merges.txt"):
        assert (tmp_path / name).is_file(), name
    cfg = net.load_config(str(tmp_path))
    qwen = json.loads((tmp_path / "CosyVoice-BlankEN" / "config.json").read_text())
    assert cfg.lm.hidden == qwen["hidden_size"] == 32
    llm = net.load_checkpoint(str(tmp_path / "llm.pt"))
    embed = llm["llm.model.model.embed_tokens.weight"]
    assert tuple(embed.shape) == (qwen["vocab_size"], 32)
    assert torch.equal(llm["llm.model.lm_head.weight"], embed)
    hift = net.load_checkpoint(str(tmp_path / "hift.pt"))
    assert any(k.endswith(".parametrizations.weight.original0") for k in hift)
    assert not any(k.startswith("conv_pre.") and k.endswith(".weight") and "parametrizations" not in k
                   for k in hift)
    # load_models refuses a missing or unexpected key and a shape other than the config's.
    lm, flow, hift_net = export.load_models(str(tmp_path), cfg)
    assert lm.llm.model.model.embed_tokens.weight.shape == embed.shape

    tok = onnx.load(str(tmp_path / "speech_tokenizer_v3.onnx")).graph
    assert [i.name for i in tok.input] == ["feats", "feats_length"]
    assert dims(tok.input[0]) == [1, 128, "T"] and dims(tok.output[0]) == [1, "N"]
    assert tok.output[0].type.tensor_type.elem_type == onnx.TensorProto.INT32
    cam = onnx.load(str(tmp_path / "campplus.onnx")).graph
    assert dims(cam.input[0]) == [1, "T", 80] and dims(cam.output[0]) == [1, 192]


def test_voxcpm_tiny_loads_into_the_network(tmp_path):
    from ..voxcpm import net
    make("scripts.voxcpm.make_tiny", tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    lm = raw["lm_config"]
    assert (lm["hidden_size"], lm["num_attention_heads"], lm["num_key_value_heads"]) == (64, 4, 2)
    state = net.read_safetensors(str(tmp_path / "model.safetensors"))
    with open(tmp_path / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert tuple(state["base_lm.embed_tokens.weight"].shape) == (lm["vocab_size"], 64)
    vae = torch.load(str(tmp_path / "audiovae.pth"), map_location="cpu")
    vae = vae.get("state_dict", vae)
    assert any(k.endswith(".weight_g") for k in vae) and any(k.endswith(".weight_v") for k in vae)
    # load_model refuses a missing or unexpected key and a shape other than the config's.
    model, vae_net, cfg = net.load_model(str(tmp_path))
    assert cfg.lm.hidden == 64 and cfg.vae.latent_dim == raw["audio_vae_config"]["latent_dim"]
