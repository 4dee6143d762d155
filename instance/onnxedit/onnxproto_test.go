package onnxedit

import (
	"slices"
	"testing"

	"github.com/voxmux/voxmux/instance/ort"
	"google.golang.org/protobuf/encoding/protowire"
)

// Small int64 tensors are read as values: initializers with raw_data or int64_data, and a
// Constant node's value attribute; a float tensor, or a long one, is not.
func TestParseInt64Constants(t *testing.T) {
	packed := func(name string, elem uint64, vals ...int64) []byte {
		var b, p []byte
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, elem)
		b = protowire.AppendTag(b, 8, protowire.BytesType)
		b = protowire.AppendString(b, name)
		for _, v := range vals {
			p = protowire.AppendVarint(p, uint64(v))
		}
		b = protowire.AppendTag(b, 7, protowire.BytesType)
		return protowire.AppendBytes(b, p)
	}
	var value []byte // the Constant's attribute: name "value", t (5)
	value = protowire.AppendTag(value, 1, protowire.BytesType)
	value = protowire.AppendString(value, "value")
	value = AppendMessage(value, 5, packed("", ort.ONNXInt64, 1, -2))
	var g []byte
	g = AppendMessage(g, 5, Int64Scalar("raw", -2))
	g = AppendMessage(g, 5, packed("list", ort.ONNXInt64, 0, 1, 2))
	g = AppendMessage(g, 5, packed("long", ort.ONNXInt64, make([]int64, 17)...))
	g = AppendMessage(g, 5, packed("float", ort.ONNXFloat))
	g = AppendMessage(g, 1, NodeProto("c", "Constant", nil, "c_out", value))
	parsed, err := ParseGraph(g)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]int64{"raw": {-2}, "list": {0, 1, 2}} {
		if got := parsed.Int64s[name]; !slices.Equal(got, want) {
			t.Errorf("initializer %s: %v, want %v", name, got, want)
		}
	}
	for _, name := range []string{"long", "float"} {
		if v, ok := parsed.Int64s[name]; ok {
			t.Errorf("initializer %s read as %v", name, v)
		}
	}
	if got := parsed.Nodes[0].Attrs["value"].Int64s; !slices.Equal(got, []int64{1, -2}) {
		t.Errorf("Constant's value: %v, want [1 -2]", got)
	}
}
