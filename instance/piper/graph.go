package piper

import (
	"errors"
	"fmt"
	"os"

	"github.com/voxmux/voxmux/instance/ort"
	"google.golang.org/protobuf/encoding/protowire"
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
	var graph []byte
	var graphAt, graphEnd int
	pos := 0
	// The top-level fields are walked by hand to know where the graph field starts and ends.
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("not an ONNX model: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, fmt.Errorf("not an ONNX model: %w", protowire.ParseError(m))
		}
		if num == 7 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n:])
			graph, graphAt, graphEnd = v, pos, pos+n+m
		}
		b = b[n+m:]
		pos += n + m
	}
	if graph == nil {
		return nil, errors.New("not an ONNX model: no graph")
	}
	name, err := vitsLengths(graph)
	if err != nil || name == "" {
		return nil, err
	}
	// ValueInfoProto{name: piperLengthOutput, type: TypeProto{tensor_type: {elem_type: int64}}},
	// produced by an Identity node (NodeProto field 1 input, 2 output, 3 name, 4 op_type) so the
	// original tensor keeps its name.
	var node []byte
	node = protowire.AppendTag(node, 1, protowire.BytesType)
	node = protowire.AppendString(node, name)
	node = protowire.AppendTag(node, 2, protowire.BytesType)
	node = protowire.AppendString(node, piperLengthOutput)
	node = protowire.AppendTag(node, 3, protowire.BytesType)
	node = protowire.AppendString(node, "voxmux_frames_identity")
	node = protowire.AppendTag(node, 4, protowire.BytesType)
	node = protowire.AppendString(node, "Identity")
	var tensorType []byte
	tensorType = protowire.AppendTag(tensorType, 1, protowire.VarintType)
	tensorType = protowire.AppendVarint(tensorType, ort.ONNXInt64)
	var typeProto []byte
	typeProto = protowire.AppendTag(typeProto, 1, protowire.BytesType)
	typeProto = protowire.AppendBytes(typeProto, tensorType)
	var vi []byte
	vi = protowire.AppendTag(vi, 1, protowire.BytesType)
	vi = protowire.AppendString(vi, piperLengthOutput)
	vi = protowire.AppendTag(vi, 2, protowire.BytesType)
	vi = protowire.AppendBytes(vi, typeProto)

	newGraph := make([]byte, 0, len(graph)+len(node)+len(vi)+16)
	newGraph = append(newGraph, graph...)
	newGraph = protowire.AppendTag(newGraph, 1, protowire.BytesType)
	newGraph = protowire.AppendBytes(newGraph, node)
	newGraph = protowire.AppendTag(newGraph, 12, protowire.BytesType)
	newGraph = protowire.AppendBytes(newGraph, vi)

	out := make([]byte, 0, len(data)+len(node)+len(vi)+32)
	out = append(out, data[:graphAt]...)
	out = protowire.AppendTag(out, 7, protowire.BytesType)
	out = protowire.AppendBytes(out, newGraph)
	out = append(out, data[graphEnd:]...)
	return out, nil
}

// vitsLengths finds the Cast(int64) output of Ceil → ReduceSum → Clip|Max → Cast in the graph's
// nodes; "" when there is no such chain.
func vitsLengths(graph []byte) (string, error) {
	type node struct {
		in, out []string
		op      string
		to      int64 // Cast's "to"
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
				nd.out = append(nd.out, string(f))
			case 4:
				nd.op = string(f)
			case 5: // AttributeProto: name 1, i 3
				var an string
				var i uint64
				_ = ort.EachFieldOrVarint(f, func(an2 protowire.Number, b []byte, x uint64) error {
					switch {
					case an2 == 1 && b != nil:
						an = string(b)
					case an2 == 3 && b == nil:
						i = x
					}
					return nil
				})
				if an == "to" {
					nd.to = int64(i)
				}
			}
			return nil
		})
		nodes = append(nodes, nd)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("not an ONNX model: %w", err)
	}
	consumers := map[string][]int{}
	for i, nd := range nodes {
		for _, in := range nd.in {
			consumers[in] = append(consumers[in], i)
		}
	}
	// next returns the single consumer of t with one of the ops, or -1.
	next := func(t string, ops ...string) int {
		found := -1
		for _, c := range consumers[t] {
			for _, op := range ops {
				if nodes[c].op == op {
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
		if nd.op != "Ceil" || len(nd.out) != 1 {
			continue
		}
		s := next(nd.out[0], "ReduceSum")
		if s < 0 {
			continue
		}
		c := next(nodes[s].out[0], "Clip", "Max")
		if c < 0 {
			continue
		}
		k := next(nodes[c].out[0], "Cast")
		if k < 0 || nodes[k].to != ort.ONNXInt64 {
			continue
		}
		match = append(match, nodes[k].out[0])
	}
	if len(match) != 1 {
		return "", nil // none, or ambiguous: run one sentence at a time
	}
	return match[0], nil
}
