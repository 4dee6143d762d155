package onnxedit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/x448/float16"
	"google.golang.org/protobuf/encoding/protowire"
)

// The float16 conversion (Float16) runs a graph in float16, for the GPU's float16 kernels (Piper's
// decoder, docs/piper.md "Precision"; VoxCPM's VAE decoder, docs/voxcpm.md "Engine options"). Its
// inputs and outputs stay float32: a Cast to float16 follows each float input and a Cast to
// float32 precedes each float output, so the caller feeds and reads the session as before. Inside,
// every float32 weight and constant becomes float16 (rounded to nearest, a value beyond float16's
// range saturated to ±65504 and counted), Cast nodes to float32 cast to float16 instead, and
// value_info (shape hints, whose types would be stale) is dropped for ONNX Runtime to infer again.

// f16Max is float16's largest finite value.
const f16Max = 65504

// Float16Stats tells what a conversion did to the weights.
type Float16Stats struct {
	Weights   int     // float values converted (initializers and constants)
	Saturated int     // of which beyond float16's range, set to ±65504
	Largest   float64 // the largest magnitude among them
}

// tensorMode is what convertTensor does to a float32 tensor.
type tensorMode int

const (
	toFloat16    tensorMode = iota // a float16 tensor of the rounded values
	roundFloat16                   // a float32 tensor of the values rounded through float16
)

// Float16 is model (serialized) converted to float16. ops tells the ops the caller knows to run in
// float16 on its provider: a graph with another op is refused, naming it, rather than converted
// untried.
func Float16(model []byte, ops func(op string) bool) ([]byte, Float16Stats, error) {
	var st Float16Stats
	out, err := EditGraph(model, func(graph []byte) ([]byte, error) {
		return graphFloat16(graph, ops, &st)
	})
	return out, st, err
}

// RoundedFloat16 is model with its float32 weights and constants rounded through float16 but kept
// float32: the float16 graph's weights at float32's compute, which bounds the part of float16's
// error that comes from the weights alone.
func RoundedFloat16(model []byte) ([]byte, Float16Stats, error) {
	var st Float16Stats
	out, err := EditGraph(model, func(graph []byte) ([]byte, error) {
		var b []byte
		err := EachRawField(graph, func(num protowire.Number, raw, v []byte) error {
			switch num {
			case 1:
				n, err := rewriteNode(v, nil, roundFloat16, &st)
				if err != nil {
					return err
				}
				b = AppendMessage(b, 1, n)
			case 5:
				t, err := convertTensor(v, roundFloat16, &st)
				if err != nil {
					return err
				}
				b = AppendMessage(b, 5, t)
			default:
				b = append(b, raw...)
			}
			return nil
		})
		return b, err
	})
	return out, st, err
}

