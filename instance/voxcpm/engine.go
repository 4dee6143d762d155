package voxcpm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// Prefills run in groups: the requests waiting when a step ends that fit in the slots, sorted by
// prompt length, at most prefillGroup to a run, all of them before the next step. A group of n
// runs as prefillRows(n) rows (placeholders past n), so that prefills take few shapes, every one
// of which up to 256 positions runs once at load (warmPrefill). A prefill of one request a run
// cost 47-70 ms on an H200, likely bound by launching kernels as the step is (whose runs cost
// about the same at 1 and at 83 rows), and a burst of arrivals joined a few at a time held every
// running stream for each run.
const (
	prefillGroup = 8
	// prefillSpare slots past max_inflight hold a group's placeholder rows: a group of n of the
	// free slots runs prefillRows(n) ≤ n+3 rows.
	prefillSpare = 3
)

// prefillRows is the rows a prefill of n prompts runs: n rounded up to a power of two.
func prefillRows(n int) int {
	r := 1
	for r < n {
		r *= 2
	}
	return r
}

// The engine's stages, in StageStats' names.
const (
	stagePrefill = iota // a group's prefill run (its VAE states are primed with the VAE's work)
	stageStep
	stageVAE
)

var stageNames = []string{"prefill", "step", "vae"}

// Engine serves one export on one device. Requests queue for the scheduler goroutine (loop),
// which owns the runner's LM side: it prefills arrivals into free slots in groups, then steps
// every running stream by one patch in one step run. One VAE decoder run per step then decodes
// that patch of every stream, beside the next step (vaeQueue), and hands each stream its audio.
type Engine struct {
	m     *Manifest
	tok   tokenizer
	run   runner
	slots int // the most streams at once (max_inflight)
	queue *engine.Queue[*request]
	// done closes when the engine shuts down.
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	stats *engine.Counters
	// used counts the slots streams hold.
	used    atomic.Int64
	cancels cancelCounters
	// overlap runs the VAE decoder's work on a goroutine of its own (vaeQueue), each patch's
	// decode beside the next step; off, in line on the scheduler's.
	overlap bool
	// enc makes voices from clips; nil without graphs.vae_encoder.
	enc *voiceEncoder
	// closeRest frees what the engine's runner and encoder run on.
	closeRest func()
}

// newEngine starts the scheduler over run, with room for slots streams at once, each patch's VAE
// decode beside the next step.
func newEngine(m *Manifest, tok tokenizer, run runner, slots int) *Engine {
	return startEngine(m, tok, run, slots, true)
}

// startEngine is newEngine with the VAE's work beside the steps (overlap) or in line.
func startEngine(m *Manifest, tok tokenizer, run runner, slots int, overlap bool) *Engine {
	e := &Engine{m: m, tok: tok, run: run, slots: max(slots, 1), queue: engine.NewQueue[*request](),
		done: make(chan struct{}), stats: engine.NewCounters(stageNames...), overlap: overlap}
	e.wg.Add(1)
	go e.loop()
	return e
}

// Stats counts each stage's runs and the streams they carried.
func (e *Engine) Stats() []tts.StageStats { return e.stats.Stats() }

// Report is the engine's stage counts and cancels; it does not time its requests' first audio.
func (e *Engine) Report() engine.Report {
	return engine.Report{Stages: e.Stats(), Cancels: e.CancelStats()}
}

// Slots is the number of slots streams hold now.
func (e *Engine) Slots() int { return int(e.used.Load()) }

// Close stops the scheduler (requests still running fail) and frees the graphs.
func (e *Engine) Close() error {
	var err error
	e.once.Do(func() {
		close(e.done)
		e.queue.Close()
		e.wg.Wait()
		err = e.run.close()
		if e.enc != nil {
			err = errors.Join(err, e.enc.close())
		}
		if e.closeRest != nil {
			e.closeRest()
		}
	})
	return err
}

// request is one synthesis request moving through the engine.
type request struct {
	ctx     context.Context
	p       *prompt
	bound   int // the most patches
	seed    uint64
	cfg     float32
	arrived time.Time
	// cancelAt is when the request was cancelled while the engine held it (UnixNano; 0: not
	// cancelled, -1: counted). See cancel.go.
	cancelAt atomic.Int64

	// Output, from the scheduler to Synthesize.
	out engine.Output
}

