package onnxedit

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/instance/ort"
	"google.golang.org/protobuf/encoding/protowire"
)

// The conversion of one tensor, one Cast and a refused op, on graphs made here: float_data and
// raw_data both convert, a value beyond float16's range saturates and is counted, an int64 tensor
// and a Cast to int64 are kept, a Cast to float32 casts to float16; external data and an op the
// conversion does not know are refused, naming what.
func TestFloat16Convert(t *testing.T) {
	tensor := func(typ uint64, name string, data func([]byte) []byte) []byte {
		var b []byte
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, 3)
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, typ)
		b = protowire.AppendTag(b, 8, protowire.BytesType)
		b = protowire.AppendString(b, name)
		return data(b)
	}
	floatData := func(b []byte) []byte { // packed float_data: 1, 1e5, -1e-3
		var p []byte
		for _, x := range []float32{1, 1e5, -1e-3} {
			p = binary.LittleEndian.AppendUint32(p, math.Float32bits(x))
		}
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		return protowire.AppendBytes(b, p)
	}
	rawData := func(b []byte) []byte { // raw_data: 0.1, -70000, 3
		var p []byte
		for _, x := range []float32{0.1, -70000, 3} {
			p = binary.LittleEndian.AppendUint32(p, math.Float32bits(x))
		}
		b = protowire.AppendTag(b, 9, protowire.BytesType)
		return protowire.AppendBytes(b, p)
	}
	var st Float16Stats
	for _, c := range []struct {
		data func([]byte) []byte
		want []uint16
	}{{floatData, []uint16{0x3c00, 0x7bff, 0x9419}}, {rawData, []uint16{0x2e66, 0xfbff, 0x4200}}} {
		out, err := convertTensor(tensor(ort.ONNXFloat, "w", c.data), toFloat16, &st)
		if err != nil {
			t.Fatal(err)
		}
		var (
			typ  uint64
			name string
			got  []uint16
		)
		if err := ort.EachFieldOrVarint(out, func(n protowire.Number, b []byte, x uint64) error {
			switch {
			case n == 2 && b == nil:
				typ = x
			case n == 8:
				name = string(b)
			case n == 9:
				for ; len(b) >= 2; b = b[2:] {
					got = append(got, binary.LittleEndian.Uint16(b))
				}
			case n == 4:
				t.Errorf("converted tensor has float_data")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if typ != ort.ONNXFloat16 || name != "w" || fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("converted: type %d, name %q, bits %04x; want float16 w %04x", typ, name, got, c.want)
		}
	}
	if st.Weights != 6 || st.Saturated != 2 || st.Largest != 1e5 {
		t.Errorf("stats %+v, want 6 weights, 2 saturated, the largest 1e5", st)
	}
	ints := tensor(ort.ONNXInt64, "axes", func(b []byte) []byte {
		b = protowire.AppendTag(b, 9, protowire.BytesType)
		return protowire.AppendBytes(b, make([]byte, 24))
	})
	if out, err := convertTensor(ints, toFloat16, &st); err != nil || string(out) != string(ints) {
		t.Errorf("int64 tensor: changed (%v)", err)
	}
	ext := tensor(ort.ONNXFloat, "w", func(b []byte) []byte {
		b = protowire.AppendTag(b, 14, protowire.VarintType)
		return protowire.AppendVarint(b, 1)
	})
	if _, err := convertTensor(ext, toFloat16, &st); err == nil || !strings.Contains(err.Error(), "external") {
		t.Errorf("external data: %v", err)
	}
	for to, want := range map[int64]int64{ort.ONNXFloat: ort.ONNXFloat16, ort.ONNXInt64: ort.ONNXInt64} {
		n, err := rewriteNode(NodeProto("c", "Cast", []string{"x"}, "y", IntAttribute("to", to)), map[string]string{"x": "x16"}, toFloat16, &st)
		if err != nil {
			t.Fatal(err)
		}
		nd, err := ParseNode(n)
		if err != nil || nd.Attrs["to"].I != want || nd.In[0] != "x16" || nd.Out[0] != "y" {
			t.Errorf("Cast to %d: %+v %v, want to %d reading x16", to, nd, err, want)
		}
	}
	var graph []byte
	graph = AppendMessage(graph, 1, NodeProto("r", "Resize", []string{"x", "", "scales"}, "y"))
	if _, err := graphFloat16(graph, func(op string) bool { return op == "Conv" }, &st); err == nil || !strings.Contains(err.Error(), "Resize") {
		t.Errorf("a Resize node: %v", err)
	}
}
