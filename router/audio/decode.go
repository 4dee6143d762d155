package audio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Errors of Decode: ErrUnsupported is a file this build cannot read (not WAV, without FFmpeg);
// ErrBadAudio wraps a file that is not audio it can read.
var (
	ErrUnsupported = errors.New("this voxmux was built without FFmpeg (-tags noffmpeg): only WAV uploads are read")
	ErrBadAudio    = errors.New("not a readable audio file")
	ErrTooLong     = errors.New("the audio is too long")
)

// Decode reads an audio file from memory as mono float32 in [-1, 1] at its own sample rate
// (channels are averaged). WAV (PCM 8/16/24/32-bit, float 32/64-bit) is read in Go; other formats
// (mp3, flac, ogg, opus, ...) through FFmpeg's libraries, when the build has them. Audio longer
// than maxSeconds (0: no bound) is ErrTooLong, found without decoding all of it: a small
// compressed file may hold hours.
func Decode(data []byte, maxSeconds float64) (pcm []float32, rate int, err error) {
	if len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WAVE" {
		pcm, rate, err = decodeWAV(data)
		if err == nil && maxSeconds > 0 && float64(len(pcm)) > maxSeconds*float64(rate) {
			return nil, 0, fmt.Errorf("%w: more than %g seconds", ErrTooLong, maxSeconds)
		}
		return pcm, rate, err
	}
	return decodeFFmpeg(data, maxSeconds)
}

// clamp bounds a sample to [-1, 1]; NaN becomes silence.
func clamp(v float32) float32 {
	if v != v {
		return 0
	}
	return max(-1, min(1, v))
}

// WAV format codes.
const (
	wavPCM        = 1
	wavFloat      = 3
	wavExtensible = 0xFFFE
)

func decodeWAV(data []byte) ([]float32, int, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: WAV: %s", ErrBadAudio, fmt.Sprintf(format, a...))
	}
	var (
		format, channels, bits int
		rate                   int
		body                   []byte
		haveFmt, haveData      bool
	)
	for p := 12; p+8 <= len(data); {
		id, size := string(data[p:p+4]), int(binary.LittleEndian.Uint32(data[p+4:]))
		p += 8
		end := p + size
		if size < 0 || end > len(data) || end < p {
			if id != "data" {
				return nil, 0, bad("chunk %q runs past the end of the file", id)
			}
			end = len(data) // a streamed WAV's data size is often left unset (0xFFFFFFFF)
		}
		switch id {
		case "fmt ":
			if size < 16 {
				return nil, 0, bad("fmt chunk has %d bytes", size)
			}
			c := data[p:end]
			format = int(binary.LittleEndian.Uint16(c))
			channels = int(binary.LittleEndian.Uint16(c[2:]))
			rate = int(binary.LittleEndian.Uint32(c[4:]))
			bits = int(binary.LittleEndian.Uint16(c[14:]))
			if format == wavExtensible && size >= 26 {
				format = int(binary.LittleEndian.Uint16(c[24:])) // the subformat GUID's first two bytes
			}
			haveFmt = true
		case "data":
			body, haveData = data[p:end], true
		}
		p = end + end&1 // chunks are padded to even sizes
		if haveFmt && haveData {
			break
		}
	}
	switch {
	case !haveFmt:
		return nil, 0, bad("no fmt chunk")
	case !haveData:
		return nil, 0, bad("no data chunk")
	case channels < 1 || channels > 64:
		return nil, 0, bad("%d channels", channels)
	case rate < 1000 || rate > 768000:
		return nil, 0, bad("sample rate %d Hz", rate)
	}
	var sample func([]byte) float64
	switch {
	case format == wavPCM && bits == 8:
		sample = func(b []byte) float64 { return (float64(b[0]) - 128) / 128 }
	case format == wavPCM && bits == 16:
		sample = func(b []byte) float64 { return float64(int16(binary.LittleEndian.Uint16(b))) / (1 << 15) }
	case format == wavPCM && bits == 24:
		sample = func(b []byte) float64 {
			return float64(int32(uint32(b[0])<<8|uint32(b[1])<<16|uint32(b[2])<<24)>>8) / (1 << 23)
		}
	case format == wavPCM && bits == 32:
		sample = func(b []byte) float64 { return float64(int32(binary.LittleEndian.Uint32(b))) / (1 << 31) }
	case format == wavFloat && bits == 32:
		sample = func(b []byte) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(b))) }
	case format == wavFloat && bits == 64:
		sample = func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }
	default:
		return nil, 0, bad("format %d with %d bits per sample is not PCM 8/16/24/32-bit or float 32/64-bit", format, bits)
	}
	width := bits / 8
	frame := width * channels
	n := len(body) / frame
	if n == 0 {
		return nil, 0, bad("no audio")
	}
	pcm := make([]float32, n)
	for i := range pcm {
		var sum float64
		for c := range channels {
			sum += sample(body[i*frame+c*width:])
		}
		pcm[i] = clamp(float32(sum / float64(channels)))
	}
	return pcm, rate, nil
}
