//go:build !noffmpeg

package audio

// #cgo pkg-config: libavcodec libavformat libavfilter libswresample libavutil
// #cgo LDFLAGS: -lm
// #include <stdlib.h>
// #include <malloc.h>
// #include "ffmpeg.h"
import "C"

import (
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// quietLogs silences FFmpeg's own stderr logging once: every failure comes back as an error
// value, and stray unstructured lines would break the server's structured logs.
var quietLogs = sync.OnceFunc(func() { C.vx_quiet_logs() })

// avError renders an AVERROR code.
type avError struct {
	op   string
	code C.int
}

func (e avError) Error() string {
	return fmt.Sprintf("%s: ffmpeg error %d", e.op, int(e.code))
}

func cErr(buf []C.char) error { return errors.New(C.GoString(&buf[0])) }

func floatPtr(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}

// codecEncoder encodes with an FFmpeg encoder and muxer into w.
type codecEncoder struct {
	c       *C.vx_enc
	cleanup runtime.Cleanup
	w       io.Writer
	rs      Stage // to the codec's rate, or nil
	size    int   // samples per frame; 0: any
	pend    []float32
	err     error
}

// newCodecEncoder opens f's codec and muxer at rate (resampling first when the codec cannot take it).
func newCodecEncoder(f format, rate int, w io.Writer) (*codecEncoder, error) {
	quietLogs()
	codec, muxer := f.codec, f.muxer
	cc, cm, cco, cmo := C.CString(codec), C.CString(muxer), C.CString(f.codecopts), C.CString(f.muxopts)
	defer C.free(unsafe.Pointer(cc))
	defer C.free(unsafe.Pointer(cm))
	defer C.free(unsafe.Pointer(cco))
	defer C.free(unsafe.Pointer(cmo))
	out := int(C.vx_codec_rate(cc, C.int(rate)))
	if out < 0 {
		return nil, fmt.Errorf("encoder %s is not in this FFmpeg build", codec)
	}
	e := &codecEncoder{w: w}
	if out != rate {
		rs, err := NewResampler(rate, out)
		if err != nil {
			return nil, err
		}
		e.rs = rs
	}
	var msg [256]C.char
	e.c = C.vx_enc_open(cc, cm, C.int(out), C.int64_t(f.bitrate), cco, cmo, &msg[0], C.int(len(msg)))
	if e.c == nil {
		if e.rs != nil {
			e.rs.Close()
		}
		return nil, fmt.Errorf("%s in %s at %d Hz: %w", codec, muxer, out, cErr(msg[:]))
	}
	// A backstop for an encoder dropped without Close; Close and Abort free it themselves.
	e.cleanup = runtime.AddCleanup(e, func(c *C.vx_enc) { C.vx_enc_free(c) }, e.c)
	e.size = int(C.vx_enc_frame_size(e.c))
	if e.size > 0 {
		e.pend = make([]float32, 0, e.size)
	}
	// The container header leaves at once.
	if err := e.emit(); err != nil {
		e.Abort()
		return nil, err
	}
	return e, nil
}

// emit hands what the muxer wrote to w.
func (e *codecEncoder) emit() error {
	var n C.int
	p := C.vx_enc_out(e.c, &n)
	if n == 0 {
		return nil
	}
	b := C.GoBytes(unsafe.Pointer(p), n)
	C.vx_enc_take(e.c)
	if _, err := e.w.Write(b); err != nil {
		return fmt.Errorf("writing encoded audio: %w", err)
	}
	return nil
}

func (e *codecEncoder) Write(pcm []float32) error {
	if e.err != nil {
		return e.err
	}
	if e.c == nil {
		return errClosed
	}
	e.err = e.write(pcm)
	return e.err
}

func (e *codecEncoder) write(pcm []float32) error {
	if e.rs != nil {
		var err error
		if pcm, err = e.rs.Process(pcm); err != nil {
			return err
		}
	}
	return e.frames(pcm)
}

func (e *codecEncoder) frames(pcm []float32) error {
	// Whole frames go now; only the remainder of a frame waits for the next chunk.
	whole := pcm
	if e.size > 0 {
		if len(e.pend) > 0 {
			whole = append(e.pend, pcm...)
		}
		n := len(whole) / e.size * e.size
		rest := whole[n:]
		whole = whole[:n]
		defer func() { e.pend = append(e.pend[:0], rest...) }()
	}
	if len(whole) == 0 {
		return nil
	}
	if r := C.vx_enc_write(e.c, floatPtr(whole), C.int(len(whole))); r < 0 {
		return avError{"encoding", r}
	}
	return e.emit()
}

func (e *codecEncoder) Close() error {
	if e.c == nil {
		return nil
	}
	defer e.Abort()
	if e.err != nil {
		return e.err
	}
	if e.rs != nil {
		last, err := e.rs.Flush()
		if err != nil {
			return err
		}
		if err := e.frames(last); err != nil {
			return err
		}
	}
	tail := e.pend
	if r := C.vx_enc_finish(e.c, floatPtr(tail), C.int(len(tail))); r < 0 {
		return avError{"finishing the stream", r}
	}
	return e.emit()
}

func (e *codecEncoder) Abort() {
	if e.c == nil {
		return
	}
	e.cleanup.Stop()
	C.vx_enc_free(e.c)
	e.c = nil
	if e.rs != nil {
		e.rs.Close()
	}
}

// resampler converts mono float PCM between rates with libswresample.
type resampler struct {
	c       *C.vx_swr
	cleanup runtime.Cleanup
}

func newSWR(from, to int) (*resampler, error) {
	quietLogs()
	var msg [256]C.char
	c := C.vx_swr_open(C.int(from), C.int(to), &msg[0], C.int(len(msg)))
	if c == nil {
		return nil, fmt.Errorf("resampling %d to %d Hz: %w", from, to, cErr(msg[:]))
	}
	r := &resampler{c: c}
	r.cleanup = runtime.AddCleanup(r, func(c *C.vx_swr) { C.vx_swr_free(c) }, c)
	return r, nil
}

func (r *resampler) convert(in []float32) ([]float32, error) {
	if r.c == nil {
		return nil, errClosed
	}
	capacity := int(C.vx_swr_out_cap(r.c, C.int(len(in))))
	if capacity <= 0 {
		return nil, nil
	}
	out := make([]float32, capacity)
	n := C.vx_swr_convert(r.c, floatPtr(out), C.int(capacity), floatPtr(in), C.int(len(in)))
	if n < 0 {
		return nil, avError{"resampling", n}
	}
	return out[:n], nil
}

func (r *resampler) Process(pcm []float32) ([]float32, error) {
	if len(pcm) == 0 {
		return nil, nil
	}
	return r.convert(pcm)
}

func (r *resampler) Flush() ([]float32, error) {
	var all []float32
	for {
		out, err := r.convert(nil)
		if err != nil || len(out) == 0 {
			return all, err
		}
		all = append(all, out...)
	}
}

func (r *resampler) Close() {
	if r.c == nil {
		return
	}
	r.cleanup.Stop()
	C.vx_swr_free(r.c)
	r.c = nil
}

// graph runs mono float PCM through an FFmpeg filter chain.
type graph struct {
	c       *C.vx_graph
	cleanup runtime.Cleanup
	ended   bool
}

func newGraph(rate int, filters string) (*graph, error) {
	quietLogs()
	cf := C.CString(filters)
	defer C.free(unsafe.Pointer(cf))
	var msg [256]C.char
	c := C.vx_graph_open(C.int(rate), cf, &msg[0], C.int(len(msg)))
	if c == nil {
		return nil, fmt.Errorf("filters %q at %d Hz: %w", filters, rate, cErr(msg[:]))
	}
	g := &graph{c: c}
	g.cleanup = runtime.AddCleanup(g, func(c *C.vx_graph) { C.vx_graph_free(c) }, c)
	return g, nil
}

func (g *graph) push(in []float32, end bool) ([]float32, error) {
	if g.c == nil {
		return nil, errClosed
	}
	if g.ended {
		return nil, nil
	}
	g.ended = end
	var p *C.float
	if !end {
		if len(in) == 0 {
			return nil, nil
		}
		p = floatPtr(in)
	}
	if r := C.vx_graph_push(g.c, p, C.int(len(in))); r < 0 {
		return nil, avError{"filtering", r}
	}
	var n C.int
	o := C.vx_graph_out(g.c, &n)
	if n == 0 {
		return nil, nil
	}
	out := make([]float32, int(n))
	copy(out, unsafe.Slice((*float32)(unsafe.Pointer(o)), int(n)))
	C.vx_graph_take(g.c)
	return out, nil
}

func (g *graph) Process(pcm []float32) ([]float32, error) { return g.push(pcm, false) }
func (g *graph) Flush() ([]float32, error)                { return g.push(nil, true) }

func (g *graph) Close() {
	if g.c == nil {
		return
	}
	g.cleanup.Stop()
	C.vx_graph_free(g.c)
	g.c = nil
}

// cHeapInUse is the C heap's allocated bytes (glibc mallinfo2), for the leak test.
func cHeapInUse() int {
	return int(C.mallinfo2().uordblks)
}

// tempoFilters is the atempo chain for speed: one atempo keeps its best quality within 0.5–2,
// so a speed outside that splits into two equal steps.
func tempoFilters(speed float64) string {
	f := fmt.Sprintf("atempo=%.6f", speed)
	if speed < 0.5 || speed > 2 {
		s := math.Sqrt(speed)
		f = fmt.Sprintf("atempo=%.6f,atempo=%.6f", s, s)
	}
	return f + ",aformat=sample_fmts=flt:channel_layouts=mono"
}
