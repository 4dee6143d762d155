package staged

// chunkInput is what the flow reads of a stream of n tokens for its chunk [flowed, end): tokens
// from start (the left context, streaming.context_tokens) and la look-ahead tokens after end
// (flow.lookahead_tokens, as many as exist; none for the stream's last chunk, which has none).
func chunkInput(m *Manifest, flowed, end, n int, last bool) (start, la int) {
	start = max(0, flowed-m.Streaming.ContextTokens)
	if !last {
		la = max(0, min(m.Flow.LookaheadTokens, n-end))
	}
	return start, la
}

// flowJob is a chunk's flow input: its tokens, the starting noise of every one of their frames
// (flowNoise), and the voice's prompt mel and speaker embedding.
func (p *Pipeline) flowJob(it *flowItem) flowJob {
	if it.chunk != nil {
		return p.chunkJob(it)
	}
	R := p.m.Flow.FramesPerToken
	f0 := it.firstToken * R
	j := flowJob{
		tokens:    it.tokens,
		noise:     p.flowNoise(it.s.req.Seed, it.prompt*R, f0, f0+(len(it.tokens)-it.prompt)*R),
		prompt:    it.prompt,
		lookahead: it.lookahead,
	}
	if v := it.s.voice; v != nil {
		j.cond, j.embedding = v.Mel, v.Embedding
	}
	if j.embedding == nil && p.m.Flow.EmbeddingDim > 0 {
		// A voice without a prompt conditions on no speaker (zeros).
		j.embedding = make([]float32, p.m.Flow.EmbeddingDim)
	}
	return j
}

// chunkJob is a chunk-causal run's input (flow.chunk_step): the encoder's window of tokens, the
// stream's kept frames (made on its first chunk) and the voice. The noise is the manifest's table
// by frame from the voice prompt's first, which flowChunks reads itself.
func (p *Pipeline) chunkJob(it *flowItem) flowJob {
	s := it.s
	if s.kv == nil {
		s.kv = p.newChunkKV()
	}
	j := flowJob{tokens: it.tokens, prompt: it.prompt, lookahead: it.lookahead,
		chunk: &chunkJob{span: it.chunk, toks: it.chunk.toks, st: s.kv, voice: s.voice, last: it.last}}
	if v := s.voice; v != nil {
		j.cond, j.embedding = v.Mel, v.Embedding
	}
	if j.embedding == nil {
		j.embedding = make([]float32, p.m.Flow.EmbeddingDim)
	}
	return j
}
