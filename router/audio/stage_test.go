package audio

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func sine(rate int, secs, freq float64) []float32 {
	out := make([]float32, int(secs*float64(rate)))
	for i := range out {
		out[i] = float32(0.5 * math.Sin(2*math.Pi*freq*float64(i)/float64(rate)))
	}
	return out
}

// dominant is the frequency, in 1 Hz steps between lo and hi, with the most power in the middle
// half second of pcm (a direct DFT at each candidate).
func dominant(pcm []float32, rate int, lo, hi float64) float64 {
	mid := len(pcm) / 2
	win := pcm[max(0, mid-rate/4):min(len(pcm), mid+rate/4)]
	best, bestP := 0.0, -1.0
	for f := lo; f <= hi; f++ {
		var re, im float64
		w := 2 * math.Pi * f / float64(rate)
		for i, v := range win {
			re += float64(v) * math.Cos(w*float64(i))
			im += float64(v) * math.Sin(w*float64(i))
		}
		if p := re*re + im*im; p > bestP {
			best, bestP = f, p
		}
	}
	return best
}

// run feeds pcm through s in chunks of n samples and returns everything it produced, and how
// much of it came before Flush.
func run(t *testing.T, s Stage, pcm []float32, n int) (all []float32, streamed int) {
	t.Helper()
	var out []float32
	for i := 0; i < len(pcm); i += n {
		o, err := s.Process(pcm[i:min(i+n, len(pcm))])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o...)
	}
	streamed = len(out)
	o, err := s.Flush()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	return append(out, o...), streamed
}

func TestTempoKeepsPitch(t *testing.T) {
	const rate, secs, freq = 24000, 3.0, 440.0
	in := sine(rate, secs, freq)
	for _, speed := range []float64{0.25, 0.5, 1, 2, 4} {
		s, err := NewTempo(speed, rate)
		if err != nil {
			t.Fatal(err)
		}
		out, streamed := run(t, s, in, 2400)
		if streamed < len(out)*3/4 {
			t.Errorf("speed %g: only %d of %d samples came before Flush", speed, streamed, len(out))
		}
		want := secs / speed
		got := float64(len(out)) / rate
		if math.Abs(got-want) > 0.1*want {
			t.Errorf("speed %g: %.3f s out of %.1f s, want %.3f s ± 10%%", speed, got, secs, want)
		}
		if f := dominant(out, rate, 300, 600); math.Abs(f-freq) > 0.03*freq {
			t.Errorf("speed %g: dominant frequency %.0f Hz, want %.0f Hz", speed, f, freq)
		}
		t.Logf("speed %g: %.3f s, %.0f Hz", speed, got, dominant(out, rate, 300, 600))
	}
}

func TestTempoOneIsPassThrough(t *testing.T) {
	s, err := NewTempo(1, 24000)
	if err != nil {
		t.Fatal(err)
	}
	in := []float32{1, 2, 3}
	out, _ := s.Process(in)
	if &out[0] != &in[0] {
		t.Error("speed 1 copied the samples")
	}
	for _, bad := range []float64{0.2, 4.5, math.NaN()} {
		if _, err := NewTempo(bad, 24000); err == nil {
			t.Errorf("speed %g accepted", bad)
		}
	}
}

func TestResampler(t *testing.T) {
	const secs, freq = 2.0, 1000.0
	for _, c := range []struct{ from, to int }{{24000, 48000}, {22050, 24000}, {44100, 24000}, {48000, 16000}} {
		r, err := NewResampler(c.from, c.to)
		if err != nil {
			t.Fatal(err)
		}
		out, streamed := run(t, r, sine(c.from, secs, freq), c.from/10)
		if streamed < len(out)*9/10 {
			t.Errorf("%d→%d Hz: only %d of %d samples came before Flush", c.from, c.to, streamed, len(out))
		}
		want := secs * float64(c.to)
		if math.Abs(float64(len(out))-want) > 0.01*want {
			t.Errorf("%d→%d Hz: %d samples, want %.0f", c.from, c.to, len(out), want)
		}
		if f := dominant(out, c.to, 800, 1200); math.Abs(f-freq) > 0.01*freq {
			t.Errorf("%d→%d Hz: dominant frequency %.0f Hz, want %.0f", c.from, c.to, f, freq)
		}
	}
	if _, err := NewResampler(0, 24000); err == nil {
		t.Error("rate 0 accepted")
	}
}

func TestSSE(t *testing.T) {
	var out bytes.Buffer
	if _, err := (SSEWriter{&out}).Write([]byte{0, 1, 2, 255}); err != nil {
		t.Fatal(err)
	}
	out.Write(SSEDone(Usage{InputTokens: 3, OutputTokens: 5, TotalTokens: 8}))

	events := strings.Split(strings.TrimSuffix(out.String(), "\n\n"), "\n\n")
	if len(events) != 2 {
		t.Fatalf("events %q", out.String())
	}
	var delta struct{ Type, Audio string }
	if err := json.Unmarshal([]byte(strings.TrimPrefix(events[0], "data: ")), &delta); err != nil {
		t.Fatal(err)
	}
	if b, _ := base64.StdEncoding.DecodeString(delta.Audio); delta.Type != "speech.audio.delta" || !bytes.Equal(b, []byte{0, 1, 2, 255}) {
		t.Errorf("delta event %q", events[0])
	}
	if want := `data: {"type":"speech.audio.done","usage":{"input_tokens":3,"output_tokens":5,"total_tokens":8}}`; events[1] != want {
		t.Errorf("done event %q, want %q", events[1], want)
	}
}
