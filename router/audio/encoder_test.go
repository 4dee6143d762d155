package audio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// signal is a sine at freq Hz plus a little noise, the kind of content a vocoder produces.
func signal(rate int, secs, freq float64, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]float32, int(secs*float64(rate)))
	for i := range out {
		out[i] = float32(0.5*math.Sin(2*math.Pi*freq*float64(i)/float64(rate)) + 0.05*(r.Float64()*2-1))
	}
	return out
}

// probe is what ffprobe and ffmpeg say about an encoded file.
type probe struct {
	codec    string
	rate     int
	channels int
	samples  int // decoded samples per channel
}

func (p probe) seconds() float64 { return float64(p.samples) / float64(p.rate) }

// decode runs ffprobe and ffmpeg on data; raw pcm needs its layout given. Any error ffmpeg
// reports while decoding the whole stream fails the test.
func decode(t *testing.T, format string, data []byte) probe {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audio."+format)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var in []string
	if format == "pcm" {
		in = []string{"-f", "s16le", "-ar", strconv.Itoa(PCMRate), "-ac", "1"}
	}
	args := append([]string{"-v", "error"}, in...)
	args = append(args, "-show_entries", "stream=codec_name,sample_rate,channels", "-of", "default=nw=1", path)
	out, err := exec.Command("ffprobe", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ffprobe %s: %v\n%s", format, err, out)
	}
	var p probe
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "codec_name":
			p.codec = v
		case "sample_rate":
			p.rate, _ = strconv.Atoi(v)
		case "channels":
			p.channels, _ = strconv.Atoi(v)
		}
	}
	args = append([]string{"-v", "error", "-nostdin"}, in...)
	args = append(args, "-i", path, "-f", "s16le", "-acodec", "pcm_s16le", "-")
	cmd := exec.Command("ffmpeg", args...)
	var pcm, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &pcm, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("ffmpeg decoding %s: %v\n%s", format, err, stderr.Bytes())
	}
	if p.channels > 0 {
		p.samples = pcm.Len() / 2 / p.channels
	}
	return p
}

func TestEncodersStreamAndDecode(t *testing.T) {
	const secs, chunk = 3.0, 0.1
	for _, format := range Formats() {
		for _, rate := range []int{24000, 22050} {
			t.Run(fmt.Sprintf("%s/%d", format, rate), func(t *testing.T) {
				t.Parallel()
				var out bytes.Buffer
				enc, err := NewEncoder(format, rate, 1, &out)
				if err != nil {
					t.Fatal(err)
				}
				header := out.Len()
				pcm := signal(rate, secs, 440, 1)
				step := int(chunk * float64(rate))
				var afterFirst int // output size after 0.2 s of input
				var partial []byte
				for i := 0; i < len(pcm); i += step {
					if err := enc.Write(pcm[i:min(i+step, len(pcm))]); err != nil {
						t.Fatal(err)
					}
					if i == step { // 0.2 s in: every codec here has completed a frame
						afterFirst = out.Len()
					}
					if i+step == int(1.0*float64(rate)) {
						partial = bytes.Clone(out.Bytes())
					}
				}
				if err := enc.Close(); err != nil {
					t.Fatal(err)
				}
				// Streaming: audio leaves with the Write that completes a codec frame (FLAC's are up
				// to 0.1 s, AAC holds one frame back).
				if afterFirst <= header {
					t.Errorf("after 0.2 s of input the output is still %d bytes (header %d)", afterFirst, header)
				}
				// And what left after 1 s is already playable audio of about that length.
				if p := decode(t, format, partial); p.seconds() < 0.8 {
					t.Errorf("output after 1 s of input decodes to only %.3f s", p.seconds())
				}

				p := decode(t, format, out.Bytes())
				wantRate := map[string]int{"pcm": PCMRate, "opus": 48000}[format] // ffmpeg decodes Opus at 48 kHz
				if wantRate == 0 {
					wantRate = rate
				}
				if p.rate != wantRate || p.channels != 1 {
					t.Errorf("decoded as %d Hz, %d channels; want %d Hz mono", p.rate, p.channels, wantRate)
				}
				if d := p.seconds(); math.Abs(d-secs) > 0.1*secs {
					t.Errorf("decoded duration %.3f s, want %.1f s ± 10%%", d, secs)
				}
				t.Logf("%s at %d Hz: %d bytes, %s, decoded %.3f s at %d Hz", format, rate, out.Len(), p.codec, p.seconds(), p.rate)
			})
		}
	}
}

