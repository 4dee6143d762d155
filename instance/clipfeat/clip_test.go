package clipfeat

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// Trimming keeps the loud part and 20 ms either side.
func TestTrimSilence(t *testing.T) {
	rate := 16000
	x := make([]float32, 3*rate)
	for i := rate; i < 2*rate; i++ {
		x[i] = float32(0.5 * math.Sin(float64(i)*0.1))
	}
	got := TrimSilence(x, rate)
	if want := rate + 4*rate/100; len(got) != want {
		t.Errorf("trimmed to %d samples, want %d", len(got), want)
	}
	if TrimSilence(make([]float32, rate), rate) != nil {
		t.Error("a silent clip is not empty once trimmed")
	}
}

// Each fault of a clip is the client's, and says what is wrong.
func TestClipSpeech(t *testing.T) {
	rate := 16000
	speech := make([]float32, 5*rate)
	for i := rate; i < 4*rate; i++ {
		speech[i] = float32(0.5 * math.Sin(float64(i)*0.1))
	}
	nan := append([]float32(nil), speech...)
	nan[7] = float32(math.NaN())
	for _, c := range []struct {
		clip tts.VoiceClip
		want string
	}{
		{tts.VoiceClip{SampleRate: rate, Text: "hi"}, "holds no audio"},
		{tts.VoiceClip{PCM: speech, SampleRate: 8000, Text: "hi"}, "8000 Hz"},
		{tts.VoiceClip{PCM: nan, SampleRate: rate, Text: "hi"}, "sample 7 is NaN"},
		{tts.VoiceClip{PCM: speech, SampleRate: rate, Text: "\xff"}, "not valid UTF-8"},
		{tts.VoiceClip{PCM: speech, SampleRate: rate, Text: " \n"}, "transcript is empty"},
		{tts.VoiceClip{PCM: speech[:2*rate], SampleRate: rate, Text: "hi"}, "a voice needs 3 to 30 s"},
	} {
		_, err := ClipSpeech(c.clip, 16000, 3, 30)
		var te *tts.Error
		if !errors.As(err, &te) || te.Kind != tts.ErrInvalid || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want an invalid clip saying %q", c.want, err, c.want)
		}
	}
	pcm, err := ClipSpeech(tts.VoiceClip{PCM: speech, SampleRate: rate, Text: "hi"}, 16000, 3, 30)
	if err != nil || len(pcm) != 3*rate+4*rate/100 {
		t.Errorf("%d samples, %v; want %d", len(pcm), err, 3*rate+4*rate/100)
	}
}