// context is the voice's last vae.context_patches patches, which prime the VAE state; nil
// without a voice.
func (r *request) context(m *Manifest) []float32 {
	v := r.p.voice
	if v == nil || m.VAE.ContextPatches == 0 {
		return nil
	}
	k := min(m.VAE.ContextPatches, v.patches)
	return v.latents[(v.patches-k)*m.patchFloats():]
}

func (r *request) push(c tts.Chunk) { r.out.Push(c) }

func (r *request) finish(err error) { r.out.Finish(err) }

// Synthesize runs req and calls emit with each patch's audio, in order, as soon as it is
// decoded. It returns when the audio is complete, emit fails or ctx ends.
func (e *Engine) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	if req.Text == "" {
		return tts.ErrEmptyText
	}
	if !utf8.ValidString(req.Text) {
		return tts.Invalid("text is not valid UTF-8")
	}
	v, err := e.requestVoice(req)
	if err != nil {
		return err
	}
	p, err := e.m.buildPrompt(e.tok, v, req.Text)
	if err != nil {
		return err
	}
	bound, err := e.m.patchBound(p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a request that returns early (emit failed) leaves its slot
	r := &request{ctx: ctx, p: p, bound: bound, seed: req.Seed, cfg: e.m.Generation.CFGValue,
		arrived: time.Now()}
	defer e.watchCancel(r)()
	select {
	case <-e.done:
		return engine.ErrClosed
	default:
	}
	e.queue.Push(r)
	index := 0
	for {
		closed, err := r.out.Drain(ctx, &index, emit)
		if err != nil || closed {
			return err
		}
		select {
		case <-r.out.Ready():
		case <-ctx.Done():
			return ctx.Err()
		case <-e.done:
			return engine.ErrClosed
		}
	}
}

// requestVoice is the voice a request speaks in: its Prompt, else its named voice. A name the
// model does not have and another family's prompt are the request's errors
// (tts.Description.CheckRequest).
func (e *Engine) requestVoice(req tts.Request) (*voice, error) {
	if err := e.m.description().CheckRequest(req); err != nil {
		return nil, err
	}
	if req.Prompt != nil {
		return e.m.promptVoice(req.Prompt)
	}
	return e.m.voice(req.Voice), nil
}

// scheduler is the loop's state: the slots and the requests waiting for one.
type scheduler struct {
	e *Engine
	// rows are by slot (max_inflight and prefillSpare more); nil where free. At most max_inflight
	// are live.
	rows    []*row
	live    int
	waiting []*request
	// vae runs the VAE decoder's work; nil: in line.
	vae *vaeQueue
	// decoding closes when the last decode queued has handed out its audio.
	decoding chan struct{}
	// vaeErr is the first error of the VAE's work since the scheduler last looked.
	vaeMu  sync.Mutex
	vaeErr error
}

// loop is the scheduler goroutine: the only one that runs the LM's graphs (prefill, step).
func (e *Engine) loop() {
	defer e.wg.Done()
	// One OS thread for every prefill: on an H100 a one-row prefill from a thread that had not run
	// the session before took 75-96 ms (median) against 32-33 ms from one thread, the difference
	// inside its first GroupQueryAttention node (TestGPUPrefillTimes); the server's first audio at
	// one stream went from 87 to 29 ms P50 (docs/benchmarks/2026-12-08-h100-voxcpm-vae-sessions/).
	// Not unlocked: the thread ends with the loop.
	goruntime.LockOSThread()
	s := &scheduler{e: e, rows: make([]*row, e.slots+prefillSpare)}
	if e.overlap {
		s.vae = newVAEQueue()
	}
	ready := e.queue.Ready()
	for {
		arrived, ok := e.queue.TryPopAll()
		s.waiting = append(s.waiting, arrived...)
		if !ok {
			s.failAll(engine.ErrClosed)
			s.vae.close()
			return
		}
		if err := s.takeVAEErr(); err != nil {
			s.failRunning(err)
		}
		s.dropCancelled()
		if s.live == 0 && len(s.waiting) == 0 {
			<-ready
			continue
		}
		if err := s.join(); err != nil {
			s.failAll(err)
			continue
		}
		if err := s.compact(); err != nil {
			s.failAll(err)
			continue
		}
		if s.live > 0 {
			s.step()
		}
	}
}

// onVAE queues f, the VAE's work, whose error fails the streams running when the scheduler next
// looks (the states may then be wrong for all of them).
func (s *scheduler) onVAE(f func() error) {
	s.vae.do(func() {
		if err := f(); err != nil {
			s.setVAEErr(err)
		}
	})
}

