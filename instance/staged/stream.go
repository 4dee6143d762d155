package staged

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// stream is one request moving through the engine.
type stream struct {
	ctx    context.Context
	cancel context.CancelFunc
	req    tts.Request
	prompt []int64
	// voice is the zero-shot prompt the stream speaks with; nil: none.
	voice *Voice
	// sampler draws the stream's tokens; nil: greedy (the manifest has no lm.sampling).
	sampler *sampler
	// lmDone is closed once the stream has left the LM (done, failed or cancelled).
	lmDone chan struct{}
	lmOnce sync.Once
	// stopWatch ends watchCancel's watch of the stream.
	stopWatch func() bool
	// textFrom and textTo bound the part of req.Text the stream (one segment) speaks.
	textFrom, textTo int

	// Owned by the LM loop.
	row            *lmRow
	tokens         []int64
	minTok, maxTok int
	flowed         int // tokens already handed to the flow
	chunk          int // index of the next chunk
	textEnd        int // byte offset in req.Text where the chunks handed to the flow end
	// kvFrom is the first frame (from the voice prompt's) that the stream's chunk-causal runs have
	// not kept once the chunks handed to the flow have run (flow.chunk_step).
	kvFrom int

	// kv is the stream's kept keys and values (flow.chunk_step), owned by the batch that runs its
	// chunk; released with the stream's last hold (Engine.release).
	kv *chunkKV

	// Owned by the flow loop: the mel the vocoder's next window needs.
	vocHist vocHistory
	// Owned by the vocoder loop: the previous window's phase (vocoder.source_phase).
	vocPhase *vocPhase

	// When the first audio passed each mark, written by the loop the stream is in at the time.
	marks [numMarks]time.Time

	// Stages holding the stream, and when its request was cancelled while they did (UnixNano;
	// 0: not cancelled, -1: counted). See cancel.go.
	held     atomic.Int32
	cancelAt atomic.Int64
	// 1 + the decode steps started when its request was cancelled; 0: not cancelled.
	cancelStep atomic.Int64

	// Output, handed from the vocoder loop to Synthesize; next is the index of the stream's next
	// chunk, owned by the vocoder loop.
	out  engine.Output
	next int
}

// newStream makes the stream of segment i of req, whose text is seg and prompt prompt (in voice,
// segTokens of it the segment's text).
func (e *Engine) newStream(ctx context.Context, req tts.Request, voice *Voice, seg string, prompt []int64, segTokens, i int) *stream {
	ctx, cancel := context.WithCancel(ctx)
	s := &stream{ctx: ctx, cancel: cancel, req: req, prompt: prompt, voice: voice, lmDone: make(chan struct{})}
	s.minTok, s.maxTok = e.p.tokenBounds(seg, segTokens)
	if lim := e.p.lm.limit(); lim > 0 {
		s.maxTok = min(s.maxTok, lim-len(prompt))
	}
	if sp := e.p.m.LM.Sampling; sp != nil {
		s.sampler = newSampler(*sp, req.Seed, i)
	}
	return s
}

// leftLM records that the stream needs the LM no more.
func (s *stream) leftLM() { s.lmOnce.Do(func() { close(s.lmDone) }) }

func (s *stream) push(pcm []float32, rate int, text tts.TextSpan) {
	s.out.Push(tts.Chunk{PCM: pcm, SampleRate: rate, Index: s.next, Text: &text})
	s.next++
}

func (s *stream) finish(err error) {
	s.leftLM()
	s.out.Finish(err)
}

// liveItems drops the items of streams whose request has ended.
func liveItems[T any](e *Engine, items []T, s func(T) *stream) []T {
	out := items[:0]
	for _, it := range items {
		if err := s(it).ctx.Err(); err != nil {
			s(it).finish(err)
			e.release(s(it))
			continue
		}
		out = append(out, it)
	}
	return out
}
