package staged

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// Engine runs many requests through one Pipeline at once, batching every stage across them:
// one LM loop decodes all active sequences in a single run per step (sequences join and leave
// between steps), and the flow and vocoder workers each run every chunk that is waiting for them
// in one call. The three run concurrently, so while the LM decodes, earlier chunks are turned into
// audio.
type Engine struct {
	p        *Pipeline
	arrivals chan *stream
	// Frame budgets of one flow and one vocoder batch.
	flowFrames, vocFrames int
	// Largest ratio of item lengths within one flow or vocoder batch (lengthSpread, or 1 with
	// engine option exact_batches).
	spread float64
	flowQ  *engine.Queue[*flowItem]
	vocQ   *engine.Queue[*vocItem]
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	stats  *engine.Counters
	// Where each request's first audio spent its time (FirstAudio).
	firstMu    sync.Mutex
	firstAudio []FirstAudio
	// Streams some stage holds, and what cancels cost (cancel.go).
	active  atomic.Int64
	cancels cancelCounters
	steps   atomic.Int64 // decode steps started
	// wakeFlow makes the flow loop drop cancelled chunks from its queue now rather than when a
	// batch next ends.
	wakeFlow chan struct{}
	// kvMu guards streams' kept keys and values (stream.kv) where the flow loop frees them for
	// room while another stage may release the stream.
	kvMu sync.Mutex
	// Speech tokens per character of text, learned from the streams the LM finished: it places
	// each chunk in the text (textSpan). Owned by the LM loop.
	tokensPerRune float64
	// onMel, where set (tests), sees each chunk's mel, channel-major, as the vocoder gets it.
	onMel func(s *stream, mel []float32, last bool)
}

// The engine's batched stages, in StageStats' names.
const (
	stageLMPrefill = iota
	stageLMDecode
	stageFlow
	stageVocoder
	// stageFlowGraph counts the flow batches (also counted in stageFlow) that ran in a fixed
	// shape: replays of CUDA graphs with flow_chunk_cuda_graph on, uncaptured with fixed.
	stageFlowGraph
	numStages
)

var stageNames = []string{"lm_prefill", "lm_decode", "flow", "vocoder", "flow_graph"}

// The engine's policy numbers.
const (
	// vocoderBatchFrames is the mel frames of one vocoder batch.
	vocoderBatchFrames = 16384
	// lengthSpread is the largest ratio of item lengths within one flow or vocoder batch (0
	// would allow any mix). Items are padded to the longest, so a first chunk of 30 frames batched
	// with chunks of 230 would cost 230; grouping by length keeps the padding below a third and
	// lets short first chunks run in small, fast batches of their own.
	lengthSpread = 1.3
	// firstAudioKept bounds the first-audio figures kept for a reader (FirstAudio), so that
	// memory stays bounded when nobody reads them.
	firstAudioKept = 100000
	// streamsPerPicker is the fewest sampling streams per goroutine worth picking tokens in
	// parallel (pickAll).
	streamsPerPicker = 4
)

// Stats counts each stage's batches and the items they carried since the engine started.
// flow_graph is there only where the flow runs fixed-shape batches.
func (e *Engine) Stats() []tts.StageStats {
	st := e.stats.Stats()
	if c, ok := e.p.flows[0].(*flowChunks); ok && c.graphs != nil {
		return st
	}
	return slices.DeleteFunc(st, func(s tts.StageStats) bool { return s.Stage == stageNames[stageFlowGraph] })
}

// NewEngine starts the engine's loops over p.
func NewEngine(p *Pipeline) *Engine { return newEngine(p, flowFrames(p.m), vocoderBatchFrames) }

// newEngine is NewEngine with the flow's and the vocoder's frame budgets per batch.
func newEngine(p *Pipeline, flowFrames, vocFrames int) *Engine {
	e := &Engine{
		p:          p,
		arrivals:   make(chan *stream),
		flowFrames: flowFrames,
		vocFrames:  vocFrames,
		spread:     lengthSpread,
		flowQ:      engine.NewQueue[*flowItem](),
		vocQ:       engine.NewQueue[*vocItem](),
		done:       make(chan struct{}),
		stats:      engine.NewCounters(stageNames...),
		wakeFlow:   make(chan struct{}, 1),
		// The middle of the manifest's bounds until streams have finished.
		tokensPerRune: (p.m.LM.MinTokensPerChar + p.m.LM.MaxTokensPerChar) / 2,
	}
	if p.opt.exactBatches {
		e.spread = 1
	}
	e.wg.Add(3)
	go e.lmLoop()
	go e.flowLoop()
	go e.vocoderLoop()
	return e
}

