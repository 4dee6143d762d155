package ort

import goruntime "runtime"

// Thread runs functions on one locked OS thread; a nil Thread runs them on the caller's.
type Thread struct{ calls chan func() }

func NewThread() *Thread {
	t := &Thread{calls: make(chan func())}
	go func() {
		goruntime.LockOSThread() // for good: the thread ends with the goroutine
		for f := range t.calls {
			f()
		}
	}()
	return t
}

func (t *Thread) Do(f func() error) error {
	if t == nil {
		return f()
	}
	var err error
	done := make(chan struct{})
	t.calls <- func() { err = f(); close(done) }
	<-done
	return err
}

func (t *Thread) Close() {
	if t != nil {
		close(t.calls)
	}
}
