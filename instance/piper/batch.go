package piper

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"

	onnxrt "github.com/yalue/onnxruntime_go"
)

// Batching of Piper voices (docs/piper.md, "Batching"): every sentence of every request for a
// voice file is a job in that file's queue; a fixed number of workers each take up to piper_batch
// queued jobs with the same scales and run them as one [B, T] graph run (ids padded, each row's
// input_lengths its own), then cut each row's audio by its own length. GPU memory is bounded by
// the workers × the batch, never by the number of requests; a sentence that finds the queue full
// is refused (ErrBusy, HTTP 429).

// piperOptions are the piper engine options, resolved.
type piperOptions struct {
	Batch   int // most sentences per graph run (1: no batching)
	Workers int // graph runs at once per voice file
	Queue   int // sentences waiting per voice file beyond which requests are refused
	// BatchIDs bounds a batch's padded size (rows × longest row's ids) so one long sentence does
	// not make a batch of long rows; a single row of any length still runs.
	BatchIDs int
	// Chunks: decode sentences in chunks of FirstChunk frames, doubling up to Chunk (chunked.go).
	Chunks            bool
	FirstChunk, Chunk int
	// Float16: the chunked decoder runs converted to float16 (float16.go).
	Float16 bool
	// CPUFront: the chunked front runs on ONNX Runtime's CPU provider with FrontThreads intra-op
	// threads (0: ONNX Runtime's default), whatever the group's provider (piper_front cpu).
	// AutoFront: it runs there for small batches and on the group's provider for the others
	// (piper_front auto).
	CPUFront, AutoFront bool
	FrontThreads        int
	// ChunkFlow: the flow is cut out of the front and run over each chunk's frames (piper_flow
	// chunks); FlowAsked: the config set it so, rather than the provider's default.
	ChunkFlow, FlowAsked bool
}

// Defaults: on CUDA, batches of up to 64 sentences with 2 runs at once (one run's host work
// overlaps the other's kernels); on the CPU, one sentence per run and as many runs at once as
// requests (max_inflight), which measured fastest there (docs/piper.md, Concurrency).
const (
	piperCUDABatch   = 64
	piperCUDAWorkers = 2
	piperQueue       = 1024
	piperRowIDs      = 400 // a long sentence's ids; BatchIDs = Batch × piperRowIDs
	piperFirstChunk  = 12  // frames
	piperChunk       = 256
)

// piperOptionsFrom resolves the family's engine options e (checked when the config loaded) for
// cfg's provider.
func piperOptionsFrom(cfg tts.LoadConfig, e Options) piperOptions {
	o := piperOptions{Batch: 1, Workers: max(cfg.MaxInflight, 1), Queue: piperQueue}
	if cfg.Provider == "cuda" {
		o.Batch, o.Workers = piperCUDABatch, piperCUDAWorkers
	}
	o.Batch = cmp.Or(e.Batch, o.Batch)
	o.Workers = cmp.Or(e.Workers, o.Workers)
	o.Queue = cmp.Or(e.Queue, o.Queue)
	o.BatchIDs = o.Batch * piperRowIDs
	o.Chunks = e.Decode != DecodeSentences
	o.FirstChunk = cmp.Or(e.FirstChunk, piperFirstChunk)
	o.Chunk = max(cmp.Or(e.Chunk, piperChunk), o.FirstChunk)
	o.Float16 = e.Precision == Float16
	o.CPUFront = e.Front == FrontCPU
	o.AutoFront = e.Front == FrontAuto
	// The flow runs in chunks by default where it measured faster to first audio (the CPU
	// provider, docs/piper.md "The flow in chunks"). On CUDA the cut flow runs on the GPU, and
	// with the front on the CPU first audio came later that way (90 against 74 ms P50, H100).
	o.ChunkFlow = o.Chunks && (e.Flow == FlowChunks || e.Flow == "" && cfg.Provider != "cuda")
	o.FlowAsked = e.Flow == FlowChunks
	o.FrontThreads = e.IntraOpThreads
	if (o.CPUFront || o.AutoFront) && cfg.Provider == "cuda" && o.FrontThreads == 0 {
		o.FrontThreads = cpuFrontThreads(runtime.NumCPU())
	}
	return o
}

// cpuFrontThreads is the front's intra-op threads on the CPU beside a GPU decoder, for a host of
// cpus cores, unless intra_op_num_threads sets it: half the cores, at most 8. The front's session
// has one pool of threads, which the front runs of every worker share (each run's calling thread
// joins in), so the fronts keep to about that many cores however many workers run them; the other
// half is left to the rest of the server (espeak-ng, HTTP, encoding, the decoder's kernel
// launches). The bound of 8 is for the front's small ops ([rows, 192, frames] tensors, a few
// hundred a run); it is not measured yet (docs/piper.md, "Front on the CPU").
func cpuFrontThreads(cpus int) int {
	return min(8, max(1, cpus/2))
}

