"""Builds tiny VITS-shaped Piper voices in models/tiny-piper-vits/ for tests (no download, no torch).

    usage: python3 -m scripts.piper.make_tiny_vits [OUT_DIR]

Writes two voices with Piper's interface and .onnx.json (as scripts/piper/make_tiny.py does):

  en_US-tinyvits-x_low.onnx        single speaker, espeak voice en-us
  es_ES-tinyvitsmulti-x_low.onnx   speakers "alice" and "bob", espeak voice es (input sid)

Unlike make_tiny's voices, these graphs have the structure of Piper's export of VITS's infer
(piper_train/vits/models.py), which voxmux relies on to batch sentences and to decode in chunks:

  durations  w_ceil = ceil(exp(logw) * x_mask * length_scale), logw a 1x1 convolution of the ids'
             embedding (plus a per-speaker offset); y_lengths = Cast(Clip(ReduceSum(w_ceil), 1))
  expansion  the ids' embedding repeated over their frames through the monotonic path
             (CumSum of w_ceil, compared with the frame index), as generate_path does
  flow       two coupling layers run in reverse, each after a flip of the channels, as VITS's
             ResidualCouplingBlock exports (mean only): x0, x1 = split(x); h = pre(x0) * y_mask;
             one WaveNet layer (kernel 5, tanh * sigmoid, plus the speaker's conditioning);
             m = post(h) * y_mask; x = concat(x0, (x1 - m) * y_mask)
  decoder    dec((z * y_mask), g): conv_pre (+ cond(g) for several speakers), LeakyRelu, three
             transposed convolutions (strides 8, 8, 4: 256 samples a frame) with a dilated
             residual convolution, conv_post, Tanh; unsqueezed to [B, 1, 1, samples]

Rows are batched as in Piper's graphs: ids padded, each row's input_lengths its own. noise_scale
and noise_w are ignored (no random sampling): the output is deterministic. Weights come from a
fixed seed; the same onnx version writes byte-identical files.
"""

import os
import sys

import numpy as np
from onnx import TensorProto, helper
import onnx

from ..common.paths import REPO
from .make_tiny import IR_VERSION, NUM_SYMBOLS, OPSET, Graph, voice_config, write_voice

SEED = 4321
PRODUCER = "voxmux scripts/piper/make_tiny_vits.py"
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
CHANNELS = 4  # latent channels
FRAMES_PER_ID = 3.0  # exp of the duration bias