// Close stops the loops (requests still running fail) and frees the pipeline.
func (e *Engine) Close() error {
	var err error
	e.once.Do(func() {
		close(e.done)
		e.flowQ.Close()
		e.vocQ.Close()
		e.wg.Wait()
		err = e.p.Close()
	})
	return err
}

// Synthesize runs req and calls emit with each audio chunk in order. It returns when the audio is
// complete, emit fails, or ctx ends. Long text is spoken as segments (the manifest's text:), in
// order, as one stream of chunks: each segment's LM starts once the one before it has left the
// LM, so its audio is ready when the previous segment's ends.
func (e *Engine) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	if req.Text == "" {
		return tts.ErrEmptyText
	}
	if !utf8.ValidString(req.Text) {
		return tts.Invalid("text is not valid UTF-8")
	}
	lmVoice, voice, err := e.p.m.requestVoices(req)
	if err != nil {
		return err
	}
	segs := e.p.m.Segments(req.Text)
	prompts := make([][]int64, len(segs))
	segTokens := make([]int, len(segs))
	// Every segment is checked before any work starts.
	for i, seg := range segs {
		prompts[i], segTokens[i] = e.p.m.Prompt(lmVoice, seg)
		if err := e.checkPrompt(prompts[i], seg, segTokens[i], i, len(segs)); err != nil {
			return err
		}
	}
	reqCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the segments started and not yet spoken end with the request
	spans := segmentSpans(req.Text, segs)
	var started []*stream
	emitFailed := false
	defer func() { // before cancel: a segment still held is a cancel when the client is gone
		early := reqCtx.Err() != nil || emitFailed
		for _, s := range started {
			e.abandon(s, early)
		}
	}()
	emitOne := emit
	emit = func(c tts.Chunk) error {
		err := emitOne(c)
		emitFailed = emitFailed || err != nil
		return err
	}
	start := func() error {
		i := len(started)
		s := e.newStream(ctx, req, voice, segs[i], prompts[i], segTokens[i], i)
		s.textFrom, s.textEnd, s.textTo = spans[i][0], spans[i][0], spans[i][1]
		s.stopWatch = e.watchCancel(s)
		started = append(started, s)
		s.marks[markArrived] = time.Now()
		select {
		case e.arrivals <- s:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-e.done:
			return engine.ErrClosed
		}
	}
	if err := start(); err != nil {
		return err
	}
	index := 0
	for cur := 0; cur < len(segs); cur++ {
		s := started[cur]
		for {
			closed, err := s.out.Drain(s.ctx, &index, emit)
			if err != nil {
				return err
			}
			if closed {
				break
			}
			// The next segment starts once this one has left the LM, at most one ahead.
			var lmDone chan struct{}
			if len(started) == cur+1 && len(started) < len(segs) {
				lmDone = s.lmDone
			}
			select {
			case <-s.out.Ready():
			case <-lmDone:
				if err := start(); err != nil {
					return err
				}
			case <-s.ctx.Done():
				return s.ctx.Err()
			}
		}
		if len(started) == cur+1 && len(started) < len(segs) {
			if err := start(); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkPrompt refuses a segment's prompt that passes the model's limits, in tokens; segTokens
// of it are the segment's text.
func (e *Engine) checkPrompt(prompt []int64, seg string, segTokens, i, n int) error {
	m := e.p.m
	what := "the text"
	if n > 1 {
		what = fmt.Sprintf("segment %d of %d", i+1, n)
	}
	if lim := m.LM.MaxPromptTokens; len(prompt) > lim {
		return tts.Invalid(fmt.Sprintf("input is too long for model %s: %s makes %d prompt tokens; the limit is %d tokens (lm.max_prompt_tokens)", m.Name, what, len(prompt), lim))
	}
	if lim := e.p.lm.limit(); lim > 0 {
		// The LM's cache holds the prompt and every speech token but the last.
		minTok, _ := e.p.tokenBounds(seg, segTokens)
		if len(prompt)+minTok > lim {
			return tts.Invalid(fmt.Sprintf("input is too long for model %s: %s makes %d prompt tokens and needs at least %d speech tokens, more than the LM's %d positions (lm.max_positions)", m.Name, what, len(prompt), minTok, lim))
		}
	}
	return nil
}
