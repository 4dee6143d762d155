package piper

import (
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/voxmux/voxmux/instance/ort"
	"google.golang.org/protobuf/encoding/protowire"
)

// A Piper voice split at its decoder (docs/piper.md, "First audio"): VITS's infer ends with
//
//	z = flow(z_p, y_mask, g=g, reverse=True)
//	o = dec((z * y_mask)[:, :, :max_len], g=g)
//
// where dec is HiFi-GAN: convolutions and transposed convolutions over the latent frames, each
// output sample depending on a bounded window of frames. The graph is cut at dec's input into a
// front graph (text encoder, duration predictor, flow; outputs the latent and y_lengths) and a
// decoder graph (latent, and sid where the decoder is conditioned on the speaker → audio), so the
// decoder can run over chunks of frames with as much context on each side as its receptive field
// needs. Both graphs are built in memory from the voice file's protobuf (the file on disk is not
// touched), keeping each one's own nodes and initializers.

// piperSplit is a voice graph cut at the decoder's input.
type piperSplit struct {
	front, decoder []byte // the two models, serialized
	latent         string // the decoder's input: the front's first output, [B, channels, frames]
	decoderSID     bool   // the decoder takes sid (a multi-speaker voice conditions it on g)
	// left and right are the decoder's receptive field in frames: output frame t depends on latent
	// frames t-left to t+right only.
	left, right int
	hop         int // output samples per latent frame
}

// onnxNode is one NodeProto of a graph.
type onnxNode struct {
	raw     []byte // the whole field, tag included
	in, out []string
	op      string
	attrs   map[string]onnxAttr
}

// onnxAttr is what voxmux reads of an AttributeProto.
type onnxAttr struct {
	i     int64
	ints  []int64
	s     string
	graph bool // holds a subgraph (If, Loop, Scan): its outer-scope inputs are not listed
}

// onnxGraph is a GraphProto read field by field, each field's bytes kept for re-encoding.
type onnxGraph struct {
	fields []graphField
	nodes  []onnxNode
	dims   map[string][]int64 // initializer name → dims
	inputs map[string]bool
}

type graphField struct {
	num  protowire.Number
	raw  []byte // tag and value
	name string // for nodes: the index is kept in node; for initializers, inputs, outputs, value_info: the name
	node int    // index into nodes, for field 1
}

// Decoder ops voxmux knows the reach of in time, besides convolutions: elementwise ones.
var piperLocalOps = map[string]bool{
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Pow": true, "LeakyRelu": true, "Relu": true,
	"Tanh": true, "Sigmoid": true, "Exp": true, "Sin": true, "Cos": true, "Neg": true, "Abs": true,
	"Identity": true, "Cast": true, "Unsqueeze": true, "Squeeze": true,
}

// splitPiper reads the voice file at path and cuts it at the decoder's input. It returns a reason
// (and no split) when the graph cannot be cut: the voice then runs whole sentences.
func splitPiper(path string) (*piperSplit, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	graphBytes, at, end, err := modelGraph(data)
	if err != nil {
		return nil, "", err
	}
	g, err := parseGraph(graphBytes)
	if err != nil {
		return nil, "", fmt.Errorf("not an ONNX model: %w", err)
	}
	lengths, err := vitsLengths(graphBytes)
	if err != nil {
		return nil, "", err
	}
	if lengths == "" {
		return nil, "the graph has no VITS length computation (Ceil → ReduceSum → Clip → Cast)", nil
	}
	for _, n := range g.nodes {
		for _, a := range n.attrs {
			if a.graph {
				return nil, fmt.Sprintf("the graph has a %s node with a subgraph", n.op), nil
			}
		}
	}
	producer := map[string]int{}
	for i, n := range g.nodes {
		for _, o := range n.out {
			producer[o] = i
		}
	}
	latent, reason := g.decoderInput(producer)
	if reason != "" {
		return nil, reason, nil
	}
	dec, decInputs := g.ancestors(producer, []string{"output"}, latent)
	for in := range decInputs {
		if in != "sid" {
			return nil, fmt.Sprintf("the decoder needs graph input %q besides the latent", in), nil
		}
	}
	sp := &piperSplit{latent: latent, decoderSID: decInputs["sid"]}
	if reason := g.reach(dec, latent, sp); reason != "" {
		return nil, reason, nil
	}
	front, frontInputs := g.ancestors(producer, []string{latent, lengths}, "")
	frames := identityNode(lengths, piperLengthOutput)
	sp.front = replaceGraph(data, at, end, g.subgraph(front, frontInputs, nil,
		[][]byte{valueInfo(latent, ort.ONNXFloat, 3), valueInfo(piperLengthOutput, ort.ONNXInt64, 1)}, frames))
	sp.decoder = replaceGraph(data, at, end, g.subgraph(dec, decInputs,
		[][]byte{valueInfo(latent, ort.ONNXFloat, 3)}, nil, nil))
	return sp, "", nil
}

