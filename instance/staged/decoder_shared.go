package staged

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// sharedDecoder runs an LM whose cache is one buffer per layer, [slots, kv_heads, max_positions,
// head_dim], that the graph writes in place (ONNX Runtime's GroupQueryAttention with past and
// present bound to the same memory). Each sequence owns a slot and its tokens sit at positions
// 0..n-1 of it, so nothing is copied per step (the concat contract copies the whole cache every
// step) and the graph needs no attention mask or position ids: its kernels take each row's length
// from seqlens_k. A decode step runs over slots 0..top, so compaction moves rows down into free
// slots.
type sharedDecoder struct {
	m       *Manifest
	s       *iobind.Session
	elem    iobind.Elem
	maxPos  int
	c       *iobind.SlotCache // key0, value0, key1, ...: [len(slots), H, maxPos, D]
	slots   []*lmRow          // one per slot of c, nil where free
	ins     []string          // past tensor names, in kv order
	outs    []string          // present tensor names, in kv order
	logits  string
	ids     string
	seqlens string
	total   string
	// g is set when decode steps run as CUDA graphs.
	g *lmGraphs
}

// lmGraphs hold what the LM's runs as CUDA graphs (lm_cuda_graph) need. A graph replays the
// kernels ONNX Runtime launched for one shape at the addresses it saw, so each graph has inputs
// and outputs of its own that stay put, and the cache is sized once for the most rows and never
// moves. A decode step of n rows runs the graph of the smallest bucket of at least n rows (the
// rows past n are free slots, which write a placeholder at their position 0). With prefill
// graphs, a prefill of a shape join pads to (a power of two rows up to 8, whole runs of 16
// positions up to 256) runs that shape's graph over a scratch cache of its own. The graphs are
// captured at load. ONNX Runtime keeps a session's graphs per OS thread, so every run of the
// session goes through one locked thread.
type lmGraphs struct {
	steps    []*lmGraph // by batch size, rising; the last has the cache's slot count
	prefills map[[2]int]*lmGraph
	thread   *ort.Thread
}

// lmGraph is one captured shape: B rows of T tokens.
type lmGraph struct {
	id, B, T             int
	ids, seqlens, logits *iobind.Tensor   // on the device
	total                *iobind.Tensor   // host scalar, as the graph was captured with
	cache                []*iobind.Tensor // views of the shared cache, or a prefill's scratch
	// run is bound once to the tensors above, and the inputs go up from and a decode step's
	// logits come back into page-locked host memory on the LM's own stream. Before, each step
	// rebound about a hundred names, fetched as many outputs back, and made three copies through
	// pageable memory, each waiting for a copy stream all sessions share.
	run             *iobind.Bound
	hostIDs, hostSL *iobind.Pinned
	// hostLogits receives a decode step's logits (nil for prefills): one buffer for every step,
	// because a new one of B × vocabulary floats each step (3.4 MB at 128 rows) kept Go's
	// collector busy enough to cost a step about a tenth of its time (H100, bench stages with
	// GOGC=off, voxmux 0586e99).
	hostLogits *iobind.Pinned
}

func (g *lmGraph) release() {
	g.run.Close()
	g.hostIDs.Free()
	g.hostSL.Free()
	g.hostLogits.Free()
	release([]*iobind.Tensor{g.ids, g.seqlens, g.logits, g.total})
	release(g.cache)
}

