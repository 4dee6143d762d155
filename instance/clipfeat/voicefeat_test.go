package clipfeat

import (
	"math"
	"slices"
	"testing"
)

func tone(freq float64, n, sr int, amp, phase float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(amp * math.Sin(2*math.Pi*freq*float64(i)/float64(sr)+phase))
	}
	return x
}

func noise(n int, seed uint64) []float32 {
	x := make([]float32, n)
	for i := range x {
		seed = seed*6364136223846793005 + 1442695040888963407
		x[i] = float32(float64(seed>>11)/(1<<53)-0.5) * 0.2
	}
	return x
}

func TestFrameCounts(t *testing.T) {
	for _, n := range []int{0, 1, 159, 160, 201, 399, 400, 16000, 16159, 16160, 16161, 48000} {
		feats, frames := WhisperLogMel(noise(n, uint64(n)))
		if frames != n/160 || frames != WhisperFrames(n) || len(feats) != 128*frames {
			t.Errorf("whisper, %d samples: %d frames, %d values; want %d", n, frames, len(feats), n/160)
		}
	}
	for _, n := range []int{0, 479, 480, 721, 959, 960, 24000, 24479, 24480, 24481, 72000} {
		mel, frames := FlowMel(noise(n, uint64(n)))
		if frames != n/480 || frames != FlowFrames(n) || len(mel) != 80*frames {
			t.Errorf("flow, %d samples: %d frames, %d values; want %d", n, frames, len(mel), n/480)
		}
	}
	for _, c := range [][2]int{{0, 0}, {399, 0}, {400, 1}, {559, 1}, {560, 2}, {16000, 98}, {48000, 298}} {
		feats, frames := KaldiFbank(noise(c[0], uint64(c[0])))
		if frames != c[1] || frames != FbankFrames(c[0]) || len(feats) != 80*frames {
			t.Errorf("fbank, %d samples: %d frames, %d values; want %d", c[0], frames, len(feats), c[1])
		}
	}
	for _, v := range [][]float32{mustFeats(WhisperLogMel(noise(300, 1))), mustFeats(FlowMel(noise(500, 1)))} {
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatal("a clip shorter than the padding gave a value that is not finite")
			}
		}
	}
}

func mustFeats(f []float32, _ int) []float32 { return f }

func TestReflect(t *testing.T) {
	// numpy.pad(arange(4), 7, mode="reflect")
	want := []int{1, 0, 1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1, 2, 3, 2}
	for i, w := range want {
		if got := reflect(i-7, 4); got != w {
			t.Errorf("reflect(%d, 4) = %d, want %d", i-7, got, w)
		}
	}
	if reflect(-3, 1) != 0 || reflect(5, 1) != 0 {
		t.Error("a one-sample clip reflects onto its only sample")
	}
}

// slaneyEdge is edge k of n+2 on Slaney's scale from 0 to fmax, from the scale's closed form.
func slaneyEdge(k, nMels int, fmax float64) float64 {
	top := 15 + 27*math.Log(fmax/1000)/math.Log(6.4)
	m := top * float64(k) / float64(nMels+1)
	if m < 15 {
		return m * 200 / 3
	}
	return 1000 * math.Pow(6.4, (m-15)/27)
}

