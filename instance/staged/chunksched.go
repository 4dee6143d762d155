package staged

import (
	"slices"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// chunkEncoderContext is how many tokens before the first frame a chunk-causal run reads (its
// conv_context_frames included) the flow encoder runs over: its look-ahead layer's causal
// convolution reads two tokens back, so its mu there equals a run over the whole utterance's.
const chunkEncoderContext = 8

// chunkSpan is what a chunk-causal run (flow.chunk_step) computes of its stream, in frames from the
// voice prompt's first: frames [from, end), from the first frame its stream has not kept (a chunk
// boundary); emit is the first frame the vocoder has not had yet, tokFrom the index in the voice's
// and the stream's tokens together of the item's first token (the encoder's window).
type chunkSpan struct {
	from, end, emit, tokFrom int
	// toks are the voice's and the stream's tokens to the chunk's end and look-ahead: a run that
	// computes again frames its stream gave up (chunkKV.drop) reads from further back.
	toks []int64
}

// voiceFrames is how many of a voice prompt's frames depend on the voice alone under the
// chunk-causal mask: its complete chunks short of the frames of its last look-ahead tokens, whose
// mu reads the request's first tokens.
func (m *Manifest) voiceFrames(promptFrames int) int {
	f := m.Flow
	n := max(promptFrames-f.LookaheadTokens*f.FramesPerToken, 0)
	return n / f.ChunkFrames * f.ChunkFrames
}

// chunkSize is the number of tokens of stream s's next chunk. With flow.chunk_step every chunk
// after the first ends on a chunk boundary (counted from the voice prompt's first frame), so that
// each is exact and its frames are kept; the first is streaming.chunk_tokens' first (early audio,
// computed again whole with the chunk that completes it) or, with flow_chunk_emit: cosyvoice,
// CosyVoice's first hop: one chunk, padded so that prompt and hop end on a boundary.
func (e *Engine) chunkSize(s *stream) int {
	m := e.p.m
	if m.Flow.ChunkStep == "" {
		return m.ChunkSize(s.chunk)
	}
	P := 0
	if s.voice != nil {
		P = len(s.voice.SpeechTokens)
	}
	per := m.Flow.ChunkFrames / m.Flow.FramesPerToken
	switch {
	case s.chunk == 0 && e.p.opt.chunkEmit != ChunkEmitCosyVoice:
		return m.ChunkSize(0)
	case s.chunk == 0:
		return (per-P%per)%per + per
	}
	next := ((P+s.flowed)/per + 1) * per
	return next - P - s.flowed
}

// chunkItem is the flow item of s's chunk of tokens [s.flowed, end) for the chunk-causal flow: it
// computes from the stream's first frame not kept to the chunk's end, and the chunks it completes
// are kept (chunkKV) for the next.
func (e *Engine) chunkItem(s *stream, prompt []int64, end, la int, last bool, text tts.TextSpan) *flowItem {
	f := e.p.m.Flow
	R, P := f.FramesPerToken, len(prompt)
	if s.chunk == 0 {
		s.kvFrom = e.p.m.voiceFrames(P * R)
	}
	sp := chunkSpan{from: s.kvFrom, end: (P + end) * R, emit: (P + s.flowed) * R}
	sp.tokFrom = e.p.m.chunkTokFrom(sp.from)
	all := slices.Concat(prompt, s.tokens[:end+la])
	sp.toks = all
	if last {
		s.kvFrom = sp.end
	} else {
		s.kvFrom = max(sp.from, sp.end/f.ChunkFrames*f.ChunkFrames)
	}
	return &flowItem{
		s:          s,
		queued:     time.Now(),
		tokens:     all[sp.tokFrom:],
		prompt:     P,
		lookahead:  la,
		firstToken: s.flowed,
		first:      s.chunk == 0,
		last:       last,
		text:       text,
		chunk:      &sp,
	}
}