func newSharedDecoder(m *Manifest, place iobind.Placement, graphRows int, prefillGraphs bool) (*sharedDecoder, error) {
	var thread *ort.Thread
	if graphRows > 0 {
		thread = ort.NewThread()
	}
	var s *iobind.Session
	err := thread.Do(func() (err error) {
		s, err = iobind.Open(m.Path(m.LM.File), place)
		return err
	})
	if err != nil {
		thread.Close()
		return nil, fmt.Errorf("lm: %w", err)
	}
	d := &sharedDecoder{m: m, s: s, elem: iobind.Float32, maxPos: m.LM.MaxPositions,
		logits: m.Tensor("logits"), ids: m.Tensor("input_ids"), seqlens: m.Tensor("seqlens_k"),
		total: m.Tensor("total_sequence_length")}
	if m.DType == "float16" {
		d.elem = iobind.Float16
	}
	d.ins, d.outs = cacheNames(m)
	// With CUDA graphs the cache is sized once for the largest graph's rows and never moves.
	most := 0
	if graphRows > 0 {
		b := engine.Buckets(graphRows)
		most = b[len(b)-1]
	}
	if d.c, err = iobind.NewSlotCache(s, iobind.SlotShape{Tensors: len(d.ins), Heads: m.LM.KVHeads, Positions: d.maxPos,
		Dim: m.LM.HeadDim, Elem: d.elem}, most, graphRows > 0); err != nil {
		d.close()
		thread.Close()
		return nil, fmt.Errorf("lm: %w", err)
	}
	if graphRows > 0 {
		d.g = &lmGraphs{thread: thread}
		if err := d.capture(engine.Buckets(graphRows), prefillGraphs); err != nil {
			d.close()
			return nil, fmt.Errorf("lm: CUDA graphs: %w", err)
		}
	}
	if d.g == nil || d.g.prefills == nil { // captured prefills have run every shape already
		if err := d.warmPrefill(); err != nil {
			d.close()
			return nil, fmt.Errorf("lm: warm-up: %w", err)
		}
	}
	return d, nil
}

// prefillStep is the step of the prefill's padded lengths (join).
const prefillStep = 16

// warmPrefill prefills batches of 1 to 8 prompts at every padded length up to 256 tokens, so that
// requests do not pay ONNX Runtime's cost of a shape's first run (join).
func (d *sharedDecoder) warmPrefill() error {
	for _, bt := range d.prefillShapes() {
		prompts := make([][]int64, bt[0])
		for i := range prompts {
			prompts[i] = make([]int64, bt[1])
		}
		rows, _, err := d.join(prompts)
		if err != nil {
			return err
		}
		for _, r := range rows {
			d.leave(r)
		}
	}
	return nil
}

// prefillShapes are the prefill shapes warmed up at load (and captured, with prefill graphs):
// batches of 1 to 8 rows, every padded length up to 256 tokens.
func (d *sharedDecoder) prefillShapes() [][2]int {
	var out [][2]int
	for B := 1; B <= d.prefillRows(); B *= 2 {
		for T := prefillStep; T <= min(256, d.maxPos); T += prefillStep {
			out = append(out, [2]int{B, T})
		}
	}
	return out
}

// capture sizes the cache for the largest of the decode batch sizes (buckets, rising), makes
// every graph's tensors and runs each graph three times: ONNX Runtime captures a graph after two
// ordinary runs with its ID. No sequence is in the cache yet, so what the runs write there is
// never read.
func (d *sharedDecoder) capture(buckets []int, prefills bool) error {
	g := d.g
	if err := d.grow(buckets[len(buckets)-1]); err != nil {
		return err
	}
	for _, b := range buckets {
		cache, err := d.c.Views(0, b)
		if err != nil {
			return err
		}
		step, err := d.newGraph(len(g.steps)+1, b, 1, d.maxPos, cache)
		if err != nil {
			return err
		}
		g.steps = append(g.steps, step)
	}
	if prefills {
		g.prefills = map[[2]int]*lmGraph{}
		for _, bt := range d.prefillShapes() {
			scratch, err := d.scratch(bt[0], bt[1])
			if err != nil {
				return err
			}
			pg, err := d.newGraph(len(g.steps)+len(g.prefills)+1, bt[0], bt[1], bt[1], scratch)
			if err != nil {
				return err
			}
			g.prefills[bt] = pg
		}
	}
	all := append([]*lmGraph(nil), g.steps...)
	for _, pg := range g.prefills {
		all = append(all, pg)
	}
	for _, gr := range all {
		for range 3 {
			if err := d.replay(gr); err != nil {
				return fmt.Errorf("%d rows of %d tokens: %w", gr.B, gr.T, err)
			}
		}
	}
	return nil
}

