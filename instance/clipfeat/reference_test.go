package clipfeat

import (
	"encoding/json"
	"math"
	"os"
	"strconv"
	"testing"
)

// reference.json is written by testdata/reference.py: scripts/cosyvoice3/voice.py's resampler,
// Whisper log-mel and flow mel, and an independent float64 numpy Kaldi fbank, all on the clip
// that testClip makes.

type refSummary struct {
	Frames    int                  `json:"frames"`
	Bins      int                  `json:"bins"`
	Sum       float64              `json:"sum"`
	AbsSum    float64              `json:"abs_sum"`
	FrameSums []float64            `json:"frame_sums"`
	BinSums   []float64            `json:"bin_sums"`
	Rows      map[string][]float64 `json:"rows"`
}

type reference struct {
	Seed  uint64 `json:"seed"`
	Clips map[string]struct {
		N     int     `json:"n"`
		Sum   float64 `json:"sum"`
		SumSq float64 `json:"sum_sq"`
	} `json:"clips"`
	Resample []struct {
		From    int                  `json:"from"`
		To      int                  `json:"to"`
		N       int                  `json:"n"`
		Sum     float64              `json:"sum"`
		SumSq   float64              `json:"sum_sq"`
		Windows map[string][]float64 `json:"windows"`
	} `json:"resample"`
	Whisper     refSummary `json:"whisper"`
	Flow        refSummary `json:"flow"`
	Fbank       refSummary `json:"fbank"`
	FbankNoMean refSummary `json:"fbank_mean_removed"`
}

