package clipfeat

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/voxmux/voxmux/tts"
)

// silenceDB is how far under the clip's peak a frame's RMS is silence, for trimming.
const silenceDB = 50

// ClipSpeech checks a reference clip a voice is made from and returns its speech: the clip's
// leading and trailing silence trimmed (TrimSilence). It refuses, as tts.Invalid, a clip with no
// audio, sampled under minRate Hz, with a sample that is not a finite number, whose transcript is
// not valid UTF-8 or blank, or whose speech lasts less than minSeconds or more than maxSeconds.
func ClipSpeech(clip tts.VoiceClip, minRate int, minSeconds, maxSeconds float64) ([]float32, error) {
	if len(clip.PCM) == 0 {
		return nil, tts.Invalid("the reference clip holds no audio")
	}
	if clip.SampleRate < minRate {
		return nil, tts.Invalid(fmt.Sprintf("the reference clip's sample rate is %d Hz; a voice needs %d Hz or more", clip.SampleRate, minRate))
	}
	for i, v := range clip.PCM {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, tts.Invalid(fmt.Sprintf("the reference clip's sample %d is %v, not a finite number", i, v))
		}
	}
	if !utf8.ValidString(clip.Text) {
		return nil, tts.Invalid("the reference clip's transcript is not valid UTF-8")
	}
	if strings.TrimSpace(clip.Text) == "" {
		return nil, tts.Invalid("the reference clip's transcript is empty; give the words said in the clip")
	}
	pcm := TrimSilence(clip.PCM, clip.SampleRate)
	secs := float64(len(pcm)) / float64(clip.SampleRate)
	if secs < minSeconds || secs > maxSeconds {
		return nil, tts.Invalid(fmt.Sprintf("the reference clip is %.2f s long once its leading and trailing silence is trimmed (%.2f s in all); a voice needs %g to %g s",
			secs, float64(len(clip.PCM))/float64(clip.SampleRate), minSeconds, maxSeconds))
	}
	return pcm, nil
}

// TrimSilence cuts the clip's leading and trailing silence: 10 ms frames whose RMS is more than
// silenceDB under the clip's peak sample, keeping 20 ms beside the speech so that soft onsets and
// endings stay whole. A silent clip comes back empty.
func TrimSilence(pcm []float32, rate int) []float32 {
	var peak float64
	for _, v := range pcm {
		peak = max(peak, math.Abs(float64(v)))
	}
	if peak == 0 {
		return nil
	}
	floor := peak * math.Pow(10, -silenceDB/20.0)
	n := max(rate/100, 1)
	loud := func(f int) bool {
		seg := pcm[f*n : min((f+1)*n, len(pcm))]
		var s float64
		for _, v := range seg {
			s += float64(v) * float64(v)
		}
		return math.Sqrt(s/float64(len(seg))) >= floor
	}
	frames := (len(pcm) + n - 1) / n
	first, last := 0, frames-1
	for first < frames && !loud(first) {
		first++
	}
	if first == frames {
		return nil
	}
	for last > first && !loud(last) {
		last--
	}
	from := max(first-2, 0) * n
	to := min((last+3)*n, len(pcm))
	return pcm[from:to]
}