// modelGraph finds the GraphProto (field 7) of a ModelProto: its bytes and where the field starts
// and ends in data.
func modelGraph(data []byte) (graph []byte, at, end int, err error) {
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

// replaceGraph is data with its graph field [at, end) replaced by graph.
func replaceGraph(data []byte, at, end int, graph []byte) []byte {
	out := make([]byte, 0, at+len(graph)+len(data)-end+16)
	out = append(out, data[:at]...)
	out = protowire.AppendTag(out, 7, protowire.BytesType)
	out = protowire.AppendBytes(out, graph)
	return append(out, data[end:]...)
}

func parseGraph(b []byte) (*onnxGraph, error) {
	g := &onnxGraph{dims: map[string][]int64{}, inputs: map[string]bool{}}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		f := graphField{num: num, raw: b[:n+m]}
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n:])
			var err error
			switch num {
			case 1:
				var nd onnxNode
				nd, err = parseNode(v)
				nd.raw = f.raw
				f.node = len(g.nodes)
				g.nodes = append(g.nodes, nd)
			case 5: // TensorProto: dims 1, name 8
				var dims []int64
				err = ort.EachFieldOrVarint(v, func(k protowire.Number, s []byte, x uint64) error {
					switch {
					case k == 8 && s != nil:
						f.name = string(s)
					case k == 1 && s == nil:
						dims = append(dims, int64(x))
					case k == 1 && s != nil:
						dims = append(dims, packed(s)...)
					}
					return nil
				})
				g.dims[f.name] = dims
			case 11, 12, 13: // ValueInfoProto: name 1
				err = ort.EachField(v, func(k protowire.Number, s []byte) error {
					if k == 1 {
						f.name = string(s)
					}
					return nil
				})
				if num == 11 {
					g.inputs[f.name] = true
				}
			}
			if err != nil {
				return nil, err
			}
		}
		g.fields = append(g.fields, f)
		b = b[n+m:]
	}
	for name := range g.dims {
		delete(g.inputs, name) // an initializer listed as an input too (IR < 4) is a weight
	}
	return g, nil
}

func parseNode(v []byte) (onnxNode, error) {
	nd := onnxNode{attrs: map[string]onnxAttr{}}
	err := ort.EachField(v, func(n protowire.Number, f []byte) error {
		switch n {
		case 1:
			nd.in = append(nd.in, string(f))
		case 2:
			nd.out = append(nd.out, string(f))
		case 4:
			nd.op = string(f)
		case 5: // AttributeProto: name 1, i 3, s 4, g 6, ints 8, graphs 11
			var name string
			var a onnxAttr
			err := ort.EachFieldOrVarint(f, func(k protowire.Number, b []byte, x uint64) error {
				switch {
				case k == 1 && b != nil:
					name = string(b)
				case k == 3 && b == nil:
					a.i = int64(x)
				case k == 4 && b != nil:
					a.s = string(b)
				case (k == 6 || k == 11) && b != nil:
					a.graph = true
				case k == 8 && b == nil:
					a.ints = append(a.ints, int64(x))
				case k == 8 && b != nil:
					a.ints = append(a.ints, packed(b)...)
				}
				return nil
			})
			nd.attrs[name] = a
			return err
		}
		return nil
	})
	return nd, err
}