// newGraph makes the tensors of a graph of B rows of T tokens over cache (released with the
// graph), captured with total_sequence_length total.
func (d *sharedDecoder) newGraph(id, B, T, total int, cache []*iobind.Tensor) (*lmGraph, error) {
	gr := &lmGraph{id: id, B: B, T: T, cache: cache}
	V := int64(d.m.LM.SpeechVocab + 1)
	place := d.s.Placement()
	err := func() (err error) {
		if gr.ids, err = d.s.Alloc([]int64{int64(B), int64(T)}, iobind.Int64); err != nil {
			return err
		}
		if gr.seqlens, err = d.s.Alloc([]int64{int64(B)}, iobind.Int32); err != nil {
			return err
		}
		if gr.logits, err = d.s.AllocEmpty([]int64{int64(B), int64(T), V}, iobind.Float32); err != nil {
			return err
		}
		if gr.total, err = iobind.Host([]int64{}, []int32{int32(total)}); err != nil {
			return err
		}
		if gr.hostIDs, err = iobind.NewPinned(place, gr.ids.Bytes()); err != nil {
			return err
		}
		if gr.hostSL, err = iobind.NewPinned(place, gr.seqlens.Bytes()); err != nil {
			return err
		}
		if T == 1 {
			if gr.hostLogits, err = iobind.NewPinned(place, gr.logits.Bytes()); err != nil {
				return err
			}
		}
		in := map[string]*iobind.Tensor{d.ids: gr.ids, d.seqlens: gr.seqlens, d.total: gr.total}
		outs := d.bind(in, []iobind.Output{{Name: d.logits, Into: gr.logits}}, gr.cache)
		gr.run, err = d.s.Bind(in, outs, gr.id)
		return err
	}()
	if err != nil {
		gr.release()
		return nil, err
	}
	return gr, nil
}

