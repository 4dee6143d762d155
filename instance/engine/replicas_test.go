package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// fakeReplica stands for one GPU's engine.
type fakeReplica struct {
	mu    sync.Mutex
	calls int
	hold  chan struct{} // Synthesize waits on it when set
}

func (f *fakeReplica) Synthesize(context.Context, tts.Request, func(tts.Chunk) error) error {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	if f.hold != nil {
		<-f.hold
	}
	return nil
}
func (f *fakeReplica) Stats() []tts.StageStats { return nil }
func (f *fakeReplica) Close() error            { return nil }

// Requests go to the least loaded engine.
func TestReplicasLeastLoaded(t *testing.T) {
	a, b := &fakeReplica{hold: make(chan struct{})}, &fakeReplica{}
	r := NewReplicas([]*fakeReplica{a, b})
	done := make(chan struct{})
	go func() { r.Synthesize(context.Background(), tts.Request{}, nil); close(done) }()
	for {
		a.mu.Lock()
		n := a.calls
		a.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	r.Synthesize(context.Background(), tts.Request{}, nil)
	if b.calls != 1 {
		t.Errorf("engine b took %d requests while a was busy, want 1", b.calls)
	}
	close(a.hold)
	<-done
}