// packed decodes a packed repeated varint field.
func packed(b []byte) []int64 {
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

// decoderInput finds HiFi-GAN's input by structure: the first transposed convolution (the one no
// other is upstream of) upsamples conv_pre's output, through activations and, for a multi-speaker
// voice, the addition of cond(g); conv_pre's input is the latent. Where an op has several inputs,
// the path follows the one computed from the phoneme ids.
func (g *onnxGraph) decoderInput(producer map[string]int) (string, string) {
	fromIDs := g.dependsOn("input")
	var first = -1
	for i, n := range g.nodes {
		if n.op != "ConvTranspose" {
			continue
		}
		upstream, _ := g.ancestors(producer, n.in[:1], "")
		has := false
		for j := range upstream {
			if j != i && g.nodes[j].op == "ConvTranspose" {
				has = true
			}
		}
		if !has {
			if first >= 0 {
				return "", "the graph has two first transposed convolutions"
			}
			first = i
		}
	}
	if first < 0 {
		return "", "the graph has no transposed convolution (HiFi-GAN's upsampling)"
	}
	cur := g.nodes[first].in[0]
	for range 16 {
		p, ok := producer[cur]
		if !ok {
			return "", fmt.Sprintf("the decoder's input %q is a graph input", cur)
		}
		n := g.nodes[p]
		if n.op == "Conv" {
			return n.in[0], ""
		}
		if !piperLocalOps[n.op] {
			return "", fmt.Sprintf("a %s node precedes the decoder's first upsampling", n.op)
		}
		next := ""
		for _, in := range n.in {
			if fromIDs[in] {
				if next != "" {
					return "", fmt.Sprintf("%s node %v joins two paths from the phoneme ids before the decoder", n.op, n.in)
				}
				next = in
			}
		}
		if next == "" {
			return "", "the decoder's first upsampling does not depend on the phoneme ids"
		}
		cur = next
	}
	return "", "no convolution before the decoder's first upsampling"
}

// dependsOn marks every tensor computed from graph input in (nodes are in topological order, as
// ONNX requires).
func (g *onnxGraph) dependsOn(in string) map[string]bool {
	dep := map[string]bool{in: true}
	for _, n := range g.nodes {
		for _, x := range n.in {
			if dep[x] {
				for _, o := range n.out {
					dep[o] = true
				}
				break
			}
		}
	}
	return dep
}

// ancestors returns the nodes that compute outs, not looking past stop (a tensor that becomes a
// graph input), and the graph inputs they read.
func (g *onnxGraph) ancestors(producer map[string]int, outs []string, stop string) (map[int]bool, map[string]bool) {
	nodes, inputs := map[int]bool{}, map[string]bool{}
	stack := append([]string(nil), outs...)
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if t == stop || t == "" {
			continue
		}
		if g.inputs[t] {
			inputs[t] = true
			continue
		}
		p, ok := producer[t]
		if !ok || nodes[p] {
			continue
		}
		nodes[p] = true
		stack = append(stack, g.nodes[p].in...)
	}
	return nodes, inputs
}