// piperJob is one sentence waiting for synthesis.
type piperJob struct {
	ctx    context.Context
	req    *request  // its request, which the job holds until a worker lets go of it
	queued time.Time // when it joined the queue
	ids    []int64
	sid    int64
	scales [3]float32
	speed  float32          // divides the row's durations where the graph takes piperSpeedInput
	done   chan piperResult // buffered: a worker never waits for a request that left
	parts  *piperParts      // a chunked session's audio, part by part, instead of done
	first  bool             // the request's first sentence, whose first chunk is its first audio
}

type piperResult struct {
	pcm []float32
	err error
}

// piperSession is one voice file's loaded graph, its queue and its workers.
type piperSession struct {
	sess    *onnxrt.DynamicAdvancedSession
	file    *piperFile
	opts    piperOptions
	lengths bool // the graph gives each row's frames (piperLengthOutput), so rows can share a run
	speed   bool // the graph (a chunked voice's front) takes each row's speed (piperSpeedInput, speed.go)
	// chunks, when set, is the voice split at its decoder: sentences are decoded in chunks
	// (chunked.go) and sess is nil.
	chunks *piperChunker
	jobs   chan *piperJob
	stop   chan struct{}
	wg     sync.WaitGroup
	// r counts the runs and holds the jobs' requests.
	r *Runner
}

func newPiperSession(sess *onnxrt.DynamicAdvancedSession, f *piperFile, o piperOptions, lengths, speed bool, r *Runner) *piperSession {
	return startPiperSession(&piperSession{sess: sess, file: f, opts: o, lengths: lengths, speed: speed, r: r})
}

// startPiperSession makes s's queue and starts its workers.
func startPiperSession(s *piperSession) *piperSession {
	o := &s.opts
	if !s.lengths {
		o.Batch = 1 // without row lengths a padded row's audio cannot be cut
	}
	s.jobs, s.stop = make(chan *piperJob, o.Queue), make(chan struct{})
	for range o.Workers {
		s.wg.Add(1)
		go s.work()
	}
	return s
}

