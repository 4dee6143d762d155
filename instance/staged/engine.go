package staged

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
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
	// Largest ratio of item lengths within one flow or vocoder batch (0: any mix; 1: one length,
	// engine option exact_batches). Items are padded to the longest, so a first chunk of 30 frames
	// batched with chunks of 230 would cost 230; grouping by length keeps the padding below a
	// third and lets short first chunks run in small, fast batches of their own.
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
	// Speech tokens per character of text, learned from the streams the LM finished: it places
	// each chunk in the text (textSpan). Owned by the LM loop.
	tokensPerRune float64
}

// The engine's batched stages, in StageStats' names.
const (
	stageLMPrefill = iota
	stageLMDecode
	stageFlow
	stageVocoder
	numStages
)

var stageNames = []string{"lm_prefill", "lm_decode", "flow", "vocoder"}

// Stats counts each stage's batches and the items they carried since the engine started.
func (e *Engine) Stats() []tts.StageStats { return e.stats.Stats() }

// NewEngine starts the engine's loops over p.
func NewEngine(p *Pipeline) *Engine { return newEngine(p, flowFrames(p.m), 16384) }

// newEngine is NewEngine with the flow's and the vocoder's frame budgets per batch.
func newEngine(p *Pipeline, flowFrames, vocFrames int) *Engine {
	e := &Engine{
		p:          p,
		arrivals:   make(chan *stream),
		flowFrames: flowFrames,
		vocFrames:  vocFrames,
		spread:     1.3,
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the segments started and not yet spoken end with the request
	spans := segmentSpans(req.Text, segs)
	var started []*stream
	defer func() {
		for _, s := range started {
			s.stopWatch()
		}
	}()
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
			return errors.New("engine is shut down")
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
		minTok, _ := m.TokenBounds(seg, segTokens)
		if len(prompt)+minTok > lim {
			return tts.Invalid(fmt.Sprintf("input is too long for model %s: %s makes %d prompt tokens and needs at least %d speech tokens, more than the LM's %d positions (lm.max_positions)", m.Name, what, len(prompt), minTok, lim))
		}
	}
	return nil
}

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
	s.minTok, s.maxTok = e.p.m.TokenBounds(seg, segTokens)
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

// The marks on a request's way to its first audio.
const (
	markArrived = iota // handed to the LM loop
	markPrefill        // prompt prefilled
	markQueued         // first chunk of speech tokens handed to the flow
	markMel            // first chunk's mel handed to the vocoder
	numMarks
)

// FirstAudio is where one request's first audio spent its time: waiting for the LM loop and
// prefilling its prompt, decoding the first chunk's speech tokens, waiting for and running the
// flow, waiting for and running the vocoder.
type FirstAudio struct {
	Prefill, Decode, Flow, Vocoder time.Duration
}

// FirstAudio returns what requests' first audio spent its time on since the last call.
func (e *Engine) FirstAudio() []FirstAudio {
	e.firstMu.Lock()
	defer e.firstMu.Unlock()
	out := e.firstAudio
	e.firstAudio = nil
	return out
}

// firstAudioOut records s's first audio, which leaves now.
func (e *Engine) firstAudioOut(s *stream) {
	m := s.marks
	f := FirstAudio{Prefill: m[markPrefill].Sub(m[markArrived]), Decode: m[markQueued].Sub(m[markPrefill]),
		Flow: m[markMel].Sub(m[markQueued]), Vocoder: time.Since(m[markMel])}
	e.firstMu.Lock()
	defer e.firstMu.Unlock()
	if len(e.firstAudio) < 100000 { // nobody reading: keep memory bounded
		e.firstAudio = append(e.firstAudio, f)
	}
}