func TestEncoderSpeed(t *testing.T) {
	for _, speed := range []float64{0.5, 2} {
		var out bytes.Buffer
		enc, err := NewEncoder("mp3", 24000, speed, &out)
		if err != nil {
			t.Fatal(err)
		}
		pcm := signal(24000, 2, 440, 2)
		for i := 0; i < len(pcm); i += 2400 {
			if err := enc.Write(pcm[i : i+2400]); err != nil {
				t.Fatal(err)
			}
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		want := 2 / speed
		if d := decode(t, "mp3", out.Bytes()).seconds(); math.Abs(d-want) > 0.1*want {
			t.Errorf("speed %g: decoded %.3f s, want %.2f s ± 10%%", speed, d, want)
		}
	}
}

func TestEncoderEmptyStreams(t *testing.T) {
	for _, format := range Formats() {
		var out bytes.Buffer
		enc, err := NewEncoder(format, 24000, 1, &out)
		if err != nil {
			t.Fatal(err)
		}
		if err := enc.Close(); err != nil {
			t.Errorf("%s: closing an empty stream: %v", format, err)
		}
		if err := enc.Close(); err != nil {
			t.Errorf("%s: second Close: %v", format, err)
		}
		if err := enc.Write(make([]float32, 10)); err == nil {
			t.Errorf("%s: Write after Close succeeded", format)
		}
	}
}

func TestEncoderRejects(t *testing.T) {
	if _, err := NewEncoder("ogg", 24000, 1, &bytes.Buffer{}); err == nil {
		t.Error("format ogg accepted")
	}
	if _, err := NewEncoder("mp3", 24000, 5, &bytes.Buffer{}); err == nil {
		t.Error("speed 5 accepted")
	}
	if _, err := NewEncoder("mp3", 0, 1, &bytes.Buffer{}); err == nil {
		t.Error("rate 0 accepted")
	}
}

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after <= 0 {
		return 0, errors.New("client went away")
	}
	w.after--
	return len(p), nil
}

// A client that goes away mid-stream: the encoder is aborted, or keeps failing and is closed;
// either way it frees itself and never panics.
func TestEncoderClientGone(t *testing.T) {
	for _, format := range Formats() {
		pcm := signal(24000, 0.5, 440, 3)

		enc, err := NewEncoder(format, 24000, 1.5, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if err := enc.Write(pcm); err != nil {
			t.Fatal(err)
		}
		enc.Abort()
		enc.Abort()
		if err := enc.Write(pcm); err == nil {
			t.Errorf("%s: Write after Abort succeeded", format)
		}
		if err := enc.Close(); err != nil {
			t.Errorf("%s: Close after Abort: %v", format, err)
		}

		enc, err = NewEncoder(format, 24000, 1, &failingWriter{after: 1})
		if err != nil {
			t.Fatal(err)
		}
		var failed error
		for i := 0; i < 5 && failed == nil; i++ {
			failed = enc.Write(pcm)
		}
		if failed == nil {
			t.Errorf("%s: writes into a failing writer all succeeded", format)
		}
		_ = enc.Close()
	}
}

// Many encoders opened and closed or aborted leave the C heap where it was.
func TestEncoderNoLeak(t *testing.T) {
	pcm := signal(24000, 0.3, 440, 4)
	round := func() {
		for _, format := range Formats() {
			for i := 0; i < 20; i++ {
				enc, err := NewEncoder(format, 22050, []float64{1, 2}[i%2], &bytes.Buffer{})
				if err != nil {
					t.Fatal(err)
				}
				if err := enc.Write(pcm); err != nil {
					t.Fatal(err)
				}
				if i%3 == 0 {
					enc.Abort()
				} else if err := enc.Close(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	round() // warms up FFmpeg's one-time tables
	before := cHeapInUse()
	for i := 0; i < 5; i++ {
		round()
	}
	if grew := cHeapInUse() - before; grew > 1<<20 {
		t.Errorf("C heap grew by %d bytes over 600 encoders", grew)
	}
}

func TestWAVStreamingHeader(t *testing.T) {
	var out bytes.Buffer
	enc, err := NewEncoder("wav", 16000, 1, &out)
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.Write([]float32{0, 0.5, -1}); err != nil {
		t.Fatal(err)
	}
	b := out.Bytes()
	if len(b) != 44+6 || binary.LittleEndian.Uint32(b[40:]) != StreamingSize || binary.LittleEndian.Uint32(b[24:]) != 16000 {
		t.Errorf("wav stream starts % x", b)
	}
}

// BenchmarkEncode encodes one second of 24 kHz audio per op, in two chunks, stream set-up included.
func BenchmarkEncode(b *testing.B) {
	pcm := signal(24000, 1, 440, 5)
	for _, format := range Formats() {
		for _, speed := range []float64{1, 1.5} {
			b.Run(fmt.Sprintf("%s/speed=%g", format, speed), func(b *testing.B) {
				for b.Loop() {
					enc, err := NewEncoder(format, 24000, speed, io.Discard)
					if err != nil {
						b.Fatal(err)
					}
					_ = enc.Write(pcm[:12000])
					_ = enc.Write(pcm[12000:])
					if err := enc.Close(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
