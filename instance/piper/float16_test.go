package piper

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/instance/onnxedit"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
	"google.golang.org/protobuf/encoding/protowire"
)

// float16Diff is how far audio b is from a: the rms of the difference over the rms of a, and the
// largest absolute difference (raw audio, before the gain).
func float16Diff(a, b []float32) (relRMS, maxAbs float64) {
	var d2, a2 float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		d2 += d * d
		a2 += float64(a[i]) * float64(a[i])
		maxAbs = max(maxAbs, math.Abs(d))
	}
	return math.Sqrt(d2 / max(a2, 1e-30)), maxAbs
}

// tensorInfo is what the tests read of a TensorProto: name, data type, and its values' bytes.
type tensorInfo struct {
	name string
	typ  uint64
	raw  int
}

func readTensor(t *testing.T, v []byte) tensorInfo {
	t.Helper()
	var ti tensorInfo
	if err := ort.EachFieldOrVarint(v, func(n protowire.Number, b []byte, x uint64) error {
		switch {
		case n == 2 && b == nil:
			ti.typ = x
		case n == 8 && b != nil:
			ti.name = string(b)
		case n == 9 && b != nil:
			ti.raw = len(b)
		case n == 4:
			t.Errorf("tensor has float_data")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ti
}

// The converted decoder of the tiny VITS voices and jenny: every float initializer is float16
// (two bytes a value), the graph's inputs and outputs are still float32, a Cast to float16
// follows the float input and one to float32 precedes the output and no other node casts to
// float32; no weight saturates. Where /usr/bin/python3 has onnx, onnx's checker (full check) and
// strict shape inference accept the graph and infer float16 for every tensor inside it.
func TestPiperFloat16Graph(t *testing.T) {
	for _, path := range []string{tinyVITSEN, tinyVITSMulti, reference(t).voice} {
		sp, reason, err := splitPiper(path, false)
		if err != nil || sp == nil {
			t.Fatalf("%s: %v %s", path, err, reason)
		}
		g16, st, err := decoderFloat16(sp.decoder)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		graph, _, _, err := onnxedit.ModelGraph(g16)
		if err != nil {
			t.Fatal(err)
		}
		g, err := onnxedit.ParseGraph(graph)
		if err != nil {
			t.Fatal(err)
		}
		floats, halves := 0, 0
		for _, f := range g.Fields {
			switch f.Num {
			case 5:
				v, _ := protowire.ConsumeBytes(f.Raw[protowire.SizeTag(5):])
				ti := readTensor(t, v)
				switch ti.typ {
				case ort.ONNXFloat:
					floats++
				case ort.ONNXFloat16:
					halves += ti.raw / 2
				}
			case 11, 12:
				v, _ := protowire.ConsumeBytes(f.Raw[protowire.SizeTag(f.Num):])
				name, elem, err := onnxedit.ValueInfoType(v)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]int32{true: ort.ONNXInt64, false: ort.ONNXFloat}[name == "sid"]; elem != want {
					t.Errorf("%s: graph input/output %s is %s", path, name, ort.ElemTypeName(elem))
				}
			case 13:
				t.Errorf("%s: value_info kept", path)
			}
		}
		if floats != 0 || halves != st.Weights || st.Saturated != 0 {
			t.Errorf("%s: %d float32 initializers left; %d float16 values of %d converted, %d saturated", path, floats, halves, st.Weights, st.Saturated)
		}
		first, last := g.Nodes[0], g.Nodes[len(g.Nodes)-1]
		if first.Op != "Cast" || first.In[0] != sp.latent || first.Attrs["to"].I != ort.ONNXFloat16 {
			t.Errorf("%s: first node %s %v → %v, want a Cast of %s to float16", path, first.Op, first.In, first.Out, sp.latent)
		}
		if last.Op != "Cast" || last.Out[0] != "output" || last.Attrs["to"].I != ort.ONNXFloat {
			t.Errorf("%s: last node %s %v → %v, want a Cast to float32 giving output", path, last.Op, last.In, last.Out)
		}
		for _, n := range g.Nodes[:len(g.Nodes)-1] {
			if n.Op == "Cast" && n.Attrs["to"].I == ort.ONNXFloat {
				t.Errorf("%s: node %v casts to float32 inside the graph", path, n.Out)
			}
		}
		t.Logf("%s: %d nodes, %d weights to float16, the largest %.3g", filepath.Base(path), len(g.Nodes), st.Weights, st.Largest)
		onnxCheck(t, g16)
	}
}

// onnxCheck runs onnx's checker and strict shape inference on model, and wants every tensor
// inferred inside it float16; skipped where /usr/bin/python3 has no onnx.
func onnxCheck(t *testing.T, model []byte) {
	t.Helper()
	if exec.Command("/usr/bin/python3", "-c", "import onnx").Run() != nil {
		t.Log("no /usr/bin/python3 with onnx: onnx's checker not run")
		return
	}
	p := filepath.Join(t.TempDir(), "decoder.onnx")
	if err := os.WriteFile(p, model, 0o644); err != nil {
		t.Fatal(err)
	}
	const script = `import sys, onnx
m = onnx.load(sys.argv[1])
onnx.checker.check_model(m, full_check=True)
inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True).graph.value_info
print(sorted({onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type) for v in inferred}))`
	out, err := exec.Command("/usr/bin/python3", "-c", script, p).CombinedOutput()
	if err != nil {
		t.Fatalf("onnx checker: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "['FLOAT16']" {
		t.Errorf("types inferred inside the float16 decoder: %s", got)
	}
}

// float16Sentences are the sentences the float16 tests decode.
const float16Sentences = "The weather is nice today, so we will walk to the park. Please call me back when you get home tonight."

// Bounds of the CPU tests, raw audio against the float32 decoder's. Measured, worst sentence:
// rounding the weights through float16 gives relative rms 4.0e-4 on jenny, 3.8e-4 and 6.0e-4 on
// the tiny VITS voices; the float16 graph on the CPU provider 4.5e-4 on jenny (largest
// difference 6.7e-4), 4.4e-4 and 6.3e-4 on the tiny ones. Weights rounded to float16's 11
// significant bits move the audio by a few parts in 10⁴; the bounds leave about 8× for other
// voices' weights.
const (
	float16RoundedRMS = 3e-3
	float16CPURMS     = 5e-3
	float16CPUMaxAbs  = 2e-2
)

// The float16 decoder's error, on the CPU: (1) the float32 decoder with its weights rounded
// through float16 (the weight-rounding part of float16's error, float32 compute) and (2) the
// float16 graph itself, which ONNX Runtime's CPU provider runs (casting to float32 for ops it has
// no float16 kernel for), each against the float32 decoder, over whole sentences; and a voice
// with piper_precision float16 synthesizes speech in chunks that joined equal its decoder run
// once.
func TestPiperFloat16OnCPU(t *testing.T) {
	ph := testPhonemizer(t)
	for _, c := range []struct {
		path string
		sid  int64
	}{{tinyVITSEN, 0}, {tinyVITSMulti, 1}, {reference(t).voice, 0}} {
		// The flow in the front: the decoders compared here take the same latent (a flow run in
		// parts differs from one run by float32 rounding, which float16 can round either way).
		r, s32 := chunkRunner(t, c.path, Options{Flow: FlowFront})
		_, s16 := chunkRunner(t, c.path, Options{Precision: Float16, Flow: FlowFront})
		if s16.chunks == nil || !s16.opts.Float16 {
			t.Fatalf("%s: float16 not in force", c.path)
		}
		// The float32 decoder with its weights rounded through float16.
		sp, _, err := splitPiper(c.path, false)
		if err != nil {
			t.Fatal(err)
		}
		rounded, st, err := onnxedit.RoundedFloat16(sp.decoder)
		if err != nil || st.Weights == 0 {
			t.Fatalf("%s: %v, %+v", c.path, err, st)
		}
		decIn := []string{sp.latent}
		if sp.decoderSID {
			decIn = append(decIn, "sid")
		}
		dec, err := r.rt.SessionFromData("piper-decoder-rounded", rounded, decIn, []string{"output"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dec.Destroy() })
		sr := *s32.chunks
		sr.dec = dec

		f := s32.file
		sents, err := f.sentences(ph, float16Sentences)
		if err != nil {
			t.Fatal(err)
		}
		var worstRounded, worstF16, worstMax float64
		for _, sent := range sents {
			ls, err := s32.chunks.runFront(f, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(s32, 1, 1), f.scales)
			if err != nil {
				t.Fatal(err)
			}
			l := &ls[0]
			w := []window{{l: l, sid: c.sid, hi: l.frames, to: l.frames}}
			var out [3][]float32
			for i, ch := range []*piperChunker{s32.chunks, &sr, s16.chunks} {
				pcm, err := ch.decode(f, w)
				if err != nil {
					t.Fatal(err)
				}
				out[i] = pcm[0]
			}
			rr, _ := float16Diff(out[0], out[1])
			r16, m16 := float16Diff(out[0], out[2])
			worstRounded, worstF16, worstMax = max(worstRounded, rr), max(worstF16, r16), max(worstMax, m16)
			// Chunked float16 equals the float16 decoder run once.
			chunked := decodeChunks(t, s16.chunks, f, l, c.sid, s16.chunks.split.left, s16.chunks.split.right)
			if d := piperMaxDiff(chunked, out[2]); len(chunked) != len(out[2]) || d > chunkTolerance {
				t.Errorf("%s: float16 in chunks: %d samples, %g from the whole decoder's %d", f.Stem, len(chunked), d, len(out[2]))
			}
		}
		t.Logf("float16 %s cpu: weights rounded: rel rms %.3g; float16 graph: rel rms %.3g, max abs %.3g", f.Stem, worstRounded, worstF16, worstMax)
		if worstRounded > float16RoundedRMS {
			t.Errorf("%s: weights rounded through float16 move the audio by rel rms %.3g, over %g", f.Stem, worstRounded, float16RoundedRMS)
		}
		if worstF16 > float16CPURMS || worstMax > float16CPUMaxAbs {
			t.Errorf("%s: the float16 decoder on the CPU is rel rms %.3g, max abs %.3g from float32's, over %g, %g", f.Stem, worstF16, worstMax, float16CPURMS, float16CPUMaxAbs)
		}
	}
}

// A float16 voice through Synthesize gives its sentences' audio, as long as float32's.
func TestPiperFloat16Synthesize(t *testing.T) {
	voice := reference(t).voice
	var n [2]int
	for i, o := range []Options{{}, {Precision: Float16}} {
		r, _ := chunkRunner(t, voice, o)
		err := r.Synthesize(t.Context(), tts.Request{Text: float16Sentences}, func(c tts.Chunk) error {
			n[i] += len(c.PCM)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n[0] == 0 || n[0] != n[1] {
		t.Errorf("float32 gave %d samples, float16 %d", n[0], n[1])
	}
}

// piper_precision: float32 or float16; float16 is refused with piper_decode sentences, and a voice
// that cannot be split refuses it when it loads.
func TestPiperPrecisionOption(t *testing.T) {
	got, err := Family{}.ParseOptions(tts.EngineSection(`{"piper_precision": "float16"}`))
	if want := (Options{Precision: Float16}); err != nil || got != want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	for section, want := range map[string]string{
		`{"piper_precision": "half"}`:                                 `engine.piper_precision: "half" is not one of [float32 float16]`,
		`{"piper_precision": "float16", "piper_decode": "sentences"}`: "engine.piper_precision: float16 converts the decoder that piper_decode chunks splits off the voice's graph; it cannot be used with piper_decode sentences",
	} {
		if _, err := (Family{}).ParseOptions(tts.EngineSection(section)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", section, err, want)
		}
	}
	r, _, err := openPiper(tts.LoadConfig{Manifest: tinyPiperEN, Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, Options{Precision: Float16})})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, _, err = r.cache.acquire(r.m.Files[0])
	if err == nil || !strings.Contains(err.Error(), "piper_precision float16") || !strings.Contains(err.Error(), "cannot be decoded in chunks") {
		t.Errorf("a voice that cannot be split, in float16: %v", err)
	}
}
