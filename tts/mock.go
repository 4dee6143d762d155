package tts

import (
	"context"
	"errors"
)

// MockInstance is an Instance whose methods a test supplies; a method left nil fails.
type MockInstance struct {
	LoadF       func(context.Context, LoadConfig) (Info, error)
	SynthesizeF func(context.Context, Request, func(Chunk) error) error
	HealthF     func(context.Context) (Health, error)
	ExtractF    func(context.Context, VoiceClip) (VoicePrompt, error)
}

var _ Instance = (*MockInstance)(nil)

func (m *MockInstance) Load(ctx context.Context, cfg LoadConfig) (Info, error) {
	if m.LoadF == nil {
		return Info{}, errors.New("mock: Load not set")
	}
	return m.LoadF(ctx, cfg)
}

func (m *MockInstance) Synthesize(ctx context.Context, req Request, emit func(Chunk) error) error {
	if m.SynthesizeF == nil {
		return errors.New("mock: Synthesize not set")
	}
	return m.SynthesizeF(ctx, req, emit)
}

func (m *MockInstance) Health(ctx context.Context) (Health, error) {
	if m.HealthF == nil {
		return Health{}, errors.New("mock: Health not set")
	}
	return m.HealthF(ctx)
}

func (m *MockInstance) ExtractVoice(ctx context.Context, clip VoiceClip) (VoicePrompt, error) {
	if m.ExtractF == nil {
		return VoicePrompt{}, errors.New("mock: ExtractVoice not set")
	}
	return m.ExtractF(ctx, clip)
}
