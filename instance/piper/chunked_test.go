package piper

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// models/tiny-piper-vits is made by scripts/piper/make_tiny_vits.py: Piper's interface with the
// structure of its VITS export (durations, monotonic path, flow, HiFi-GAN-shaped decoder).
const (
	tinyVITSDir   = "../../models/tiny-piper-vits"
	tinyVITSEN    = tinyVITSDir + "/en_US-tinyvits-x_low.onnx"
	tinyVITSMulti = tinyVITSDir + "/es_ES-tinyvitsmulti-x_low.onnx"
)

// Chunked audio equals one decoder run over the whole sentence within chunkTolerance (float32,
// largest absolute difference of raw audio; measured 0 on the tiny voices, at most 9.3e-7 on jenny).
const chunkTolerance = 1e-4

// The graph splits at the decoder's input, found by structure, with the decoder's receptive field
// read from its convolutions, and, asked to, at the flow's input, with the flow's field (its
// speaker conditioning where the voice has several); a graph without VITS's structure is refused
// with the reason.
func TestPiperSplit(t *testing.T) {
	for _, c := range []struct {
		path        string
		sid         bool
		left, right int
		// the flow's field in frames; flowReason: what keeps the flow in the front
		flowLeft, flowRight int
		flowReason          string
	}{
		{reference(t).voice, false, 13, 12, 32, 32, ""},
		{tinyVITSEN, false, 7, 6, 4, 4, ""},
		{tinyVITSMulti, true, 7, 6, 4, 4, ""},
	} {
		for _, flow := range []bool{false, true} {
			sp, reason, err := splitPiper(c.path, flow)
			if err != nil || sp == nil {
				t.Fatalf("%s: %v %s", c.path, err, reason)
			}
			if sp.decoderSID != c.sid || sp.left != c.left || sp.right != c.right || sp.hop != 256 {
				t.Errorf("%s: decoder input %s, sid %v, field %d/%d frames, hop %d; want sid %v, %d/%d, 256",
					c.path, sp.latent, sp.decoderSID, sp.left, sp.right, sp.hop, c.sid, c.left, c.right)
			}
			switch {
			case !flow && (sp.flow != nil || sp.flowReason != ""):
				t.Errorf("%s: the flow cut out unasked (%q)", c.path, sp.flowReason)
			case flow && c.flowReason == "" && (sp.flow == nil || sp.flowLeft != c.flowLeft || sp.flowRight != c.flowRight || sp.flowSID != c.sid):
				t.Errorf("%s: flow from %s with mask %s, field %d/%d, sid %v (%q); want %d/%d",
					c.path, sp.flowIn, sp.flowMask, sp.flowLeft, sp.flowRight, sp.flowSID, sp.flowReason, c.flowLeft, c.flowRight)
			case flow && c.flowReason != "" && (sp.flow != nil || !strings.Contains(sp.flowReason, c.flowReason)):
				t.Errorf("%s: flow cut %v with reason %q, want it kept in the front for %q", c.path, sp.flow != nil, sp.flowReason, c.flowReason)
			}
		}
	}
	sp, reason, err := splitPiper(tinyPiperEN, false)
	if err != nil || sp != nil || !strings.Contains(reason, "length computation") {
		t.Fatalf("tiny voice without VITS's structure: %v, %v, %q", sp, err, reason)
	}
}

