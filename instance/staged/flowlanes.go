package staged

import (
	"fmt"
	"slices"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// flowItem is one chunk of a stream's speech tokens waiting for or in a flow batch; it holds
// its stream (cancel.go) until the vocoder takes it.
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
	// chunk is what a chunk-causal run computes and returns (flow.chunk_step); nil otherwise.
	chunk *chunkSpan
}

// flowRun is a batch of chunks on one flow worker, and the flow time it took.
type flowRun struct {
	items  []*flowItem
	worker int
	mels   [][]float32 // each item's, once done
	busy   time.Duration
	err    error
	// grant is the chunk-causal flow's memory reserved for the batch (flowMemory); nil without it.
	grant *flowGrant
	// fixed: the batch ran in one of the chunk-causal flow's fixed shapes (chunkGraphs).
	fixed bool
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
	runs   []*flowRun       // by worker; nil where free
	busy   map[*stream]bool // streams with a chunk in a batch under way
	budget int              // frames per batch
	share  bool             // no worker is kept for first chunks
	// oneEach keeps a batch to one chunk per stream: a chunk-causal run starts from the frames its
	// stream's earlier chunk keeps (flow.chunk_step).
	oneEach        bool
	spread         float64 // see takeBatch
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
	if l.oneEach {
		seen := map[*stream]bool{}
		var kept, later []*flowItem
		for _, it := range take {
			if seen[it.s] {
				later = append(later, it)
				continue
			}
			seen[it.s] = true
			kept = append(kept, it)
		}
		if len(later) > 0 {
			take, rest = kept, slices.Concat(later, rest)
		}
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
	lanes.oneEach = e.p.m.Flow.ChunkStep != ""
	finished := make(chan *flowRun)
	ready := e.flowQ.Ready()
	var waiting []*flowItem
	var cm *chunkMemory
	var freed chan struct{}
	if e.p.flowMem != nil {
		cm = &chunkMemory{e: e, mem: e.p.flowMem}
		freed = e.p.flowMem.freed
	}
	blocked := false // waiting for memory
	for {
		items, ok := e.flowQ.TryPopAll()
		waiting = liveItems(e, append(waiting, items...), func(it *flowItem) *stream { return it.s })
		if !ok {
			// Shut down: what waits fails now, batches under way at their next step.
			for _, it := range waiting {
				it.s.finish(engine.ErrClosed)
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
			var grant *flowGrant
			if cm != nil {
				if take, rest, grant = cm.admit(take, rest); grant == nil {
					waiting = rest
					if !blocked {
						blocked = true
						cm.mem.waited()
					}
					if all, _ := lanes.running(); all > 0 {
						break // a batch under way frees its scratch memory when done
					}
					head := waiting[0]
					err := cm.tooBig(head)
					if err == nil && cm.makeRoom(head) {
						continue
					}
					if err == nil {
						err = fmt.Errorf("chunk flow: no room for a chunk under engine.flow_kv_memory_mb (%d MiB)", cm.mem.limit>>20)
					}
					waiting = waiting[1:]
					head.s.finish(err)
					e.release(head.s)
					continue
				}
				blocked = false
			}
			waiting = rest
			now := time.Now()
			for _, it := range take {
				e.stats.Waited(stageFlow, now, it.queued)
			}
			r := &flowRun{items: take, worker: w, grant: grant}
			lanes.add(r)
			go e.runFlow(r, finished)
		}
		select {
		case r := <-finished:
			lanes.remove(r)
			if cm != nil {
				for _, it := range r.items {
					if r.err == nil && !it.last && it.s.kv != nil && it.s.kv.n > 0 {
						cm.keeps(it.s)
					}
				}
			}
			e.stats.CountFor(stageFlow, len(r.items), r.busy)
			if r.fixed {
				e.stats.CountFor(stageFlowGraph, len(r.items), r.busy)
			}
			e.flowDone(r, r.err)
		case <-ready:
		case <-e.wakeFlow:
		case <-freed:
		}
	}
}

// runFlow runs a batch through the flow on its worker (the encoder, then every Euler step) and
// sends it to done.
func (e *Engine) runFlow(r *flowRun, done chan<- *flowRun) {
	jobs := make([]flowJob, len(r.items))
	for i, it := range r.items {
		jobs[i] = e.p.flowJob(it)
		if jobs[i].chunk != nil {
			jobs[i].chunk.grant = r.grant
		}
	}
	stop, unwatch := cancelledBatch(r.items, e.done)
	t0 := time.Now()
	f := e.p.flows[r.worker]
	r.mels, r.err = f.run(jobs, stop)
	r.busy = time.Since(t0)
	if c, ok := f.(*flowChunks); ok {
		r.fixed = c.lastBucket != nil
	}
	r.grant.done()
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
		if sp := it.chunk; sp != nil {
			// A chunk-causal run returns frames [from, end); the vocoder has had those before emit.
			skip = sp.emit - sp.from
		}
		nf := all - skip
		chunk := make([]float32, C*nf)
		for c := 0; c < C; c++ {
			copy(chunk[c*nf:(c+1)*nf], mels[i][c*all+skip:(c+1)*all])
		}
		if e.onMel != nil {
			e.onMel(it.s, chunk, it.last)
		}
		if it.chunk != nil && it.last {
			e.freeKV(it.s) // no later chunk reads its frames
		}
		win := it.s.vocHist.window(m, chunk, it.last)
		if it.first {
			it.s.marks[markMel] = time.Now()
		}
		// The chunk's hold passes from the flow to the vocoder.
		e.vocQ.Push(&vocItem{s: it.s, queued: time.Now(), win: win, first: it.first, last: it.last, text: it.text})
	}
}
