//go:build !noffmpeg

package audio

// #include <stdlib.h>
// #include "decode.h"
import "C"

import (
	"fmt"
	"unsafe"
)

// decodeFFmpeg decodes any format FFmpeg reads, at most maxSeconds of it (0: no bound).
func decodeFFmpeg(data []byte, maxSeconds float64) ([]float32, int, error) {
	if len(data) == 0 {
		return nil, 0, fmt.Errorf("%w: the file is empty", ErrBadAudio)
	}
	quietLogs()
	// FFmpeg's callbacks read the file during the call; a copy in C memory keeps Go memory out
	// of the structures C holds.
	in := C.CBytes(data)
	defer C.free(in)
	var (
		out  *C.float
		n    C.int64_t
		rate C.int
		msg  [256]C.char
	)
	ret := C.vx_decode((*C.uint8_t)(in), C.int64_t(len(data)), C.double(maxSeconds), &out, &n, &rate, &msg[0], C.int(len(msg)))
	switch {
	case ret == C.VX_DECODE_TOO_LONG:
		return nil, 0, fmt.Errorf("%w: more than %g seconds", ErrTooLong, maxSeconds)
	case ret != 0:
		return nil, 0, fmt.Errorf("%w: %w", ErrBadAudio, cErr(msg[:]))
	}
	defer C.free(unsafe.Pointer(out))
	pcm := make([]float32, int(n))
	copy(pcm, unsafe.Slice((*float32)(unsafe.Pointer(out)), int(n)))
	for i, v := range pcm {
		pcm[i] = clamp(v) // float codecs may overshoot
	}
	return pcm, int(rate), nil
}
