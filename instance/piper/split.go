package piper

import (
	"fmt"
	"math"
	"os"
	"slices"

	"github.com/voxmux/voxmux/instance/onnxedit"
	"github.com/voxmux/voxmux/instance/ort"
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
	// flow is VITS's flow cut out of the front (piper_flow chunks; nil: the front holds it): a
	// graph from the flow's input (z_p, flowIn, [B, channels, frames]) and the frames' mask
	// (y_mask, flowMask, [B, 1, frames]: 1 for a row's frames, 0 past them) to the latent,
	// each latent frame t depending on flowIn's frames t-flowLeft to t+flowRight only. Then the
	// front outputs z_p in place of the latent.
	flow                []byte
	flowIn, flowMask    string
	flowSID             bool
	flowLeft, flowRight int
	// flowReason says why the flow stayed in the front when it was asked for.
	flowReason string
	// frontWhole, with flow set, is the front with the flow (outputs the latent and the lengths),
	// for sentences whose first chunk is not their request's first audio.
	frontWhole []byte
}

// Decoder ops voxmux knows the reach of in time, besides convolutions: elementwise ones.
var piperLocalOps = map[string]bool{
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Pow": true, "LeakyRelu": true, "Relu": true,
	"Tanh": true, "Sigmoid": true, "Exp": true, "Sin": true, "Cos": true, "Neg": true, "Abs": true,
	"Identity": true, "Cast": true, "Unsqueeze": true, "Squeeze": true,
}

// channelAxis reports whether axis is a [B, channels, frames] tensor's channel axis.
func channelAxis(axis int64) bool { return axis == 1 || axis == -2 }

// splitGraph is the voice's graph, with what splitPiper asks of it.
type splitGraph struct{ *onnxedit.Graph }

