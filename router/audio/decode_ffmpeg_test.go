//go:build !noffmpeg

package audio

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// TestDecodeFFmpeg encodes a tone with the router's own encoders and reads it back: length,
// rate and pitch survive (Opus decodes at 48 kHz whatever it was made from).
func TestDecodeFFmpeg(t *testing.T) {
	const rate, seconds, hz = 24000, 1.0, 440.0
	tone := make([]float32, int(rate*seconds))
	for i := range tone {
		tone[i] = float32(0.5 * math.Sin(2*math.Pi*hz*float64(i)/rate))
	}
	for _, c := range []struct {
		format   string
		wantRate int
	}{{"mp3", 24000}, {"flac", 24000}, {"opus", 48000}, {"aac", 24000}} {
		var buf bytes.Buffer
		enc, err := NewEncoder(c.format, rate, 1, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if err := enc.Write(tone); err != nil {
			t.Fatal(err)
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		pcm, got, err := Decode(buf.Bytes(), 0)
		if err != nil {
			t.Fatalf("%s: %v", c.format, err)
		}
		if got != c.wantRate {
			t.Errorf("%s: rate %d, want %d", c.format, got, c.wantRate)
		}
		secs := float64(len(pcm)) / float64(got)
		if secs < seconds-0.01 || secs > seconds+0.1 {
			t.Errorf("%s: %.3f s, want about %g", c.format, secs, seconds)
		}
		// The pitch from zero crossings over the middle half (codec delay and edges aside).
		mid := pcm[len(pcm)/4 : 3*len(pcm)/4]
		cross := 0
		for i := 1; i < len(mid); i++ {
			if (mid[i-1] < 0) != (mid[i] < 0) {
				cross++
			}
		}
		f := float64(cross) / 2 / (float64(len(mid)) / float64(got))
		if math.Abs(f-hz) > 5 {
			t.Errorf("%s: %.1f Hz, want %g", c.format, f, hz)
		}
		if _, _, err := Decode(buf.Bytes(), 0.5); !errors.Is(err, ErrTooLong) {
			t.Errorf("%s: a 1 s file with a limit of 0.5 s: %v", c.format, err)
		}
	}
	for name, data := range map[string][]byte{"empty": nil, "text": []byte("hello, this is not audio at all")} {
		if _, _, err := Decode(data, 0); !errors.Is(err, ErrBadAudio) {
			t.Errorf("%s: %v, want ErrBadAudio", name, err)
		}
	}
}
