package piper

import (
	"fmt"
	"os"

	"github.com/voxmux/voxmux/instance/onnxedit"
	"github.com/voxmux/voxmux/instance/ort"
	"google.golang.org/protobuf/encoding/protowire"
)

// piperSpeedInput is the graph input voxmux adds to a Piper voice: each row's speed, float32
// [B, 1, 1], by which the row's phoneme durations are divided after VITS rounds them to frames.
const piperSpeedInput = "voxmux_speed"

// piperWithSpeed returns the voice graph (an ONNX model in memory) with piperSpeedInput added, or
// nil when the graph does not have VITS's duration rounding (then the request's speed divides
// length_scale, as Piper does).
//
// Dividing length_scale by the speed is far from proportional: Piper's export computes
//
//	w_ceil = ceil(exp(logw) * x_mask * length_scale)
//
// and every phoneme id (half of them the pad id between phonemes) lasts at least one frame, so
// at speed 4 most ids still last a frame and the audio is only 2.07× shorter, at speed 2 1.65×
// (docs/piper.md, "Speed"). The rewritten graph keeps length_scale as the voice sets it and
// replaces w_ceil by the rounded durations divided by the speed, rounded so that they add up to
// the row's frames divided by the speed:
//
//	c = CumSum(w_ceil); w_ceil' = Round(c / speed) - Round((c - w_ceil) / speed)
//
// (c - w_ceil is CumSum's exclusive form). A phoneme may get no frame at a high speed; VITS's
// alignment (generate_path, a CumSum of the durations) takes that as it takes padding. At speed 1
// the durations are w_ceil exactly, so the audio is Piper's. Only the Ceil node's output is
// renamed and new nodes placed after it, so the graph stays in topological order; the rest of the
// file is kept byte for byte.
func piperWithSpeed(model []byte) ([]byte, error) {
	return onnxedit.EditGraph(model, func(graph []byte) ([]byte, error) {
		g, err := onnxedit.ParseGraph(graph)
		if err != nil {
			return nil, fmt.Errorf("not an ONNX model: %w", err)
		}
		ceil := vitsDurationRounding(g.Nodes)
		if ceil < 0 {
			return nil, nil
		}
		var out []byte
		i := 0 // node index
		err = onnxedit.EachRawField(graph, func(num protowire.Number, raw, v []byte) error {
			if num != 1 {
				out = append(out, raw...)
				return nil
			}
			if i != ceil {
				out = append(out, raw...)
				i++
				return nil
			}
			i++
			n, ceilOut, err := renameOutput(v, "voxmux_speed_ceil")
			if err != nil {
				return err
			}
			out = onnxedit.AppendMessage(out, 1, n)
			for _, nd := range speedNodes("voxmux_speed_ceil", ceilOut) {
				out = onnxedit.AppendMessage(out, 1, nd)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("not an ONNX model: %w", err)
		}
		out = onnxedit.AppendMessage(out, 5, onnxedit.Int64Scalar("voxmux_speed_axis", 2)) // initializer
		out = onnxedit.AppendMessage(out, 11, speedInputInfo())
		return out, nil
	})
}

// vitsDurationRounding finds VITS's w_ceil: the graph's one Ceil node whose output a CumSum
// (generate_path) reads. It returns the node's index, or -1 when there is none or more than one.
func vitsDurationRounding(nodes []onnxedit.Node) int {
	cumsum := map[string]bool{} // tensors a CumSum reads
	for _, nd := range nodes {
		if nd.Op == "CumSum" && len(nd.In) > 0 {
			cumsum[nd.In[0]] = true
		}
	}
	found := -1
	for i, nd := range nodes {
		if nd.Op == "Ceil" && len(nd.Out) == 1 && cumsum[nd.Out[0]] {
			if found >= 0 {
				return -1 // ambiguous: leave the graph as it is
			}
			found = i
		}
	}
	return found
}

// speedNodes compute the durations out from the rounded ones in, divided by piperSpeedInput
// along the phoneme axis (2 of [B, 1, T]) and rounded cumulatively.
func speedNodes(in, out string) [][]byte {
	const p = "voxmux_speed_"
	cumAttr := func(exclusive int64) [][]byte {
		if exclusive == 0 {
			return nil
		}
		return [][]byte{onnxedit.IntAttribute("exclusive", exclusive)}
	}
	return [][]byte{
		onnxedit.NodeProto(p+"cum", "CumSum", []string{in, p + "axis"}, p+"c", cumAttr(0)...),
		onnxedit.NodeProto(p+"cum_before", "CumSum", []string{in, p + "axis"}, p+"c0", cumAttr(1)...),
		onnxedit.NodeProto(p+"div", "Div", []string{p + "c", piperSpeedInput}, p+"cs", nil...),
		onnxedit.NodeProto(p+"div_before", "Div", []string{p + "c0", piperSpeedInput}, p+"c0s", nil...),
		onnxedit.NodeProto(p+"round", "Round", []string{p + "cs"}, p+"r", nil...),
		onnxedit.NodeProto(p+"round_before", "Round", []string{p + "c0s"}, p+"r0", nil...),
		onnxedit.NodeProto(p+"sub", "Sub", []string{p + "r", p + "r0"}, out, nil...),
	}
}

// renameOutput returns the NodeProto with its one output (field 2) named name, and the old name.
func renameOutput(node []byte, name string) ([]byte, string, error) {
	var out []byte
	var old string
	outs := 0
	err := onnxedit.EachRawField(node, func(num protowire.Number, raw, v []byte) error {
		if num == 2 && v != nil {
			old = string(v)
			outs++
			out = protowire.AppendTag(out, 2, protowire.BytesType)
			out = protowire.AppendString(out, name)
			return nil
		}
		out = append(out, raw...)
		return nil
	})
	if err == nil && outs != 1 {
		err = fmt.Errorf("the duration rounding node has %d outputs, want 1", outs)
	}
	return out, old, err
}

// speedInputInfo is piperSpeedInput's ValueInfoProto: float32 [batch, 1, 1].
func speedInputInfo() []byte {
	dim := func(value int64, param string) []byte {
		var d []byte
		if param != "" {
			d = protowire.AppendTag(d, 2, protowire.BytesType)
			return protowire.AppendString(d, param)
		}
		d = protowire.AppendTag(d, 1, protowire.VarintType)
		return protowire.AppendVarint(d, uint64(value))
	}
	var shape []byte
	for _, d := range [][]byte{dim(0, "batch"), dim(1, ""), dim(1, "")} {
		shape = onnxedit.AppendMessage(shape, 1, d)
	}
	var tensor []byte
	tensor = protowire.AppendTag(tensor, 1, protowire.VarintType)
	tensor = protowire.AppendVarint(tensor, ort.ONNXFloat)
	tensor = onnxedit.AppendMessage(tensor, 2, shape)
	typ := onnxedit.AppendMessage(nil, 1, tensor)
	var vi []byte
	vi = protowire.AppendTag(vi, 1, protowire.BytesType)
	vi = protowire.AppendString(vi, piperSpeedInput)
	return onnxedit.AppendMessage(vi, 2, typ)
}

// withSpeedInput returns the voice's graph (graph, or the file at path when graph is nil) with
// piperSpeedInput added, and whether it was; a graph without VITS's duration rounding is returned
// as it is.
func withSpeedInput(path string, graph []byte) ([]byte, bool, error) {
	if graph == nil {
		var err error
		if graph, err = os.ReadFile(path); err != nil {
			return nil, false, err
		}
	}
	g, err := piperWithSpeed(graph)
	if err != nil || g == nil {
		return graph, false, err
	}
	return g, true, nil
}
