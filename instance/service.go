package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// Service is the instance process's side of the router contract: it loads one pipeline and runs
// requests on its engine, refusing more than max_inflight at once.
type Service struct {
	mu       sync.Mutex
	e        Runner
	info     Info
	slots    chan struct{}
	inflight atomic.Int64
	env      func(string) string
}

// NewService makes an empty service; getenv is how it reads what the router set in its environment.
func NewService(getenv func(string) string) *Service { return &Service{env: getenv} }

// Load loads the pipeline; an instance loads exactly one.
func (s *Service) Load(_ context.Context, cfg LoadConfig) (Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		return Info{}, errors.New("instance already loaded")
	}
	r, desc, err := Open(cfg)
	if err != nil {
		return Info{}, err
	}
	n := cfg.MaxInflight
	if n <= 0 {
		n = 16
	}
	s.e, s.slots = r, make(chan struct{}, n)
	s.info = Info{
		Model:              desc.Name,
		SampleRate:         desc.SampleRate,
		Voices:             desc.Voices,
		Provider:           cfg.Provider,
		CUDAVisibleDevices: s.env("CUDA_VISIBLE_DEVICES"),
		PID:                os.Getpid(),
		GPUs:               CUDADevices(),
	}
	return s.info, nil
}

func (s *Service) engine() Runner {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e
}

// Synthesize runs one request.
func (s *Service) Synthesize(ctx context.Context, req Request, emit func(Chunk) error) error {
	e := s.engine()
	if e == nil {
		return &Error{Kind: ErrNotReady, Msg: "instance has no pipeline loaded"}
	}
	select {
	case s.slots <- struct{}{}:
	default:
		return &Error{Kind: ErrBusy, Msg: fmt.Sprintf("instance is at its max_inflight (%d)", cap(s.slots))}
	}
	defer func() { <-s.slots }()
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	err := e.Synthesize(ctx, req, emit)
	if errors.Is(err, ErrEmptyText) {
		return &Error{Kind: ErrInvalid, Msg: err.Error()}
	}
	return err
}

// Health reports whether a pipeline is loaded and how busy the instance is.
func (s *Service) Health(context.Context) (Health, error) {
	if s.engine() == nil {
		return Health{Ready: false, Message: "no pipeline loaded"}, nil
	}
	h := Health{Ready: true, Message: "ok", Inflight: int(s.inflight.Load())}
	if st, ok := s.engine().(interface{ Stats() []StageStats }); ok {
		h.Stages = st.Stats()
	}
	return h, nil
}

// Close stops the engine and frees the pipeline.
func (s *Service) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e == nil {
		return nil
	}
	err := s.e.Close()
	s.e = nil
	return err
}