func graphFloat16(graph []byte, ops func(string) bool, st *Float16Stats) ([]byte, error) {
	g, err := ParseGraph(graph)
	if err != nil {
		return nil, fmt.Errorf("not an ONNX model: %w", err)
	}
	for _, n := range g.Nodes {
		if !ops(n.Op) {
			return nil, fmt.Errorf("the graph has a %s node, which its float16 conversion does not take", n.Op)
		}
	}
	// The float inputs and outputs, each given a float16 name inside the graph.
	rename := map[string]string{}
	var inCasts, outCasts [][]byte
	inputs := map[string]bool{}
	err = EachRawField(graph, func(num protowire.Number, _, v []byte) error {
		if num != 11 && num != 12 {
			return nil
		}
		name, elem, err := ValueInfoType(v)
		if err != nil {
			return err
		}
		if num == 11 {
			inputs[name] = true
		}
		if _, weight := g.Dims[name]; elem != ort.ONNXFloat || weight {
			return nil // an integer input, or a weight listed as an input
		}
		half := name + "_voxmux_f16"
		if num == 11 {
			inCasts = append(inCasts, NodeProto(half+"_cast", "Cast", []string{name}, half, IntAttribute("to", ort.ONNXFloat16)))
		} else {
			if inputs[name] {
				return fmt.Errorf("graph input %q is an output too", name)
			}
			outCasts = append(outCasts, NodeProto(name+"_voxmux_f32_cast", "Cast", []string{half}, name, IntAttribute("to", ort.ONNXFloat)))
		}
		rename[name] = half
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []byte
	nodes := 0
	for _, f := range g.Fields {
		switch f.Num {
		case 1:
			if nodes == 0 {
				for _, c := range inCasts {
					out = AppendMessage(out, 1, c)
				}
			}
			nodes++
			v, _ := protowire.ConsumeBytes(f.Raw[protowire.SizeTag(1):])
			n, err := rewriteNode(v, rename, toFloat16, st)
			if err != nil {
				return nil, fmt.Errorf("%s node %v: %w", g.Nodes[f.Node].Op, g.Nodes[f.Node].Out, err)
			}
			out = AppendMessage(out, 1, n)
			if nodes == len(g.Nodes) {
				for _, c := range outCasts {
					out = AppendMessage(out, 1, c)
				}
			}
		case 5:
			v, _ := protowire.ConsumeBytes(f.Raw[protowire.SizeTag(5):])
			t, err := convertTensor(v, toFloat16, st)
			if err != nil {
				return nil, fmt.Errorf("initializer %s: %w", f.Name, err)
			}
			out = AppendMessage(out, 5, t)
		case 13:
			// value_info: dropped, ONNX Runtime infers the types anew.
		case 15:
			return nil, errors.New("the graph has sparse initializers, which the float16 conversion does not convert")
		default:
			out = append(out, f.Raw...)
		}
	}
	return out, nil
}

// valueInfoType reads a ValueInfoProto's name and tensor element type (0 for a non-tensor).
func ValueInfoType(v []byte) (name string, elem int32, err error) {
	err = ort.EachField(v, func(n protowire.Number, b []byte) error {
		switch n {
		case 1:
			name = string(b)
		case 2: // TypeProto: tensor_type 1 → elem_type 1
			return ort.EachField(b, func(n protowire.Number, tt []byte) error {
				if n != 1 {
					return nil
				}
				return ort.EachFieldOrVarint(tt, func(n protowire.Number, s []byte, x uint64) error {
					if n == 1 && s == nil {
						elem = int32(x)
					}
					return nil
				})
			})
		}
		return nil
	})
	return name, elem, err
}

// rewriteNode re-encodes a NodeProto with its inputs and outputs renamed by rename, a Cast to
// float32 casting to float16 (toFloat16), and float tensors in its attributes converted by mode.
func rewriteNode(v []byte, rename map[string]string, mode tensorMode, st *Float16Stats) ([]byte, error) {
	op, err := stringField(v, 4)
	if err != nil {
		return nil, err
	}
	var out []byte
	err = EachRawField(v, func(num protowire.Number, raw, b []byte) error {
		switch {
		case (num == 1 || num == 2) && b != nil && rename[string(b)] != "":
			out = protowire.AppendTag(out, num, protowire.BytesType)
			out = protowire.AppendString(out, rename[string(b)])
		case num == 5 && b != nil:
			a, err := rewriteAttr(op, b, mode, st)
			if err != nil {
				return err
			}
			out = AppendMessage(out, 5, a)
		default:
			out = append(out, raw...)
		}
		return nil
	})
	return out, err
}

// stringField is the last value of field num of message v, a string.
func stringField(v []byte, num protowire.Number) (s string, err error) {
	err = ort.EachField(v, func(n protowire.Number, b []byte) error {
		if n == num {
			s = string(b)
		}
		return nil
	})
	return s, err
}

// rewriteAttr re-encodes an AttributeProto (name 1, i 3, t 5, g 6, tensors 10, graphs 11,
// sparse_tensor 22, sparse_tensors 23): Cast's to FLOAT becomes FLOAT16, float tensors are
// converted by mode.
func rewriteAttr(op string, v []byte, mode tensorMode, st *Float16Stats) ([]byte, error) {
	name, err := stringField(v, 1)
	if err != nil {
		return nil, err
	}
	var out []byte
	err = EachRawField(v, func(num protowire.Number, raw, b []byte) error {
		switch {
		case num == 3 && b == nil && op == "Cast" && name == "to" && mode == toFloat16:
			x, _ := protowire.ConsumeVarint(raw[protowire.SizeTag(3):])
			if x == ort.ONNXFloat {
				x = ort.ONNXFloat16
			}
			out = protowire.AppendTag(out, 3, protowire.VarintType)
			out = protowire.AppendVarint(out, x)
		case (num == 5 || num == 10) && b != nil:
			t, err := convertTensor(b, mode, st)
			if err != nil {
				return fmt.Errorf("attribute %s: %w", name, err)
			}
			out = AppendMessage(out, num, t)
		case (num == 6 || num == 11 || num == 22 || num == 23) && b != nil:
			return fmt.Errorf("attribute %s holds a subgraph or sparse tensor, which the float16 conversion does not convert", name)
		default:
			out = append(out, raw...)
		}
		return nil
	})
	return out, err
}

// convertTensor converts a float32 TensorProto (dims 1, data_type 2, float_data 4, name 8,
// raw_data 9, data_location 14) by mode; a tensor of another type is returned as it is.
func convertTensor(v []byte, mode tensorMode, st *Float16Stats) ([]byte, error) {
	var (
		typ      uint64
		raw      []byte
		floats   []float32
		external bool
	)
	err := ort.EachFieldOrVarint(v, func(n protowire.Number, b []byte, x uint64) error {
		switch {
		case n == 2 && b == nil:
			typ = x
		case n == 9 && b != nil:
			raw = b
		case n == 14 && b == nil:
			external = x == 1
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if typ != ort.ONNXFloat {
		return v, nil
	}
	if external {
		return nil, errors.New("its data is in an external file, which the float16 conversion does not convert")
	}
	// float_data, packed (or not, as proto2 writers may): fixed32 fields are skipped by
	// EachFieldOrVarint, so they are read here.
	if err := EachRawField(v, func(num protowire.Number, r, b []byte) error {
		if num != 4 {
			return nil
		}
		if b != nil {
			for len(b) >= 4 {
				floats = append(floats, math.Float32frombits(binary.LittleEndian.Uint32(b)))
				b = b[4:]
			}
			return nil
		}
		x, _ := protowire.ConsumeFixed32(r[protowire.SizeTag(4):])
		floats = append(floats, math.Float32frombits(x))
		return nil
	}); err != nil {
		return nil, err
	}
	if raw != nil {
		if len(raw)%4 != 0 {
			return nil, fmt.Errorf("float32 raw_data of %d bytes", len(raw))
		}
		for ; len(raw) >= 4; raw = raw[4:] {
			floats = append(floats, math.Float32frombits(binary.LittleEndian.Uint32(raw)))
		}
	}
	data := make([]byte, 0, 4*len(floats))
	for _, x := range floats {
		st.Weights++
		st.Largest = max(st.Largest, math.Abs(float64(x)))
		if x > f16Max || x < -f16Max {
			st.Saturated++
			x = float32(math.Copysign(f16Max, float64(x)))
		}
		h := float16.Fromfloat32(x)
		if mode == toFloat16 {
			data = binary.LittleEndian.AppendUint16(data, h.Bits())
		} else {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(h.Float32()))
		}
	}
	var out []byte
	err = EachRawField(v, func(num protowire.Number, r, _ []byte) error {
		switch num {
		case 2:
			out = protowire.AppendTag(out, 2, protowire.VarintType)
			if mode == toFloat16 {
				out = protowire.AppendVarint(out, ort.ONNXFloat16)
			} else {
				out = protowire.AppendVarint(out, ort.ONNXFloat)
			}
		case 4, 9:
			// replaced by raw_data below
		default:
			out = append(out, r...)
		}
		return nil
	})
	out = protowire.AppendTag(out, 9, protowire.BytesType)
	return protowire.AppendBytes(out, data), err
}
