"""Builds tiny Piper-format voices in models/tiny-piper/ for tests (no download, no torch).

    usage: python3 -m scripts.piper.make_tiny [OUT_DIR] [--bench]

Writes two voices, each an .onnx graph with a Piper .onnx.json beside it:

  en_US-tiny-x_low.onnx        single speaker, espeak voice en-us (inputs input, input_lengths, scales)
  es_ES-tinymulti-x_low.onnx   two speakers "alice" and "bob", espeak voice es (adds input sid)

The graphs have Piper's exact interface, as rhasspy/piper's src/python/piper_train/export_onnx.py
(and OHF-Voice/piper1-gpl's src/piper/train/export_onnx.py) export it:

  in  input          int64   [1, phonemes]   phoneme ids
  in  input_lengths  int64   [1]             number of ids
  in  scales         float32 [3]             noise_scale, length_scale, noise_w
  in  sid            int64   [1]             speaker id (multi-speaker voices only)
  out output         float32 [1, 1, 1, time] audio (VITS' [B, 1, T] decoder output, unsqueezed once more)

and the .onnx.json has the schema piper_train/preprocess.py writes (audio, espeak, inference,
phoneme_type, phoneme_map, phoneme_id_map, num_symbols, num_speakers, speaker_id_map, piper_version,
language, dataset) with piper-phonemize's default phoneme id map.

What the tiny graph computes: each of the first input_lengths ids lasts ceil(2 * length_scale)
frames of HOP samples (so audio length is proportional to ids x length_scale, as VITS' duration
predictor scaled by length_scale is), and sounds as a sine whose pitch comes from an embedding of the
id (times a per-speaker factor, so speakers differ), shaped by a small convolution stack over frames.
noise_scale and noise_w are accepted and ignored: the output is deterministic. Weights come from a
fixed seed; the same onnx version writes byte-identical files.

--bench makes the convolution stack run at sample rate with 32 channels (about the compute of a
real medium voice per second of audio) for concurrency measurements; its files are not committed.

Needs only the `onnx` and `numpy` packages (Debian: python3-onnx, python3-numpy).
"""

import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..common.paths import REPO

OPSET = 15  # what Piper exports with
IR_VERSION = 8
SEED = 1234
# The name this script had when models/tiny-piper was committed: a new one would change every
# graph's bytes.
PRODUCER = "voxmux scripts/gen_tiny_piper.py"
SAMPLE_RATE = 22050
HOP = 256
FRAMES_PER_ID = 2.0
NUM_SYMBOLS = 256
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64

# piper-phonemize's DEFAULT_PHONEME_ID_MAP (src/phoneme_ids.hpp): the map published voices carry.
PHONEMES = (
    ["_", "^", "$", " ", "!", "'", "(", ")", ",", "-", ".", ":", ";", "?"]
    + list("abcdefhijklmnopqrstuvwxyz")
    + list("æçðøħŋœǀǁǂǃɐɑɒɓɔɕɖɗɘəɚɛɜɞɟɠɡɢɣɤɥɦɧɨɪɫɬɭɮɯɰɱɲɳɴɵɶɸɹɺɻɽɾʀʁʂʃʄʈʉʊʋʌʍʎ"
           "ʏʐʑʒʔʕʘʙʛʜʝʟʡʢʲˈˌːˑ˞βθχᵻⱱ")
    + list("0123456789")
    + ["\u0327", "\u0303", "\u032a", "\u032f", "\u0329", "ʰ", "ˤ", "ε", "↓", "#", '"', "↑",
       "\u033a", "\u033b", "g", "ʦ", "X", "\u031d", "\u030a"]
)
assert len(PHONEMES) == 159 and len(set(PHONEMES)) == 159, len(PHONEMES)
PHONEME_ID_MAP = {p: [i] for i, p in enumerate(PHONEMES)}