// scratch is a cache for B rows of T positions, for one prefill.
func (d *sharedDecoder) scratch(B, T int) ([]*iobind.Tensor, error) {
	shape := []int64{int64(B), int64(d.m.LM.KVHeads), int64(T), int64(d.m.LM.HeadDim)}
	out := make([]*iobind.Tensor, len(d.ins))
	for i := range out {
		t, err := d.s.AllocEmpty(shape, d.elem)
		if err != nil {
			release(out)
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}

// bind adds the cache as the run's past inputs and, written in place, its present outputs.
func (d *sharedDecoder) bind(in map[string]*iobind.Tensor, outs []iobind.Output, cache []*iobind.Tensor) []iobind.Output {
	for j, v := range cache {
		in[d.ins[j]] = v
		outs = append(outs, iobind.Output{Name: d.outs[j], Into: v})
	}
	return outs
}

// replay runs graph gr over the inputs already in its tensors, into its logits and cache.
func (d *sharedDecoder) replay(gr *lmGraph) error {
	return d.g.thread.Do(gr.run.Run)
}

// runGraph sends ids and seqlens (gr.B rows of gr.T, padded here) into gr's tensors and replays it.
func (d *sharedDecoder) runGraph(gr *lmGraph, ids []int64, seqlens []int32) error {
	hi, hs := gr.hostIDs.Int64s(), gr.hostSL.Int32s()
	clear(hi[copy(hi, ids):])
	clear(hs[copy(hs, seqlens):])
	if err := d.s.Send(gr.ids, gr.hostIDs); err != nil {
		return fmt.Errorf("lm: %w", err)
	}
	if err := d.s.Send(gr.seqlens, gr.hostSL); err != nil {
		return fmt.Errorf("lm: %w", err)
	}
	// On the LM's stream after the copies, which the replay waits for with its kernels.
	if err := d.replay(gr); err != nil {
		return fmt.Errorf("lm: %w", err)
	}
	return nil
}

// stepGraph is step's run as the graph of the smallest bucket of at least n rows. The logits it
// returns are gr's host buffer, which the next step overwrites.
func (d *sharedDecoder) stepGraph(n int, ids []int64, seqlens []int32) ([]float32, error) {
	steps := d.g.steps
	i := 0
	for i < len(steps) && steps[i].B < n {
		i++
	}
	if i == len(steps) {
		return nil, fmt.Errorf("lm: a step of %d sequences is over the %d the CUDA graphs were made for", n, steps[len(steps)-1].B)
	}
	gr := steps[i]
	if err := d.runGraph(gr, ids, seqlens); err != nil {
		return nil, err
	}
	if err := d.s.Receive(gr.hostLogits, gr.logits); err != nil {
		return nil, fmt.Errorf("lm: %w", err)
	}
	if err := d.s.Wait(); err != nil {
		return nil, fmt.Errorf("lm: %w", err)
	}
	return gr.hostLogits.Float32s()[:n*(d.m.LM.SpeechVocab+1)], nil
}

func (d *sharedDecoder) limit() int { return d.maxPos }

func (d *sharedDecoder) size() int {
	live, _ := d.used()
	return live
}

// used counts the rows and returns one past the highest slot in use.
func (d *sharedDecoder) used() (live, top int) {
	for i, r := range d.slots {
		if r != nil {
			live, top = live+1, i+1
		}
	}
	return live, top
}

func (d *sharedDecoder) close() {
	if g := d.g; g != nil {
		for _, gr := range g.steps {
			gr.release()
		}
		for _, gr := range g.prefills {
			gr.release()
		}
	}
	if d.c != nil {
		d.c.Release()
	}
	d.slots = nil
	t := d.thread()
	t.Do(func() error { d.s.Close(); return nil })
	t.Close()
}

// thread is the OS thread the session runs on: nil (any) without CUDA graphs.
func (d *sharedDecoder) thread() *ort.Thread {
	if d.g == nil {
		return nil
	}
	return d.g.thread
}

// release frees what the sequences hold. With CUDA graphs the cache stays (the graphs write
// into it); its slots are freed.
func (d *sharedDecoder) release() {
	if d.g != nil {
		clear(d.slots)
		return
	}
	d.c.Release()
	d.slots = nil
}

// grow makes room for n slots (the cache doubles, so that joins rarely reallocate; with CUDA
// graphs it cannot grow).
func (d *sharedDecoder) grow(n int) error {
	if err := d.c.Reserve(n); err != nil {
		return fmt.Errorf("lm: %w", err)
	}
	d.slots = append(d.slots, make([]*lmRow, d.c.Slots()-len(d.slots))...)
	return nil
}

// run feeds B rows of T tokens to the slots [from, from+B); seqlens[b] is row b's length after
// the run, minus one. It returns the logits.
func (d *sharedDecoder) run(from, B, T int, ids []int64, seqlens []int32) ([]float32, error) {
	cache, err := d.c.Views(from, B)
	if err != nil {
		return nil, err
	}
	defer release(cache)
	return d.runOn(cache, B, T, ids, seqlens)
}

// runOn is run over the given caches, written in place.
func (d *sharedDecoder) runOn(cache []*iobind.Tensor, B, T int, ids []int64, seqlens []int32) ([]float32, error) {
	// A prefill's rows are right-padded to T positions: a total of T is what makes
	// GroupQueryAttention read them as first prompts, each of its own length.
	total := int32(T)
	for _, s := range seqlens {
		total = max(total, s+1)
	}
	if int64(total) > cache[0].Shape[2] {
		return nil, fmt.Errorf("lm: a sequence needs %d positions, over lm.max_positions (%d)", total, d.maxPos)
	}
	var host []*iobind.Tensor
	defer func() { release(host) }()
	in := map[string]*iobind.Tensor{}
	for _, h := range []struct {
		name  string
		shape []int64
		data  any
	}{
		{d.ids, []int64{int64(B), int64(T)}, ids},
		{d.seqlens, []int64{int64(B)}, seqlens},
		{d.total, []int64{}, []int32{total}},
	} {
		t, err := iobind.Host(h.shape, h.data)
		if err != nil {
			return nil, err
		}
		host = append(host, t)
		in[h.name] = t
	}
	outs := d.bind(in, []iobind.Output{{Name: d.logits, Host: true}}, cache)
	var res []*iobind.Tensor
	err := d.thread().Do(func() (err error) {
		if d.g != nil {
			res, err = d.s.RunGraph(in, outs, iobind.NoGraph)
		} else {
			res, err = d.s.Run(in, outs)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("lm: %w", err)
	}
	defer release(res)
	logits, err := res[0].Float32s()
	if err != nil {
		return nil, err
	}
	V := d.m.LM.SpeechVocab + 1
	if len(logits) != B*T*V {
		return nil, fmt.Errorf("lm: logits have %d values, want B·T·(speech_vocab+1) = %d", len(logits), B*T*V)
	}
	return logits, nil
}

// freeRun finds n adjacent free slots (the lowest run, or after the highest slot in use),
// growing the cache when needed.
func (d *sharedDecoder) freeRun(n int) (int, error) {
	run, top := 0, 0
	for i, r := range d.slots {
		if r != nil {
			run, top = 0, i+1
			continue
		}
		if run++; run == n {
			return i + 1 - n, nil
		}
	}
	if d.g != nil && top+n > len(d.slots) {
		// The cache cannot grow: move every row down first.
		if err := d.compactAll(); err != nil {
			return 0, err
		}
		_, top = d.used()
	}
	return top, d.grow(top + n)
}

// join prefills the prompts in one run, right-padded to the longest, over a scratch cache just as
// long (the attention kernels' work on a prompt grows with the cache length they are given), then
// copies the rows into adjacent slots. A row's padding lands past its length, where its later
// tokens overwrite it; the kernels take each row's length from seqlens_k.
func (d *sharedDecoder) join(prompts [][]int64) ([]*lmRow, [][]float32, error) {
	Bn, T := len(prompts), 0
	for _, p := range prompts {
		if len(p) == 0 {
			return nil, nil, fmt.Errorf("lm: empty prompt")
		}
		T = max(T, len(p))
	}
	if T > d.maxPos {
		return nil, nil, fmt.Errorf("lm: a prompt of %d tokens is over lm.max_positions (%d)", T, d.maxPos)
	}
	// Whole runs of prefillStep positions, and batches of a power of two rows (the rows past Bn
	// are placeholders of one token that are not kept): ONNX Runtime's first prefill of each new
	// shape cost 40-60 ms more than later ones on an H100 (its first GroupQueryAttention node),
	// and with shapes in steps the load-time warm-up (warmPrefill) meets the common ones.
	T = min(d.maxPos, (T+prefillStep-1)/prefillStep*prefillStep)
	Bp := 1
	for Bp < Bn {
		Bp *= 2
	}
	from, err := d.freeRun(Bn)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]int64, Bp*T)
	seqlens := make([]int32, Bp)
	for b, p := range prompts {
		copy(ids[b*T:], p)
		seqlens[b] = int32(len(p) - 1)
	}
	V, H := d.m.LM.SpeechVocab+1, int64(d.m.LM.KVHeads)
	var scratch []*iobind.Tensor
	var rowLogits func(b, n int) ([]float32, error) // row b's logits at its last position n-1
	if pg := d.prefillGraph(Bp, T); pg != nil {
		if err := d.runGraph(pg, ids, seqlens); err != nil {
			return nil, nil, err
		}
		scratch = pg.cache
		rowLogits = func(b, n int) ([]float32, error) {
			v, err := d.s.View(pg.logits, int64((b*T+n-1)*V*4), []int64{int64(V)})
			if err != nil {
				return nil, err
			}
			defer v.Release()
			out := make([]float32, V)
			return out, iobind.Download(out, v)
		}
	} else {
		if scratch, err = d.scratch(Bp, T); err != nil {
			return nil, nil, err
		}
		defer release(scratch)
		logits, err := d.runOn(scratch, Bp, T, ids, seqlens)
		if err != nil {
			return nil, nil, err
		}
		rowLogits = func(b, n int) ([]float32, error) {
			return append([]float32(nil), logits[(b*T+n-1)*V:(b*T+n)*V]...), nil
		}
	}
	pb := d.c.PosBytes()
	kv := d.c.Tensors()
	copies := make([]iobind.Copy, len(scratch))
	for i, t := range scratch {
		// Bn·H rows of T positions each, into the slots' rows of maxPos positions.
		copies[i] = iobind.Copy{Dst: kv[i], DstOff: int64(from) * d.c.SlotBytes(), DstPitch: int64(d.maxPos) * pb,
			Src: t, SrcPitch: int64(T) * pb, Width: int64(T) * pb, Height: int64(Bn) * H}
	}
	if err := iobind.Copies(copies); err != nil {
		return nil, nil, fmt.Errorf("lm: prefill into the cache: %w", err)
	}
	rows := make([]*lmRow, Bn)
	out := make([][]float32, Bn)
	for b, p := range prompts {
		n := len(p)
		if out[b], err = rowLogits(b, n); err != nil {
			return nil, nil, fmt.Errorf("lm: %w", err)
		}
	}
	for b, p := range prompts {
		n := len(p)
		rows[b] = &lmRow{live: true, pos: int64(n), real: n, slot: from + b}
		d.slots[from+b] = rows[b]
	}
	return rows, out, nil
}

// prefillRows is a power of two, as the prefills' batches are (join): 8, or fewer where the
// graphs' cache has fewer slots.
func (d *sharedDecoder) prefillRows() int {
	n := 8
	for d.g != nil && n > len(d.slots) {
		n /= 2
	}
	return n
}

// prefillGraph is the captured prefill of B rows of T tokens, if there is one.
func (d *sharedDecoder) prefillGraph(B, T int) *lmGraph {
	if d.g == nil {
		return nil
	}
	return d.g.prefills[[2]int{B, T}]
}

// step runs one position for every slot up to the highest one in use. A live row that is not
// stepped gets a placeholder at its next position, which attends only to its own past and is
// overwritten when the row steps; free slots get one at position 0.
func (d *sharedDecoder) step(rows []*lmRow, tokens []int64) ([][]float32, error) {
	_, n := d.used()
	ids := make([]int64, n)
	seqlens := make([]int32, n)
	for b := 0; b < n; b++ {
		if r := d.slots[b]; r != nil {
			seqlens[b] = int32(r.pos)
		}
	}
	for i, r := range rows {
		if !r.live || r.slot >= n || d.slots[r.slot] != r {
			return nil, fmt.Errorf("lm: step for a sequence that is not in the batch")
		}
		ids[r.slot] = tokens[i]
	}
	var logits []float32
	var err error
	if d.g != nil {
		logits, err = d.stepGraph(n, ids, seqlens)
	} else {
		logits, err = d.run(0, n, 1, ids, seqlens)
	}
	if err != nil {
		return nil, err
	}
	V := d.m.LM.SpeechVocab + 1
	out := make([][]float32, len(rows))
	for i, r := range rows {
		out[i] = logits[r.slot*V : (r.slot+1)*V : (r.slot+1)*V]
		r.pos++
		r.real++
	}
	return out, nil
}

func (d *sharedDecoder) leave(r *lmRow) {
	r.live = false
	if r.slot < len(d.slots) && d.slots[r.slot] == r {
		d.slots[r.slot] = nil
	}
}

// compact moves the rows in the highest slots down into free ones once a step runs over
// noticeably more slots than there are rows.
func (d *sharedDecoder) compact() error {
	live, top := d.used()
	if top <= live+live/8 {
		return nil
	}
	return d.compactAll()
}

// compactAll moves every row above the number of rows down into free slots.
func (d *sharedDecoder) compactAll() error {
	live, top := d.used()
	free := 0
	var moves []iobind.SlotMove
	for j := top - 1; j >= live; j-- {
		r := d.slots[j]
		if r == nil {
			continue
		}
		for d.slots[free] != nil {
			free++
		}
		// The row's real positions, for every head.
		moves = append(moves, iobind.SlotMove{From: j, To: free, Positions: int(r.pos)})
		d.slots[free], d.slots[j] = r, nil
		r.slot = free
	}
	if err := d.c.Move(moves); err != nil {
		return fmt.Errorf("lm: compact: %w", err)
	}
	return nil
}