func TestSlaneyFilterPeaks(t *testing.T) {
	// Bins 0.5 Hz apart: each filter peaks at its centre frequency with height 2/(width in Hz)
	// and has area 1 (Slaney normalization).
	const sr, nFFT, nMels = 24000, 48000, 80
	df := float64(sr) / nFFT
	for m, f := range slaneyFilters(sr, nFFT, nMels, 0, 12000) {
		lo, mid, hi := slaneyEdge(m, nMels, 12000), slaneyEdge(m+1, nMels, 12000), slaneyEdge(m+2, nMels, 12000)
		peak, area := 0, 0.0
		for i, w := range f.w {
			if w > f.w[peak] {
				peak = i
			}
			area += w * df
		}
		height := 2 / (hi - lo)
		if at := float64(f.start+peak) * df; math.Abs(at-mid) > df {
			t.Errorf("filter %d peaks at %.2f Hz, its centre is %.2f Hz", m, at, mid)
		}
		slack := 0.5 * df / math.Min(mid-lo, hi-mid)
		if w := f.w[peak]; w > height*(1+1e-6) || w < height*(1-slack-1e-6) {
			t.Errorf("filter %d: peak %g, want %g", m, w, height)
		}
		if math.Abs(area-1) > 1e-3 {
			t.Errorf("filter %d: area %g, want 1", m, area)
		}
		if float64(f.start)*df < lo-df || float64(f.start+len(f.w)-1)*df > hi+df {
			t.Errorf("filter %d spans %g..%g Hz outside %g..%g", m, float64(f.start)*df, float64(f.start+len(f.w)-1)*df, lo, hi)
		}
	}
	// Whisper's and the flow's banks: every filter covers some bin.
	for _, c := range [][4]int{{16000, 400, 128, 8000}, {24000, 1920, 80, 12000}} {
		for m, f := range slaneyFilters(c[0], c[1], c[2], 0, float64(c[3])) {
			if len(f.w) == 0 {
				t.Errorf("(%v) filter %d covers no bin", c, m)
			}
		}
	}
}

func TestKaldiFilterPeaks(t *testing.T) {
	// Peak 1 at the centre on the HTK mel scale; neighbours overlap so that adjacent weights sum
	// to 1 between centres; bin 256 (Nyquist) is never used.
	filters := kaldiFilters(16000, 512, 80, 20, 8000)
	mlo, mhi := kaldiMelScale(20), kaldiMelScale(8000)
	for m, f := range filters {
		centre := 700 * (math.Exp((mlo+float64(m+1)*(mhi-mlo)/81)/1127) - 1)
		peak := slices.Index(f.w, slices.Max(f.w))
		if at := float64(f.start+peak) * 16000 / 512; math.Abs(at-centre) > 31.25 {
			t.Errorf("filter %d peaks at %.1f Hz, its centre is %.1f Hz", m, at, centre)
		}
		if f.w[peak] > 1 {
			t.Errorf("filter %d: peak %g above 1", m, f.w[peak])
		}
		if f.start+len(f.w) > 256 {
			t.Errorf("filter %d reaches the Nyquist bin", m)
		}
	}
	// Between the first and last centres, every bin's weights sum to 1.
	sum := make([]float64, 257)
	for _, f := range filters {
		for i, w := range f.w {
			sum[f.start+i] += w
		}
	}
	first, last := 700*(math.Exp((mlo+(mhi-mlo)/81)/1127)-1), 700*(math.Exp((mlo+80*(mhi-mlo)/81)/1127)-1)
	for k := range sum {
		if f := float64(k) * 16000 / 512; f > first && f < last && math.Abs(sum[k]-1) > 1e-9 {
			t.Errorf("bin %d (%.1f Hz): weights sum to %g", k, f, sum[k])
		}
	}
}

func TestResampleIdentity(t *testing.T) {
	x := noise(1000, 7)
	y := Resample(x, 16000, 16000)
	if !slices.Equal(x, y) {
		t.Fatal("from == to changed the samples")
	}
	y[0] = 99
	if x[0] == 99 {
		t.Fatal("from == to returned the caller's slice")
	}
	if got := Resample(nil, 44100, 16000); len(got) != 0 {
		t.Fatalf("no samples gave %d", len(got))
	}
}

