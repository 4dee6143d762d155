package staged

import (
	"cmp"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
)

// lmBatch is the LM loop's state: the streams in the decode batch, the decoder they are in.
type lmBatch struct {
	e      *Engine
	dec    lmDecoder
	active []*stream
}

// lmLoop owns the LM: each round it takes the streams that arrived, runs one decode step for
// every stream in the batch, then prefills the new ones, which join the batch for the next step.
func (e *Engine) lmLoop() {
	defer e.wg.Done()
	b := &lmBatch{e: e, dec: e.p.lm}
	defer b.dec.release()
	for {
		fresh, ok := b.arrivals()
		if !ok {
			return
		}
		b.step()
		// New streams are prefilled after the step, so arrivals never hold the running streams
		// back by more than one round of prefills.
		b.join(fresh)
		if err := b.dec.compact(); err != nil {
			b.fail(err)
		}
	}
}

// arrivals takes the streams that arrived, waiting for one when the batch is empty; false once
// the engine shuts down, when every stream it holds has failed.
func (b *lmBatch) arrivals() ([]*stream, bool) {
	e := b.e
	var fresh []*stream
	if len(b.active) == 0 {
		select {
		case s := <-e.arrivals:
			e.hold(s)
			fresh = append(fresh, s)
		case <-e.done:
			return nil, false
		}
	}
	for {
		select {
		case s := <-e.arrivals:
			e.hold(s)
			fresh = append(fresh, s)
		case <-e.done:
			b.fail(engine.ErrClosed)
			for _, s := range fresh {
				s.finish(engine.ErrClosed)
				e.release(s)
			}
			return nil, false
		default:
			return fresh, true
		}
	}
}

// fail ends every stream in the batch with err and frees what they held in the LM.
func (b *lmBatch) fail(err error) {
	for _, s := range b.active {
		s.finish(err)
		b.e.release(s)
	}
	b.active = nil
	b.dec.release()
}

// step runs one decode step for every stream in the batch, in one run; cancelled streams leave
// the batch first.
func (b *lmBatch) step() {
	e := b.e
	live := b.active[:0]
	for _, s := range b.active {
		if s.ctx.Err() != nil {
			// Cancelled: out of the batch before the next step.
			s.finish(s.ctx.Err())
			b.dec.leave(s.row)
			e.cancels.leftLM(s, e.steps.Load())
			e.release(s)
			continue
		}
		live = append(live, s)
	}
	b.active = live
	if len(b.active) == 0 {
		return
	}
	rows := make([]*lmRow, len(b.active))
	tokens := make([]int64, len(b.active))
	for i, s := range b.active {
		rows[i] = s.row
		tokens[i] = s.tokens[len(s.tokens)-1] + e.p.m.LM.SpeechTokenOffset
	}
	t0 := time.Now()
	e.steps.Add(1)
	logits, err := b.dec.step(rows, tokens)
	e.stats.Count(stageLMDecode, len(rows), t0)
	if err != nil {
		b.fail(err)
		return
	}
	next := b.active[:0]
	toks := e.pickAll(b.active, logits)
	for i, s := range b.active {
		if e.advance(s, toks[i]) {
			next = append(next, s)
		} else {
			b.dec.leave(s.row)
			e.release(s)
		}
	}
	b.active = next
}

// join prefills the new streams in groups (prefillGroups); those that need more tokens join the
// batch. Those cancelled while they waited are not prefilled.
func (b *lmBatch) join(fresh []*stream) {
	e := b.e
	fresh = slices.DeleteFunc(fresh, func(s *stream) bool {
		if err := s.ctx.Err(); err != nil {
			s.finish(err)
			e.release(s)
			return true
		}
		return false
	})
	for _, group := range prefillGroups(fresh, b.dec.prefillRows(), e.p.m.LM.MaxPromptTokens) {
		b.prefill(group)
	}
}

// prefill runs one group's prompts in one prefill and takes each stream's first token.
func (b *lmBatch) prefill(group []*stream) {
	e := b.e
	prompts := make([][]int64, len(group))
	arrived := make([]time.Time, len(group))
	for i, s := range group {
		prompts[i], arrived[i] = s.prompt, s.marks[markArrived]
	}
	t0 := time.Now()
	e.stats.Waited(stageLMPrefill, t0, arrived...)
	rows, logits, err := b.dec.join(prompts)
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
			b.active = append(b.active, s)
		default:
			b.dec.leave(rows[i])
			e.release(s)
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
	workers := min(runtime.GOMAXPROCS(0), len(streams)/streamsPerPicker)
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
		size := e.chunkSize(s)
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
	if e.p.m.Flow.ChunkStep != "" {
		e.flowQ.Push(e.chunkItem(s, prompt, end, la, last, text))
		s.flowed = end
		s.chunk++
		return
	}
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
