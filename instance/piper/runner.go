package piper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/voxmux/voxmux/tts"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/espeak"
	"github.com/voxmux/voxmux/instance/ort"
)

// Runner synthesizes with Piper (VITS) voices: text → sentences → espeak-ng phonemes → ids
// → graph runs, each sentence's audio emitted before the next is synthesized. Concurrent requests'
// sentences for one voice file share its session and run in batches (batch.go): on CUDA
// many sentences per run, on the CPU one per run, many runs at once (docs/piper.md).
type Runner struct {
	m     *piperModel
	rt    *ort.Runtime
	ph    *espeak.Phonemizer
	cache *sessionCache
	opts  piperOptions
	// stats count the graph runs of every voice file; cancels what cancelled requests cost
	// (report.go).
	stats   *engine.Counters
	cancels engine.Cancels
}

// openPiper checks the voices, starts espeak-ng and prepares ONNX Runtime; sessions are loaded
// on a voice's first request.
func openPiper(cfg tts.LoadConfig) (*Runner, tts.Description, error) {
	m, err := loadPiperModel(cfg.Manifest)
	if err != nil {
		return nil, tts.Description{}, err
	}
	dataDir, err := espeak.FindData(m.ESpeakData)
	if err != nil {
		return nil, tts.Description{}, fmt.Errorf("piper model %s: %w", cfg.Manifest, err)
	}
	ph, err := espeak.Open(dataDir)
	if err != nil {
		return nil, tts.Description{}, fmt.Errorf("piper model %s: %w", cfg.Manifest, err)
	}
	for _, f := range m.Files {
		if err := ph.CheckVoice(f.Config.ESpeak.Voice); err != nil {
			return nil, tts.Description{}, fmt.Errorf("piper voice config %s: espeak.voice: %w", f.ConfigPath, err)
		}
	}
	// On CUDA the runtime's default cuDNN search (a fixed algorithm) suits sentences of every
	// length; see ort.New.
	e, err := parseOptions(cfg.Engine)
	if err != nil {
		return nil, tts.Description{}, err // the config's own check names its file too
	}
	opts := piperOptionsFrom(cfg, e)
	rt, err := ort.New(cfg, 0, e.Options) // voices run on the group's first GPU
	if err != nil {
		return nil, tts.Description{}, err
	}
	r := &Runner{m: m, rt: rt, ph: ph, opts: opts, stats: engine.NewCounters(stageNames...)}
	r.cache = newSessionCache(m.MaxLoaded, r.load)
	return r, m.description(), nil
}

// load opens a voice file's sessions and starts its workers: split at the decoder (chunked.go)
// when chunks are wanted and the graph can be split, else the whole graph with its row lengths
// exposed (piperWithLengths) when it has them and batches are wanted. Either way the graph that
// runs the duration predictor (the front, or the whole graph) gets the speed input
// (piperWithSpeed) when it has VITS's duration rounding, added after the row lengths so that they
// count the frames at the row's speed.
func (r *Runner) load(f *piperFile) (*piperSession, error) {
	in := []string{"input", "input_lengths", "scales"}
	if f.HasSID {
		in = append(in, "sid")
	}
	if r.opts.Chunks {
		c, reason, err := r.newPiperChunker(f, in)
		if err != nil {
			return nil, err
		}
		if c != nil {
			if !c.speed {
				slog.Info("piper voice has no duration rounding to scale; its speed divides length_scale", "voice", f.Stem)
			}
			return startPiperSession(&piperSession{chunks: c, file: f, opts: r.opts, lengths: true, speed: c.speed, r: r}), nil
		}
		if r.opts.Float16 {
			return nil, fmt.Errorf("piper voice %s: engine option piper_precision float16 converts the decoder that chunked decoding splits off, and this voice cannot be decoded in chunks (%s); use piper_precision float32", f.Path, reason)
		}
		if (r.opts.CPUFront || r.opts.AutoFront) && r.rt.CUDA() {
			slog.Warn("piper voice cannot be decoded in chunks, so piper_front has no front to move; it runs whole sentences on CUDA", "voice", f.Stem, "reason", reason)
		} else {
			slog.Info("piper voice cannot be decoded in chunks; it runs whole sentences", "voice", f.Stem, "reason", reason)
		}
	}
	out := []string{"output"}
	var graph []byte
	if r.opts.Batch > 1 {
		g, err := piperWithLengths(f.Path)
		if err != nil {
			return nil, fmt.Errorf("piper voice %s: %w", f.Path, err)
		}
		if g != nil {
			graph, out = g, append(out, piperLengthOutput)
		} else {
			slog.Info("piper voice has no row-length computation; it runs one sentence at a time", "voice", f.Stem)
		}
	}
	graph, speed, err := withSpeedInput(f.Path, graph)
	if err != nil {
		return nil, fmt.Errorf("piper voice %s: %w", f.Path, err)
	}
	if speed {
		in = append(in, piperSpeedInput)
	} else {
		slog.Info("piper voice has no duration rounding to scale; its speed divides length_scale", "voice", f.Stem)
	}
	s, err := r.rt.SessionFromData("piper", graph, in, out)
	if err != nil {
		return nil, fmt.Errorf("piper voice: load %s: %w", f.Path, err)
	}
	return newPiperSession(s, f, r.opts, len(out) > 1, speed, r), nil
}