// openRunner opens voice path on provider with options o, noise off, and returns its loaded
// session.
func openRunner(t *testing.T, path, provider string, o Options) (*Runner, *piperSession) {
	t.Helper()
	r, _, err := openPiper(tts.LoadConfig{Manifest: path, Provider: provider, ORTLibrary: ortLibrary(t), Engine: section(t, o)})
	if err != nil {
		t.Fatalf("%s on %s: %v", path, provider, err)
	}
	t.Cleanup(func() { r.Close() })
	for _, f := range r.m.Files {
		f.scales = [3]float32{0, 1, 0} // deterministic: no noise
	}
	s, release, err := r.cache.acquire(r.m.Files[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return r, s
}

// chunkRunner opens a voice on the CPU with options o and returns its loaded session.
func chunkRunner(t *testing.T, path string, o Options) (*Runner, *piperSession) {
	t.Helper()
	r, s := openRunner(t, path, "cpu", o)
	if (s.chunks != nil) != (o.Decode != DecodeSentences) {
		t.Fatalf("%s: chunked %v with piper_decode %q", path, s.chunks != nil, o.Decode)
	}
	return r, s
}

// decodeChunks decodes l in the runner's chunk sizes with left and right frames of context (with
// the flow in chunks, the flow run afresh).
func decodeChunks(t *testing.T, c *piperChunker, f *piperFile, l *latent, sid int64, left, right int) []float32 {
	t.Helper()
	fresh := *l
	fresh.lat, fresh.done, fresh.first = nil, 0, true
	l = &fresh
	var out []float32
	for at, size := 0, c.first; at < l.frames; size = min(2*size, c.most) {
		to := min(at+size, l.frames)
		w := window{l: l, sid: sid, lo: max(0, at-left), hi: min(l.frames, to+right), from: at, to: to}
		pcm, err := c.decode(f, []window{w})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pcm[0]...)
		at = to
	}
	return out
}

// Decoded in chunks of 12 frames doubling to 96 (and of 4 frames), with the receptive field as
// context, a sentence equals the decoder run once over all its frames, which equals the voice's
// whole graph (at speed 1 and 2); with less context than the field it does not. The test logs the
// largest difference and the least context that keeps it within chunkTolerance.
func TestPiperChunksEqualWhole(t *testing.T) {
	ph := testPhonemizer(t)
	for _, c := range []struct {
		path string
		sid  int64
		flow Flow
	}{{tinyVITSEN, 0, FlowFront}, {tinyVITSMulti, 1, FlowFront}, {tinyVITSEN, 0, FlowChunks}, {tinyVITSMulti, 1, FlowChunks},
		{reference(t).voice, 0, FlowFront}, {reference(t).voice, 0, FlowChunks}} {
		for _, sizes := range [][2]int{{12, 96}, {4, 4}} {
			_, s := chunkRunner(t, c.path, Options{FirstChunk: sizes[0], Chunk: sizes[1], Flow: c.flow})
			_, whole := chunkRunner(t, c.path, Options{Decode: DecodeSentences})
			ch, f := s.chunks, s.file
			if (ch.flow != nil) != (c.flow == FlowChunks) {
				t.Fatalf("%s: flow session %v with piper_flow %q", c.path, ch.flow != nil, c.flow)
			}
			sents, err := f.sentences(ph, "The weather is nice today, so we will walk to the park. What? No!")
			if err != nil {
				t.Fatal(err)
			}
			for si, sent := range sents {
				ls, err := ch.runFront(f, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(s, 1, 1), f.scales)
				if err != nil {
					t.Fatal(err)
				}
				l := &ls[0]
				one, err := ch.decode(f, []window{{l: l, sid: c.sid, hi: l.frames, to: l.frames}})
				if err != nil {
					t.Fatal(err)
				}
				graph, err := runPiperBatch(whole.sess, f, whole.lengths, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(whole, 1, 1), f.scales)
				if err != nil {
					t.Fatal(err)
				}
				if len(graph[0]) != len(one[0]) {
					t.Fatalf("%s: whole graph %d samples, front and decoder %d", f.Stem, len(graph[0]), len(one[0]))
				}
				if d := piperMaxDiff(graph[0], one[0]); d > chunkTolerance {
					t.Errorf("%s: front and decoder differ from the whole graph by %g", f.Stem, d)
				}
				if sizes[0] == 12 {
					// At another speed too: the speed edit in the front is the whole graph's.
					ls2, err := ch.runFront(f, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(s, 1, 2), f.scales)
					if err != nil {
						t.Fatal(err)
					}
					one2, err := ch.decode(f, []window{{l: &ls2[0], sid: c.sid, hi: ls2[0].frames, to: ls2[0].frames}})
					if err != nil {
						t.Fatal(err)
					}
					graph2, err := runPiperBatch(whole.sess, f, whole.lengths, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(whole, 1, 2), f.scales)
					if err != nil {
						t.Fatal(err)
					}
					if !s.speed || !whole.speed || len(graph2[0]) != len(one2[0]) || len(one2[0]) >= len(one[0]) {
						t.Fatalf("%s at speed 2: speed input %v/%v, whole graph %d samples, front and decoder %d (%d at speed 1)",
							f.Stem, s.speed, whole.speed, len(graph2[0]), len(one2[0]), len(one[0]))
					}
					if d := piperMaxDiff(graph2[0], one2[0]); d > chunkTolerance {
						t.Errorf("%s at speed 2: front and decoder differ from the whole graph by %g", f.Stem, d)
					}
				}
				left, right := ch.split.left, ch.split.right
				got := decodeChunks(t, ch, f, l, c.sid, left, right)
				if len(got) != len(one[0]) {
					t.Fatalf("%s: chunked %d samples, whole %d", f.Stem, len(got), len(one[0]))
				}
				d := piperMaxDiff(got, one[0])
				hop := ch.split.hop
				inner := piperMaxDiff(got[hop:len(got)-hop], one[0][hop:len(got)-hop])
				if d > chunkTolerance {
					t.Errorf("%s, chunks %v, %d frames: chunked differs from whole by %g (%g away from the first and last frames)", f.Stem, sizes, l.frames, d, inner)
				}
				t.Logf("%s, piper_flow %q, chunks %v: %d frames, largest difference %.2g (%.2g away from the ends), receptive field %d/%d frames",
					f.Stem, c.flow, sizes, l.frames, d, inner, left, right)
				if sizes[0] != 4 || si > 0 {
					continue
				}
				if ch.flow != nil {
					// The flow's own context matters: without it the chunks differ.
					fl, fr := ch.split.flowLeft, ch.split.flowRight
					ch.split.flowLeft, ch.split.flowRight = 0, 0
					d := piperMaxDiff(decodeChunks(t, ch, f, l, c.sid, left, right), one[0])
					ch.split.flowLeft, ch.split.flowRight = fl, fr
					if d <= chunkTolerance {
						t.Errorf("%s: the flow run over chunks with no context equals the whole run (%g): the test cannot tell context from none", f.Stem, d)
					}
				}
				// The least context on both sides that keeps the chunks equal.
				need := 0
				for k := range max(left, right) + 1 {
					if piperMaxDiff(decodeChunks(t, ch, f, l, c.sid, min(k, left), min(k, right)), one[0]) <= chunkTolerance {
						break
					}
					need = k + 1
				}
				t.Logf("%s, chunks %v: %d frames of context needed", f.Stem, sizes, need)
				if need == 0 {
					t.Errorf("%s: chunks of one frame with no context equal the whole run: the test cannot tell context from none", f.Stem)
				}
			}
		}
	}
}

// Through Synthesize, jenny with the flow in chunks speaks as with the flow in the front: the same
// chunks, equal within chunkTolerance after the gain, for a request of several sentences (the
// first one's flow run in two parts, the others' in the front with the flow).
func TestPiperFlowChunksSynthesize(t *testing.T) {
	text := "The weather is nice today, so we will walk to the park. What? No! It is raining again."
	var got [2][]tts.Chunk
	for i, flow := range []Flow{FlowFront, FlowChunks} {
		r, s := chunkRunner(t, reference(t).voice, Options{Flow: flow})
		if (s.chunks.flow != nil) != (flow == FlowChunks) || (s.chunks.frontWhole != nil) != (flow == FlowChunks) {
			t.Fatalf("piper_flow %s: flow session %v, front with the flow %v", flow, s.chunks.flow != nil, s.chunks.frontWhole != nil)
		}
		if flow == FlowChunks {
			// A batch of no request's first sentence runs the front with the flow: its latent
			// comes complete, and equals the flow run over the front's z_p.
			ch, f := s.chunks, s.file
			sents, err := f.sentences(testPhonemizer(t), text)
			if err != nil {
				t.Fatal(err)
			}
			ids := [][]int64{sents[0].IDs}
			whole, err := ch.runBatchFront(f, ids, []int64{0}, atSpeed(s, 1, 1), f.scales, []bool{false})
			if err != nil {
				t.Fatal(err)
			}
			split, err := ch.runBatchFront(f, ids, []int64{0}, atSpeed(s, 1, 1), f.scales, []bool{true})
			if err != nil {
				t.Fatal(err)
			}
			l := &split[0]
			if err := ch.runFlow(f, []window{{l: l, hi: l.frames, to: l.frames}}); err != nil {
				t.Fatal(err)
			}
			if w := whole[0]; w.done != w.frames || w.frames != l.frames || piperMaxDiff(w.lat, l.lat) > 1e-5 {
				t.Fatalf("front with the flow: %d of %d frames, %g from the flow run alone", w.done, w.frames, piperMaxDiff(w.lat, l.lat))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := r.Synthesize(ctx, tts.Request{Text: text}, func(c tts.Chunk) error {
			got[i] = append(got[i], c)
			return nil
		})
		cancel()
		if err != nil {
			t.Fatalf("piper_flow %s: %v", flow, err)
		}
	}
	if len(got[0]) != len(got[1]) || len(got[0]) < 5 {
		t.Fatalf("%d chunks with the flow in the front, %d in chunks", len(got[0]), len(got[1]))
	}
	for k := range got[0] {
		a, b := got[0][k], got[1][k]
		if len(a.PCM) != len(b.PCM) || *a.Text != *b.Text {
			t.Fatalf("chunk %d: %d samples for %+v in the front, %d for %+v in chunks", k, len(a.PCM), *a.Text, len(b.PCM), *b.Text)
		}
		if d := piperMaxDiff(a.PCM, b.PCM); d > chunkTolerance {
			t.Errorf("chunk %d: differs by %g", k, d)
		}
	}
}

// Through Synthesize a chunked sentence arrives in several chunks, the first after its first
// chunk's frames, each no louder than full scale, with spans that follow each other and end at
// each sentence's end; the audio, joined, is the whole run's, at one gain per sentence.
func TestPiperChunkedSynthesize(t *testing.T) {
	r, s := chunkRunner(t, tinyVITSEN, Options{FirstChunk: 4, Chunk: 16})
	r.m.SentenceSilence = 0
	_, whole := chunkRunner(t, tinyVITSEN, Options{Decode: DecodeSentences})
	text := "The weather is nice today. What? No!"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var chunks []tts.Chunk
	err := r.Synthesize(ctx, tts.Request{Text: text}, func(c tts.Chunk) error {
		chunks = append(chunks, c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sents, _ := s.file.sentences(testPhonemizer(t), text)
	if len(chunks) <= len(sents) {
		t.Fatalf("%d chunks for %d sentences", len(chunks), len(sents))
	}
	if n := len(chunks[0].PCM); n != 4*256 {
		t.Errorf("first chunk %d samples, want 4 frames", n)
	}
	from, si := 0, 0
	var joined []float32
	for i, c := range chunks {
		if c.Index != i || c.Text == nil || c.Text.Start != from || c.Text.End < from {
			t.Fatalf("chunk %d: index %d, span %+v after %d", i, c.Index, c.Text, from)
		}
		from = c.Text.End
		joined = append(joined, c.PCM...)
		if si < len(sents) && c.Text.End == min(sents[si].End, len(text)) || c.Text.End == len(text) {
			want, err := runPiperBatch(whole.sess, s.file, whole.lengths, [][]int64{sents[si].IDs}, []int64{0}, atSpeed(whole, 1, 1), s.file.scales)
			if err != nil {
				t.Fatal(err)
			}
			if len(joined) != len(want[0]) {
				t.Fatalf("sentence %d: %d samples chunked, %d whole", si, len(joined), len(want[0]))
			}
			g := float64(rawPeak(joined)) / float64(rawPeak(want[0]))
			for k := range joined {
				want[0][k] *= float32(g)
			}
			if d := piperMaxDiff(joined, want[0]); d > 1e-4 || rawPeak(joined) > 1 {
				t.Errorf("sentence %d: chunks differ from the whole run at gain %.3f by %g", si, g, d)
			}
			joined, si = nil, si+1
		}
	}
	if from != len(text) || si != len(sents) {
		t.Errorf("spans end at %d of %d, %d of %d sentences", from, len(text), si, len(sents))
	}
}

func TestPiperChunkOptions(t *testing.T) {
	o := piperOptionsFrom(tts.LoadConfig{Provider: "cpu"}, Options{})
	if !o.Chunks || o.FirstChunk != piperFirstChunk || o.Chunk != piperChunk || !o.ChunkFlow {
		t.Fatalf("defaults %+v", o)
	}
	if o := piperOptionsFrom(tts.LoadConfig{Provider: "cuda"}, Options{}); o.ChunkFlow {
		t.Fatalf("CUDA's defaults %+v: the flow in chunks", o)
	}
	if o := piperOptionsFrom(tts.LoadConfig{Provider: "cpu"}, Options{Flow: FlowFront}); o.ChunkFlow {
		t.Fatalf("piper_flow front: %+v", o)
	}
	if o := piperOptionsFrom(tts.LoadConfig{Provider: "cuda"}, Options{Flow: FlowChunks}); !o.ChunkFlow {
		t.Fatalf("piper_flow chunks on CUDA: %+v", o)
	}
	o = piperOptionsFrom(tts.LoadConfig{Provider: "cuda"}, Options{Decode: DecodeSentences, FirstChunk: 300})
	if o.Chunks || o.FirstChunk != 300 || o.Chunk != 300 || o.ChunkFlow {
		t.Fatalf("sentences, first chunk above the default most: %+v", o)
	}
	got, err := Family{}.ParseOptions(tts.EngineSection(`{"piper_decode": "sentences", "piper_first_chunk": 8, "piper_chunk": 64}`))
	if want := (Options{Decode: DecodeSentences, FirstChunk: 8, Chunk: 64}); err != nil || got != want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	for section, want := range map[string]string{
		`{"piper_decode": "frames"}`:  `engine.piper_decode: "frames" is not one of [chunks sentences]`,
		`{"piper_first_chunk": 0.5}`:  "engine.piper_first_chunk: 0.5 is not a whole number",
		`{"piper_first_chunk": 2000}`: "engine.piper_first_chunk: 2000 is not a number from 1 to 1024",
		`{"piper_chunk": -1}`:         "engine.piper_chunk: -1 is not a number from 1 to 4096",
		`{"piper_flow": "decoder"}`:   `engine.piper_flow: "decoder" is not one of [front chunks]`,
	} {
		if _, err := (Family{}).ParseOptions(tts.EngineSection(section)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", section, err, want)
		}
	}
}