type flowItem struct {
	s      *stream
	queued time.Time
	tokens []int64 // the voice's prompt + context + chunk + look-ahead
	// prompt, ctxTokens and lookahead count tokens' prompt, context and look-ahead tokens.
	prompt, ctxTokens, lookahead int
	firstToken                   int // index of tokens[prompt] in the stream
	first                        bool
	last                         bool
	text                         tts.TextSpan // the part of the text the chunk speaks
}

type vocItem struct {
	s      *stream
	queued time.Time
	win    vocWindow // the mel and which of its audio is kept
	first  bool
	last   bool
	text   tts.TextSpan
}

func (e *Engine) lmLoop() {
	defer e.wg.Done()
	dec := e.p.lm
	defer dec.release()
	var active []*stream
	fail := func(err error) {
		for _, s := range active {
			s.finish(err)
			e.release(s)
		}
		active = nil
		dec.release()
	}
	for {
		var fresh []*stream
		if len(active) == 0 {
			select {
			case s := <-e.arrivals:
				e.hold(s)
				fresh = append(fresh, s)
			case <-e.done:
				return
			}
		}
	drain:
		for {
			select {
			case s := <-e.arrivals:
				e.hold(s)
				fresh = append(fresh, s)
			case <-e.done:
				fail(errors.New("engine is shut down"))
				for _, s := range fresh {
					s.finish(errors.New("engine is shut down"))
					e.release(s)
				}
				return
			default:
				break drain
			}
		}
		// One decode step for every active stream, in one run.
		live := active[:0]
		for _, s := range active {
			if s.ctx.Err() != nil {
				// Cancelled: out of the batch before the next step.
				s.finish(s.ctx.Err())
				dec.leave(s.row)
				e.cancels.leftLM(s, e.steps.Load())
				e.release(s)
				continue
			}
			live = append(live, s)
		}
		active = live
		if len(active) > 0 {
			rows := make([]*lmRow, len(active))
			tokens := make([]int64, len(active))
			for i, s := range active {
				rows[i] = s.row
				tokens[i] = s.tokens[len(s.tokens)-1] + e.p.m.LM.SpeechTokenOffset
			}
			t0 := time.Now()
			e.steps.Add(1)
			logits, err := dec.step(rows, tokens)
			e.stats.Count(stageLMDecode, len(rows), t0)
			if err != nil {
				fail(err)
			} else {
				next := active[:0]
				toks := e.pickAll(active, logits)
				for i, s := range active {
					if e.advance(s, toks[i]) {
						next = append(next, s)
					} else {
						dec.leave(s.row)
						e.release(s)
					}
				}
				active = next
			}
		}
		// New streams are prefilled and join the batch for the next step, so arrivals never hold
		// the running streams back by more than one round of prefills. Those cancelled while they
		// waited are not prefilled.
		fresh = slices.DeleteFunc(fresh, func(s *stream) bool {
			if err := s.ctx.Err(); err != nil {
				s.finish(err)
				e.release(s)
				return true
			}
			return false
		})
		for _, group := range prefillGroups(fresh, dec.prefillRows(), e.p.m.LM.MaxPromptTokens) {
			prompts := make([][]int64, len(group))
			arrived := make([]time.Time, len(group))
			for i, s := range group {
				prompts[i], arrived[i] = s.prompt, s.marks[markArrived]
			}
			t0 := time.Now()
			e.stats.Waited(stageLMPrefill, t0, arrived...)
			rows, logits, err := dec.join(prompts)
			e.stats.Count(stageLMPrefill, len(prompts), t0)
			var toks []int
			if err == nil {
				toks = e.pickAll(group, logits)
			}
			for i, s := range group {
				s.marks[markPrefill] = time.Now()
				switch {
				case err != nil:
					s.finish(err)
					e.release(s)
				case e.advance(s, toks[i]):
					s.row = rows[i]
					active = append(active, s)
				default:
					dec.leave(rows[i])
					e.release(s)
				}
			}
		}
		if err := dec.compact(); err != nil {
			fail(err)
		}
	}
}

