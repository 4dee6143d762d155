package audio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// wavFile builds a WAV file of the given format code, bits and channels from per-frame samples.
func wavFile(format, bits, channels, rate int, frames [][]float64, extensible bool) []byte {
	var data bytes.Buffer
	for _, fr := range frames {
		for _, v := range fr {
			switch {
			case format == wavFloat && bits == 32:
				binary.Write(&data, binary.LittleEndian, math.Float32bits(float32(v)))
			case format == wavFloat && bits == 64:
				binary.Write(&data, binary.LittleEndian, math.Float64bits(v))
			case bits == 8:
				data.WriteByte(byte(int(v*127) + 128))
			case bits == 16:
				binary.Write(&data, binary.LittleEndian, int16(v*32767))
			case bits == 24:
				x := int32(v * 8388607)
				data.Write([]byte{byte(x), byte(x >> 8), byte(x >> 16)})
			case bits == 32:
				binary.Write(&data, binary.LittleEndian, int32(v*2147483647))
			}
		}
	}
	var fmtChunk bytes.Buffer
	code := format
	if extensible {
		code = wavExtensible
	}
	binary.Write(&fmtChunk, binary.LittleEndian, []uint16{uint16(code), uint16(channels)})
	binary.Write(&fmtChunk, binary.LittleEndian, []uint32{uint32(rate), uint32(rate * channels * bits / 8)})
	binary.Write(&fmtChunk, binary.LittleEndian, []uint16{uint16(channels * bits / 8), uint16(bits)})
	if extensible {
		binary.Write(&fmtChunk, binary.LittleEndian, []uint16{22, uint16(bits)})
		binary.Write(&fmtChunk, binary.LittleEndian, uint32(0))
		binary.Write(&fmtChunk, binary.LittleEndian, uint16(format))
		fmtChunk.Write(make([]byte, 14))
	}
	var f bytes.Buffer
	f.WriteString("RIFF")
	binary.Write(&f, binary.LittleEndian, uint32(4+8+fmtChunk.Len()+8+3+8+data.Len()))
	f.WriteString("WAVE")
	f.WriteString("fmt ")
	binary.Write(&f, binary.LittleEndian, uint32(fmtChunk.Len()))
	f.Write(fmtChunk.Bytes())
	f.WriteString("LIST") // a chunk to skip, of odd size (padded)
	binary.Write(&f, binary.LittleEndian, uint32(3))
	f.Write([]byte{1, 2, 3, 0})
	f.WriteString("data")
	binary.Write(&f, binary.LittleEndian, uint32(data.Len()))
	f.Write(data.Bytes())
	return f.Bytes()
}

func TestDecodeWAV(t *testing.T) {
	frames := [][]float64{{0.5, -0.5}, {0.25, 0.75}, {-1, -1}, {0, 1}}
	want := []float32{0, 0.5, -1, 0.5} // channel means
	for _, c := range []struct {
		name         string
		format, bits int
		extensible   bool
		tolerance    float64
	}{
		{"pcm8", wavPCM, 8, false, 1.0 / 64},
		{"pcm16", wavPCM, 16, false, 1e-4},
		{"pcm24", wavPCM, 24, false, 1e-6},
		{"pcm32", wavPCM, 32, false, 1e-6},
		{"pcm24 extensible", wavPCM, 24, true, 1e-6},
		{"float32", wavFloat, 32, false, 1e-7},
		{"float64", wavFloat, 64, false, 1e-7},
	} {
		pcm, rate, err := Decode(wavFile(c.format, c.bits, 2, 22050, frames, c.extensible), 0)
		if err != nil || rate != 22050 || len(pcm) != len(want) {
			t.Fatalf("%s: %d samples at %d Hz, %v", c.name, len(pcm), rate, err)
		}
		for i := range want {
			if math.Abs(float64(pcm[i]-want[i])) > c.tolerance {
				t.Errorf("%s: sample %d = %g, want %g", c.name, i, pcm[i], want[i])
			}
		}
	}
}

func TestDecodeWAVErrors(t *testing.T) {
	good := wavFile(wavPCM, 16, 1, 16000, [][]float64{{0.1}, {0.2}}, false)
	for name, data := range map[string][]byte{
		"truncated header": good[:20],
		"no data":          append(append([]byte{}, good[:12]...), good[12:36]...),
		"alaw":             wavFile(6, 8, 1, 8000, [][]float64{{0}}, false),
		"12-bit":           wavFile(wavPCM, 12, 1, 8000, [][]float64{{0}}, false),
	} {
		if _, _, err := Decode(data, 0); !errors.Is(err, ErrBadAudio) {
			t.Errorf("%s: %v, want ErrBadAudio", name, err)
		}
	}
	silence := make([][]float64, 3000)
	for i := range silence {
		silence[i] = []float64{0}
	}
	long := wavFile(wavPCM, 16, 1, 1000, silence, false)
	if _, _, err := Decode(long, 2); !errors.Is(err, ErrTooLong) {
		t.Errorf("3 s with a limit of 2: %v", err)
	}
}