// reach computes the decoder's receptive field in latent frames and its hop, following every
// tensor computed from the latent: a convolution of kernel k, dilation d and pads (pl, pr) at r
// steps per frame reaches pl/r frames back and ((k-1)·d-pl)/r ahead; a transposed one of stride s
// reaches ((k-1)·d-pl)/(s·r) back and pl/(s·r) ahead, plus one input step each way for rounding;
// elementwise ops take the widest of their inputs. Any other op on the latent's path refuses the
// split.
func (g *onnxGraph) reach(dec map[int]bool, latent string, sp *piperSplit) string {
	type span struct{ rate, left, right float64 }
	at := map[string]span{latent: {rate: 1}}
	for i, n := range g.nodes {
		if !dec[i] {
			continue
		}
		var in span
		found := false
		for _, x := range n.in {
			s, ok := at[x]
			if !ok {
				continue
			}
			if found && s.rate != in.rate {
				return fmt.Sprintf("%s node joins tensors at %g and %g steps a frame", n.op, in.rate, s.rate)
			}
			if !found {
				in = s
			}
			in.left, in.right = max(in.left, s.left), max(in.right, s.right)
			found = true
		}
		if !found {
			continue // the speaker's conditioning, or a constant
		}
		out := in
		switch n.op {
		case "Conv", "ConvTranspose":
			if _, ok := at[n.in[0]]; !ok {
				return fmt.Sprintf("%s node's weights depend on the latent", n.op)
			}
			if a := n.attrs["auto_pad"].s; a != "" && a != "NOTSET" {
				return fmt.Sprintf("%s node has auto_pad %s", n.op, a)
			}
			k := n.attrs["kernel_shape"].ints
			if len(k) == 0 && len(n.in) > 1 && len(g.dims[n.in[1]]) > 2 {
				k = g.dims[n.in[1]][2:]
			}
			pads, strides, dil := n.attrs["pads"].ints, n.attrs["strides"].ints, n.attrs["dilations"].ints
			if len(k) != 1 || len(pads) > 2 || len(strides) > 1 || len(dil) > 1 {
				return fmt.Sprintf("%s node is not a 1-D convolution (kernel %v)", n.op, k)
			}
			d, s, pl := int64(1), int64(1), int64(0)
			if len(dil) == 1 {
				d = dil[0]
			}
			if len(strides) == 1 {
				s = strides[0]
			}
			if len(pads) > 0 {
				pl = pads[0]
			}
			width := float64((k[0] - 1) * d)
			if n.op == "Conv" {
				out.rate = in.rate / float64(s)
				out.left += float64(pl) / in.rate
				out.right += (width - float64(pl)) / in.rate
			} else {
				out.rate = in.rate * float64(s)
				out.left += (width-float64(pl))/out.rate + 1/in.rate
				out.right += float64(pl)/out.rate + 1/in.rate
			}
		default:
			if !piperLocalOps[n.op] {
				return fmt.Sprintf("the decoder has a %s node on the latent's path", n.op)
			}
		}
		for _, o := range n.out {
			at[o] = out
		}
	}
	o, ok := at["output"]
	if !ok {
		return "the output is not computed from the latent"
	}
	if o.rate < 1 || o.rate != math.Trunc(o.rate) {
		return fmt.Sprintf("the decoder gives %g samples a frame", o.rate)
	}
	sp.hop = int(o.rate)
	sp.left, sp.right = int(math.Ceil(o.left)), int(math.Ceil(o.right))
	return ""
}

// subgraph re-encodes the graph with only the nodes in keep, the initializers they read, the
// graph inputs in inputs plus addInputs, and outputs: the original ones when addOutputs is nil,
// else addOutputs alone. value_info (shape hints) is dropped. extra is appended as a node.
func (g *onnxGraph) subgraph(keep map[int]bool, inputs map[string]bool, addInputs, addOutputs [][]byte, extra []byte) []byte {
	used := map[string]bool{}
	for i := range keep {
		for _, in := range g.nodes[i].in {
			used[in] = true
		}
	}
	var out []byte
	for _, f := range g.fields {
		switch f.num {
		case 1:
			if !keep[f.node] {
				continue
			}
		case 5:
			if !used[f.name] {
				continue
			}
		case 11:
			if !inputs[f.name] && !(used[f.name] && g.dims[f.name] != nil) {
				continue
			}
		case 12:
			if addOutputs != nil {
				continue
			}
		case 13:
			continue
		}
		out = append(out, f.raw...)
	}
	if extra != nil {
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, extra)
	}
	for _, v := range addInputs {
		out = protowire.AppendTag(out, 11, protowire.BytesType)
		out = protowire.AppendBytes(out, v)
	}
	for _, v := range addOutputs {
		out = protowire.AppendTag(out, 12, protowire.BytesType)
		out = protowire.AppendBytes(out, v)
	}
	return out
}

// valueInfo is a ValueInfoProto: a tensor of elemType and rank dims of unknown size.
func valueInfo(name string, elemType int32, rank int) []byte {
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

// identityNode is a NodeProto (input 1, output 2, name 3, op_type 4) copying in to out.
func identityNode(in, out string) []byte {
	var node []byte
	node = protowire.AppendTag(node, 1, protowire.BytesType)
	node = protowire.AppendString(node, in)
	node = protowire.AppendTag(node, 2, protowire.BytesType)
	node = protowire.AppendString(node, out)
	node = protowire.AppendTag(node, 3, protowire.BytesType)
	node = protowire.AppendString(node, out+"_identity")
	node = protowire.AppendTag(node, 4, protowire.BytesType)
	return protowire.AppendString(node, "Identity")
}
