"""CosyVoice3's streaming flow in PyTorch, two ways that compute the same mel
(docs/cosyvoice3.md, "Chunk-causal flow"):

- whole(): every guided Euler step over the whole sequence (voice prompt, then the request's
  frames) under the chunk-causal mask, what CosyVoice's flow.inference(streaming=True) computes;
- CachedFlow: frames computed a segment at a time with net.ChunkFlowStep, keeping, per Euler step,
  the keys and values of every frame of a complete chunk and the frames' x as they entered the step
  (the last conv_context frames of it feed the DiT's causal position convolutions). It is the
  algorithm the engine runs; the tests and the parity script hold it against whole() and the
  reference.

Every array is [frames, channels] per utterance here (mu, cond, noise); mel comes back [mel, frames].
"""

import torch

from . import net


def voice_frames(c, prompt_frames):
    """The frames of a voice prompt of prompt_frames frames whose every step depends on the voice
    alone: its complete chunks, short of the last look-ahead tokens' frames, whose mu reads the
    request's first tokens (the look-ahead layer runs over prompt and request tokens together)."""
    return max(prompt_frames - c.lookahead * c.token_mel_ratio, 0) // c.chunk_frames * c.chunk_frames


def whole(flow, mu, cond, embedding, noise, chunk=None):
    """The flow over all frames at once under the streaming mask (chunk frames; 0: full attention).
    mu, cond, noise [F,mel]; embedding [spk]. Returns mel [mel,F]."""
    c = flow.c
    step = net.FlowStep(flow, chunk=c.chunk_frames if chunk is None else chunk)
    Fr = mu.shape[0]
    x = noise[:Fr].t().unsqueeze(0).contiguous()
    mask = torch.ones(1, 1, Fr)
    ts = flow.time_span()
    with torch.no_grad():
        for k in range(c.steps):
            x = step(x, mask, mu.t().unsqueeze(0), ts[k:k + 1], (ts[k + 1] - ts[k]).reshape(1),
                     torch.tensor([c.cfg_rate]), cond.t().unsqueeze(0), embedding.unsqueeze(0))
    return x[0]


class CachedFlow:
    """One utterance's flow computed a segment at a time.

    run(end) computes frames [done, end), where done is the first frame of the first chunk not yet
    complete, and returns their mel [mel, end-done]; every chunk that [done, end) completes (all
    of it, when end is the utterance's last frame) is then kept, so the next run starts after it.
    A segment that ends inside a chunk is computed before that chunk's later frames exist, so it
    may differ from whole(); the chunk is computed again, whole, by the run that completes it.

    seed(kv, xs, done) starts from another utterance's kept state (a voice prompt's complete
    chunks): kv[k] [done,L,4,inner], xs[k] [done or fewer (the last conv_context), mel]."""

    def __init__(self, flow, mu, cond, embedding, noise, dtype=torch.float32, step=None):
        """step: what computes a step (net.ChunkFlowStep's inputs and outputs); the network's own
        by default, an exported graph's in the parity check."""
        self.flow, self.c = flow, flow.c
        self.step = step or net.ChunkFlowStep(flow)
        self.ctx = net.conv_context(flow)
        self.mu, self.cond, self.embedding, self.noise = mu, cond, embedding, noise
        L, inner = self.c.depth, self.c.heads * self.c.dim_head
        self.kv = [torch.zeros(0, L, 4, inner, dtype=dtype) for _ in range(self.c.steps)]
        self.xs = [torch.zeros(0, self.c.mel) for _ in range(self.c.steps)]
        self.done = 0
        self.ts = flow.time_span()

    def seed(self, kv, xs, done):
        self.kv, self.xs, self.done = [k.clone() for k in kv], [x.clone() for x in xs], done

    def run(self, end, final=False):
        c, C, s = self.c, self.ctx, self.done
        n = end - s
        if n <= 0:
            raise ValueError("nothing to compute: frames %d..%d" % (s, end))
        ctx_from = max(s - C, 0)
        mask = torch.zeros(1, 1, C + n)
        mask[0, 0, C - (s - ctx_from):] = 1
        x = self.noise[s:end]
        got_kv, got_x = [], []
        with torch.no_grad():
            for k in range(c.steps):
                xk = torch.zeros(C + n, c.mel)
                xk[C - (s - ctx_from):C] = self.xs[k][self.xs[k].shape[0] - (s - ctx_from):]
                xk[C:] = x
                mu = torch.zeros(C + n, c.mel)
                mu[C - (s - ctx_from):] = self.mu[ctx_from:end]
                cond = torch.zeros(C + n, c.mel)
                cond[C - (s - ctx_from):] = self.cond[ctx_from:end]
                past = self.kv[k]
                if past.shape[0] == 0:
                    past = torch.zeros(1, *past.shape[1:], dtype=past.dtype)   # P >= 1; ignored
                xn, present = self.step(xk.t().unsqueeze(0), mask, mu.t().unsqueeze(0), cond.t().unsqueeze(0),
                                        torch.tensor([s]), self.ts[k:k + 1], (self.ts[k + 1] - self.ts[k]).reshape(1),
                                        torch.tensor([c.cfg_rate]), self.embedding.unsqueeze(0), past.unsqueeze(0))
                got_x.append(x)
                got_kv.append(present[0])
                x = xn[0].t()
        keep = n if final else n // c.chunk_frames * c.chunk_frames
        if keep:
            for k in range(c.steps):
                self.kv[k] = torch.cat([self.kv[k], got_kv[k][:keep].to(self.kv[k].dtype)])
                self.xs[k] = torch.cat([self.xs[k], got_x[k][:keep]])[-C:]
            self.done = s + keep
        return x.t()
