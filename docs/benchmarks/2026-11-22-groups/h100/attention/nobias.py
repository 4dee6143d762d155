# Session 13's timing experiment: copies an export (argv[1]) to argv[2] with the DiT's attention
# bias removed from every Attention node, so that ONNX Runtime may pick flash attention; the other
# files are linked. For timing only: padded frames are then attended, so results differ wherever a
# batch pads.
import os, sys, shutil, onnx
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
for f in os.listdir(src):
    p = os.path.join(src, f)
    if f in ("flow_step.onnx", "flow_estimator.onnx"):
        m = onnx.load(p)
        n = 0
        for node in m.graph.node:
            if node.op_type in ("Attention", "MultiHeadAttention") and len(node.input) >= 6 and node.input[5]:
                node.input[5] = ""
                n += 1
            while node.op_type in ("Attention", "MultiHeadAttention") and len(node.input) and node.input[-1] == "":
                del node.input[-1]
        onnx.save(m, os.path.join(dst, f))
        print(f, "attention nodes without bias:", n)
    elif not os.path.exists(os.path.join(dst, f)):
        os.symlink(p, os.path.join(dst, f))