// prefillGroups splits new streams into the prefills that run them: by prompt length, so a
// prefill pads its prompts little, in groups of at most n (0: any number). A burst of arrivals
// (a level of a benchmark, clients back after a restart) then runs as prefills of shapes the
// decoder prepared at load: on an H100 one prefill of 17.6 prompts in shapes it had not run before
// took 150 ms on average and held every running stream meanwhile. A group also costs at most what
// one prompt of maxTokens costs (0: no bound): rows × longest² ≤ maxTokens², since a prefill's
// attention memory grows with its rows and the square of its padded length, so concurrent long
// prompts take no more memory than one at the limit.
func prefillGroups(fresh []*stream, n, maxTokens int) [][]*stream {
	if len(fresh) == 0 {
		return nil
	}
	sorted := slices.Clone(fresh)
	slices.SortStableFunc(sorted, func(a, b *stream) int { return cmp.Compare(len(a.prompt), len(b.prompt)) })
	if n <= 0 {
		n = len(sorted)
	}
	budget := int64(maxTokens) * int64(maxTokens)
	var out [][]*stream
	for len(sorted) > 0 {
		k := 1
		for k < min(n, len(sorted)) {
			longest := int64(len(sorted[k].prompt)) // sorted: the group's longest if it takes k+1
			if budget > 0 && int64(k+1)*longest*longest > budget {
				break
			}
			k++
		}
		out = append(out, sorted[:k:k])
		sorted = sorted[k:]
	}
	return out
}

// pickAll chooses each stream's next token from its logits (end of speech banned below the
// stream's minimum). Sampling streams are picked in parallel when they are many: a pick reads the
// whole speech vocabulary (60–140 µs for CosyVoice3's 6,562 on a shared 2-core CPU) and runs between
// two LM steps. Each stream's pick depends on its own logits and generator alone.
func (e *Engine) pickAll(streams []*stream, logits [][]float32) []int {
	toks := make([]int, len(streams))
	pick := func(i int) {
		s := streams[i]
		allowEnd := len(s.tokens) >= s.minTok
		if s.sampler != nil {
			toks[i] = s.sampler.pick(logits[i], s.tokens, allowEnd)
		} else {
			toks[i] = argmax(logits[i], allowEnd)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(streams)/4)
	if workers < 2 || e.p.m.LM.Sampling == nil {
		for i := range streams {
			pick(i)
		}
		return toks
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(streams); i += workers {
				pick(i)
			}
		}()
	}
	wg.Wait()
	return toks
}

// advance takes the stream's next token, hands finished chunks to the flow, and reports whether
// the stream still needs the LM.
func (e *Engine) advance(s *stream, tok int) bool {
	m := e.p.m
	done := tok == m.LM.SpeechVocab
	if !done {
		s.tokens = append(s.tokens, int64(tok))
		done = len(s.tokens) >= s.maxTok
	}
	if done {
		e.learnTokensPerRune(s)
	}
	// A chunk leaves only when more tokens follow it, so the stream's last chunk is always
	// handed over with last=true; and, while the LM runs, only once its look-ahead tokens exist.
	for {
		pending := len(s.tokens) - s.flowed
		size := m.ChunkSize(s.chunk)
		if done && pending <= size {
			s.leftLM()
			if pending > 0 {
				e.toFlow(s, len(s.tokens), true)
			} else {
				s.finish(nil) // no speech at all
			}
			return false
		}
		if !done && pending < size+max(m.Flow.LookaheadTokens, 1) {
			return true
		}
		e.toFlow(s, s.flowed+size, false)
	}
}

