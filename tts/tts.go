// Package tts is the contract between voxmux's router, its plugin layer and its engines: the
// request and the audio it becomes, what an instance is told to load and reports back, its health
// and the errors it returns. The router and the plugin layer import this package and not the
// engine; every type in the Instance interface's signatures lives here.
package tts

import "context"

// Instance is what an instance process offers across the process boundary: the plugin layer's
// gRPC server serves it, its gRPC client implements it, and the router calls it.
type Instance interface {
	// Load loads the model named by cfg; an instance loads exactly one.
	Load(ctx context.Context, cfg LoadConfig) (Info, error)
	// Synthesize runs req and calls emit with each audio chunk in order. It returns when the
	// audio is complete, emit fails or ctx ends.
	Synthesize(ctx context.Context, req Request, emit func(Chunk) error) error
	// Health is the instance's own view of itself.
	Health(ctx context.Context) (Health, error)
	// ExtractVoice computes a zero-shot voice prompt from a reference clip, for models whose
	// Description says Cloning; others return an invalid-request error.
	ExtractVoice(ctx context.Context, clip VoiceClip) (VoicePrompt, error)
}

// VoiceClip is reference audio and its transcript, from which a cloning model makes a voice.
type VoiceClip struct {
	PCM        []float32 // mono, in [-1, 1]
	SampleRate int
	Text       string // what is said in the clip
}

// VoicePrompt is a voice a cloning model speaks in: what it conditions on, computed once from a
// reference clip. Each family fills the fields its model reads and leaves the others empty:
// models that condition on speech tokens fill SpeechTokens, Mel and Embedding (docs/pipeline.md,
// "Voices", gives CosyVoice3's meaning of each), latent-space models fill Latents.
type VoicePrompt struct {
	Text         string    // the prompt text: the clip's transcript, led by the model's instruction where it has one (CosyVoice3's)
	SpeechTokens []int64   // the clip's speech tokens
	Mel          []float32 // the clip's mel, frame-major [frames][MelBins]
	MelBins      int
	Embedding    []float32 // the speaker embedding
	// Latents are a latent-space model's clip features (e.g. VoxCPM's AudioVAE latents),
	// frame-major [frames][LatentDim].
	Latents   []float32
	LatentDim int
}

// Family is the Description.Kind of the family whose model made p, told by the fields it fills:
// speech tokens (with mel and embedding) are the staged family's, latents the voxcpm family's. ""
// when it fills neither or both, which no family makes. A prompt does not carry its family across
// the process boundary, so an instance tells it this way, as the voice library does for each of
// its voices.
func (p *VoicePrompt) Family() string {
	return PromptFamily(len(p.SpeechTokens) > 0, len(p.Latents) > 0)
}

// PromptFamily is VoicePrompt.Family for a prompt that has speech tokens, latents, or both
// (a voice.yaml's keys, before its files are read).
func PromptFamily(speechTokens, latents bool) string {
	switch {
	case speechTokens && !latents:
		return "staged"
	case latents && !speechTokens:
		return "voxcpm"
	}
	return ""
}

// Bytes is about what the prompt holds in memory, for caches that bound their size.
func (p *VoicePrompt) Bytes() int {
	return len(p.Text) + 8*len(p.SpeechTokens) + 4*len(p.Mel) + 4*len(p.Embedding) + 4*len(p.Latents)
}

// Request is one synthesis request as the router hands it to an instance.
type Request struct {
	ID   string
	Text string
	// Voice names a built-in voice of the model, one of its Description.Voices; empty is the
	// model's default voice, the first of Description.Voices. An instance refuses any other name
	// with an invalid-request error that names the voice and lists the model's voices
	// (Description.CheckVoice), whatever the family: a name is never guessed. Names clients send
	// that are not the model's (OpenAI's alloy and the others, a name in another case, a library
	// voice) are the router's to resolve before the request gets here.
	//
	// With Prompt set the request speaks in Prompt and Voice is only a label for logs: the
	// library voice's name when the client named one, else the voice the router resolved (the
	// model's default for a request that brings its own reference clip). Instances do not check
	// it then.
	Voice string
	Speed float32
	// Seed picks the flow's starting noise and the draws of models that sample their tokens;
	// equal requests with equal seeds give equal audio. The router sets a random one when the
	// client names none.
	Seed uint64
	// Instructions (OpenAI's: tone, accent, pace) reach only models whose Description says
	// they take them.
	Instructions string
	// Prompt, when set, is the voice to speak in (a cloned voice) in place of the built-in Voice.
	// It must have been made by the serving model's family (VoicePrompt.Family): an instance
	// refuses another family's prompt with an invalid-request error naming both
	// (Description.CheckPrompt).
	Prompt *VoicePrompt
}

// Chunk is a piece of mono float32 audio, in order.
type Chunk struct {
	PCM        []float32
	SampleRate int
	Index      int
	// Text is the part of the request's text the chunk speaks; nil when the model cannot say.
	Text *TextSpan
}

// TextSpan is a part of a request's text as byte offsets into Request.Text, [Start, End). The
// spans of a request's chunks follow each other: the first starts at 0, each starts where the
// one before ended and the last ends at len(Text), so they are exact at the request's ends and
// as close as the model can tell between (docs/api.md, Timestamps).
type TextSpan struct {
	Start, End int
}

// Description is what the router needs to know of a model before any instance runs it.
type Description struct {
	Kind       string
	Name       string
	SampleRate int
	Voices     []string
	// NativeSpeed is true when the model applies the request's speed itself (piper: through its
	// phoneme durations), so the router must not time-stretch its audio.
	NativeSpeed bool
	// Instructions is true when the model follows a request's "instructions" (staged exports
	// with lm.endofprompt, CosyVoice3's); the router drops them for the others.
	Instructions bool
	// Cloning is true when the model makes voices from reference clips (ExtractVoice) and speaks
	// in a request's Prompt.
	Cloning bool
	// Attribution is the credit the licences of the model's voices ask software that speaks with
	// them to show (Piper's jenny: "Jenny (Dioco)"), "" when none does; the router shows it on its
	// status page and in GET /v1/models.
	Attribution string
}
