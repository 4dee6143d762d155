package staged

import (
	"fmt"
	"math"
)

// A stream's audio is made window by window: each chunk's mel, after left context from the
// frames before it, is one vocoder window, of which only the audio of frames not yet heard and
// not held back is kept. A non-last window's last vocoder.lookahead_frames frames are held back:
// their audio depends on frames that come with the next chunk, which makes it instead. A vocoder
// that carries a source phase (vocoder.source_phase) is given the phase its previous window
// reached, so that the harmonics continue across windows.

// vocoderContext is the most left context, in frames, that a vocoder window takes:
// vocoder.context_frames, else streaming.context_tokens' frames.
func vocoderContext(m *Manifest) int {
	if m.Vocoder.ContextFrames > 0 {
		return m.Vocoder.ContextFrames
	}
	return m.Streaming.ContextTokens * m.Flow.FramesPerToken
}

// windowContext is the left context of a window after a chunk of prevFrames frames: without
// vocoder.context_frames, at most that chunk's frames.
func windowContext(m *Manifest, prevFrames int) int {
	if m.Vocoder.ContextFrames > 0 {
		return m.Vocoder.ContextFrames
	}
	return min(vocoderContext(m), prevFrames)
}

// vocHistory is what a stream's next vocoder window needs of the mel before it, owned by the
// flow loop. Frames are counted from the stream's start.
type vocHistory struct {
	mel  []float32 // channel-major, frames [from, end)
	from int
	end  int // frames the flow has made
	kept int // frames whose audio has been kept (made by a window before)
	prev int // frames of the last chunk
}

// vocWindow is one vocoder window of a stream: mel, channel-major, of frames [start, start+n),
// whose audio of window frames [keepFrom, keepTo) is kept.
type vocWindow struct {
	mel                     []float32
	start, keepFrom, keepTo int
}

// window returns the window that vocodes a chunk's mel (channel-major, C bins), last if it is
// the stream's last chunk, and keeps what the next window needs.
func (h *vocHistory) window(m *Manifest, chunk []float32, last bool) vocWindow {
	C := m.Flow.MelBins
	nf := len(chunk) / C
	start := max(0, h.kept-windowContext(m, h.prev))
	if start < h.from {
		start = h.from // the first window, or the context of a chunk shorter than it
	}
	end := h.end + nf
	n := end - start
	mel := make([]float32, C*n)
	hn, skip := h.end-h.from, start-h.from
	for c := 0; c < C; c++ {
		copy(mel[c*n:], h.mel[c*hn+skip:(c+1)*hn])
		copy(mel[c*n+h.end-start:(c+1)*n], chunk[c*nf:(c+1)*nf])
	}
	keepTo := end
	if !last {
		keepTo = max(h.kept, end-m.Vocoder.LookaheadFrames)
	}
	w := vocWindow{mel: mel, start: start, keepFrom: h.kept - start, keepTo: keepTo - start}
	// The next window starts at most the context before the audio kept so far; without
	// vocoder.context_frames its context comes from this chunk alone.
	from := max(start, keepTo-vocoderContext(m))
	if m.Vocoder.ContextFrames == 0 {
		from = max(from, min(h.end, keepTo))
	}
	hn = end - from
	h.mel = make([]float32, C*hn)
	for c := 0; c < C; c++ {
		copy(h.mel[c*hn:(c+1)*hn], mel[c*n+from-start:(c+1)*n])
	}
	h.from, h.end, h.kept, h.prev = from, end, keepTo, nf
	return w
}

// vocPhase is what the next window of a stream needs of the previous one's phase_out, owned by
// the vocoder loop.
type vocPhase struct {
	start int       // the previous window's first frame in the stream
	out   []float32 // its phase_out, [frames][source_phase]
}

// windowPhase is the phase (in cycles, reduced mod 1 per harmonic) and phase_at of a window
// that starts at stream frame start: 0 at frame 0 for a window at the stream's start; else the
// previous window's cumulative phase through frame start+at−1, at = vocoder.phase_frames.
func windowPhase(m *Manifest, prev *vocPhase, start int) (phase []float32, at int64, err error) {
	H := m.Vocoder.SourcePhase
	phase = make([]float32, H)
	if start == 0 {
		return phase, 0, nil
	}
	at = int64(m.Vocoder.PhaseFrames)
	if prev == nil {
		return nil, 0, fmt.Errorf("vocoder: a window at frame %d has no window before it to take its phase from", start)
	}
	row := start + int(at) - 1 - prev.start
	if row < 0 || (row+1)*H > len(prev.out) {
		return nil, 0, fmt.Errorf("vocoder: the phase at frame %d is outside the previous window (frames %d to %d)", start+int(at)-1, prev.start, prev.start+len(prev.out)/max(H, 1))
	}
	for k := range H {
		v := float64(prev.out[row*H+k])
		phase[k] = float32(v - math.Floor(v))
	}
	return phase, at, nil
}