func (e *Engine) toFlow(s *stream, end int, last bool) {
	if s.chunk == 0 {
		s.marks[markQueued] = time.Now()
	}
	start, la := chunkInput(e.p.m, s.flowed, end, len(s.tokens), last)
	text := e.textSpan(s, end, last)
	var prompt []int64
	if s.voice != nil {
		prompt = s.voice.SpeechTokens
	}
	e.hold(s)
	e.flowQ.Push(&flowItem{
		s:          s,
		queued:     time.Now(),
		tokens:     slices.Concat(prompt, s.tokens[start:end+la]),
		prompt:     len(prompt),
		ctxTokens:  s.flowed - start,
		lookahead:  la,
		firstToken: start,
		first:      s.chunk == 0,
		last:       last,
		text:       text,
	})
	s.flowed = end
	s.chunk++
}

// flowRun is a batch of chunks on one flow worker, and the flow time it took.
type flowRun struct {
	items  []*flowItem
	worker int
	mels   [][]float32 // each item's, once done
	busy   time.Duration
	err    error
}

// urgent reports whether the batch leads with a first chunk.
func (r *flowRun) urgent() bool { return r.items[0].first }

// flowLanes decides which flow batch starts on which worker. Each worker (Pipeline.flows) has
// its own ONNX Runtime sessions and so its own CUDA stream, so batches on several workers
// overlap one's kernel launches with another's kernels (on an H100: P95 time to first audio at
// 64 streams 972 → 869 ms with two workers; no gain at 256, where the flow is bound by the GPU;
// docs/benchmarks/RESULTS.md). With more than one worker,
// batches of later chunks (bulk) hold at most all workers but one, so a new stream's first
// chunk never waits for a whole bulk batch; first chunks start on any free worker, ahead of
// later chunks. With share, bulk batches may hold every worker: more throughput under load, a
// longer wait for first audio (engine option flow_first_worker). A stream's chunks stay in
// order: none joins a batch while another of its chunks is in one.
type flowLanes struct {
	runs           []*flowRun       // by worker; nil where free
	busy           map[*stream]bool // streams with a chunk in a batch under way
	budget         int              // frames per batch
	share          bool             // no worker is kept for first chunks
	spread         float64          // see takeBatch
	framesPerToken int
	// fit says how many of n items of up to tokens tokens a batch takes (flowRunner.fit): with the
	// flow's CUDA graphs, batches that fill a captured shape.
	fit func(n, tokens int) int
	// fits reports whether n items of up to tokens tokens may run at once (the manifest's
	// flow.max_batch_frames counts padded frames, which the budget does not).
	fits func(n, tokens int) bool
}

func newFlowLanes(workers, budget int, spread float64, framesPerToken int, fit func(n, tokens int) int, fits func(n, tokens int) bool) *flowLanes {
	return &flowLanes{runs: make([]*flowRun, workers), busy: map[*stream]bool{}, budget: budget, spread: spread, framesPerToken: framesPerToken, fit: fit, fits: fits}
}

// trim cuts take to what fit and fits allow; what it leaves waits first.
func (l *flowLanes) trim(take, rest []*flowItem) ([]*flowItem, []*flowItem) {
	longest := func(items []*flowItem) int {
		tokens := 0
		for _, it := range items {
			tokens = max(tokens, len(it.tokens))
		}
		return tokens
	}
	k := len(take)
	if l.fit != nil && k > 0 {
		if n := l.fit(k, longest(take)); n > 0 && n < k {
			k = n
		}
	}
	for l.fits != nil && k > 1 && !l.fits(k, longest(take[:k])) {
		k--
	}
	if k < len(take) {
		return take[:k:k], slices.Concat(take[k:], rest)
	}
	return take, rest
}

// running counts the batches under way; bulk those of them without a first chunk in the lead.
func (l *flowLanes) running() (all, bulk int) {
	for _, r := range l.runs {
		if r != nil {
			all++
			if !r.urgent() {
				bulk++
			}
		}
	}
	return all, bulk
}

