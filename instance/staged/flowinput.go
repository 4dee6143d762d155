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
