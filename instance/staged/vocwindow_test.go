package staged

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// streamMel is a stream's mel of n frames, 2 bins, channel-major, in chunks of the given frames:
// bin c of frame f is 1000·c + f.
func streamMel(sizes []int) [][]float32 {
	var out [][]float32
	at := 0
	for _, n := range sizes {
		ch := make([]float32, 2*n)
		for c := range 2 {
			for f := range n {
				ch[c*n+f] = float32(1000*c + at + f)
			}
		}
		out = append(out, ch)
		at += n
	}
	return out
}

// windows runs a stream's chunks through vocHistory and checks that every window's mel is the
// stream's over its frames; it returns each window as "start+frames keep [from,to)".
func windows(t *testing.T, m *Manifest, sizes []int) []string {
	t.Helper()
	var h vocHistory
	var out []string
	kept := 0
	for i, ch := range streamMel(sizes) {
		w := h.window(m, ch, i == len(sizes)-1)
		n := len(w.mel) / 2
		for c := range 2 {
			for f := range n {
				if w.mel[c*n+f] != float32(1000*c+w.start+f) {
					t.Fatalf("window %d: bin %d frame %d is %v, want the stream's frame %d", i, c, f, w.mel[c*n+f], w.start+f)
				}
			}
		}
		// The kept audio tiles the stream: each window's begins where the last one's ended.
		if w.start+w.keepFrom != kept || w.keepTo < w.keepFrom {
			t.Fatalf("window %d keeps [%d, %d) of the stream after %d kept", i, w.start+w.keepFrom, w.start+w.keepTo, kept)
		}
		kept = w.start + w.keepTo
		out = append(out, fmt.Sprintf("%d+%d keep [%d,%d)", w.start, n, w.keepFrom, w.keepTo))
	}
	if total := sum(sizes); kept != total {
		t.Fatalf("kept %d frames of %d", kept, total)
	}
	return out
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

// Without the vocoder keys a window is the chunk after up to context_tokens' frames of the chunk
// before, all of whose audio is kept, as the engine always made them.
func TestVocoderWindowsWithoutLookahead(t *testing.T) {
	m := &Manifest{Flow: FlowSpec{MelBins: 2, FramesPerToken: 2}, Streaming: StreamingSpec{ContextTokens: 4}}
	got := windows(t, m, []int{20, 50, 100, 6, 3})
	want := []string{"0+20 keep [0,20)", "12+58 keep [8,58)", "62+108 keep [8,108)", "162+14 keep [8,14)", "170+9 keep [6,9)"}
	if !slices.Equal(got, want) {
		t.Fatalf("windows %v, want %v", got, want)
	}
}

// With vocoder.context_frames and lookahead_frames a non-last window's last frames are held
// back and made by the next window, after context_frames before them; the last keeps all. The
// first window therefore keeps fewer frames, and the total is the stream's.
func TestVocoderWindowsWithLookahead(t *testing.T) {
	m := &Manifest{Flow: FlowSpec{MelBins: 2, FramesPerToken: 2}, Streaming: StreamingSpec{ContextTokens: 4},
		Vocoder: VocoderSpec{ContextFrames: 36, LookaheadFrames: 5}}
	got := windows(t, m, []int{20, 50, 100, 4, 3})
	want := []string{
		"0+20 keep [0,15)",     // 5 frames held back
		"0+70 keep [15,65)",    // 15 frames before it, fewer than 36: from the stream's start
		"29+141 keep [36,136)", // 65−36
		"129+45 keep [36,40)",  // a chunk shorter than the look-ahead: 4 held-back frames kept
		"133+44 keep [36,44)",  // the last keeps all
	}
	if !slices.Equal(got, want) {
		t.Fatalf("windows %v, want %v", got, want)
	}
	// The fixed-shape vocoder lengths follow: the first chunk alone, later ones after the
	// context and the held-back frames.
	m.Streaming.ChunkTokens = []int{10, 25, 50}
	if got, want := vocoderFrames(m), []int{20, 70, 141}; !slices.Equal(got, want) {
		t.Fatalf("vocoder frames %v, want %v", got, want)
	}
}

// A window's phase: 0 at frame 0 for a window at the stream's start; else phase_frames, and the
// previous window's phase_out at the frame before it (the window's start + phase_frames − 1),
// reduced mod 1 per harmonic.
func TestWindowPhase(t *testing.T) {
	m := &Manifest{Vocoder: VocoderSpec{SourcePhase: 2, PhaseFrames: 8}}
	ph, at, err := windowPhase(m, nil, 0)
	if err != nil || at != 0 || !slices.Equal(ph, []float32{0, 0}) {
		t.Fatalf("first window: phase %v at %d, err %v", ph, at, err)
	}
	// The previous window covered frames 10..39; row r holds (r + 0.25, −r − 0.25).
	prev := &vocPhase{start: 10, out: make([]float32, 30*2)}
	for r := range 30 {
		prev.out[2*r], prev.out[2*r+1] = float32(r)+0.25, -float32(r)-0.25
	}
	ph, at, err = windowPhase(m, prev, 29) // reads frame 29+8−1 = 36, row 26
	if err != nil || at != 8 || !slices.Equal(ph, []float32{0.25, 0.75}) {
		t.Fatalf("later window: phase %v at %d, err %v; want [0.25 0.75] at 8", ph, at, err)
	}
	// A window at the stream's start again (its context reaches back to frame 0): phase 0.
	if ph, at, _ := windowPhase(m, prev, 0); at != 0 || ph[0] != 0 {
		t.Fatalf("a later window at frame 0: phase %v at %d", ph, at)
	}
	for _, start := range []int{2, 33} { // rows −1 and 30
		if _, _, err := windowPhase(m, prev, start); err == nil || !strings.Contains(err.Error(), "outside the previous window") {
			t.Fatalf("start %d: err %v", start, err)
		}
	}
	if _, _, err := windowPhase(m, nil, 5); err == nil {
		t.Fatal("a later window without a previous one: no error")
	}
}

// Only one window of a stream runs in a batch: its next needs its phase_out.
func TestOneWindowPerStream(t *testing.T) {
	a, b := &stream{}, &stream{}
	items := []*vocItem{{s: a}, {s: b}, {s: a}, {s: b}, {s: a}}
	take, rest := oneWindowPerStream(items[:4], items[4:])
	if !slices.Equal(take, []*vocItem{items[0], items[1]}) || !slices.Equal(rest, []*vocItem{items[2], items[3], items[4]}) {
		t.Fatal("a batch holds two windows of one stream, or the rest left its order")
	}
}

// The phase keys are checked at load.
func TestVocoderPhaseKeys(t *testing.T) {
	m := tinyManifest(t)
	m.Vocoder.SourcePhase, m.Vocoder.ContextFrames, m.Vocoder.PhaseFrames = 9, 6, 8
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "vocoder.phase_frames") {
		t.Fatalf("phase_frames past context_frames: err %v", err)
	}
	m.Vocoder.ContextFrames = 36
	if err := m.validate(); err != nil {
		t.Fatal(err)
	}
	m.Vocoder.SourcePhase = 0
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "vocoder.phase_frames: applies only") {
		t.Fatalf("phase_frames without source_phase: err %v", err)
	}
}
