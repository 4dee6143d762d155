// Package onnxedit reads and edits ONNX models in memory, field by field (google.golang.org/
// protobuf's wire format; voxmux carries no generated ONNX types): the model families cut, extend
// and convert their graphs with it, every field an edit does not change kept byte for byte. It
// converts a graph to float16 too (Float16), its inputs and outputs staying float32.
package onnxedit

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/voxmux/voxmux/instance/ort"
	"google.golang.org/protobuf/encoding/protowire"
)

// Node is one NodeProto of a graph.
type Node struct {
	Raw     []byte // the whole field, tag included
	In, Out []string
	Op      string
	Attrs   map[string]Attr
}

// Attr is what voxmux reads of an AttributeProto.
type Attr struct {
	I     int64
	Ints  []int64
	S     string
	Graph bool // holds a subgraph (If, Loop, Scan): its outer-scope inputs are not listed
	// Int64s is the values of an int64 tensor attribute (a Constant's value); nil for another type.
	Int64s []int64
}

// Graph is a GraphProto read field by field, each field's bytes kept for re-encoding.
type Graph struct {
	Fields []Field
	Nodes  []Node
	Dims   map[string][]int64 // initializer name → dims
	// Int64s holds the values of the int64 initializers of at most 16 elements (axes, shapes).
	Int64s map[string][]int64
	Inputs map[string]bool // the graph's inputs, initializers listed as inputs left out
}

// Field is one field of a GraphProto.
type Field struct {
	Num  protowire.Number
	Raw  []byte // tag and value
	Name string // of an initializer, input, output or value_info
	Node int    // index into Nodes, for field 1
}

// ModelGraph finds the GraphProto (field 7) of a ModelProto: its bytes and where the field starts
// and ends in data.
func ModelGraph(data []byte) (graph []byte, at, end int, err error) {
	pos := 0
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, 0, 0, fmt.Errorf("not an ONNX model: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, 0, 0, fmt.Errorf("not an ONNX model: %w", protowire.ParseError(m))
		}
		if num == 7 && typ == protowire.BytesType {
			graph, _ = protowire.ConsumeBytes(b[n:])
			at, end = pos, pos+n+m
		}
		b = b[n+m:]
		pos += n + m
	}
	if graph == nil {
		return nil, 0, 0, errors.New("not an ONNX model: no graph")
	}
	return graph, at, end, nil
}

// ReplaceGraph is data with its graph field [at, end) replaced by graph.
func ReplaceGraph(data []byte, at, end int, graph []byte) []byte {
	out := make([]byte, 0, at+len(graph)+len(data)-end+16)
	out = AppendMessage(append(out, data[:at]...), 7, graph)
	return append(out, data[end:]...)
}

func ParseGraph(b []byte) (*Graph, error) {
	g := &Graph{Dims: map[string][]int64{}, Int64s: map[string][]int64{}, Inputs: map[string]bool{}}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		f := Field{Num: num, Raw: b[:n+m]}
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n:])
			var err error
			switch num {
			case 1:
				var nd Node
				nd, err = ParseNode(v)
				nd.Raw = f.Raw
				f.Node = len(g.Nodes)
				g.Nodes = append(g.Nodes, nd)
			case 5: // TensorProto: dims 1, name 8
				var dims []int64
				err = ort.EachFieldOrVarint(v, func(k protowire.Number, s []byte, x uint64) error {
					switch {
					case k == 8 && s != nil:
						f.Name = string(s)
					case k == 1 && s == nil:
						dims = append(dims, int64(x))
					case k == 1 && s != nil:
						dims = append(dims, Packed(s)...)
					}
					return nil
				})
				g.Dims[f.Name] = dims
				if err == nil && len(v) < 512 {
					var vals []int64
					if vals, err = int64Tensor(v); vals != nil && len(vals) <= 16 {
						g.Int64s[f.Name] = vals
					}
				}
			case 11, 12, 13: // ValueInfoProto: name 1
				err = ort.EachField(v, func(k protowire.Number, s []byte) error {
					if k == 1 {
						f.Name = string(s)
					}
					return nil
				})
				if num == 11 {
					g.Inputs[f.Name] = true
				}
			}
			if err != nil {
				return nil, err
			}
		}
		g.Fields = append(g.Fields, f)
		b = b[n+m:]
	}
	for name := range g.Dims {
		delete(g.Inputs, name) // an initializer listed as an input too (IR < 4) is a weight
	}
	return g, nil
}

func ParseNode(v []byte) (Node, error) {
	nd := Node{Attrs: map[string]Attr{}}
	err := ort.EachField(v, func(n protowire.Number, f []byte) error {
		switch n {
		case 1:
			nd.In = append(nd.In, string(f))
		case 2:
			nd.Out = append(nd.Out, string(f))
		case 4:
			nd.Op = string(f)
		case 5: // AttributeProto: name 1, i 3, s 4, g 6, ints 8, graphs 11
			var name string
			var a Attr
			err := ort.EachFieldOrVarint(f, func(k protowire.Number, b []byte, x uint64) error {
				switch {
				case k == 1 && b != nil:
					name = string(b)
				case k == 3 && b == nil:
					a.I = int64(x)
				case k == 4 && b != nil:
					a.S = string(b)
				case (k == 6 || k == 11) && b != nil:
					a.Graph = true
				case k == 5 && b != nil:
					v, err := int64Tensor(b)
					if err != nil {
						return err
					}
					a.Int64s = v
				case k == 8 && b == nil:
					a.Ints = append(a.Ints, int64(x))
				case k == 8 && b != nil:
					a.Ints = append(a.Ints, Packed(b)...)
				}
				return nil
			})
			nd.Attrs[name] = a
			return err
		}
		return nil
	})
	return nd, err
}