func TestResampleLength(t *testing.T) {
	for _, c := range [][4]int{{44100, 44100, 16000, 16000}, {1, 44100, 16000, 1}, {441, 44100, 16000, 160},
		{442, 44100, 16000, 161}, {16000, 16000, 24000, 24000}, {1, 16000, 24000, 2}, {3, 48000, 16000, 1}} {
		if got := ResampledLength(c[0], c[1], c[2]); got != c[3] {
			t.Errorf("ResampledLength(%d, %d, %d) = %d, want %d", c[0], c[1], c[2], got, c[3])
		}
		if got := len(Resample(make([]float32, c[0]), c[1], c[2])); got != c[3] {
			t.Errorf("Resample of %d samples %d -> %d gave %d", c[0], c[1], c[2], got)
		}
	}
}

func TestResampleKeepsFrequency(t *testing.T) {
	// A tone comes out as the same tone at the new rate, to 1e-3 away from the zero-padded ends
	// (the pass band is flat to 0.1 % up to about a quarter of the lower rate), and a constant
	// stays constant.
	for _, c := range [][3]float64{{44100, 16000, 440}, {48000, 24000, 1000}, {22050, 24000, 300},
		{16000, 24000, 2500}, {32000, 16000, 3000}, {44100, 24000, 5000}} {
		from, to, f := int(c[0]), int(c[1]), c[2]
		n := from / 2
		y := Resample(tone(f, n, from, 0.5, 0.3), from, to)
		want := tone(f, len(y), to, 0.5, 0.3)
		ones := make([]float32, n)
		for i := range ones {
			ones[i] = 1
		}
		dc := Resample(ones, from, to)
		worst, worstDC := 0.0, 0.0
		for i := len(y) / 10; i < len(y)*9/10; i++ {
			worst = math.Max(worst, math.Abs(float64(y[i]-want[i])))
			worstDC = math.Max(worstDC, math.Abs(float64(dc[i]-1)))
		}
		if worst > 1e-3 || worstDC > 2e-3 {
			t.Errorf("%d -> %d, %g Hz: off by %.3g (tone), %.3g (constant)", from, to, f, worst, worstDC)
		}
	}
	// Above the new Nyquist rate a tone is filtered out rather than folded down.
	y := Resample(tone(10000, 48000, 48000, 0.5, 0.3), 48000, 16000)
	for i := 1600; i < len(y)-1600; i++ {
		if math.Abs(float64(y[i])) > 0.005 {
			t.Fatalf("a 10 kHz tone at 16 kHz: sample %d is %g", i, y[i])
		}
	}
}

func TestWhisperLogMelTone(t *testing.T) {
	// The loudest channel in a middle frame is the one centred nearest the tone, values span at
	// most 2 (the 80 dB floor, scaled by 1/4), and the maximum is the floor plus 2.
	x := tone(440, 4000, 16000, 0.5, 0.3)
	for i, v := range tone(3000, 4000, 16000, 0.1, 0.3) {
		x[i] += v
	}
	feats, frames := WhisperLogMel(x)
	best := 0
	for m := 0; m < WhisperBins; m++ {
		if feats[m*frames+10] > feats[best*frames+10] {
			best = m
		}
	}
	if c := slaneyEdge(best+1, WhisperBins, 8000); math.Abs(c-440) > 40 {
		t.Errorf("loudest channel %d is centred at %.0f Hz, not near 440 Hz", best, c)
	}
	lo, hi := slices.Min(feats), slices.Max(feats)
	if hi-lo > 2+1e-6 {
		t.Errorf("values span %g, more than the floor allows", hi-lo)
	}
	// Silence: every value sits at the floor, (-10 + 4) / 4.
	silent, _ := WhisperLogMel(make([]float32, 1600))
	for _, v := range silent {
		if v != -1.5 {
			t.Fatalf("silence gave %g, want -1.5", v)
		}
	}
}

