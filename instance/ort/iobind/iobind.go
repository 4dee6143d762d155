// Package iobind runs ONNX Runtime sessions whose tensors stay where the session computes (on
// a CUDA device, or in host memory for the CPU provider), through I/O binding. onnxruntime_go
// creates tensors in CPU memory only and cannot bind an output to a device, so this small cgo
// layer over ONNX Runtime's C API keeps the LM's key/value cache on the GPU between steps.
//
// The same code runs with the CPU provider, which is how it is tested without a GPU.
package iobind

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -ldl
#include "iobind.h"
#include <stdlib.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"unsafe"
)

// Elem is a tensor element type (ONNX's numbering).
type Elem int

// Element types used by the pipeline.
const (
	Float32 Elem = 1
	Int32   Elem = 6
	Int64   Elem = 7
	Float16 Elem = 10
)

// Size is the element's size in bytes.
func (e Elem) Size() int {
	switch e {
	case Float16:
		return 2
	case Float32, Int32:
		return 4
	case Int64:
		return 8
	}
	return 0
}

var initMu sync.Mutex

func cerr(e *C.char) error {
	if e == nil {
		return nil
	}
	defer C.free(unsafe.Pointer(e))
	return errors.New(C.GoString(e))
}

// Init binds the ONNX Runtime library at path (normally already loaded by onnxruntime_go, whose
// environment this shares).
func Init(path string) error {
	initMu.Lock()
	defer initMu.Unlock()
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	if err := cerr(C.vx_init(p)); err != nil {
		return fmt.Errorf("iobind: %w", err)
	}
	return nil
}

// Placement says where a session computes.
type Placement struct {
	CUDA            bool
	Device          int
	ProviderOptions map[string]string // CUDA provider options (device_id is set from Device)
	// HighPriority runs the session's kernels on a stream of the GPU's highest priority, ahead
	// of work other sessions have queued (the LM's short steps beside long flow batches).
	HighPriority bool
	// Profile, when set, is the path prefix of ONNX Runtime's profile of this session, written
	// when the session is closed.
	Profile string
	// CUDAGraph lets runs with a graph ID (RunGraph) capture their kernels once as a CUDA graph
	// and replay it (ONNX Runtime's enable_cuda_graph). Ignored on the CPU.
	CUDAGraph bool
}

// Session is one model with its I/O binding. Not safe for concurrent use.
type Session struct {
	s     *C.OrtSession
	mem   *C.OrtMemoryInfo
	alloc *C.OrtAllocator
	b     *C.OrtIoBinding
	place Placement
	// stream is the session's compute stream (CUDA only), which its runs wait for.
	stream unsafe.Pointer
}

// Open loads a model.
func Open(model string, p Placement) (*Session, error) { return open(model, nil, p) }

// OpenData loads a model held in memory (one a model family edited after reading it); name
// stands for it in errors.
func OpenData(name string, model []byte, p Placement) (*Session, error) {
	if len(model) == 0 {
		return nil, fmt.Errorf("%s: no model", name)
	}
	return open(name, model, p)
}