func (s *scheduler) setVAEErr(err error) {
	s.vaeMu.Lock()
	s.vaeErr = cmp.Or(s.vaeErr, err)
	s.vaeMu.Unlock()
}

// takeVAEErr returns the VAE's error since the last call, if any.
func (s *scheduler) takeVAEErr() error {
	s.vaeMu.Lock()
	defer s.vaeMu.Unlock()
	err := s.vaeErr
	s.vaeErr = nil
	return err
}

// free empties slot b.
func (s *scheduler) free(b int) {
	s.rows[b] = nil
	s.live--
	s.e.used.Add(-1)
}

// failAll ends every request the scheduler holds with err.
func (s *scheduler) failAll(err error) {
	s.failRunning(err)
	for _, r := range s.waiting {
		r.finish(err)
	}
	s.waiting = nil
}

// failRunning ends every request in a slot with err.
func (s *scheduler) failRunning(err error) {
	for b, r := range s.rows {
		if r != nil {
			s.free(b) // first: a request that has returned holds no slot
			r.r.finish(err)
		}
	}
}

// dropCancelled ends the requests whose context has ended, freeing their slots before the next
// step.
func (s *scheduler) dropCancelled() {
	for b, r := range s.rows {
		if r == nil {
			continue
		}
		if err := r.r.ctx.Err(); err != nil {
			s.e.cancels.left(r.r) // counted before the slot frees, so a free slot means counted
			s.free(b)
			r.r.finish(err)
		}
	}
	kept := s.waiting[:0]
	for _, r := range s.waiting {
		if err := r.ctx.Err(); err != nil {
			s.e.cancels.left(r)
			r.finish(err)
			continue
		}
		kept = append(kept, r)
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
}

// join prefills the waiting requests that fit in the slots, the earliest arrivals first, in
// groups (prefillGroup), each into adjacent free slots. Its error is the caches'; a failed
// prefill fails its group's requests alone.
func (s *scheduler) join() error {
	n := min(len(s.waiting), s.e.slots-s.live)
	if n <= 0 {
		return nil
	}
	reqs := slices.Clone(s.waiting[:n])
	clear(s.waiting[:n])
	s.waiting = s.waiting[n:]
	// Prompts of like lengths share a run, which pads each to the longest.
	slices.SortStableFunc(reqs, func(a, b *request) int { return cmp.Compare(a.p.length(), b.p.length()) })
	for len(reqs) > 0 {
		k := min(len(reqs), prefillGroup)
		rows := prefillRows(k)
		from := s.freeRun(rows)
		if from < 0 {
			// After compaction the slots above the streams are free, and there are enough of them:
			// k ≤ max_inflight - live, rows ≤ k + prefillSpare.
			err := s.compact()
			if from = s.freeRun(rows); err == nil && from < 0 {
				err = fmt.Errorf("no %d adjacent free slots for a prefill of %d requests beside %d streams", rows, k, s.live)
			}
			if err != nil {
				for _, r := range reqs {
					r.finish(err)
				}
				return err
			}
		}
		s.prefill(from, reqs[:k], rows)
		reqs = reqs[k:]
	}
	return nil
}

// freeRun is the lowest of n adjacent free slots, or -1.
func (s *scheduler) freeRun(n int) int {
	run := 0
	for b, r := range s.rows {
		if r != nil {
			run = 0
			continue
		}
		if run++; run == n {
			return b + 1 - n
		}
	}
	return -1
}

// prefill runs reqs' prompts into slots [from, from+len(reqs)) in one run of rows rows (the slots
// up to from+rows free), primes their VAE states and makes them rows of the steps.
func (s *scheduler) prefill(from int, reqs []*request, rows int) {
	e, m := s.e, s.e.m
	t0 := time.Now()
	ps := make([]*prompt, len(reqs))
	for i, r := range reqs {
		e.stats.Waited(stagePrefill, t0, r.arrived)
		ps[i] = r.p
	}
	defer func() { e.stats.Count(stagePrefill, len(reqs), t0) }()
	fail := func(err error) {
		for _, r := range reqs {
			r.finish(err)
		}
	}
	if err := e.run.reserve(from + rows); err != nil {
		fail(err)
		return
	}
	out, err := e.run.prefill(from, ps, rows)
	if err == nil && len(out) != len(reqs) {
		err = fmt.Errorf("prefill: %d results for %d prompts", len(out), len(reqs))
	}
	if err != nil {
		fail(err)
		return
	}
	for i, r := range reqs {
		b := from + i
		if len(out[i].mu) != m.DiTHidden {
			r.finish(fmt.Errorf("prefill: mu has %d values, want dit_hidden = %d", len(out[i].mu), m.DiTHidden))
			continue
		}
		context := r.context(m)
		s.onVAE(func() error { return e.run.prime(b, context) })
		cond := make([]float32, m.patchFloats())
		if v := r.p.voice; v != nil {
			copy(cond, v.latents[(v.patches-1)*m.patchFloats():])
		}
		s.rows[b] = &row{r: r, slot: b, pos: r.p.length(), mu: slices.Clone(out[i].mu), stop: out[i].stop, cond: cond}
		s.live++
		e.used.Add(1)
	}
}

func (s *scheduler) lowestFree() int {
	for b, r := range s.rows {
		if r == nil {
			return b
		}
	}
	return -1
}

// top is one past the highest slot in use.
func (s *scheduler) top() int {
	for b := len(s.rows) - 1; b >= 0; b-- {
		if s.rows[b] != nil {
			return b + 1
		}
	}
	return 0
}

// compact moves the highest streams down into the free slots below them, so that a step runs
// over exactly the streams: every slot under the top costs a whole row of the step's work.
func (s *scheduler) compact() error {
	var moves []slotMove
	for {
		f, t := s.lowestFree(), s.top()-1
		if f < 0 || f > t {
			break
		}
		r := s.rows[t]
		moves = append(moves, slotMove{From: t, To: f, Positions: r.pos})
		s.rows[f], s.rows[t] = r, nil
		r.slot = f
	}
	if len(moves) == 0 {
		return nil
	}
	s.onVAE(func() error { return s.e.run.moveStates(moves) })
	return s.e.run.move(moves)
}

// step runs one patch of every stream: the step graph over slots [0, top), then the VAE
// decoder, queued: it runs while the scheduler goes on to the next step, and hands each stream
// its audio as soon as it returns. At most one decode is queued at a time.
func (s *scheduler) step() {
	e, m := s.e, s.e.m
	n := s.top()
	H, PD := m.DiTHidden, m.patchFloats()
	in := newStepIn(m, n)
	for b, r := range s.rows[:n] {
		if r == nil {
			continue
		}
		copy(in.mu[b*H:], r.mu)
		copy(in.cond[b*PD:], r.cond)
		fillNoise(in.noise[b*PD:(b+1)*PD], r.r.seed, r.i)
		in.cfg[b] = r.r.cfg
		in.seqlens[b] = int32(r.pos)
	}
	t0 := time.Now()
	out, err := e.run.step(in)
	e.stats.Count(stageStep, s.live, t0)
	if err != nil {
		s.failAll(err)
		return
	}
	// Who gets each row's audio, and whether it is the request's last.
	type delivery struct {
		r    *request
		last bool
	}
	to := make([]delivery, n)
	live := s.live
	for b, r := range s.rows[:n] {
		if r == nil {
			continue
		}
		to[b] = delivery{r: r.r, last: ends(r.i, r.stop, m.Generation.MinLen, r.r.bound)}
		copy(r.cond, out.patch[b*PD:(b+1)*PD])
		copy(r.mu, out.nextMu[b*H:(b+1)*H])
		copy(r.stop[:], out.nextStop[2*b:2*b+2])
		r.pos++
		r.i++
		if to[b].last {
			// Its slot is free for the next join (before the decode ends the request: one that
			// has returned holds no slot); its audio is the decode's to hand out.
			s.free(b)
		}
	}
	if s.decoding != nil {
		<-s.decoding
	}
	done := make(chan struct{})
	s.decoding = done
	patch := out.patch
	s.onVAE(func() error {
		defer close(done)
		t1 := time.Now()
		audio, err := e.run.decode(n, patch)
		e.stats.Count(stageVAE, live, t1)
		if err != nil {
			// Noted first: a request that comes after these have failed is not failed with them.
			s.setVAEErr(err)
			for _, d := range to {
				if d.r != nil {
					d.r.finish(err)
				}
			}
			return nil
		}
		S := m.patchSamples()
		for b, d := range to {
			if d.r == nil {
				continue
			}
			d.r.push(tts.Chunk{PCM: append([]float32(nil), audio[b*S:(b+1)*S]...), SampleRate: m.SampleRate})
			if d.last {
				d.r.finish(nil)
			}
		}
		return nil
	})
}