func TestFlowMelSilenceAndTone(t *testing.T) {
	// Silence: the 1e-9 inside the root is far under the 1e-5 floor after the filterbank.
	silent, _ := FlowMel(make([]float32, 4800))
	for _, v := range silent {
		if v != float32(math.Log(1e-5)) {
			t.Fatalf("silence gave %g, want log(1e-5)", v)
		}
	}
	mel, frames := FlowMel(tone(1000, 24000, 24000, 0.5, 0.3))
	row := mel[(frames/2)*FlowBins : (frames/2+1)*FlowBins]
	best := slices.Index(row, slices.Max(row))
	if c := slaneyEdge(best+1, FlowBins, 12000); math.Abs(c-1000) > 80 {
		t.Errorf("loudest bin %d is centred at %.0f Hz, not near 1 kHz", best, c)
	}
}

func TestKaldiFbankScaleAndSilence(t *testing.T) {
	// Digital silence sits at log(float32 epsilon); doubling the wave adds log 4 to every bin
	// above the floor (a power spectrum), which is what would go wrong with a 32768 scaling.
	silent, _ := KaldiFbank(make([]float32, 1600))
	for _, v := range silent {
		if v != float32(math.Log(float32Eps)) {
			t.Fatalf("silence gave %g, want log(eps)", v)
		}
	}
	x := noise(8000, 3)
	a, _ := KaldiFbank(x)
	for i := range x {
		x[i] *= 2
	}
	b, _ := KaldiFbank(x)
	for i := range a {
		if d := float64(b[i]-a[i]) - math.Log(4); math.Abs(d) > 1e-5 {
			t.Fatalf("value %d: doubling added %g, want log 4", i, float64(b[i]-a[i]))
		}
	}
}

func TestSubtractMean(t *testing.T) {
	feats, frames := KaldiFbank(noise(16000, 5))
	orig := slices.Clone(feats)
	SubtractMean(feats, FbankBins)
	for b := 0; b < FbankBins; b++ {
		var s, so float64
		for f := 0; f < frames; f++ {
			s += float64(feats[f*FbankBins+b])
			so += float64(orig[f*FbankBins+b])
		}
		if math.Abs(s/float64(frames)) > 1e-5 {
			t.Errorf("bin %d: mean %g after", b, s/float64(frames))
		}
		if d := float64(orig[b]-feats[b]) - so/float64(frames); math.Abs(d) > 1e-5 {
			t.Errorf("bin %d: subtracted %g, want its mean %g", b, float64(orig[b]-feats[b]), so/float64(frames))
		}
	}
	SubtractMean(nil, FbankBins) // no frames: nothing to do
}

func TestAlign(t *testing.T) {
	const bins = 3
	mel := make([]float32, 101*bins)
	for i := range mel {
		mel[i] = float32(i)
	}
	seq := func(n int) []int64 {
		s := make([]int64, n)
		for i := range s {
			s[i] = int64(i)
		}
		return s
	}
	for _, c := range [][3]int{{60, 101, 50}, {40, 101, 40}, {50, 101, 50}, {0, 101, 0}, {2, 1, 0}, {5, 0, 0}} {
		toks, m := Align(seq(c[0]), mel[:c[1]*bins], bins)
		if len(toks) != c[2] || len(m) != 2*c[2]*bins || !slices.Equal(m, mel[:2*c[2]*bins]) ||
			!slices.Equal(toks, seq(c[2])) {
			t.Errorf("%d tokens, %d frames: got %d tokens, %d values; want %d tokens", c[0], c[1], len(toks), len(m), c[2])
		}
		if cap(toks) != len(toks) || cap(m) != len(m) {
			t.Errorf("%d tokens, %d frames: results can grow into the arguments", c[0], c[1])
		}
	}
}

// BenchmarkPrompt is the work of one 10 s upload at 44.1 kHz: both resamplings and the three
// feature sets.
func BenchmarkPrompt(b *testing.B) {
	x := noise(441000, 9)
	for b.Loop() {
		x16, x24 := Resample(x, 44100, 16000), Resample(x, 44100, 24000)
		WhisperLogMel(x16)
		FlowMel(x24)
		f, _ := KaldiFbank(x16)
		SubtractMean(f, FbankBins)
	}
}