// admit returns the batch to start now, if any, the worker to start it on, and the items left
// waiting, in order.
func (l *flowLanes) admit(items []*flowItem) (take, rest []*flowItem, worker int) {
	worker = slices.Index(l.runs, nil)
	if len(items) == 0 || worker < 0 {
		return nil, items, -1
	}
	info := func(it *flowItem) (int, bool, *stream) { return len(it.tokens) * l.framesPerToken, it.first, it.s }
	if _, bulk := l.running(); l.share || len(l.runs) == 1 || bulk < len(l.runs)-1 {
		take, rest = l.trim(engine.TakeBatch(items, l.budget, l.spread, l.busy, info))
		return take, rest, worker
	}
	// The last free worker is kept for first chunks.
	var first, later []*flowItem
	for _, it := range items {
		if it.first {
			first = append(first, it)
		} else {
			later = append(later, it)
		}
	}
	take, first = l.trim(engine.TakeBatch(first, l.budget, l.spread, l.busy, info))
	return take, append(first, later...), worker
}

// add records a started batch on its worker.
func (l *flowLanes) add(r *flowRun) {
	for _, it := range r.items {
		l.busy[it.s] = true
	}
	l.runs[r.worker] = r
}

// remove frees a finished batch's worker and streams.
func (l *flowLanes) remove(r *flowRun) {
	for _, it := range r.items {
		delete(l.busy, it.s)
	}
	l.runs[r.worker] = nil
}

// flowLoop starts batches of chunks on the flow workers as they free up, and hands each
// finished batch to the vocoder. It alone touches the lanes and the streams' flow state.
func (e *Engine) flowLoop() {
	defer e.wg.Done()
	lanes := newFlowLanes(len(e.p.flows), e.flowFrames, e.spread, e.p.m.Flow.FramesPerToken, e.p.flows[0].fit,
		func(n, tokens int) bool { return e.p.m.flowBatchFits(n, tokens) == nil })
	lanes.share = e.p.opt.flowShare
	finished := make(chan *flowRun)
	ready := e.flowQ.Ready()
	var waiting []*flowItem
	for {
		items, ok := e.flowQ.TryPopAll()
		waiting = liveItems(e, append(waiting, items...), func(it *flowItem) *stream { return it.s })
		if !ok {
			// Shut down: what waits fails now, batches under way at their next step.
			for _, it := range waiting {
				it.s.finish(errors.New("engine is shut down"))
				e.release(it.s)
			}
			waiting, ready = nil, nil
			if all, _ := lanes.running(); all == 0 {
				return
			}
		}
		for ok {
			take, rest, w := lanes.admit(waiting)
			if len(take) == 0 {
				break
			}
			waiting = rest
			now := time.Now()
			for _, it := range take {
				e.stats.Waited(stageFlow, now, it.queued)
			}
			r := &flowRun{items: take, worker: w}
			lanes.add(r)
			go e.runFlow(r, finished)
		}
		select {
		case r := <-finished:
			lanes.remove(r)
			e.stats.CountFor(stageFlow, len(r.items), r.busy)
			e.flowDone(r, r.err)
		case <-ready:
		case <-e.wakeFlow:
		}
	}
}

// runFlow runs a batch through the flow on its worker (the encoder, then every Euler step) and
// sends it to done.
func (e *Engine) runFlow(r *flowRun, done chan<- *flowRun) {
	jobs := make([]flowJob, len(r.items))
	for i, it := range r.items {
		jobs[i] = e.p.flowJob(it)
	}
	stop, unwatch := cancelledBatch(r.items, e.done)
	t0 := time.Now()
	r.mels, r.err = e.p.flows[r.worker].run(jobs, stop)
	r.busy = time.Since(t0)
	unwatch()
	if r.err != nil && r.items[0].s.ctx.Err() != nil && !isShutDown(e.done) {
		r.err = r.items[0].s.ctx.Err() // stopped because every item was cancelled
	}
	done <- r
}

