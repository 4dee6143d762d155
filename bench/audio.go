package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// audioCounter measures streamed audio as it arrives: raw 16-bit mono PCM at a known rate, or a
// WAV stream whose header (possibly with the streaming size 0xFFFFFFFF) says the format.
type audioCounter struct {
	wav        bool
	header     []byte // wav bytes buffered until the data chunk starts
	inData     bool
	rate       int
	frameBytes int // bytes per sample frame (all channels)
	bytes      int // audio payload bytes so far
}

// maxWAVHeader bounds how much a WAV stream may send before its data chunk.
const maxWAVHeader = 64 << 10

func newAudioCounter(format string, rate int) *audioCounter {
	return &audioCounter{wav: format == "wav", rate: rate, frameBytes: 2}
}

func (a *audioCounter) feed(p []byte) error {
	if !a.wav || a.inData {
		a.bytes += len(p)
		return nil
	}
	a.header = append(a.header, p...)
	start, err := a.parseHeader()
	if err != nil {
		return err
	}
	if start < 0 {
		if len(a.header) > maxWAVHeader {
			return fmt.Errorf("no WAV data chunk in the first %d bytes", maxWAVHeader)
		}
		return nil
	}
	a.inData = true
	a.bytes += len(a.header) - start
	a.header = nil
	return nil
}

var errNotWAV = errors.New("response is not a RIFF/WAVE stream")

// parseHeader walks the RIFF chunks buffered so far; it returns the offset where audio data
// starts, or -1 when more bytes are needed.
func (a *audioCounter) parseHeader() (int, error) {
	h := a.header
	if len(h) < 12 {
		return -1, nil
	}
	if string(h[0:4]) != "RIFF" || string(h[8:12]) != "WAVE" {
		return 0, errNotWAV
	}
	off := 12
	sawFmt := false
	for {
		if len(h) < off+8 {
			return -1, nil
		}
		id := string(h[off : off+4])
		size := binary.LittleEndian.Uint32(h[off+4 : off+8])
		body := off + 8
		switch id {
		case "data":
			if !sawFmt {
				return 0, errors.New("WAV data chunk before its fmt chunk")
			}
			return body, nil
		case "fmt ":
			if len(h) < body+16 {
				return -1, nil
			}
			channels := int(binary.LittleEndian.Uint16(h[body+2:]))
			rate := int(binary.LittleEndian.Uint32(h[body+4:]))
			bits := int(binary.LittleEndian.Uint16(h[body+14:]))
			if channels < 1 || rate < 1 || bits < 8 || bits%8 != 0 {
				return 0, fmt.Errorf("WAV format: %d channels, %d Hz, %d bits", channels, rate, bits)
			}
			a.rate, a.frameBytes, sawFmt = rate, channels*bits/8, true
		}
		// Chunks are padded to an even size.
		off = body + int(size) + int(size&1)
		if off > maxWAVHeader {
			return 0, fmt.Errorf("no WAV data chunk in the first %d bytes", maxWAVHeader)
		}
	}
}

// seconds is the duration of the audio received so far.
func (a *audioCounter) seconds() float64 {
	return float64(a.bytes/a.frameBytes) / float64(a.rate)
}
