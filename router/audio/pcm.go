// Package audio turns the float PCM an instance produces into the bytes clients ask for.
package audio

import (
	"encoding/binary"
	"math"
)

// PCM16 appends samples as signed 16-bit little-endian, clipping to [-1, 1].
func PCM16(dst []byte, pcm []float32) []byte {
	for _, v := range pcm {
		f := math.Max(-1, math.Min(1, float64(v)))
		s := int16(math.Round(f * 32767))
		dst = binary.LittleEndian.AppendUint16(dst, uint16(s))
	}
	return dst
}

// StreamingSize is the RIFF and data size written when the length is not known yet; readers
// then take the data as running to the end of the file.
const StreamingSize = 0xFFFFFFFF

// WAVHeader is the 44-byte header of a mono 16-bit PCM WAV file. dataBytes may be StreamingSize
// for a stream whose length is unknown when the header leaves.
func WAVHeader(sampleRate int, dataBytes uint32) []byte {
	riff := dataBytes
	if dataBytes != StreamingSize {
		riff = 36 + dataBytes
	}
	h := make([]byte, 0, 44)
	h = append(h, "RIFF"...)
	h = binary.LittleEndian.AppendUint32(h, riff)
	h = append(h, "WAVEfmt "...)
	h = binary.LittleEndian.AppendUint32(h, 16) // fmt chunk size
	h = binary.LittleEndian.AppendUint16(h, 1)  // PCM
	h = binary.LittleEndian.AppendUint16(h, 1)  // mono
	h = binary.LittleEndian.AppendUint32(h, uint32(sampleRate))
	h = binary.LittleEndian.AppendUint32(h, uint32(sampleRate*2)) // byte rate
	h = binary.LittleEndian.AppendUint16(h, 2)                    // block align
	h = binary.LittleEndian.AppendUint16(h, 16)                   // bits per sample
	h = append(h, "data"...)
	return binary.LittleEndian.AppendUint32(h, dataBytes)
}