// splitPiper reads the voice file at path and cuts it at the decoder's input, and at the flow's
// input too when flow is set and the flow has VITS's structure (else flowReason says why not). It
// returns a reason (and no split) when the graph cannot be cut: the voice then runs whole
// sentences.
func splitPiper(path string, flow bool) (*piperSplit, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	graphBytes, at, end, err := onnxedit.ModelGraph(data)
	if err != nil {
		return nil, "", err
	}
	parsed, err := onnxedit.ParseGraph(graphBytes)
	if err != nil {
		return nil, "", fmt.Errorf("not an ONNX model: %w", err)
	}
	g := splitGraph{parsed}
	lengths := vitsLengths(g.Nodes)
	if lengths == "" {
		return nil, "the graph has no VITS length computation (Ceil → ReduceSum → Clip → Cast)", nil
	}
	for _, n := range g.Nodes {
		for _, a := range n.Attrs {
			if a.Graph {
				return nil, fmt.Sprintf("the graph has a %s node with a subgraph", n.Op), nil
			}
		}
	}
	producer := map[string]int{}
	for i, n := range g.Nodes {
		for _, o := range n.Out {
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
	o, reason := g.reach(producer, dec, []string{latent}, "output")
	if reason != "" {
		return nil, reason, nil
	}
	if o.rate < 1 || o.rate != math.Trunc(o.rate) {
		return nil, fmt.Sprintf("the decoder gives %g samples a frame", o.rate), nil
	}
	sp.hop = int(o.rate)
	sp.left, sp.right = o.frames()
	// model is the voice's model with its graph replaced by graph.
	model := func(graph []byte) []byte { return onnxedit.ReplaceGraph(data, at, end, graph) }
	frontOut := latent
	if flow {
		if sp.flowReason = g.cutFlow(producer, latent, sp, model); sp.flowReason == "" {
			frontOut = sp.flowIn
		}
	}
	frontGraph := func(out string) []byte {
		nodes, inputs := g.ancestors(producer, []string{out, lengths})
		frames := onnxedit.IdentityNode(lengths, piperLengthOutput)
		return model(g.subgraph(nodes, inputs, nil,
			[][]byte{onnxedit.ValueInfo(out, ort.ONNXFloat, 3), onnxedit.ValueInfo(piperLengthOutput, ort.ONNXInt64, 1)}, frames))
	}
	sp.front = frontGraph(frontOut)
	if sp.flow != nil {
		sp.frontWhole = frontGraph(latent)
	}
	sp.decoder = model(g.subgraph(dec, decInputs, [][]byte{onnxedit.ValueInfo(latent, ort.ONNXFloat, 3)}, nil, nil))
	return sp, "", nil
}

// cutFlow finds VITS's flow, run in reverse, ahead of the latent, by structure: the latent is
// Mul(flow output, y_mask); walking back, each coupling layer ends in Concat(Split(x)[0], ·) and
// each flip between them is a Slice; the first tensor not made so is z_p, the flow's input. It
// sets sp's flow model (made from a graph by model), inputs and receptive field, or returns why
// the flow stays in the front.
func (g splitGraph) cutFlow(producer map[string]int, latent string, sp *piperSplit, model func([]byte) []byte) string {
	p, ok := producer[latent]
	if !ok || g.Nodes[p].Op != "Mul" || len(g.Nodes[p].In) != 2 {
		return "the latent is not a product with the frames' mask"
	}
	cur, mask := "", ""
	for i, in := range g.Nodes[p].In {
		if q, ok := producer[in]; ok && g.Nodes[q].Op == "Concat" {
			cur, mask = in, g.Nodes[p].In[1-i]
		}
	}
	if cur == "" {
		return "no coupling layer: the latent's mask multiplies no Concat"
	}
	couplings := 0
	for couplings < 64 {
		c, ok := producer[cur]
		if !ok || g.Nodes[c].Op != "Concat" {
			break
		}
		s, ok := producer[g.Nodes[c].In[0]]
		if !ok || g.Nodes[s].Op != "Split" {
			return "a coupling layer's Concat does not start with a Split's output"
		}
		couplings++
		cur = g.Nodes[s].In[0]
		if f, ok := producer[cur]; ok && g.Nodes[f].Op == "Slice" {
			cur = g.Nodes[f].In[0] // the flip ahead of the coupling layer
		}
	}
	if couplings == 0 || couplings == 64 {
		return fmt.Sprintf("%d coupling layers", couplings)
	}
	flow, inputs := g.ancestors(producer, []string{latent}, cur, mask)
	for in := range inputs {
		if in != "sid" {
			return fmt.Sprintf("the flow needs graph input %q besides z_p and the mask", in)
		}
	}
	o, reason := g.reach(producer, flow, []string{cur, mask}, latent)
	if reason != "" {
		return reason
	}
	if o.rate != 1 {
		return fmt.Sprintf("the flow gives %g latent frames a frame", o.rate)
	}
	sp.flowIn, sp.flowMask, sp.flowSID = cur, mask, inputs["sid"]
	sp.flowLeft, sp.flowRight = o.frames()
	sp.flow = model(g.subgraph(flow, inputs,
		[][]byte{onnxedit.ValueInfo(cur, ort.ONNXFloat, 3), onnxedit.ValueInfo(mask, ort.ONNXFloat, 3)},
		[][]byte{onnxedit.ValueInfo(latent, ort.ONNXFloat, 3)}, nil))
	return ""
}

// decoderInput finds HiFi-GAN's input by structure: the first transposed convolution (the one no
// other is upstream of) upsamples conv_pre's output, through activations and, for a multi-speaker
// voice, the addition of cond(g); conv_pre's input is the latent. Where an op has several inputs,
// the path follows the one computed from the phoneme ids.
func (g splitGraph) decoderInput(producer map[string]int) (string, string) {
	fromIDs := g.dependsOn("input")
	var first = -1
	for i, n := range g.Nodes {
		if n.Op != "ConvTranspose" {
			continue
		}
		upstream, _ := g.ancestors(producer, n.In[:1])
		has := false
		for j := range upstream {
			if j != i && g.Nodes[j].Op == "ConvTranspose" {
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
	cur := g.Nodes[first].In[0]
	for range 16 {
		p, ok := producer[cur]
		if !ok {
			return "", fmt.Sprintf("the decoder's input %q is a graph input", cur)
		}
		n := g.Nodes[p]
		if n.Op == "Conv" {
			return n.In[0], ""
		}
		if !piperLocalOps[n.Op] {
			return "", fmt.Sprintf("a %s node precedes the decoder's first upsampling", n.Op)
		}
		next := ""
		for _, in := range n.In {
			if fromIDs[in] {
				if next != "" {
					return "", fmt.Sprintf("%s node %v joins two paths from the phoneme ids before the decoder", n.Op, n.In)
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
func (g splitGraph) dependsOn(in string) map[string]bool {
	dep := map[string]bool{in: true}
	for _, n := range g.Nodes {
		for _, x := range n.In {
			if dep[x] {
				for _, o := range n.Out {
					dep[o] = true
				}
				break
			}
		}
	}
	return dep
}

// ancestors returns the nodes that compute outs, not looking past stops (tensors that become graph
// inputs), and the graph inputs they read.
func (g splitGraph) ancestors(producer map[string]int, outs []string, stops ...string) (map[int]bool, map[string]bool) {
	nodes, inputs := map[int]bool{}, map[string]bool{}
	stack := append([]string(nil), outs...)
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if t == "" || slices.Contains(stops, t) {
			continue
		}
		if g.Inputs[t] {
			inputs[t] = true
			continue
		}
		p, ok := producer[t]
		if !ok || nodes[p] {
			continue
		}
		nodes[p] = true
		stack = append(stack, g.Nodes[p].In...)
	}
	return nodes, inputs
}

// frameSpan is where a tensor stands in time against the frames reach starts from: rate steps a
// frame, each step depending on frames left back to right ahead.
type frameSpan struct{ rate, left, right float64 }

// frames is the span's reach in whole frames back and ahead.
func (s frameSpan) frames() (left, right int) { return int(math.Ceil(s.left)), int(math.Ceil(s.right)) }

// reach computes the receptive field, in frames of the from tensors, of tensor to over nodes, and
// its rate, following every tensor computed from them: a convolution of kernel k, dilation d and
// pads (pl, pr) at r steps per frame reaches pl/r frames back and ((k-1)·d-pl)/r ahead; a
// transposed one of stride s reaches ((k-1)·d-pl)/(s·r) back and pl/(s·r) ahead, plus one input
// step each way for rounding; elementwise ops, and Split, Concat and Slice along the channels,
// take the widest of their inputs; Shape gives a shape, which only ConstantOfShape may read (zeros
// like the tensor). Any other op on the path refuses the split.
func (g splitGraph) reach(producer map[string]int, nodes map[int]bool, from []string, to string) (frameSpan, string) {
	at := map[string]frameSpan{}
	for _, f := range from {
		at[f] = frameSpan{rate: 1}
	}
	shapes := map[string]bool{} // tensors computed from a Shape of the path's tensors
	for i, n := range g.Nodes {
		if !nodes[i] {
			continue
		}
		var in frameSpan
		found, shaped := false, false
		for _, x := range n.In {
			shaped = shaped || shapes[x]
			s, ok := at[x]
			if !ok {
				continue
			}
			if found && s.rate != in.rate {
				return in, fmt.Sprintf("%s node joins tensors at %g and %g steps a frame", n.Op, in.rate, s.rate)
			}
			if !found {
				in = s
			}
			in.left, in.right = max(in.left, s.left), max(in.right, s.right)
			found = true
		}
		switch {
		case shaped && found:
			return in, fmt.Sprintf("%s node reads a shape and the frames", n.Op)
		case shaped && n.Op != "ConstantOfShape":
			for _, o := range n.Out {
				shapes[o] = true
			}
			continue
		case !found:
			continue // the speaker's conditioning, a constant, or zeros shaped like a tensor
		}
		out := in
		switch n.Op {
		case "Conv", "ConvTranspose":
			if _, ok := at[n.In[0]]; !ok {
				return in, fmt.Sprintf("%s node's weights depend on the latent", n.Op)
			}
			if a := n.Attrs["auto_pad"].S; a != "" && a != "NOTSET" {
				return in, fmt.Sprintf("%s node has auto_pad %s", n.Op, a)
			}
			k := n.Attrs["kernel_shape"].Ints
			if len(k) == 0 && len(n.In) > 1 && len(g.Dims[n.In[1]]) > 2 {
				k = g.Dims[n.In[1]][2:]
			}
			pads, strides, dil := n.Attrs["pads"].Ints, n.Attrs["strides"].Ints, n.Attrs["dilations"].Ints
			if len(k) != 1 || len(pads) > 2 || len(strides) > 1 || len(dil) > 1 {
				return in, fmt.Sprintf("%s node is not a 1-D convolution (kernel %v)", n.Op, k)
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
			if n.Op == "Conv" {
				out.rate = in.rate / float64(s)
				out.left += float64(pl) / in.rate
				out.right += (width - float64(pl)) / in.rate
			} else {
				out.rate = in.rate * float64(s)
				out.left += (width-float64(pl))/out.rate + 1/in.rate
				out.right += float64(pl)/out.rate + 1/in.rate
			}
		case "Shape":
			shapes[n.Out[0]] = true
			continue
		case "Split", "Concat":
			a, ok := n.Attrs["axis"]
			if !ok || !channelAxis(a.I) {
				return in, fmt.Sprintf("%s node not along the channels", n.Op)
			}
			if n.Op == "Split" && len(n.In) > 1 {
				if _, ok := at[n.In[1]]; ok {
					return in, "Split node's sizes depend on the latent"
				}
			}
		case "Slice":
			if _, ok := at[n.In[0]]; !ok || len(n.In) < 4 {
				return in, "Slice node without axes, or of a tensor not on the path"
			}
			for _, x := range n.In[1:] {
				if _, ok := at[x]; ok {
					return in, "Slice node's bounds depend on the latent"
				}
			}
			axes, ok := g.constant(producer, n.In[3])
			if !ok || len(axes) == 0 {
				return in, "Slice node's axes are not a constant"
			}
			for _, a := range axes {
				if !channelAxis(a) {
					return in, fmt.Sprintf("Slice node along axis %d", a)
				}
			}
		default:
			if !piperLocalOps[n.Op] {
				return in, fmt.Sprintf("a %s node on the path from %s", n.Op, from[0])
			}
		}
		for _, o := range n.Out {
			at[o] = out
		}
	}
	o, ok := at[to]
	if !ok {
		return o, fmt.Sprintf("%s is not computed from %s", to, from[0])
	}
	return o, ""
}

// constant returns the values of tensor name when it is a small int64 initializer or a Constant
// node makes it as int64s.
func (g splitGraph) constant(producer map[string]int, name string) ([]int64, bool) {
	if v, ok := g.Int64s[name]; ok {
		return v, true
	}
	p, ok := producer[name]
	if !ok || g.Nodes[p].Op != "Constant" {
		return nil, false
	}
	v := g.Nodes[p].Attrs["value"].Int64s
	return v, v != nil
}

// subgraph re-encodes the graph with only the nodes in keep, the initializers they read, the
// graph inputs in inputs plus addInputs, and outputs: the original ones when addOutputs is nil,
// else addOutputs alone. value_info (shape hints) is dropped. extra is appended as a node.
func (g splitGraph) subgraph(keep map[int]bool, inputs map[string]bool, addInputs, addOutputs [][]byte, extra []byte) []byte {
	used := map[string]bool{}
	for i := range keep {
		for _, in := range g.Nodes[i].In {
			used[in] = true
		}
	}
	var out []byte
	for _, f := range g.Fields {
		switch f.Num {
		case 1:
			if !keep[f.Node] {
				continue
			}
		case 5:
			if !used[f.Name] {
				continue
			}
		case 11:
			if !inputs[f.Name] && !(used[f.Name] && g.Dims[f.Name] != nil) {
				continue
			}
		case 12:
			if addOutputs != nil {
				continue
			}
		case 13:
			continue
		}
		out = append(out, f.Raw...)
	}
	if extra != nil {
		out = onnxedit.AppendMessage(out, 1, extra)
	}
	for _, v := range addInputs {
		out = onnxedit.AppendMessage(out, 11, v)
	}
	for _, v := range addOutputs {
		out = onnxedit.AppendMessage(out, 12, v)
	}
	return out
}
