package engine

import (
	"context"
	"sync"

	"github.com/voxmux/voxmux/tts"
)

// Output hands one request's audio from the loop that makes it to the goroutine that emits it:
// chunks pushed in order, then an end (with its error, if any); Ready is signalled after each.
// Safe for concurrent use; the zero value is ready.
type Output struct {
	mu     sync.Mutex
	out    []tts.Chunk
	closed bool
	err    error
	ready  chan struct{}
}

// Push adds c after the chunks pushed before.
func (o *Output) Push(c tts.Chunk) {
	o.mu.Lock()
	o.out = append(o.out, c)
	ready := o.readyLocked()
	o.mu.Unlock()
	wake(ready)
}

// Finish ends the output with err (nil: complete); only the first end counts.
func (o *Output) Finish(err error) {
	o.mu.Lock()
	if !o.closed {
		o.closed, o.err = true, err
	}
	ready := o.readyLocked()
	o.mu.Unlock()
	wake(ready)
}

// Take returns the chunks pushed since the last Take, whether the output has ended, and the
// error it ended with.
func (o *Output) Take() ([]tts.Chunk, bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.out
	o.out = nil
	return out, o.closed, o.err
}

// Drain emits the chunks pushed since the last Take or Drain, numbering them from *index on,
// and reports whether the output has ended. Its error is the first of: ctx's (checked before
// each chunk, so a request cancelled while several waited emits no more), emit's, and the
// error the output ended with.
func (o *Output) Drain(ctx context.Context, index *int, emit func(tts.Chunk) error) (bool, error) {
	chunks, closed, err := o.Take()
	for _, c := range chunks {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		c.Index = *index
		*index++
		if err := emit(c); err != nil {
			return false, err
		}
	}
	return closed, err
}

// Ended reports whether the output has ended, and with what error.
func (o *Output) Ended() (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.closed, o.err
}

// Ready is signalled whenever a chunk or the end arrives.
func (o *Output) Ready() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.readyLocked()
}

func (o *Output) readyLocked() chan struct{} {
	if o.ready == nil {
		o.ready = make(chan struct{}, 1)
	}
	return o.ready
}

func wake(ready chan struct{}) {
	select {
	case ready <- struct{}{}:
	default:
	}
}
