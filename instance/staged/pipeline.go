package staged

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/voxmux/voxmux/tts"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// Pipeline holds the loaded stages of a staged (LM → flow → vocoder) model.
type Pipeline struct {
	m   *Manifest
	rt  *ort.Runtime // the LM's
	rt2 *ort.Runtime // the flow's and vocoder's (rt itself unless split)
	opt options
	lm  lmDecoder
	// flows are the flow's workers, each with its own sessions (see flowLanes).
	flows []flowRunner
	voc   *vocoderStage
	// prompts keeps voice prompts' keys and values for the chunk-causal flow (flow.chunk_step),
	// shared by its workers; nil without it.
	prompts *promptCache
	// flowMem bounds the chunk-causal flow's device memory (flow_kv_memory_mb); nil without it.
	flowMem *flowMemory
	// venc makes voices from clips (voice_encoder); nil without one, and in every pipeline of an
	// instance but the one whose LM is on device 0: it runs on the CPU, so one serves them all.
	venc *voiceEncoder
}

// LoadPipeline loads the manifest's graphs on the configured provider, all on device 0.
func LoadPipeline(cfg tts.LoadConfig) (*Pipeline, error) {
	m, err := LoadManifest(cfg.Manifest)
	if err != nil {
		return nil, err
	}
	return loadPipeline(m, cfg, 0, 0)
}

// loadPipeline puts the LM on device lmDev and the flow and vocoder on flowDev.
func loadPipeline(m *Manifest, cfg tts.LoadConfig, lmDev, flowDev int) (*Pipeline, error) {
	o, err := parseOptions(cfg.Engine)
	if err != nil {
		return nil, err // the config's own check names its file too
	}
	if err := o.checkManifest(m); err != nil {
		return nil, fmt.Errorf("pipeline %s: %w", cfg.Manifest, err)
	}
	rt, err := ort.New(cfg, lmDev, o.Options)
	if err != nil {
		return nil, err
	}
	p := &Pipeline{m: m, rt: rt, rt2: rt, opt: resolveOptions(o, rt.CUDA(), m)}
	if flowDev != lmDev {
		if p.rt2, err = ort.New(cfg, flowDev, o.Options); err != nil {
			rt.Close()
			return nil, err
		}
	}
	if err = iobind.Init(cfg.ORTLibrary); err == nil {
		graphRows, mode := 0, p.opt.lmGraph
		if mode != LMGraphOff {
			// One slot per request the instance takes at once (the router's max_inflight).
			graphRows = cmp.Or(cfg.MaxInflight, 256)
		}
		p.lm, err = newLMDecoder(m, rt.LMPlacement(mode.decodeGraphs(), p.opt.lmHighPriority), graphRows, mode.fixedPrefills())
	}
	if m.Flow.ChunkStep != "" {
		p.opt.setFlowKV(o, p.rt2.CUDA(), p.rt2.DeviceMemory())
		p.flowMem = newFlowMemory(p.opt.flowKVBytes)
		p.prompts = newPromptCache(p.opt.promptCacheBytes)
	}
	for w := 0; err == nil && w < p.opt.flowWorkers; w++ {
		var f flowRunner
		if f, err = newFlow(p.rt2, m, p.opt, p.prompts, p.flowMem); err == nil {
			p.flows = append(p.flows, f)
		}
	}
	if err == nil {
		p.voc, err = newVocoderStage(p.rt2, m, p.opt)
	}
	if err == nil && m.VoiceEncoder != nil && lmDev == 0 {
		p.venc, err = newVoiceEncoder(m, cfg, o.Options)
	}
	if err == nil && p.flowMem != nil && p.rt2.CUDA() && o.FlowKVMemoryMB == 0 {
		err = p.fitFlowKV(o)
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("pipeline %s: %w", cfg.Manifest, err)
	}
	return p, nil
}

// fitFlowKV lowers the chunk-causal flow's default memory bound to what the GPU has left once every
// session is loaded, less a reserve for what grows with the streams beside the flow's keys and
// values (the LM's cache slots, the vocoder's batches, ONNX Runtime's arenas): at 40% of an 80 GB
// H100 the bound filled, and with the LM's CUDA graphs, the flow's fixed-shape buffers and the
// vocoder the GPU ran out of memory at 64 streams (docs/cosyvoice3.md, "Memory").
func (p *Pipeline) fitFlowKV(o Options) error {
	free, total, err := iobind.MemInfo(p.rt2.Device())
	if err != nil {
		return fmt.Errorf("flow_kv_memory_mb: %w", err)
	}
	limit := flowKVFit(p.opt.flowKVBytes, p.flowMem.stats().Bytes, free, total)
	p.flowMem.setLimit(limit)
	if o.FlowPromptCacheMB == 0 {
		p.prompts.setLimit(min(p.opt.promptCacheBytes, limit/4))
	}
	p.opt.flowKVBytes = limit
	return nil
}