// open loads the model in data, or with data nil, the file model.
func open(model string, data []byte, p Placement) (*Session, error) {
	opts := map[string]string{}
	for k, v := range p.ProviderOptions {
		opts[k] = v
	}
	opts["device_id"] = fmt.Sprint(p.Device)
	if p.CUDAGraph {
		opts["enable_cuda_graph"] = "1"
	}
	var keys, vals []*C.char
	for k, v := range opts {
		keys = append(keys, C.CString(k))
		vals = append(vals, C.CString(v))
	}
	defer func() {
		for i := range keys {
			C.free(unsafe.Pointer(keys[i]))
			C.free(unsafe.Pointer(vals[i]))
		}
	}()
	// The option arrays must not be Go memory holding C pointers when passed: copy to C.
	ck := (**C.char)(C.malloc(C.size_t(len(keys)+1) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	cv := (**C.char)(C.malloc(C.size_t(len(keys)+1) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cv))
	ks := unsafe.Slice(ck, len(keys)+1)
	vs := unsafe.Slice(cv, len(keys)+1)
	copy(ks, keys)
	copy(vs, vals)
	cm := C.CString(model)
	defer C.free(unsafe.Pointer(cm))
	cuda := C.int(0)
	if p.CUDA {
		cuda = 1
	}
	// Every CUDA session computes on a stream of its own, and a run waits for that stream alone
	// (vx_run): it is never held up by other sessions' work on the GPU.
	var stream unsafe.Pointer
	if p.CUDA {
		prio := C.int(0)
		if p.HighPriority {
			prio = 1
		}
		if err := cerr(C.vx_stream(C.int(p.Device), prio, &stream)); err != nil {
			return nil, fmt.Errorf("%s: %w", model, err)
		}
	}
	s := &Session{place: p, stream: stream}
	var prof *C.char
	if p.Profile != "" {
		prof = C.CString(p.Profile)
		defer C.free(unsafe.Pointer(prof))
	}
	var cdata unsafe.Pointer
	if data != nil {
		cdata = unsafe.Pointer(&data[0]) // read during the call only: no Go pointer is kept
	}
	err := cerr(C.vx_session(cm, cdata, C.size_t(len(data)), cuda, C.int(p.Device), stream, prof, ck, cv, C.int(len(keys)), &s.s, &s.mem, &s.alloc, &s.b))
	if err != nil {
		C.vx_session_free(s.s, s.mem, s.alloc, s.b)
		C.vx_stream_free(stream)
		return nil, fmt.Errorf("%s: %w", model, err)
	}
	return s, nil
}

// Placement is where the session computes.
func (s *Session) Placement() Placement { return s.place }

// Close releases the session.
func (s *Session) Close() {
	C.vx_session_free(s.s, s.mem, s.alloc, s.b)
	C.vx_stream_free(s.stream)
	s.s, s.mem, s.alloc, s.b, s.stream = nil, nil, nil, nil, nil
}

// Tensor is an ONNX Runtime value, on the session's device or in host memory.
type Tensor struct {
	v     *C.OrtValue
	data  unsafe.Pointer
	Shape []int64
	Elem  Elem
	// Device is set for tensors in the device memory of a CUDA session.
	Device bool
	place  Placement
}

// Bytes is the tensor's size in bytes.
func (t *Tensor) Bytes() int64 {
	n := int64(t.Elem.Size())
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Release frees the tensor.
func (t *Tensor) Release() {
	if t != nil && t.v != nil {
		C.vx_release(t.v)
		t.v = nil
	}
}

func shapePtr(shape []int64) (*C.int64_t, func()) {
	n := max(len(shape), 1)
	p := (*C.int64_t)(C.malloc(C.size_t(n * 8)))
	copy(unsafe.Slice((*int64)(unsafe.Pointer(p)), n), shape)
	return p, func() { C.free(unsafe.Pointer(p)) }
}

// Alloc makes a zeroed tensor in the session's memory (the GPU for a CUDA session).
func (s *Session) Alloc(shape []int64, e Elem) (*Tensor, error) {
	t, err := s.AllocEmpty(shape, e)
	if err != nil {
		return nil, err
	}
	if err := Zero(t); err != nil {
		t.Release()
		return nil, err
	}
	return t, nil
}

// AllocEmpty is Alloc without the zeroing, for tensors a run writes whole.
func (s *Session) AllocEmpty(shape []int64, e Elem) (*Tensor, error) {
	sp, free := shapePtr(shape)
	defer free()
	t := &Tensor{Shape: append([]int64(nil), shape...), Elem: e, Device: s.place.CUDA, place: s.place}
	if err := cerr(C.vx_tensor(s.alloc, sp, C.size_t(len(shape)), C.int(e), &t.v, &t.data)); err != nil {
		return nil, fmt.Errorf("alloc %v: %w", shape, err)
	}
	return t, nil
}

// View is a tensor of the given shape over t's memory from byte off on; it does not own the
// memory, so t must outlive it. The LM's per-sequence slots of one shared cache are views.
func (s *Session) View(t *Tensor, off int64, shape []int64) (*Tensor, error) {
	v := &Tensor{Shape: append([]int64(nil), shape...), Elem: t.Elem, Device: t.Device, place: t.place}
	if off < 0 || off+v.Bytes() > t.Bytes() {
		return nil, fmt.Errorf("view %v at byte %d is outside a tensor of %d bytes", shape, off, t.Bytes())
	}
	sp, free := shapePtr(shape)
	defer free()
	v.data = unsafe.Add(t.data, off)
	mem := s.mem
	if !t.Device {
		mem = nil // host memory: vx_view gets the CPU's memory info
	}
	if err := cerr(C.vx_view(mem, v.data, C.size_t(v.Bytes()), sp, C.size_t(len(shape)), C.int(t.Elem), &v.v)); err != nil {
		return nil, fmt.Errorf("view %v: %w", shape, err)
	}
	return v, nil
}

// Host makes a tensor in host memory holding a copy of data ([]int64, []int32 or []float32).
func Host(shape []int64, data any) (*Tensor, error) {
	src, n, e := hostData(data)
	if e == 0 {
		return nil, fmt.Errorf("host tensor of %T", data)
	}
	sp, free := shapePtr(shape)
	defer free()
	t := &Tensor{Shape: append([]int64(nil), shape...), Elem: e}
	if t.Bytes() != int64(n*e.Size()) {
		return nil, fmt.Errorf("host tensor %v needs %d values, got %d", shape, t.Bytes()/int64(e.Size()), n)
	}
	if err := cerr(C.vx_host_tensor(sp, C.size_t(len(shape)), C.int(e), &t.v, &t.data)); err != nil {
		return nil, fmt.Errorf("host tensor %v: %w", shape, err)
	}
	if n > 0 {
		C.memcpy(t.data, src, C.size_t(t.Bytes()))
	}
	runtime.KeepAlive(data)
	return t, nil
}

// Float32s copies a host float32 tensor out.
func (t *Tensor) Float32s() ([]float32, error) {
	if t.Device || t.Elem != Float32 {
		return nil, fmt.Errorf("tensor %v (elem %d, device %v) is not a host float32 tensor", t.Shape, t.Elem, t.Device)
	}
	out := make([]float32, t.Bytes()/4)
	if len(out) > 0 {
		copy(out, unsafe.Slice((*float32)(t.data), len(out)))
	}
	return out, nil
}

// Output asks Run for an output, on the session's device or in host memory, or written in place
// into Into.
type Output struct {
	Name string
	Host bool
	Into *Tensor
}

// Run binds inputs (by name) and outputs, runs, and returns the outputs in order. Input tensors
// stay owned by the caller; outputs are new tensors the caller releases.
func (s *Session) Run(inputs map[string]*Tensor, outputs []Output) ([]*Tensor, error) {
	return s.run(inputs, outputs, nil)
}

// NoGraph is the graph ID of a run that neither captures nor replays a CUDA graph.
const NoGraph = -1

// RunGraph is Run as CUDA graph id (1 and up; NoGraph for none) in a session opened with
// CUDAGraph: the first runs with an ID capture the kernels they launch, later ones replay them
// without ONNX Runtime. A replay reads and writes the memory the capturing run was bound to, so
// every run with one ID must bind the same tensors (same addresses, same shapes), every output
// into a tensor of its own (Output.Into), with new contents copied into the inputs beforehand
// (Upload). On the CPU the ID is ignored.
func (s *Session) RunGraph(inputs map[string]*Tensor, outputs []Output, id int) ([]*Tensor, error) {
	g := C.CString(fmt.Sprint(id))
	defer C.free(unsafe.Pointer(g))
	return s.run(inputs, outputs, g)
}

func (s *Session) run(inputs map[string]*Tensor, outputs []Output, graph *C.char) ([]*Tensor, error) {
	defer C.vx_clear(s.b)
	if err := s.bindAll(s.b, inputs, outputs); err != nil {
		return nil, err
	}
	var vals **C.OrtValue
	var n C.size_t
	if err := cerr(C.vx_run(s.s, s.b, graph, s.stream, &vals, &n)); err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(vals))
	vs := unsafe.Slice(vals, int(n))
	out := make([]*Tensor, len(vs))
	for i, v := range vs {
		t := &Tensor{v: v, place: s.place}
		var shape [8]C.int64_t
		rank := C.size_t(len(shape))
		var elem C.int
		if err := cerr(C.vx_info(v, &t.data, &shape[0], &rank, &elem)); err != nil {
			for _, o := range vs {
				C.vx_release(o)
			}
			return nil, fmt.Errorf("output %d: %w", i, err)
		}
		for _, d := range shape[:rank] {
			t.Shape = append(t.Shape, int64(d))
		}
		t.Elem = Elem(elem)
		t.Device = s.place.CUDA && !outputs[i].Host
		if into := outputs[i].Into; into != nil {
			t.Device = into.Device
		}
		out[i] = t
	}
	if len(out) != len(outputs) {
		for _, t := range out {
			t.Release()
		}
		return nil, fmt.Errorf("run returned %d outputs, want %d", len(out), len(outputs))
	}
	return out, nil
}

// bindAll binds inputs (by name) and outputs to b: each output into its Into tensor, to host
// memory, or to the session's memory.
func (s *Session) bindAll(b *C.OrtIoBinding, inputs map[string]*Tensor, outputs []Output) error {
	for name, t := range inputs {
		cn := C.CString(name)
		err := cerr(C.vx_bind_input(b, cn, t.v))
		C.free(unsafe.Pointer(cn))
		if err != nil {
			return fmt.Errorf("bind input %w", err)
		}
	}
	for _, o := range outputs {
		cn := C.CString(o.Name)
		var err error
		switch {
		case o.Into != nil:
			err = cerr(C.vx_bind_output_value(b, cn, o.Into.v))
		case o.Host:
			err = cerr(C.vx_bind_output_host(b, cn))
		default:
			err = cerr(C.vx_bind_output_to(b, cn, s.mem))
		}
		C.free(unsafe.Pointer(cn))
		if err != nil {
			return fmt.Errorf("bind output %w", err)
		}
	}
	return nil
}

// Copy2D copies height rows of width bytes from src (starting at byte srcOff, rows srcPitch
// apart) to dst (dstOff, dstPitch). Both tensors are in the same memory.
func Copy2D(dst *Tensor, dstOff, dstPitch int64, src *Tensor, srcOff, srcPitch, width, height int64) error {
	return Copies([]Copy{{dst, dstOff, dstPitch, src, srcOff, srcPitch, width, height}})
}

// Copy is one Copy2D.
type Copy struct {
	Dst              *Tensor
	DstOff, DstPitch int64
	Src              *Tensor
	SrcOff, SrcPitch int64
	Width, Height    int64
}

// Copies runs the copies in order and waits once for all of them (on a CUDA device each wait
// is a round trip, and the LM's cache moves are dozens of small copies).
func Copies(cs []Copy) error {
	var devices []int
	for _, c := range cs {
		if err := checkCopy(c); err != nil {
			return err
		}
		if c.Width == 0 || c.Height == 0 {
			continue
		}
		cuda := C.int(0)
		if c.Dst.Device {
			cuda = 1
			if !slices.Contains(devices, c.Dst.place.Device) {
				devices = append(devices, c.Dst.place.Device)
			}
		}
		err := cerr(C.vx_copy2d(cuda, C.int(c.Dst.place.Device), unsafe.Add(c.Dst.data, c.DstOff), C.size_t(c.DstPitch),
			unsafe.Add(c.Src.data, c.SrcOff), C.size_t(c.SrcPitch), C.size_t(c.Width), C.size_t(c.Height)))
		if err != nil {
			return err
		}
	}
	for _, d := range devices {
		if err := cerr(C.vx_sync(C.int(d))); err != nil {
			return err
		}
	}
	return nil
}

// checkCopy refuses a copy across memories or outside its tensors.
func checkCopy(c Copy) error {
	if c.Dst.Device != c.Src.Device {
		return errors.New("copy between device and host memory is not supported here")
	}
	if c.Width == 0 || c.Height == 0 {
		return nil
	}
	if c.DstOff < 0 || c.SrcOff < 0 || c.DstOff+c.DstPitch*(c.Height-1)+c.Width > c.Dst.Bytes() || c.SrcOff+c.SrcPitch*(c.Height-1)+c.Width > c.Src.Bytes() {
		return fmt.Errorf("copy out of bounds (dst %d bytes, src %d bytes)", c.Dst.Bytes(), c.Src.Bytes())
	}
	return nil
}

// Zero clears a tensor.
func Zero(t *Tensor) error {
	cuda := C.int(0)
	if t.Device {
		cuda = 1
	}
	return cerr(C.vx_zero(cuda, C.int(t.place.Device), t.data, C.size_t(t.Bytes())))
}

// MemInfo is device's free and total memory as CUDA reports them (cudaMemGetInfo).
func MemInfo(device int) (free, total uint64, err error) {
	var f, t C.size_t
	if err := cerr(C.vx_mem_info(C.int(device), &f, &t)); err != nil {
		return 0, 0, err
	}
	return uint64(f), uint64(t), nil
}

// Upload copies data ([]int64, []int32 or []float32, exactly t's size) into t, on the device or
// in host memory, and waits for the copy.
func Upload(t *Tensor, data any) error {
	src, n, e := hostData(data)
	if e != t.Elem || int64(n*e.Size()) != t.Bytes() {
		return fmt.Errorf("upload of %d values of type %d into a tensor %v of type %d", n, e, t.Shape, t.Elem)
	}
	return across(t, t.data, src, t.Bytes(), data)
}

// Download copies t (float32) into dst, which holds exactly t's values, and waits for the copy.
func Download(dst []float32, t *Tensor) error {
	if t.Elem != Float32 || int64(len(dst)*4) != t.Bytes() {
		return fmt.Errorf("download of a tensor %v of type %d into %d float32 values", t.Shape, t.Elem, len(dst))
	}
	if len(dst) == 0 {
		return nil
	}
	return across(t, unsafe.Pointer(&dst[0]), t.data, t.Bytes(), dst)
}

// across copies bytes between Go memory (keep) and t's memory, through C memory so that no
// copy engine ever holds a Go pointer.
func across(t *Tensor, dst, src unsafe.Pointer, bytes int64, keep any) error {
	defer runtime.KeepAlive(keep)
	if bytes == 0 {
		return nil
	}
	if !t.Device {
		C.memcpy(dst, src, C.size_t(bytes))
		return nil
	}
	stage := C.malloc(C.size_t(bytes))
	defer C.free(stage)
	if dst == t.data { // upload
		C.memcpy(stage, src, C.size_t(bytes))
		return cerr(C.vx_copy_across(C.int(t.place.Device), dst, stage, C.size_t(bytes)))
	}
	if err := cerr(C.vx_copy_across(C.int(t.place.Device), stage, src, C.size_t(bytes))); err != nil {
		return err
	}
	C.memcpy(dst, stage, C.size_t(bytes))
	return nil
}

// hostData is data's first element, length and element type.
func hostData(data any) (unsafe.Pointer, int, Elem) {
	switch d := data.(type) {
	case []int64:
		if len(d) > 0 {
			return unsafe.Pointer(&d[0]), len(d), Int64
		}
		return nil, 0, Int64
	case []int32:
		if len(d) > 0 {
			return unsafe.Pointer(&d[0]), len(d), Int32
		}
		return nil, 0, Int32
	case []float32:
		if len(d) > 0 {
			return unsafe.Pointer(&d[0]), len(d), Float32
		}
		return nil, 0, Float32
	}
	return nil, 0, 0
}
