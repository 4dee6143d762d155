package clipfeat

import "math"

// Resampling kernel: torchaudio.functional.resample's defaults (sinc_interp_hann).
const (
	lowpassWidth = 6    // zero crossings of the sinc on each side
	rolloff      = 0.99 // cut-off as a fraction of the lower Nyquist rate
)

// ResampledLength is the number of samples Resample returns for n samples: ceil(n * to / from).
func ResampledLength(n, from, to int) int {
	g := gcd(from, to)
	a, b := from/g, to/g
	return (n*b + a - 1) / a
}

// Resample converts x from one sample rate to another with a Hann-windowed sinc of 6 zero
// crossings cut off at 0.99 of the lower Nyquist rate: torchaudio.functional.resample's default,
// so that prompts match those made by the exporter or by CosyVoice itself. Input beyond the ends
// counts as zero. from == to returns a copy.
func Resample(x []float32, from, to int) []float32 {
	if from <= 0 || to <= 0 {
		panic("clipfeat: sample rates must be positive")
	}
	if from == to {
		return append([]float32(nil), x...)
	}
	g := gcd(from, to)
	a, b := from/g, to/g // b outputs for every a inputs
	cutoff := float64(min(a, b)) * rolloff
	half := int(math.Ceil(lowpassWidth * float64(a) / cutoff))
	taps := 2*half + a

	// kernel[j] gives output phase j (at input time block*a + j*a/b) from inputs
	// block*a - half .. block*a + a + half - 1. torchaudio rounds it to float32 before convolving.
	kernel := make([]float64, b*taps)
	for j := 0; j < b; j++ {
		phase := -float64(j) / float64(b)
		for k := 0; k < taps; k++ {
			u := (phase + float64(k-half)/float64(a)) * cutoff
			u = math.Max(-lowpassWidth, math.Min(lowpassWidth, u))
			w := math.Cos(u * math.Pi / (2 * lowpassWidth))
			arg := u * math.Pi
			s := 1.0
			if arg != 0 {
				s = math.Sin(arg) / arg
			}
			kernel[j*taps+k] = float64(float32(s * w * w * cutoff / float64(a)))
		}
	}

	n := len(x)
	out := make([]float32, ResampledLength(n, from, to))
	for i := range out {
		block, j := i/b, i%b
		start := block*a - half // first input sample under the kernel
		kr := kernel[j*taps : (j+1)*taps]
		k0, k1 := max(0, -start), min(taps, n-start)
		var acc float64
		for k := k0; k < k1; k++ {
			acc += kr[k] * float64(x[start+k])
		}
		out[i] = float32(acc)
	}
	return out
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
