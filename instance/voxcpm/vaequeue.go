package voxcpm

import "sync"

// vaeQueue runs the VAE decoder's work (runner.prime, decode, moveStates) in the order the
// scheduler queues it, on a goroutine of its own, so that patch i's decode runs while the
// scheduler prefills and steps patch i+1 (different sessions, caches and states). Done in order,
// the work leaves the states exactly as it does run in line: a prime or a move of states queued
// after a decode waits for it, and the states never move under one. A nil queue runs the work in
// line.
type vaeQueue struct {
	mu      sync.Mutex
	wake    *sync.Cond
	work    []func()
	closing bool
	done    chan struct{}
}

func newVAEQueue() *vaeQueue {
	q := &vaeQueue{done: make(chan struct{})}
	q.wake = sync.NewCond(&q.mu)
	go q.run()
	return q
}

func (q *vaeQueue) run() {
	defer close(q.done)
	for {
		q.mu.Lock()
		for len(q.work) == 0 && !q.closing {
			q.wake.Wait()
		}
		if len(q.work) == 0 {
			q.mu.Unlock()
			return
		}
		f := q.work[0]
		q.work[0] = nil
		q.work = q.work[1:]
		q.mu.Unlock()
		f()
	}
}

// do queues f; the scheduler never waits for the queue here, only for a decode (scheduler.step).
func (q *vaeQueue) do(f func()) {
	if q == nil {
		f()
		return
	}
	q.mu.Lock()
	q.work = append(q.work, f)
	q.mu.Unlock()
	q.wake.Signal()
}

// close runs the work queued so far and stops the goroutine.
func (q *vaeQueue) close() {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.closing = true
	q.mu.Unlock()
	q.wake.Signal()
	<-q.done
}