// flowKVReserve is the share of the GPU fitFlowKV leaves beside the flow's keys and values: from
// one stream to 64 the rest of CosyVoice3-0.5B's pipeline grew by 8 GB of an 80 GB H100, and it
// keeps growing with the LM's cache slots up to max_inflight.
const flowKVReserve = 4 // a quarter

// flowKVFit is the flow's memory bound once the pipeline is loaded: at most limit (the option's
// default), and no more than what the flow has allocated (used) plus the GPU's free memory less a
// quarter of it; at least 1 GiB, so that one stream's chunks still run.
func flowKVFit(limit, used int64, free, total uint64) int64 {
	fit := used + int64(free) - int64(total)/flowKVReserve
	return max(min(limit, fit), 1<<30)
}

// tokenBounds is Manifest.TokenBounds with the engine's minimum (lm_min_tokens_per_text_token).
func (p *Pipeline) tokenBounds(seg string, textTokens int) (minTok, maxTok int) {
	return p.m.tokenBounds(seg, textTokens, p.opt.minTokensPerTextToken)
}

// Manifest returns the pipeline's manifest.
func (p *Pipeline) Manifest() *Manifest { return p.m }

// Close releases the sessions.
func (p *Pipeline) Close() error {
	var errs []error
	if p.lm != nil {
		p.lm.close()
	}
	if p.prompts != nil {
		p.prompts.close()
	}
	for _, f := range p.flows {
		errs = append(errs, f.close())
	}
	if p.voc != nil {
		errs = append(errs, p.voc.close())
	}
	if p.venc != nil {
		errs = append(errs, p.venc.close())
	}
	p.rt.Close()
	if p.rt2 != p.rt {
		p.rt2.Close()
	}
	return errors.Join(errs...)
}

// noise returns the flow's starting sample for frames [from, to), channel-major. Each frame's
// values depend only on (seed, frame), so chunking and batching never change them.
func (p *Pipeline) noise(seed uint64, from, to int) []float32 {
	C, n := p.m.Flow.MelBins, to-from
	out := make([]float32, C*n)
	for f := from; f < to; f++ {
		r := rand.New(rand.NewPCG(seed, uint64(f)))
		for c := 0; c < C; c++ {
			out[c*n+f-from] = float32(r.NormFloat64())
		}
	}
	return out
}

// flowNoise is the flow's starting sample for a window of prompt frames of a voice's prompt and
// then frames [from, to) of the stream, channel-major [mel_bins][prompt+to−from]. With flow.noise,
// window frame p takes the table's frame idx(p) mod its length, where idx(p) = p in the prompt
// and prompt + the stream's frame after it; else a prompt frame's noise depends on (seed, its
// index in the prompt) and a stream frame's as noise gives it.
func (p *Pipeline) flowNoise(seed uint64, prompt, from, to int) []float32 {
	C := p.m.Flow.MelBins
	if t := p.m.noise; t != nil {
		T := len(t) / C
		n := prompt + to - from
		out := make([]float32, C*n)
		for f := range n {
			idx := f
			if f >= prompt {
				idx = prompt + from + f - prompt
			}
			row := t[(idx%T)*C : (idx%T+1)*C]
			for c := range C {
				out[c*n+f] = row[c]
			}
		}
		return out
	}
	rest := p.noise(seed, from, to)
	if prompt == 0 {
		return rest
	}
	n, r := prompt+to-from, to-from
	out := make([]float32, C*n)
	for f := range prompt {
		// A stream of its own, apart from the stream frames' (seed, frame).
		g := rand.New(rand.NewPCG(^seed, uint64(f)))
		for c := range C {
			out[c*n+f] = float32(g.NormFloat64())
		}
	}
	for c := range C {
		copy(out[c*n+prompt:(c+1)*n], rest[c*r:(c+1)*r])
	}
	return out
}

// argmax picks the next speech token; end of speech (the last index) is masked while allowEnd is false.
func argmax(logits []float32, allowEnd bool) int {
	n := len(logits)
	if !allowEnd {
		n--
	}
	best := 0
	for i := 1; i < n; i++ {
		if logits[i] > logits[best] {
			best = i
		}
	}
	return best
}
