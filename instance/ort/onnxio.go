package ort

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"google.golang.org/protobuf/encoding/protowire"
)

// TensorInfo is one graph input or output as the ONNX file declares it.
type TensorInfo struct {
	Name     string
	ElemType int32 // onnx.TensorProto.DataType: 1 float32, 7 int64, 10 float16, ...
	Rank     int   // -1 when the file gives no shape
}

// ONNX TensorProto.DataType values used here.
const (
	ONNXFloat   = 1
	ONNXInt64   = 7
	ONNXFloat16 = 10
)

func ElemTypeName(t int32) string {
	switch t {
	case ONNXFloat:
		return "float32"
	case ONNXInt64:
		return "int64"
	case ONNXFloat16:
		return "float16"
	case 6:
		return "int32"
	case 11:
		return "float64"
	}
	return fmt.Sprintf("type %d", t)
}

// ReadGraphIO lists a graph's inputs (initializers left out) and outputs straight from the ONNX
// protobuf, without ONNX Runtime, so that every voice of a model can be checked against its
// .onnx.json at start-up for the cost of walking the file: the weights are skipped, not decoded.
// Field numbers are those of onnx.proto (ModelProto.graph = 7; GraphProto.initializer = 5,
// input = 11, output = 12; ValueInfoProto.name = 1, type = 2; TypeProto.tensor_type = 1;
// Tensor.elem_type = 1, shape = 2; TensorShapeProto.dim = 1; TensorProto.name = 8).
func ReadGraphIO(path string) (inputs, outputs []TensorInfo, err error) {
	data, unmap, err := MapFile(path)
	if err != nil {
		return nil, nil, err
	}
	defer unmap()
	var graph []byte
	if err := EachField(data, func(num protowire.Number, v []byte) error {
		if num == 7 {
			graph = v
		}
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("not an ONNX model: %w", err)
	}
	if graph == nil {
		return nil, nil, errors.New("not an ONNX model: no graph")
	}
	inits := map[string]bool{}
	var ins []TensorInfo
	err = EachField(graph, func(num protowire.Number, v []byte) error {
		switch num {
		case 5:
			return EachField(v, func(n protowire.Number, f []byte) error {
				if n == 8 {
					inits[string(f)] = true
				}
				return nil
			})
		case 11, 12:
			t, err := valueInfo(v)
			if err != nil {
				return err
			}
			if num == 11 {
				ins = append(ins, t)
			} else {
				outputs = append(outputs, t)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("not an ONNX model: %w", err)
	}
	for _, t := range ins {
		if !inits[t.Name] { // old exporters also list weights as inputs
			inputs = append(inputs, t)
		}
	}
	return inputs, outputs, nil
}

func valueInfo(b []byte) (TensorInfo, error) {
	t := TensorInfo{Rank: -1}
	err := EachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			t.Name = string(v)
		case 2: // TypeProto
			return EachField(v, func(n protowire.Number, tt []byte) error {
				if n != 1 { // not a tensor
					return nil
				}
				return EachFieldOrVarint(tt, func(n protowire.Number, f []byte, x uint64) error {
					switch n {
					case 1:
						t.ElemType = int32(x)
					case 2:
						t.Rank = 0
						return EachField(f, func(n protowire.Number, _ []byte) error {
							if n == 1 {
								t.Rank++
							}
							return nil
						})
					}
					return nil
				})
			})
		}
		return nil
	})
	return t, err
}

// EachField calls fn with every length-delimited field of a message; other fields are skipped.
func EachField(b []byte, fn func(protowire.Number, []byte) error) error {
	return EachFieldOrVarint(b, func(n protowire.Number, v []byte, _ uint64) error {
		if v == nil {
			return nil
		}
		return fn(n, v)
	})
}

// EachFieldOrVarint calls fn with every length-delimited field (v set) and varint field (x set).
func EachFieldOrVarint(b []byte, fn func(protowire.Number, []byte, uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			if v == nil {
				v = []byte{}
			}
			if err := fn(num, v, 0); err != nil {
				return err
			}
			b = b[m:]
		case protowire.VarintType:
			x, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			if err := fn(num, nil, x); err != nil {
				return err
			}
			b = b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			b = b[m:]
		}
	}
	return nil
}

// MapFile maps a file read-only: voices are tens of megabytes, and only their headers are read.
func MapFile(path string) ([]byte, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if st.Size() == 0 {
		return nil, nil, errors.New("empty file")
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("map %s: %w", path, err)
	}
	return data, func() { _ = syscall.Munmap(data) }, nil
}