class Graph:
    """A graph's initializers and nodes as they are added: const and node return the name made."""

    def __init__(self):
        self.inits, self.nodes = [], []

    def const(self, n, arr):
        self.inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def node(self, op, ins, outs, **kw):
        self.nodes.append(helper.make_node(op, ins, outs, **kw))
        return outs[0]

    def make(self, name, inputs, outputs):
        return helper.make_graph(self.nodes, name, inputs, outputs, self.inits)


def build_graph(name, num_speakers, bench, rng):
    parts = Graph()
    const, node = parts.const, parts.node

    channels = 32 if bench else 8
    layers = 4 if bench else 2
    kernel = 7 if bench else 3

    # ids[:, :input_lengths]
    ids = node("Slice", ["input", const("zero1", np.array([0], np.int64)), "input_lengths",
                         const("axis1", np.array([1], np.int64))], ["ids"])
    # frames per id = ceil(FRAMES_PER_ID * length_scale), at least 1
    ls = node("Gather", ["scales", const("idx1", np.array(1, np.int64))], ["length_scale"], axis=0)
    fpi = node("Ceil", [node("Mul", [ls, const("fpi", np.array(FRAMES_PER_ID, np.float32))], ["fpi_f"])], ["fpi_c"])
    fpi = node("Max", [fpi, const("one_f", np.array(1.0, np.float32))], ["fpi_m"])
    fpi = node("Cast", [fpi], ["fpi_i"], to=INT64)
    samples_per_id = node("Mul", [fpi, const("hop", np.array(HOP, np.int64))], ["spi"])

    # Pitch of each id (Hz), times the speaker's factor.
    pitch = const("pitch_table", rng.uniform(110.0, 330.0, NUM_SYMBOLS).astype(np.float32))
    f = node("Gather", [pitch, ids], ["pitch"], axis=0)  # [1, T]
    if num_speakers > 1:
        factors = const("speaker_factor", np.linspace(1.0, 1.5, num_speakers).astype(np.float32))
        sf = node("Gather", [factors, "sid"], ["sid_factor"], axis=0)  # [1]
        f = node("Mul", [f, sf], ["pitch_spk"])
    # Repeat each id's pitch over its samples: [1, T, 1] tiled to [1, T, spi] -> [1, T*spi]
    f3 = node("Unsqueeze", [f, const("ax2", np.array([2], np.int64))], ["pitch3"])
    reps = node("Concat", [const("one_i", np.array([1, 1], np.int64)),
                           node("Reshape", [samples_per_id, const("shape1", np.array([1], np.int64))], ["spi1"])],
                ["reps"], axis=0)
    ft = node("Tile", [f3, reps], ["pitch_tiled"])
    fs = node("Reshape", [ft, const("flat", np.array([1, -1], np.int64))], ["pitch_samples"])  # [1, N]
    # Phase accumulator so the sine is continuous across ids.
    step = node("Mul", [fs, const("twopi_sr", np.array(2 * np.pi / SAMPLE_RATE, np.float32))], ["dphase"])
    phase = node("CumSum", [step, const("cum_axis", np.array(1, np.int64))], ["phase"])
    wave = node("Sin", [phase], ["sine"])  # [1, N]

    # Envelope from a small convolution stack over the id embedding (at frame rate, or at sample
    # rate with --bench), so the graph has the conv-heavy shape of a vocoder.
    emb = const("embedding", (rng.standard_normal((NUM_SYMBOLS, channels)) * 0.5).astype(np.float32))
    e = node("Gather", [emb, ids], ["emb"], axis=0)  # [1, T, C]
    e = node("Transpose", [e], ["emb_t"], perm=[0, 2, 1])  # [1, C, T]
    e4 = node("Unsqueeze", [e, const("ax3", np.array([3], np.int64))], ["emb4"])  # [1, C, T, 1]
    rep_unit = samples_per_id if bench else fpi
    reps4 = node("Concat", [const("ones3", np.array([1, 1, 1], np.int64)),
                            node("Reshape", [rep_unit, const("shape1b", np.array([1], np.int64))], ["ru1"])],
                 ["reps4"], axis=0)
    e = node("Reshape", [node("Tile", [e4, reps4], ["emb_tiled"]),
                         const("shape_c", np.array([1, channels, -1], np.int64))], ["x0"])  # [1, C, L]
    for i in range(layers):
        w = rng.standard_normal((channels, channels, kernel)) / np.sqrt(channels * kernel)
        w = const(f"conv{i}.w", w.astype(np.float32))
        b = const(f"conv{i}.b", np.zeros(channels, np.float32))
        y = node("Conv", [e, w, b], [f"conv{i}"], pads=[kernel // 2, kernel // 2])
        y = node("LeakyRelu", [y], [f"act{i}"], alpha=0.1)
        e = node("Add", [e, y], [f"res{i}"])
    wp = const("proj.w", (rng.standard_normal((1, channels, 1)) / np.sqrt(channels)).astype(np.float32))
    env = node("Sigmoid", [node("Conv", [e, wp], ["proj"])], ["env"])  # [1, 1, L]
    env = node("Reshape", [env, const("shape_l", np.array([1, 1, -1, 1], np.int64))], ["env4"])
    if not bench:
        hop_reps = const("hop_reps", np.array([1, 1, 1, HOP], np.int64))
        env = node("Tile", [env, hop_reps], ["env_hop"])
    env = node("Reshape", [env, const("flat2", np.array([1, -1], np.int64))], ["env_samples"])  # [1, N]
    audio = node("Mul", [node("Mul", [wave, env], ["shaped"]), const("gain", np.array(0.8, np.float32))], ["audio"])
    node("Reshape", [audio, const("out_shape", np.array([1, 1, 1, -1], np.int64))], ["output"])

    inputs = [
        helper.make_tensor_value_info("input", INT64, [1, "phonemes"]),
        helper.make_tensor_value_info("input_lengths", INT64, [1]),
        helper.make_tensor_value_info("scales", FLOAT, [3]),
    ]
    if num_speakers > 1:
        inputs.append(helper.make_tensor_value_info("sid", INT64, [1]))
    outputs = [helper.make_tensor_value_info("output", FLOAT, [1, 1, 1, "time"])]
    graph = parts.make(name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=PRODUCER, producer_version="1")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def voice_config(espeak_voice, lang, speakers, dataset):
    family, region = lang.split("_")
    return {
        "dataset": dataset,
        "audio": {"sample_rate": SAMPLE_RATE, "quality": "x_low"},
        "espeak": {"voice": espeak_voice},
        "language": {"code": lang, "family": family, "region": region,
                     "name_native": "", "name_english": "", "country_english": ""},
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "phoneme_map": {},
        "phoneme_id_map": PHONEME_ID_MAP,
        "num_symbols": NUM_SYMBOLS,
        "num_speakers": max(1, len(speakers)),
        "speaker_id_map": {s: i for i, s in enumerate(speakers)},
        "piper_version": "1.0.0",
    }


def write_voice(out_dir, stem, model, config):
    path = os.path.join(out_dir, stem + ".onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=True, indent=4)
        f.write("\n")
    print("wrote", path, "and", os.path.basename(path) + ".json")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    bench = "--bench" in sys.argv[1:]
    out_dir = args[0] if args else os.path.join(REPO, "models", "tiny-piper")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    write_voice(out_dir, "en_US-tiny-x_low", build_graph("tiny", 1, bench, rng),
                voice_config("en-us", "en_US", [], "tiny"))
    write_voice(out_dir, "es_ES-tinymulti-x_low", build_graph("tinymulti", 2, bench, rng),
                voice_config("es", "es_ES", ["alice", "bob"], "tinymulti"))


if __name__ == "__main__":
    main()
