package piper

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

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
	return editGraph(model, func(graph []byte) ([]byte, error) {
		ceil, err := vitsDurationRounding(graph)
		if err != nil || ceil < 0 {
			return nil, err
		}
		var out []byte
		i := 0 // node index
		err = eachRawField(graph, func(num protowire.Number, raw, v []byte) error {
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
			out = appendMessage(out, 1, n)
			for _, nd := range speedNodes("voxmux_speed_ceil", ceilOut) {
				out = appendMessage(out, 1, nd)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("not an ONNX model: %w", err)
		}
		out = appendMessage(out, 5, int64Scalar("voxmux_speed_axis", 2)) // initializer
		out = appendMessage(out, 11, speedInputInfo())
		return out, nil
	})
}

// vitsDurationRounding finds VITS's w_ceil: the graph's one Ceil node whose output a CumSum
// (generate_path) reads. It returns the node's index, or -1 when there is none or more than one.
func vitsDurationRounding(graph []byte) (int, error) {
	type node struct {
		in  []string
		out string
		op  string
	}
	var nodes []node
	err := ort.EachField(graph, func(num protowire.Number, v []byte) error {
		if num != 1 {
			return nil
		}
		var nd node
		err := ort.EachField(v, func(n protowire.Number, f []byte) error {
			switch n {
			case 1:
				nd.in = append(nd.in, string(f))
			case 2:
				nd.out = string(f)
			case 4:
				nd.op = string(f)
			}
			return nil
		})
		nodes = append(nodes, nd)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("not an ONNX model: %w", err)
	}
	cumsum := map[string]bool{} // tensors a CumSum reads
	for _, nd := range nodes {
		if nd.op == "CumSum" && len(nd.in) > 0 {
			cumsum[nd.in[0]] = true
		}
	}
	found := -1
	for i, nd := range nodes {
		if nd.op == "Ceil" && cumsum[nd.out] {
			if found >= 0 {
				return -1, nil // ambiguous: leave the graph as it is
			}
			found = i
		}
	}
	return found, nil
}

// speedNodes compute the durations out from the rounded ones in, divided by piperSpeedInput
// along the phoneme axis (2 of [B, 1, T]) and rounded cumulatively.
func speedNodes(in, out string) [][]byte {
	const p = "voxmux_speed_"
	cumAttr := func(exclusive int64) [][]byte {
		if exclusive == 0 {
			return nil
		}
		return [][]byte{intAttribute("exclusive", exclusive)}
	}
	return [][]byte{
		nodeProto(p+"cum", "CumSum", []string{in, p + "axis"}, p+"c", cumAttr(0)...),
		nodeProto(p+"cum_before", "CumSum", []string{in, p + "axis"}, p+"c0", cumAttr(1)...),
		nodeProto(p+"div", "Div", []string{p + "c", piperSpeedInput}, p+"cs", nil...),
		nodeProto(p+"div_before", "Div", []string{p + "c0", piperSpeedInput}, p+"c0s", nil...),
		nodeProto(p+"round", "Round", []string{p + "cs"}, p+"r", nil...),
		nodeProto(p+"round_before", "Round", []string{p + "c0s"}, p+"r0", nil...),
		nodeProto(p+"sub", "Sub", []string{p + "r", p + "r0"}, out, nil...),
	}
}

// editGraph replaces the model's graph (ModelProto field 7) by what edit makes of it; nil from
// edit leaves the model as it is and returns nil.
func editGraph(model []byte, edit func(graph []byte) ([]byte, error)) ([]byte, error) {
	var graph []byte
	var at, end int
	pos := 0
	err := eachRawField(model, func(num protowire.Number, raw, v []byte) error {
		if num == 7 && v != nil {
			graph, at, end = v, pos, pos+len(raw)
		}
		pos += len(raw)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("not an ONNX model: %w", err)
	}
	if graph == nil {
		return nil, errors.New("not an ONNX model: no graph")
	}
	g, err := edit(graph)
	if err != nil || g == nil {
		return nil, err
	}
	out := make([]byte, 0, len(model)+len(g)-len(graph)+16)
	out = append(out, model[:at]...)
	out = appendMessage(out, 7, g)
	return append(out, model[end:]...), nil
}

// eachRawField calls fn with every field of a message: its bytes as encoded (tag included) and,
// for a length-delimited field, its value.
func eachRawField(b []byte, fn func(num protowire.Number, raw, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		var v []byte
		if typ == protowire.BytesType {
			v, _ = protowire.ConsumeBytes(b[n:])
			if v == nil {
				v = []byte{}
			}
		}
		if err := fn(num, b[:n+m], v); err != nil {
			return err
		}
		b = b[n+m:]
	}
	return nil
}

// renameOutput returns the NodeProto with its one output (field 2) named name, and the old name.
func renameOutput(node []byte, name string) ([]byte, string, error) {
	var out []byte
	var old string
	outs := 0
	err := eachRawField(node, func(num protowire.Number, raw, v []byte) error {
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

func appendMessage(b []byte, num protowire.Number, msg []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, msg)
}

// nodeProto encodes a NodeProto: input 1, output 2, name 3, op_type 4, attribute 5.
func nodeProto(name, op string, inputs []string, output string, attrs ...[]byte) []byte {
	var b []byte
	for _, in := range inputs {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, in)
	}
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, output)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendString(b, op)
	for _, a := range attrs {
		b = appendMessage(b, 5, a)
	}
	return b
}

// intAttribute encodes an AttributeProto of type INT: name 1, i 3, type 20 (INT = 2).
func intAttribute(name string, v int64) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(v))
	b = protowire.AppendTag(b, 20, protowire.VarintType)
	return protowire.AppendVarint(b, 2)
}

// int64Scalar encodes a 0-d int64 TensorProto: data_type 2, name 8, raw_data 9.
func int64Scalar(name string, v int64) []byte {
	var b []byte
	b = protowire.AppendTag(b, 2, protowire.VarintType)
	b = protowire.AppendVarint(b, ort.ONNXInt64)
	b = protowire.AppendTag(b, 8, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 9, protowire.BytesType)
	return protowire.AppendBytes(b, binary.LittleEndian.AppendUint64(nil, uint64(v)))
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
		shape = appendMessage(shape, 1, d)
	}
	var tensor []byte
	tensor = protowire.AppendTag(tensor, 1, protowire.VarintType)
	tensor = protowire.AppendVarint(tensor, ort.ONNXFloat)
	tensor = appendMessage(tensor, 2, shape)
	typ := appendMessage(nil, 1, tensor)
	var vi []byte
	vi = protowire.AppendTag(vi, 1, protowire.BytesType)
	vi = protowire.AppendString(vi, piperSpeedInput)
	return appendMessage(vi, 2, typ)
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
