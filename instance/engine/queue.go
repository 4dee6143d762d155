package engine

import "sync"

// Queue is an unbounded FIFO whose consumer takes everything waiting at once (one batch).
type Queue[T any] struct {
	mu     sync.Mutex
	items  []T
	closed bool
	ready  chan struct{}
}

// NewQueue makes an empty queue.
func NewQueue[T any]() *Queue[T] { return &Queue[T]{ready: make(chan struct{}, 1)} }

// Ready is signalled whenever items arrive or the queue closes.
func (q *Queue[T]) Ready() <-chan struct{} { return q.ready }

// Push adds v at the tail.
func (q *Queue[T]) Push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// Close wakes the consumer, whose next pop reports the queue closed.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// PushFront puts items back at the head of the queue, in order.
func (q *Queue[T]) PushFront(items []T) {
	if len(items) == 0 {
		return
	}
	q.mu.Lock()
	q.items = append(append([]T(nil), items...), q.items...)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// TryPopAll returns whatever is waiting, without blocking; false once closed.
func (q *Queue[T]) TryPopAll() ([]T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, false
	}
	out := q.items
	q.items = nil
	return out, true
}

// PopAll blocks until items are waiting and returns all of them; false once closed.
func (q *Queue[T]) PopAll() ([]T, bool) {
	for {
		if out, ok := q.TryPopAll(); !ok || len(out) > 0 {
			return out, ok
		}
		<-q.ready
	}
}
