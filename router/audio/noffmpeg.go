//go:build noffmpeg

package audio

import (
	"errors"
	"io"
)

// Built with -tags noffmpeg (for hosts without FFmpeg's shared libraries, such as a GPU host that
// only serves wav and pcm): the compressed formats, resampling and speed changes say so instead.
var errNoFFmpeg = errors.New("this voxmux was built without FFmpeg (-tags noffmpeg): only wav and pcm at the model's rate, speed 1")

func newCodecEncoder(format, int, io.Writer) (Encoder, error) { return nil, errNoFFmpeg }
func newSWR(int, int) (Stage, error)                          { return nil, errNoFFmpeg }
func newGraph(int, string) (Stage, error)                     { return nil, errNoFFmpeg }
func tempoFilters(float64) string                             { return "" }
