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

// CopiesOn queues the copies (device to device, or host to host with the CPU provider) on s's
// stream, after the runs and copies queued there before it, and does not wait for them (Wait
// does). With the CPU provider they copy at once.
func (s *Session) CopiesOn(cs []Copy) error {
	for _, c := range cs {
		if err := checkCopy(c); err != nil {
			return err
		}
		if c.Width == 0 || c.Height == 0 {
			continue
		}
		dst, src := unsafe.Add(c.Dst.data, c.DstOff), unsafe.Add(c.Src.data, c.SrcOff)
		var err error
		if c.Dst.Device {
			err = cerr(C.vx_copy2d_on(C.int(s.place.Device), s.stream, dst, C.size_t(c.DstPitch), src, C.size_t(c.SrcPitch), C.size_t(c.Width), C.size_t(c.Height)))
		} else {
			err = cerr(C.vx_copy2d(0, 0, dst, C.size_t(c.DstPitch), src, C.size_t(c.SrcPitch), C.size_t(c.Width), C.size_t(c.Height)))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ZeroOn queues clearing t on s's stream (see CopiesOn).
func (s *Session) ZeroOn(t *Tensor) error {
	if !t.Device {
		return Zero(t)
	}
	return cerr(C.vx_zero_on(C.int(s.place.Device), s.stream, t.data, C.size_t(t.Bytes())))
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
	return s.bind(inputs, outputs, id, false)
}

// BindQueued is Bind (NoGraph) for runs that only queue their kernels on the session's stream:
// Run returns without waiting for the GPU, and work queued on the stream afterwards (CopiesOn,
// Receive) runs after it. The caller waits (Wait) before reading an output on the host or
// releasing a tensor the queued work uses. With the CPU provider a run computes before it returns.
func (s *Session) BindQueued(inputs map[string]*Tensor, outputs []Output) (*Bound, error) {
	return s.bind(inputs, outputs, NoGraph, true)
}

func (s *Session) bind(inputs map[string]*Tensor, outputs []Output, id int, queued bool) (*Bound, error) {
	for _, o := range outputs {
		if o.Into == nil {
			return nil, fmt.Errorf("bound output %s has no tensor to be written into", o.Name)
		}
	}
	g := C.CString(fmt.Sprint(id))
	defer C.free(unsafe.Pointer(g))
	b := &Bound{s: s}
	q := C.int(0)
	if queued {
		q = 1
	}
	err := cerr(C.vx_binding(s.s, g, q, &b.b, &b.ro))
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
