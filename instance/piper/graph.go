package piper

import (
	"fmt"
	"os"

	"github.com/voxmux/voxmux/instance/onnxedit"
	"github.com/voxmux/voxmux/instance/ort"
)

// piperLengthOutput is the extra graph output voxmux adds to a Piper voice: each row's length in
// frames (VITS's y_lengths), so that a batched run's audio can be cut row by row.
const piperLengthOutput = "voxmux_frames"

// piperWithLengths returns the voice graph with y_lengths exposed as an output named
// piperLengthOutput, or nil when the graph does not have VITS's length computation (then the
// voice runs one sentence at a time).
//
// Piper's export (piper_train/vits/models.py infer) computes
//
//	w_ceil = ceil(exp(logw) * x_mask * length_scale)
//	y_lengths = clamp_min(sum(w_ceil, [1, 2]), 1).long()
//
// which ONNX has as Ceil → ReduceSum → Clip → Cast(int64): a [B] tensor, each row's frames; the
// audio of row i is its first y_lengths[i] × hop samples (hop = samples per frame: the output's
// length over the longest row's frames). The graph is rewritten in memory only: the output is
// appended to GraphProto.output (field 12) as a ValueInfoProto, the rest of the file is kept byte
// for byte, and the voice file on disk is not touched.
func piperWithLengths(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return onnxedit.EditGraph(data, func(graph []byte) ([]byte, error) {
		g, err := onnxedit.ParseGraph(graph)
		if err != nil {
			return nil, fmt.Errorf("not an ONNX model: %w", err)
		}
		name := vitsLengths(g.Nodes)
		if name == "" {
			return nil, nil
		}
		// An Identity node copies the lengths to the new output, so the original tensor keeps its name.
		out := onnxedit.AppendMessage(append([]byte(nil), graph...), 1, onnxedit.IdentityNode(name, piperLengthOutput))
		return onnxedit.AppendMessage(out, 12, onnxedit.ValueInfo(piperLengthOutput, ort.ONNXInt64, 1)), nil
	})
}

// vitsLengths finds the Cast(int64) output of Ceil → ReduceSum → Clip|Max → Cast among the
// graph's nodes; "" when there is no such chain, or more than one.
func vitsLengths(nodes []onnxedit.Node) string {
	consumers := map[string][]int{}
	for i, nd := range nodes {
		for _, in := range nd.In {
			consumers[in] = append(consumers[in], i)
		}
	}
	// next returns the single consumer of t with one of the ops, or -1.
	next := func(t string, ops ...string) int {
		found := -1
		for _, c := range consumers[t] {
			for _, op := range ops {
				if nodes[c].Op == op {
					if found >= 0 {
						return -1
					}
					found = c
				}
			}
		}
		return found
	}
	var match []string
	for _, nd := range nodes {
		if nd.Op != "Ceil" || len(nd.Out) != 1 {
			continue
		}
		s := next(nd.Out[0], "ReduceSum")
		if s < 0 {
			continue
		}
		c := next(nodes[s].Out[0], "Clip", "Max")
		if c < 0 {
			continue
		}
		k := next(nodes[c].Out[0], "Cast")
		if k < 0 || nodes[k].Attrs["to"].I != ort.ONNXInt64 {
			continue
		}
		match = append(match, nodes[k].Out[0])
	}
	if len(match) != 1 {
		return "" // none, or ambiguous: run one sentence at a time
	}
	return match[0]
}