// Synthesize speaks req.Text with req.Voice (empty: the first voice) at req.Speed, which divides
// the durations of its phonemes and the silence between sentences (speed.go). A name the model
// does not have and a voice prompt (which no Piper voice speaks in) are the request's errors
// (tts.Description.CheckRequest).
func (r *Runner) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) (err error) {
	q, end := r.begin(ctx)
	defer func() { end(err) }()
	if err := r.m.description().CheckRequest(req); err != nil {
		return err
	}
	if req.Prompt != nil { // one whose family CheckRequest cannot tell
		return tts.InvalidVoice(fmt.Sprintf("model %q does not speak in voice prompts", r.m.Name))
	}
	v, _ := r.m.voice(req.Voice) // found: CheckRequest passed the name
	if strings.TrimSpace(req.Text) == "" {
		return tts.ErrEmptyText
	}
	sents, err := v.File.sentences(r.ph, req.Text)
	if err != nil {
		return fmt.Errorf("phonemize: %w", err)
	}
	if len(sents) == 0 {
		return &tts.Error{Kind: tts.ErrInvalid, Msg: fmt.Sprintf("espeak-ng found nothing to pronounce in the input for voice %s (espeak voice %s): it has no words it can read, e.g. only emoji or symbols", v.Name, v.File.Config.ESpeak.Voice)}
	}
	sess, release, err := r.cache.acquire(v.File)
	if err != nil {
		return err
	}
	defer release()
	speed := cmp.Or(max(req.Speed, 0), 1)
	scales := v.File.scales
	if !sess.speed {
		scales[1] /= speed
	}
	rate := v.File.Config.Audio.SampleRate
	silence := int(math.Round(r.m.SentenceSilence * float64(rate) / float64(speed)))
	out := &sentenceOut{text: req.Text, rate: rate, silence: silence, emit: emit}
	for i, s := range sents {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Each sentence's last chunk ends at its text's end: spans are exact at sentence ends.
		if err := out.speak(ctx, q, sess, s, i, len(sents), scales, speed, v.Speaker); err != nil {
			return err
		}
	}
	return nil
}

// normalizePeak scales a sentence's audio to full range, as Piper does (its C++ divides by the
// peak, at least 0.01, so near-silence is not blown up; piper1-gpl does the same by default).
func normalizePeak(pcm []float32) {
	var peak float32 = 0.01
	for _, x := range pcm {
		peak = max(peak, float32(math.Abs(float64(x))))
	}
	g := 1 / peak
	for i, x := range pcm {
		pcm[i] = min(1, max(-1, x*g))
	}
}

// Voices lists the model's voice names, as Description does.
func (r *Runner) Voices() []string { return r.m.description().Voices }

// Loaded lists the voice files whose sessions are loaded now (least recently used first).
func (r *Runner) Loaded() []string { return r.cache.loaded() }

// Close frees every session; requests still running fail.
func (r *Runner) Close() error {
	err := r.cache.close()
	r.rt.Close()
	return err
}

// sessionCache keeps the sessions of at most max voice files, loading each on first use and
// unloading the least recently used one that no request is using when over the bound. A session
// in use is never unloaded, so the bound can be passed while more voices than that are in use.
type sessionCache struct {
	mu      sync.Mutex
	max     int
	load    func(*piperFile) (*piperSession, error)
	entries map[*piperFile]*cacheEntry
	clock   uint64
	closed  bool
}

type cacheEntry struct {
	f       *piperFile
	sess    *piperSession
	err     error
	ready   chan struct{} // closed once loaded (or failed)
	refs    int
	lastUse uint64
}

func newSessionCache(max int, load func(*piperFile) (*piperSession, error)) *sessionCache {
	return &sessionCache{max: max, load: load, entries: map[*piperFile]*cacheEntry{}}
}

// acquire returns f's session, loading it if needed; release must be called when done with it.
func (c *sessionCache) acquire(f *piperFile) (*piperSession, func(), error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, nil, &tts.Error{Kind: tts.ErrNotReady, Msg: "instance is shutting down"}
	}
	e, ok := c.entries[f]
	if !ok {
		e = &cacheEntry{f: f, ready: make(chan struct{})}
		c.entries[f] = e
	}
	e.refs++
	c.mu.Unlock()
	if !ok {
		// Loaded outside the lock, so requests for loaded voices go on meanwhile; requests for this
		// voice wait on ready.
		s, err := c.load(f)
		c.mu.Lock()
		e.sess, e.err = s, err
		if err != nil {
			delete(c.entries, f) // the next request tries again
		}
		close(e.ready)
		c.mu.Unlock()
	}
	<-e.ready
	release := func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		e.refs--
		c.clock++
		e.lastUse = c.clock
		if c.closed && e.refs == 0 && e.sess != nil {
			_ = e.sess.close() // the last request on a closed cache frees the session
			e.sess = nil
			return
		}
		c.evictLocked()
	}
	if e.err != nil {
		release()
		return nil, nil, e.err
	}
	return e.sess, release, nil
}

// evictLocked unloads idle sessions, least recently used first, while more than max are loaded.
func (c *sessionCache) evictLocked() {
	for {
		n := 0
		var victim *cacheEntry
		for _, e := range c.entries {
			if e.sess == nil {
				continue
			}
			n++
			if e.refs == 0 && (victim == nil || e.lastUse < victim.lastUse) {
				victim = e
			}
		}
		if n <= c.max || victim == nil {
			return
		}
		delete(c.entries, victim.f)
		_ = victim.sess.close()
	}
}

func (c *sessionCache) loaded() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var es []*cacheEntry
	for _, e := range c.entries {
		if e.sess != nil {
			es = append(es, e)
		}
	}
	slices.SortFunc(es, func(a, b *cacheEntry) int { return cmp.Compare(a.lastUse, b.lastUse) })
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.f.Stem
	}
	return out
}

// close frees the idle sessions; one in use is freed when its last request releases it.
func (c *sessionCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for f, e := range c.entries {
		if e.sess != nil && e.refs == 0 {
			errs = append(errs, e.sess.close())
			e.sess = nil
		}
		delete(c.entries, f)
	}
	return errors.Join(errs...)
}
