package iobind

/*
#include "iobind.h"
#include <stdlib.h>
#include <string.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Pinned is host memory that a CUDA session's stream copies to and from directly (page-locked),
// for the inputs and outputs of runs repeated many times a second: the LM's decode steps. A copy
// from Go's memory (Upload, Download) goes through C memory and, being pageable, through the
// driver's own buffer, and waits for a stream that every session's copies share. With the CPU
// provider it is ordinary C memory. Go code reads and writes it through the slices its methods
// return, which hold until Free.
type Pinned struct {
	p     unsafe.Pointer
	bytes int64
	cuda  bool
}

// NewPinned allocates bytes of host memory for copies to and from tensors placed as p.
func NewPinned(p Placement, bytes int64) (*Pinned, error) {
	h := &Pinned{bytes: bytes, cuda: p.CUDA}
	if !p.CUDA {
		h.p = C.calloc(C.size_t(max(bytes, 1)), 1)
		return h, nil
	}
	if err := cerr(C.vx_pinned(C.size_t(bytes), &h.p)); err != nil {
		return nil, fmt.Errorf("pinned host memory of %d bytes: %w", bytes, err)
	}
	C.memset(h.p, 0, C.size_t(max(bytes, 1)))
	return h, nil
}

// Free releases the memory; slices of it must no longer be used.
func (h *Pinned) Free() {
	if h == nil || h.p == nil {
		return
	}
	if h.cuda {
		C.vx_pinned_free(h.p)
	} else {
		C.free(h.p)
	}
	h.p = nil
}

// Int64s, Int32s and Float32s are the memory as values of that type.
func (h *Pinned) Int64s() []int64 { return unsafe.Slice((*int64)(h.p), h.bytes/8) }

func (h *Pinned) Int32s() []int32 { return unsafe.Slice((*int32)(h.p), h.bytes/4) }

func (h *Pinned) Float32s() []float32 { return unsafe.Slice((*float32)(h.p), h.bytes/4) }

// Send queues a copy of h into t (of h's size, in s's memory) on s's stream, ahead of s's next
// run, and does not wait for it. Receive queues a copy of t into h; Wait waits for both. With
// the CPU provider they copy at once.
func (s *Session) Send(t *Tensor, h *Pinned) error {
	return s.copyOn(t, t.data, h.p, h)
}

// Receive queues a copy of t into h on s's stream (see Send).
func (s *Session) Receive(h *Pinned, t *Tensor) error {
	return s.copyOn(t, h.p, t.data, h)
}

func (s *Session) copyOn(t *Tensor, dst, src unsafe.Pointer, h *Pinned) error {
	if t.Bytes() != h.bytes {
		return fmt.Errorf("copy between a tensor %v of %d bytes and %d bytes of host memory", t.Shape, t.Bytes(), h.bytes)
	}
	if !t.Device {
		C.memcpy(dst, src, C.size_t(h.bytes))
		return nil
	}
	return cerr(C.vx_copy_on(s.stream, dst, src, C.size_t(h.bytes)))
}

// Wait waits for every copy and run queued on s's stream.
func (s *Session) Wait() error {
	if s.stream == nil {
		return nil
	}
	return cerr(C.vx_wait(s.stream))
}

// Bound is a run whose inputs and outputs are bound once, for runs that read and write the same
// tensors every time: a CUDA graph's replays. Binding a run's names afresh each time cost the
// LM's decode step ~100 name lookups, and fetching its outputs back as many more calls; a Bound
// run does neither. Not safe for concurrent use.
type Bound struct {
	s  *Session
	b  *C.OrtIoBinding
	ro *C.OrtRunOptions
}

// Bind binds inputs (by name) and outputs, each of which must be written into a tensor of its
// own (Output.Into), for runs as CUDA graph id (NoGraph for none; see RunGraph).
func (s *Session) Bind(inputs map[string]*Tensor, outputs []Output, id int) (*Bound, error) {
	for _, o := range outputs {
		if o.Into == nil {
			return nil, fmt.Errorf("bound output %s has no tensor to be written into", o.Name)
		}
	}
	g := C.CString(fmt.Sprint(id))
	defer C.free(unsafe.Pointer(g))
	b := &Bound{s: s}
	err := cerr(C.vx_binding(s.s, g, &b.b, &b.ro))
	if err == nil {
		err = s.bindAll(b.b, inputs, outputs)
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Run runs the bound inputs into the bound outputs. A CUDA graph's replay has finished on the GPU
// when it returns (ONNX Runtime waits for the session's stream after a replay), as has any other
// run on the session's stream.
func (b *Bound) Run() error {
	return cerr(C.vx_run_bound(b.s.s, b.b, b.ro))
}

// Close releases the binding (not the tensors).
func (b *Bound) Close() {
	if b == nil {
		return
	}
	C.vx_binding_free(b.b, b.ro)
	b.b, b.ro = nil, nil
}