func loadReference(t *testing.T) *reference {
	t.Helper()
	b, err := os.ReadFile("testdata/reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var r reference
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// testClip is reference.py's clip: 1.3 s of a chirp from 80 Hz to 6 kHz, a weak 7 kHz tone and
// splitmix64 noise, 50 ms of digital silence at 0.40 s and 100 ms at 1/1000 level at 0.80 s.
func testClip(sr int, seed uint64) []float32 {
	n := sr * 13 / 10
	const dur, f0, f1 = 1.3, 80.0, 6000.0
	rate := (f1 - f0) / dur
	state := seed
	out := make([]float32, n)
	for i := range out {
		t := float64(i) / float64(sr)
		state += 0x9E3779B97F4A7C15
		z := state
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		u := float64(z>>11) * (1.0 / (1 << 53))
		x := 0.5*math.Sin(2*math.Pi*(f0*t+0.5*rate*t*t)) +
			0.02*math.Sin(2*math.Pi*7000.0*t) + 0.04*(u-0.5)
		switch {
		case i >= sr*40/100 && i < sr*45/100:
			x = 0
		case i >= sr*80/100 && i < sr*90/100:
			x *= 0.001
		}
		out[i] = float32(x)
	}
	return out
}

func sums(x []float32) (s, sq float64) {
	for _, v := range x {
		s += float64(v)
		sq += float64(v) * float64(v)
	}
	return s, sq
}

func TestReferenceClip(t *testing.T) {
	ref := loadReference(t)
	for sr, c := range ref.Clips {
		rate, _ := strconv.Atoi(sr)
		x := testClip(rate, ref.Seed)
		s, sq := sums(x)
		if len(x) != c.N || math.Abs(s-c.Sum) > 1e-5 || math.Abs(sq-c.SumSq) > 1e-9*c.SumSq+1e-6 {
			t.Fatalf("clip at %d Hz: n %d sum %.9g sum_sq %.9g, reference.py has %d %.9g %.9g",
				rate, len(x), s, sq, c.N, c.Sum, c.SumSq)
		}
	}
}

// Resampling: both use the kernel rounded to float32; the reference convolves in float32, this
// in float64, so they differ by the reference's rounding (under 1e-7 seen; samples are up to 0.5).
const resampleTol = 5e-7

func TestResampleReference(t *testing.T) {
	ref := loadReference(t)
	for _, c := range ref.Resample {
		y := Resample(testClip(c.From, ref.Seed), c.From, c.To)
		if len(y) != c.N || ResampledLength(len(testClip(c.From, ref.Seed)), c.From, c.To) != c.N {
			t.Fatalf("%d -> %d: %d samples, want %d", c.From, c.To, len(y), c.N)
		}
		worst := 0.0
		for off, want := range c.Windows {
			o, _ := strconv.Atoi(off)
			for i, w := range want {
				worst = math.Max(worst, math.Abs(float64(y[o+i])-w))
			}
		}
		s, sq := sums(y)
		t.Logf("%d -> %d: worst %.3g, sum %.3g off, sum_sq %.3g off", c.From, c.To, worst, s-c.Sum, (sq-c.SumSq)/c.SumSq)
		if worst > resampleTol {
			t.Errorf("%d -> %d: samples differ by %.3g (tolerance %g)", c.From, c.To, worst, resampleTol)
		}
		if math.Abs(s-c.Sum) > resampleTol*float64(c.N) || math.Abs(sq-c.SumSq) > 1e-6*c.SumSq {
			t.Errorf("%d -> %d: sum %.9g sum_sq %.9g, want %.9g %.9g", c.From, c.To, s, sq, c.Sum, c.SumSq)
		}
	}
}

// checkSummary compares got, [frames][bins] frame-major or, with channelMajor, [bins][frames],
// with a reference summary: every selected frame's values within tol, each frame's and each
// bin's sum within tol times the number of values summed.
func checkSummary(t *testing.T, name string, got []float32, frames, bins int, channelMajor bool, want refSummary, tol float64) {
	t.Helper()
	if frames != want.Frames || bins != want.Bins || len(got) != frames*bins {
		t.Fatalf("%s: %d values, %d frames x %d bins; want %d x %d", name, len(got), frames, bins, want.Frames, want.Bins)
	}
	at := func(f, b int) float64 {
		if channelMajor {
			return float64(got[b*frames+f])
		}
		return float64(got[f*bins+b])
	}
	worst, worstSum := 0.0, 0.0
	for key, row := range want.Rows {
		f, _ := strconv.Atoi(key)
		for b, w := range row {
			if d := math.Abs(at(f, b) - w); d > worst {
				worst = d
			}
		}
	}
	frameSums, binSums := make([]float64, frames), make([]float64, bins)
	var total, abs float64
	for f := 0; f < frames; f++ {
		for b := 0; b < bins; b++ {
			v := at(f, b)
			frameSums[f] += v
			binSums[b] += v
			total += v
			abs += math.Abs(v)
		}
	}
	for f, w := range want.FrameSums {
		worstSum = math.Max(worstSum, math.Abs(frameSums[f]-w)/float64(bins))
	}
	for b, w := range want.BinSums {
		worstSum = math.Max(worstSum, math.Abs(binSums[b]-w)/float64(frames))
	}
	worstSum = math.Max(worstSum, math.Abs(total-want.Sum)/float64(frames*bins))
	worstSum = math.Max(worstSum, math.Abs(abs-want.AbsSum)/float64(frames*bins))
	t.Logf("%s: worst value %.3g, worst mean over a sum %.3g", name, worst, worstSum)
	if worst > tol || worstSum > tol {
		t.Errorf("%s: differs from the reference by %.3g in a value, %.3g per value in a sum (tolerance %g)",
			name, worst, worstSum, tol)
	}
}

// Tolerances in the features' own (log) units, absolute. The reference's Whisper and flow mels
// are float32 torch STFTs, these float64, so they differ by the reference's rounding (up to
// 4e-6 and 6e-6 seen), largest in the quietest bins above the floors. The fbank reference is
// float64 too (1e-6 seen, the float32 outputs' rounding).
const (
	whisperTol = 2e-5
	flowTol    = 3e-5
	fbankTol   = 5e-6
)

func TestWhisperLogMelReference(t *testing.T) {
	ref := loadReference(t)
	feats, frames := WhisperLogMel(testClip(16000, ref.Seed))
	checkSummary(t, "whisper", feats, frames, WhisperBins, true, ref.Whisper, whisperTol)
}

func TestFlowMelReference(t *testing.T) {
	ref := loadReference(t)
	mel, frames := FlowMel(testClip(24000, ref.Seed))
	checkSummary(t, "flow", mel, frames, FlowBins, false, ref.Flow, flowTol)
}

func TestKaldiFbankReference(t *testing.T) {
	ref := loadReference(t)
	feats, frames := KaldiFbank(testClip(16000, ref.Seed))
	checkSummary(t, "fbank", feats, frames, FbankBins, false, ref.Fbank, fbankTol)
	SubtractMean(feats, FbankBins)
	checkSummary(t, "fbank less mean", feats, frames, FbankBins, false, ref.FbankNoMean, fbankTol)
}