def build_graph(name, num_speakers, rng):
    parts = Graph()
    const, node = parts.const, parts.node

    def weight(n, *shape, scale=1.0):
        fan_in = int(np.prod(shape[1:]))
        return const(n, (rng.standard_normal(shape) * scale / np.sqrt(fan_in)).astype(np.float32))

    multi = num_speakers > 1
    ax1 = const("ax1", np.array([1], np.int64))
    ax2 = const("ax2", np.array([2], np.int64))

    # x_mask [B, 1, T] from input_lengths.
    t = node("Gather", [node("Shape", ["input"], ["in_shape"]), const("one", np.array(1, np.int64))], ["t"], axis=0)
    pos = node("Range", [const("zero_i", np.array(0, np.int64)), t, const("one_i", np.array(1, np.int64))], ["pos"])
    lens = node("Unsqueeze", ["input_lengths", ax1], ["lens2"])  # [B, 1]
    x_mask = node("Cast", [node("Less", [pos, lens], ["x_less"])], ["x_mask2"], to=FLOAT)  # [B, T]
    x_mask = node("Unsqueeze", [x_mask, ax1], ["x_mask"])  # [B, 1, T]

    # Text encoder: an embedding, masked.
    emb = const("emb.weight", (rng.standard_normal((NUM_SYMBOLS, CHANNELS)) * 0.7).astype(np.float32))
    m_p = node("Transpose", [node("Gather", [emb, "input"], ["emb"], axis=0)], ["emb_t"], perm=[0, 2, 1])
    m_p = node("Mul", [m_p, x_mask], ["m_p"])  # [B, C, T]

    # Duration predictor: logw = conv1x1(m_p) + log(FRAMES_PER_ID) (+ the speaker's offset).
    logw = node("Conv", [m_p, weight("dp.weight", 1, CHANNELS, 1, scale=0.5),
                         const("dp.bias", np.array([np.log(FRAMES_PER_ID)], np.float32))], ["logw0"])
    if multi:
        spk = const("dp.speaker", np.linspace(0.0, 0.3, num_speakers).astype(np.float32))
        off = node("Unsqueeze", [node("Gather", [spk, "sid"], ["dp_sid"], axis=0),
                                 const("ax12", np.array([1, 2], np.int64))], ["dp_off"])
        logw = node("Add", [logw, off], ["logw"])
    ls = node("Gather", ["scales", const("idx1", np.array(1, np.int64))], ["length_scale"], axis=0)
    w = node("Mul", [node("Mul", [node("Exp", [logw], ["w_exp"]), x_mask], ["w_masked"]), ls], ["w"])
    w_ceil = node("Ceil", [w], ["w_ceil"])  # [B, 1, T]
    y_sum = node("ReduceSum", [w_ceil, const("ax_12", np.array([1, 2], np.int64))], ["y_sum"], keepdims=0)
    y_clip = node("Clip", [y_sum, const("one_f", np.array(1.0, np.float32))], ["y_clip"])
    y_lengths = node("Cast", [y_clip], ["y_lengths"], to=INT64)  # [B]

    # The monotonic path: id t covers frames [cum[t] - w_ceil[t], cum[t]).
    f_max = node("ReduceMax", [y_lengths], ["f_max"], keepdims=0)
    frames = node("Cast", [node("Range", ["zero_i", f_max, "one_i"], ["frames_i"])], ["frames"], to=FLOAT)
    cum = node("CumSum", [w_ceil, const("cum_axis", np.array(2, np.int64))], ["cum"])
    cum_t = node("Transpose", [cum], ["cum_t"], perm=[0, 2, 1])  # [B, T, 1]
    start_t = node("Transpose", [node("Sub", [cum, w_ceil], ["cum_prev"])], ["start_t"], perm=[0, 2, 1])
    upper = node("Cast", [node("Less", [frames, cum_t], ["upper_b"])], ["upper"], to=FLOAT)  # [B, T, F]
    lower = node("Cast", [node("Less", [frames, start_t], ["lower_b"])], ["lower"], to=FLOAT)
    path = node("Sub", [upper, lower], ["path"])
    z_p = node("MatMul", [m_p, path], ["z_p"])  # [B, C, F]
    yl = node("Cast", [node("Unsqueeze", [y_lengths, ax1], ["yl2"])], ["yl2f"], to=FLOAT)  # [B, 1]
    y_mask = node("Cast", [node("Less", [frames, yl], ["y_less"])], ["y_mask2"], to=FLOAT)
    y_mask = node("Unsqueeze", [y_mask, ax1], ["y_mask"])  # [B, 1, F]

    # Flow: two coupling layers in reverse, each after a flip of the channels (VITS's
    # ResidualCouplingBlock, mean only, one WaveNet layer each).
    half, hidden = CHANNELS // 2, 4
    flip = [const("flip.start", np.array([-1], np.int64)), const("flip.end", np.array([-(2**63)], np.int64)), ax1,
            const("flip.step", np.array([-1], np.int64))]
    split = const("flow.split", np.array([half, half], np.int64))
    lo, mid, hi = (const(n, np.array([v], np.int64)) for n, v in (("wn.lo", 0), ("wn.mid", hidden), ("wn.hi", 2 * hidden)))
    if multi:
        flow_emb = const("flow.emb_g", rng.standard_normal((num_speakers, 3)).astype(np.float32))
        g_flow = node("Unsqueeze", [node("Gather", [flow_emb, "sid"], ["flow_g0"], axis=0), ax2], ["flow_g"])
    z = z_p
    for i in range(2):
        z = node("Slice", [z] + flip, [f"flow{i}_flip"])
        x0, x1 = f"flow{i}_x0", f"flow{i}_x1"
        node("Split", [z, split], [x0, x1], axis=1)
        h = node("Mul", [node("Conv", [x0, weight(f"flow.{i}.pre.weight", hidden, half, 1),
                                       const(f"flow.{i}.pre.bias", np.zeros(hidden, np.float32))], [f"flow{i}_pre"]),
                         y_mask], [f"flow{i}_h"])
        a = node("Conv", [h, weight(f"flow.{i}.in.weight", 2 * hidden, hidden, 5, scale=0.5),
                          const(f"flow.{i}.in.bias", np.zeros(2 * hidden, np.float32))], [f"flow{i}_in"],
                 pads=[2, 2], kernel_shape=[5])
        if multi:
            cond = node("Conv", [g_flow, weight(f"flow.{i}.cond.weight", 2 * hidden, 3, 1)], [f"flow{i}_cond"])
            a = node("Add", [a, cond], [f"flow{i}_in_g"])
        t = node("Tanh", [node("Slice", [a, lo, mid, ax1], [f"flow{i}_a_t"])], [f"flow{i}_t"])
        sg = node("Sigmoid", [node("Slice", [a, mid, hi, ax1], [f"flow{i}_a_s"])], [f"flow{i}_s"])
        acts = node("Mul", [t, sg], [f"flow{i}_acts"])
        h = node("Mul", [node("Conv", [acts, weight(f"flow.{i}.res.weight", hidden, hidden, 1),
                                       const(f"flow.{i}.res.bias", np.zeros(hidden, np.float32))], [f"flow{i}_res"]),
                         y_mask], [f"flow{i}_wn"])
        m = node("Mul", [node("Conv", [h, weight(f"flow.{i}.post.weight", half, hidden, 1, scale=0.5),
                                       const(f"flow.{i}.post.bias", np.zeros(half, np.float32))], [f"flow{i}_post"]),
                         y_mask], [f"flow{i}_m"])
        x1 = node("Mul", [node("Sub", [x1, m], [f"flow{i}_x1m"]), y_mask], [f"flow{i}_x1n"])
        z = node("Concat", [x0, x1], [f"flow{i}_out"], axis=1)
    z = node("Mul", [z, y_mask], ["z_masked"])  # the decoder's input

    # Decoder: HiFi-GAN's shape at a few channels.
    x = node("Conv", [z, weight("dec.conv_pre.weight", 8, CHANNELS, 7), const("dec.conv_pre.bias", np.zeros(8, np.float32))],
             ["pre"], pads=[3, 3], kernel_shape=[7])
    if multi:
        emb_g = const("emb_g.weight", rng.standard_normal((num_speakers, 6)).astype(np.float32))
        g = node("Unsqueeze", [node("Gather", [emb_g, "sid"], ["g0"], axis=0), ax2], ["g"])  # [B, 6, 1]
        cond = node("Conv", [g, weight("dec.cond.weight", 8, 6, 1), const("dec.cond.bias", np.zeros(8, np.float32))], ["cond"])
        x = node("Add", [x, cond], ["pre_g"])
    chans = [8, 4, 4, 2]
    for i, (stride, k) in enumerate([(8, 16), (8, 16), (4, 8)]):
        x = node("LeakyRelu", [x], [f"up{i}_act"], alpha=0.1)
        x = node("ConvTranspose", [x, weight(f"dec.ups.{i}.weight", chans[i], chans[i + 1], k),
                                   const(f"dec.ups.{i}.bias", np.zeros(chans[i + 1], np.float32))],
                 [f"up{i}"], strides=[stride], kernel_shape=[k], pads=[(k - stride) // 2] * 2)
        r = node("LeakyRelu", [x], [f"res{i}_act"], alpha=0.1)
        r = node("Conv", [r, weight(f"dec.res.{i}.weight", chans[i + 1], chans[i + 1], 3),
                          const(f"dec.res.{i}.bias", np.zeros(chans[i + 1], np.float32))],
                 [f"res{i}"], pads=[3, 3], dilations=[3], kernel_shape=[3])
        x = node("Add", [x, r], [f"block{i}"])
    x = node("LeakyRelu", [x], ["post_act"], alpha=0.01)
    x = node("Conv", [x, weight("dec.conv_post.weight", 1, chans[-1], 7)], ["post"], pads=[3, 3], kernel_shape=[7])
    node("Unsqueeze", [node("Tanh", [x], ["audio"]), ax1], ["output"])

    inputs = [
        helper.make_tensor_value_info("input", INT64, ["batch", "phonemes"]),
        helper.make_tensor_value_info("input_lengths", INT64, ["batch"]),
        helper.make_tensor_value_info("scales", FLOAT, [3]),
    ]
    if multi:
        inputs.append(helper.make_tensor_value_info("sid", INT64, ["batch"]))
    outputs = [helper.make_tensor_value_info("output", FLOAT, ["batch", 1, 1, "time"])]
    graph = parts.make(name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=PRODUCER, producer_version="1")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out_dir = args[0] if args else os.path.join(REPO, "models", "tiny-piper-vits")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    write_voice(out_dir, "en_US-tinyvits-x_low", build_graph("tinyvits", 1, rng),
                voice_config("en-us", "en_US", [], "tinyvits"))
    write_voice(out_dir, "es_ES-tinyvitsmulti-x_low", build_graph("tinyvitsmulti", 2, rng),
                voice_config("es", "es_ES", ["alice", "bob"], "tinyvitsmulti"))


if __name__ == "__main__":
    main()
