package instance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// gateRunner holds each request until release closes or its context ends, then takes a moment to
// return, as an engine winding a cancelled request down does.
type gateRunner struct{ release chan struct{} }

func (g gateRunner) Synthesize(ctx context.Context, _ tts.Request, _ func(tts.Chunk) error) error {
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		time.Sleep(20 * time.Millisecond)
		return ctx.Err()
	}
}

func (gateRunner) Close() error   { return nil }
func (gateRunner) Report() Report { return Report{} }

type gateFamily struct{ r gateRunner }

func (gateFamily) Name() string                                { return "gate" }
func (gateFamily) OptionKeys() []string                        { return nil }
func (gateFamily) ParseOptions(tts.EngineSection) (any, error) { return nil, nil }
func (gateFamily) Claims(string) bool                          { return true }
func (gateFamily) Describe(string) (tts.Description, error)    { return tts.Description{}, nil }
func (f gateFamily) Open(tts.LoadConfig) (Runner, tts.Description, error) {
	return f.r, tts.Description{}, nil
}

// A request that arrives while a cancelled one still holds the last slot gets the slot when the
// cancelled one returns; with every slot held by a live request it is busy.
func TestServiceWaitsForASlotBeingFreed(t *testing.T) {
	load := func() (*Service, gateRunner) {
		g := gateRunner{release: make(chan struct{})}
		s := NewService(Families{gateFamily{g}}, func(string) string { return "" })
		t.Cleanup(func() { s.Close() })
		if _, err := s.Load(context.Background(), tts.LoadConfig{MaxInflight: 1}); err != nil {
			t.Fatal(err)
		}
		return s, g
	}
	hold := func(s *Service, ctx context.Context) chan error {
		done := make(chan error, 1)
		go func() { done <- s.Synthesize(ctx, tts.Request{Text: "a"}, nil) }()
		for s.inflight.Load() != 1 {
			time.Sleep(time.Millisecond)
		}
		return done
	}

	s, g := load()
	ctx, cancel := context.WithCancel(context.Background())
	first := hold(s, ctx)
	cancel() // the router moved on; the request is still winding down
	second := make(chan error, 1)
	go func() { second <- s.Synthesize(context.Background(), tts.Request{Text: "b"}, nil) }()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v", err)
	}
	for s.inflight.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	if err := <-second; err != nil {
		t.Fatalf("the request behind the cancelled one: %v, want it served", err)
	}

	s, g = load()
	live := hold(s, context.Background())
	var ie *tts.Error
	if err := s.Synthesize(context.Background(), tts.Request{Text: "b"}, nil); !errors.As(err, &ie) || ie.Kind != tts.ErrBusy {
		t.Fatalf("every slot live: %v, want busy", err)
	}
	close(g.release)
	<-live
}