// synthesize queues one sentence of request q and waits for its audio (not yet peak-normalized).
func (s *piperSession) synthesize(ctx context.Context, q *request, ids []int64, scales [3]float32, speed float32, sid int64) ([]float32, error) {
	j := &piperJob{ctx: ctx, req: q, queued: time.Now(), ids: ids, sid: sid, scales: scales, speed: speed, done: make(chan piperResult, 1)}
	s.r.hold(q)
	select {
	case s.jobs <- j:
	default:
		s.r.release(q)
		return nil, &tts.Error{Kind: tts.ErrBusy, Msg: fmt.Sprintf("voice %s: %d sentences are already waiting for synthesis (engine option piper_queue); retry later", s.file.Stem, s.opts.Queue)}
	}
	select {
	case r := <-j.done:
		return r.pcm, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// work runs batches until the session closes. Jobs with other scales than the batch's first (one
// tensor for the whole batch; a request's speed changes length_scale where the graph does not
// take piperSpeedInput, each row's own) or that would pass the batch's padded size are held for
// this worker's next batch, first in line.
func (s *piperSession) work() {
	defer s.wg.Done()
	var held []*piperJob
	for {
		var first *piperJob
		if len(held) > 0 {
			first, held = held[0], held[1:]
		} else {
			select {
			case first = <-s.jobs:
			case <-s.stop:
				return
			}
		}
		batch := []*piperJob{first}
		longest := len(first.ids)
		fits := func(j *piperJob) bool {
			return len(batch) < s.opts.Batch && j.scales == first.scales &&
				(len(batch)+1)*max(longest, len(j.ids)) <= s.opts.BatchIDs
		}
		var keep []*piperJob
		for _, j := range held {
			if fits(j) {
				batch = append(batch, j)
				longest = max(longest, len(j.ids))
			} else {
				keep = append(keep, j)
			}
		}
		held = keep
	drain:
		for len(batch) < s.opts.Batch {
			select {
			case j := <-s.jobs:
				if fits(j) {
					batch = append(batch, j)
					longest = max(longest, len(j.ids))
				} else {
					held = append(held, j)
				}
			default:
				break drain
			}
		}
		s.run(batch)
	}
}

// answer hands j its result and lets go of its request.
func (s *piperSession) answer(j *piperJob, r piperResult) {
	if j.parts != nil {
		j.parts.push(piperPart{pcm: r.pcm, err: r.err, last: true})
	} else {
		j.done <- r
	}
	s.r.release(j.req)
}

// run synthesizes a batch and hands each job its audio; jobs whose request has gone are left out.
func (s *piperSession) run(batch []*piperJob) {
	live := batch[:0]
	for _, j := range batch {
		if err := j.ctx.Err(); err != nil {
			s.answer(j, piperResult{err: err})
			continue
		}
		live = append(live, j)
	}
	if len(live) == 0 {
		return
	}
	if s.chunks != nil {
		s.runChunks(live)
		return
	}
	t0 := time.Now()
	rows, sids, speeds := s.rows(live, t0)
	pcm, err := runPiperBatch(s.sess, s.file, s.lengths, rows, sids, speeds, live[0].scales)
	s.r.stats.Count(stageGraph, len(live), t0)
	for i, j := range live {
		if err != nil {
			s.answer(j, piperResult{err: err})
			continue
		}
		s.answer(j, piperResult{pcm: pcm[i]})
	}
}

// rows are the jobs' ids, speakers and speeds (nil where the graph does not take
// piperSpeedInput: then the speed is in the batch's scales), each job's wait counted up to t0.
func (s *piperSession) rows(live []*piperJob, t0 time.Time) (rows [][]int64, sids []int64, speeds []float32) {
	rows, sids = make([][]int64, len(live)), make([]int64, len(live))
	if s.speed {
		speeds = make([]float32, len(live))
	}
	for i, j := range live {
		rows[i], sids[i] = j.ids, j.sid
		if speeds != nil {
			speeds[i] = j.speed
		}
		s.r.stats.Waited(stageGraph, t0, j.queued)
	}
	return rows, sids, speeds
}

// close stops the workers (no request holds the session then) and frees the graph.
func (s *piperSession) close() error {
	close(s.stop)
	s.wg.Wait()
	for {
		select {
		case j := <-s.jobs:
			s.answer(j, piperResult{err: &tts.Error{Kind: tts.ErrNotReady, Msg: "instance is shutting down"}})
		default:
			if s.chunks != nil {
				return s.chunks.close()
			}
			return s.sess.Destroy()
		}
	}
}

// runPiperBatch runs rows of ids as one graph run: ids padded with 0 to the longest row,
// input_lengths each row's own, sid each row's speaker, speeds (nil where the graph does not take
// piperSpeedInput) each row's speed. With lengths, row i's audio is its first frames[i] × hop
// samples; without, there must be one row and its audio is the whole output.
func runPiperBatch(sess *onnxrt.DynamicAdvancedSession, f *piperFile, lengths bool, rows [][]int64, sids []int64, speeds []float32, scales [3]float32) ([][]float32, error) {
	b := len(rows)
	if !lengths && b != 1 {
		return nil, fmt.Errorf("piper voice %s: %d rows in one run without the graph's row lengths", f.Stem, b)
	}
	vals, err := piperInputs(f, rows, sids, speeds, scales)
	defer func() { ort.Destroy(vals) }()
	if err != nil {
		return nil, err
	}
	outs := []onnxrt.Value{nil}
	if lengths {
		outs = append(outs, nil)
	}
	err = sess.Run(vals, outs)
	defer ort.Destroy(outs)
	if err != nil {
		return nil, piperRunError(f, b, err)
	}
	audio, err := ort.Floats(outs[0])
	if err != nil {
		return nil, fmt.Errorf("piper voice %s: %w", f.Stem, err)
	}
	// [B, 1, 1, T] from Piper's export, [B, T] or [B, 1, T] from others: B rows of equal length.
	if len(audio)%b != 0 {
		return nil, fmt.Errorf("piper voice %s: %d output samples do not split into %d rows", f.Stem, len(audio), b)
	}
	per := len(audio) / b
	out := make([][]float32, b)
	if !lengths {
		out[0] = append([]float32(nil), audio...)
		return out, nil
	}
	ft, ok := outs[1].(*onnxrt.Tensor[int64])
	if !ok {
		return nil, fmt.Errorf("piper voice %s: row lengths are %T, want int64", f.Stem, outs[1])
	}
	frames := ft.GetData()
	longest := int64(0)
	for _, n := range frames {
		longest = max(longest, n)
	}
	if len(frames) != b || longest <= 0 || per%int(longest) != 0 {
		return nil, fmt.Errorf("piper voice %s: row lengths %v do not fit %d samples a row", f.Stem, frames, per)
	}
	hop := per / int(longest)
	for i := range out {
		out[i] = append([]float32(nil), audio[i*per:i*per+int(frames[i])*hop]...)
	}
	return out, nil
}

// runPiper synthesizes one sentence in a run of its own.
func runPiper(sess *onnxrt.DynamicAdvancedSession, ids []int64, scales [3]float32, v piperVoice) ([]float32, error) {
	out, err := runPiperBatch(sess, v.File, false, [][]int64{ids}, []int64{v.Speaker}, nil, scales)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}
