# Small graphs with the CosyVoice3 inputs for the staged tests (cv3_test.go): a flow step that
# reads cond and embedding, and a vocoder that carries a source phase. Run: python3 gen_cv3_graphs.py OUTDIR
import sys

import onnx
from onnx import TensorProto as T
from onnx import helper as h

out = sys.argv[1]
# Flow step with cond and embedding: x_next = (x + dt*(mu + cond + sum(embedding))) * mask.
C = 80
nodes = [
    h.make_node("ReduceSum", ["embedding", "axes1"], ["esum"], keepdims=1),  # [B,1]
    h.make_node("Unsqueeze", ["esum", "axes2"], ["e3"]),                       # [B,1,1]
    h.make_node("Add", ["mu", "cond"], ["a1"]),
    h.make_node("Add", ["a1", "e3"], ["a2"]),
    h.make_node("Mul", ["a2", "dt"], ["a3"]),
    h.make_node("Add", ["x", "a3"], ["a4"]),
    h.make_node("Mul", ["a4", "mask"], ["x_next"]),
]
inits = [h.make_tensor("axes1", T.INT64, [1], [1]), h.make_tensor("axes2", T.INT64, [1], [2])]


def f(n, shape):
    return h.make_tensor_value_info(n, T.FLOAT, shape)


g = h.make_graph(nodes, "step",
                 [f("x", ["B", C, "F"]), f("mask", ["B", 1, "F"]), f("mu", ["B", C, "F"]), f("t", ["B"]),
                  f("dt", [1]), f("cfg", [1]), f("cond", ["B", C, "F"]), f("embedding", ["B", 4])],
                 [f("x_next", ["B", C, "F"])], inits)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
m.ir_version = 8
onnx.checker.check_model(m)
onnx.save(m, out + "/flow_step_cond.onnx")
# Vocoder with a carried phase (H=2, hop 480): phase_out[b,f,h] = phase[b,h] + (f - phase_at[b] + 1)·0.1·(h+1);
# audio[b,s] = sample_offset[b] + s + 0.5·frac(phase_out[b, s // hop, 0]).
hop, H = 480, 2
nodes = [
    h.make_node("Shape", ["mel"], ["shp"]),
    h.make_node("Gather", ["shp", "i2"], ["Fs"], axis=0),            # scalar F
    h.make_node("Range", ["zero", "Fs", "one"], ["fr"]),              # [F]
    h.make_node("Unsqueeze", ["fr", "ax0"], ["fr2"]),                 # [1,F]
    h.make_node("Unsqueeze", ["phase_at", "ax1"], ["pa"]),            # [B,1]
    h.make_node("Sub", ["fr2", "pa"], ["d0"]),
    h.make_node("Add", ["d0", "one"], ["d1"]),                        # [B,F] int64
    h.make_node("Cast", ["d1"], ["d1f"], to=T.FLOAT),
    h.make_node("Unsqueeze", ["d1f", "ax2"], ["d3"]),                 # [B,F,1]
    h.make_node("Mul", ["d3", "inc"], ["d4"]),                        # [B,F,H]
    h.make_node("Unsqueeze", ["phase", "ax1"], ["p3"]),               # [B,1,H]
    h.make_node("Add", ["p3", "d4"], ["phase_out"]),
    h.make_node("Mul", ["Fs", "hopc"], ["Ns"]),
    h.make_node("Range", ["zero", "Ns", "one"], ["sr"]),              # [N]
    h.make_node("Div", ["sr", "hopc"], ["sf"]),                       # frame of each sample
    h.make_node("Gather", ["phase_out", "sf"], ["ps"], axis=1),       # [B,N,H]
    h.make_node("Gather", ["ps", "zero"], ["p0"], axis=2),            # [B,N]
    h.make_node("Floor", ["p0"], ["p0f"]),
    h.make_node("Sub", ["p0", "p0f"], ["frac"]),
    h.make_node("Mul", ["frac", "half"], ["fh"]),
    h.make_node("Unsqueeze", ["sample_offset", "ax1"], ["so"]),       # [B,1]
    h.make_node("Unsqueeze", ["sr", "ax0"], ["sr2"]),                 # [1,N]
    h.make_node("Add", ["so", "sr2"], ["idx"]),
    h.make_node("Cast", ["idx"], ["idxf"], to=T.FLOAT),
    h.make_node("Add", ["idxf", "fh"], ["audio"]),
]
inits = [h.make_tensor("i2", T.INT64, [], [2]), h.make_tensor("zero", T.INT64, [], [0]),
         h.make_tensor("one", T.INT64, [], [1]),
         h.make_tensor("ax0", T.INT64, [1], [0]), h.make_tensor("ax1", T.INT64, [1], [1]),
         h.make_tensor("ax2", T.INT64, [1], [2]),
         h.make_tensor("inc", T.FLOAT, [H], [0.1 * (k + 1) for k in range(H)]),
         h.make_tensor("hopc", T.INT64, [], [hop]),
         h.make_tensor("half", T.FLOAT, [], [0.5])]
g = h.make_graph(nodes, "voc",
                 [f("mel", ["B", C, "F"]), f("phase", ["B", H]), h.make_tensor_value_info("phase_at", T.INT64, ["B"]),
                  h.make_tensor_value_info("sample_offset", T.INT64, ["B"])],
                 [f("audio", ["B", "N"]), f("phase_out", ["B", "F", H])], inits)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
m.ir_version = 8
onnx.checker.check_model(m)
onnx.save(m, out + "/vocoder_phase.onnx")