// int64Tensor reads a TensorProto's values when its type is int64 (data_type 2 = 7; int64_data 7,
// packed or not; raw_data 9, little-endian); nil for another type.
func int64Tensor(b []byte) ([]int64, error) {
	var elem uint64
	var vals []int64
	var raw []byte
	err := ort.EachFieldOrVarint(b, func(k protowire.Number, s []byte, x uint64) error {
		switch {
		case k == 2 && s == nil:
			elem = x
		case k == 7 && s == nil:
			vals = append(vals, int64(x))
		case k == 7 && s != nil:
			vals = append(vals, Packed(s)...)
		case k == 9 && s != nil:
			raw = s
		}
		return nil
	})
	if err != nil || elem != uint64(ort.ONNXInt64) {
		return nil, err
	}
	if raw != nil {
		if len(raw)%8 != 0 {
			return nil, fmt.Errorf("int64 raw_data of %d bytes", len(raw))
		}
		vals = make([]int64, len(raw)/8)
		for i := range vals {
			vals[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]))
		}
	}
	if vals == nil {
		vals = []int64{}
	}
	return vals, nil
}

// Packed decodes a packed repeated varint field.
func Packed(b []byte) []int64 {
	var out []int64
	for len(b) > 0 {
		x, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return out
		}
		out = append(out, int64(x))
		b = b[n:]
	}
	return out
}

// ValueInfo is a ValueInfoProto: a tensor of elemType and rank dims of unknown size.
func ValueInfo(name string, elemType int32, rank int) []byte {
	var shape []byte
	for i := range rank {
		var dim []byte
		dim = protowire.AppendTag(dim, 2, protowire.BytesType) // dim_param
		dim = protowire.AppendString(dim, fmt.Sprintf("%s_%d", name, i))
		shape = protowire.AppendTag(shape, 1, protowire.BytesType)
		shape = protowire.AppendBytes(shape, dim)
	}
	var tensor []byte
	tensor = protowire.AppendTag(tensor, 1, protowire.VarintType)
	tensor = protowire.AppendVarint(tensor, uint64(elemType))
	tensor = protowire.AppendTag(tensor, 2, protowire.BytesType)
	tensor = protowire.AppendBytes(tensor, shape)
	var typ []byte
	typ = protowire.AppendTag(typ, 1, protowire.BytesType)
	typ = protowire.AppendBytes(typ, tensor)
	var vi []byte
	vi = protowire.AppendTag(vi, 1, protowire.BytesType)
	vi = protowire.AppendString(vi, name)
	vi = protowire.AppendTag(vi, 2, protowire.BytesType)
	return protowire.AppendBytes(vi, typ)
}

// IdentityNode is a NodeProto copying in to out.
func IdentityNode(in, out string) []byte {
	return NodeProto(out+"_identity", "Identity", []string{in}, out)
}

// EditGraph replaces the model's graph (ModelProto field 7) by what edit makes of it; nil from
// edit leaves the model as it is and returns nil.
func EditGraph(model []byte, edit func(graph []byte) ([]byte, error)) ([]byte, error) {
	graph, at, end, err := ModelGraph(model)
	if err != nil {
		return nil, err
	}
	g, err := edit(graph)
	if err != nil || g == nil {
		return nil, err
	}
	return ReplaceGraph(model, at, end, g), nil
}

// EachRawField calls fn with every field of a message: its bytes as encoded (tag included) and,
// for a length-delimited field, its value.
func EachRawField(b []byte, fn func(num protowire.Number, raw, v []byte) error) error {
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

func AppendMessage(b []byte, num protowire.Number, msg []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, msg)
}

// NodeProto encodes a NodeProto: input 1, output 2, name 3, op_type 4, attribute 5.
func NodeProto(name, op string, inputs []string, output string, attrs ...[]byte) []byte {
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
		b = AppendMessage(b, 5, a)
	}
	return b
}

// IntAttribute encodes an AttributeProto of type INT: name 1, i 3, type 20 (INT = 2).
func IntAttribute(name string, v int64) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(v))
	b = protowire.AppendTag(b, 20, protowire.VarintType)
	return protowire.AppendVarint(b, 2)
}

// Int64Scalar encodes a 0-d int64 TensorProto: data_type 2, name 8, raw_data 9.
func Int64Scalar(name string, v int64) []byte {
	var b []byte
	b = protowire.AppendTag(b, 2, protowire.VarintType)
	b = protowire.AppendVarint(b, ort.ONNXInt64)
	b = protowire.AppendTag(b, 8, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 9, protowire.BytesType)
	return protowire.AppendBytes(b, binary.LittleEndian.AppendUint64(nil, uint64(v)))
}