// flowDone hands a finished batch's mel to the vocoder, each chunk as a window over its stream's
// mel (vocHistory.window); on err its streams fail.
func (e *Engine) flowDone(r *flowRun, err error) {
	m := e.p.m
	C, R := m.Flow.MelBins, m.Flow.FramesPerToken
	mels := r.mels
	for i, it := range r.items {
		if err != nil {
			it.s.finish(err)
			e.release(it.s)
			continue
		}
		if err := it.s.ctx.Err(); err != nil {
			// Cancelled while the batch ran: no vocoder run for it.
			it.s.finish(err)
			e.release(it.s)
			continue
		}
		// The flow returns the prompt's, context's and chunk's frames; the chunk's are new.
		all := len(mels[i]) / C
		skip := (it.prompt + it.ctxTokens) * R
		nf := all - skip
		chunk := make([]float32, C*nf)
		for c := 0; c < C; c++ {
			copy(chunk[c*nf:(c+1)*nf], mels[i][c*all+skip:(c+1)*all])
		}
		win := it.s.vocHist.window(m, chunk, it.last)
		if it.first {
			it.s.marks[markMel] = time.Now()
		}
		// The chunk's hold passes from the flow to the vocoder.
		e.vocQ.Push(&vocItem{s: it.s, queued: time.Now(), win: win, first: it.first, last: it.last, text: it.text})
	}
}

func (e *Engine) vocoderLoop() {
	defer e.wg.Done()
	m := e.p.m
	hop, rate := m.Vocoder.Hop, m.SampleRate
	for {
		items, ok := e.vocQ.PopAll()
		if !ok {
			return
		}
		items = liveItems(e, items, func(it *vocItem) *stream { return it.s })
		items, rest := engine.TakeBatch(items, e.vocFrames, e.spread, nil, func(it *vocItem) (int, bool, *stream) {
			return len(it.win.mel) / m.Flow.MelBins, it.first, it.s
		})
		if m.Vocoder.SourcePhase > 0 {
			// A window's phase comes from its stream's window before it.
			items, rest = oneWindowPerStream(items, rest)
		}
		e.vocQ.PushFront(rest)
		if len(items) == 0 {
			continue
		}
		jobs := make([]vocJob, len(items))
		t0 := time.Now()
		var err error
		for i, it := range items {
			jobs[i] = vocJob{mel: it.win.mel, offset: int64(it.win.start * hop)}
			if m.Vocoder.SourcePhase > 0 && err == nil {
				jobs[i].phase, jobs[i].phaseAt, err = windowPhase(m, it.s.vocPhase, it.win.start)
			}
			e.stats.Waited(stageVocoder, t0, it.queued)
		}
		var audio, phase [][]float32
		if err == nil {
			audio, phase, err = e.p.voc.runJobs(jobs)
		}
		e.stats.Count(stageVocoder, len(jobs), t0)
		for i, it := range items {
			if err != nil {
				it.s.finish(fmt.Errorf("vocoder: %w", err))
				e.release(it.s)
				continue
			}
			if phase != nil {
				it.s.vocPhase = &vocPhase{start: it.win.start, out: phase[i]}
			}
			it.s.push(audio[i][it.win.keepFrom*hop:it.win.keepTo*hop], rate, it.text)
			if it.first {
				e.firstAudioOut(it.s)
			}
			// Released before the last chunk finishes the stream: a request whose Synthesize has
			// returned is no longer counted as active.
			e.release(it.s)
			if it.last {
				it.s.finish(nil)
			}
		}
	}
}

// oneWindowPerStream keeps the first of each stream's items in take; the others wait in rest,
// ahead of what rest held.
func oneWindowPerStream(take, rest []*vocItem) ([]*vocItem, []*vocItem) {
	seen := map[*stream]bool{}
	var keep, wait []*vocItem
	for _, it := range take {
		if seen[it.s] {
			wait = append(wait, it)
			continue
		}
		seen[it.s] = true
		keep = append(keep, it)
	}
	return keep, append(wait, rest...)
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
