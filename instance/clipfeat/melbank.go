package clipfeat

import "math"

// filter is one triangle of a filterbank: weights for FFT bins start .. start+len(w)-1, zero
// elsewhere, so that applying a bank costs the triangles' widths rather than bins x filters.
type filter struct {
	start int
	w     []float64
}

func (f filter) apply(spec []float64) float64 {
	var s float64
	for i, w := range f.w {
		s += w * spec[f.start+i]
	}
	return s
}

// sparse keeps the nonzero span of a dense row.
func sparse(row []float64) filter {
	lo, hi := 0, len(row)
	for lo < hi && row[lo] == 0 {
		lo++
	}
	for hi > lo && row[hi-1] == 0 {
		hi--
	}
	return filter{start: lo, w: row[lo:hi]}
}

// slaneyHzToMel is Slaney's mel scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above.
func slaneyHzToMel(f float64) float64 {
	if f < 1000 {
		return f / (200.0 / 3)
	}
	return 15 + math.Log(f/1000)/(math.Log(6.4)/27)
}

func slaneyMelToHz(m float64) float64 {
	if m < 15 {
		return m * (200.0 / 3)
	}
	return 1000 * math.Exp(math.Log(6.4)/27*(m-15))
}

// slaneyFilters is librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax, htk=False, norm='slaney'),
// which Whisper and matcha use: triangles evenly spaced on Slaney's scale, each of area 1 in Hz.
// Weights are rounded to float32 because both use a float32 filterbank.
func slaneyFilters(sr, nFFT, nMels int, fmin, fmax float64) []filter {
	nBins := nFFT/2 + 1
	mlo, mhi := slaneyHzToMel(fmin), slaneyHzToMel(fmax)
	edges := make([]float64, nMels+2)
	step := (mhi - mlo) / float64(nMels+1)
	for i := range edges {
		edges[i] = slaneyMelToHz(mlo + float64(i)*step)
	}
	edges[nMels+1] = slaneyMelToHz(mhi) // linspace ends exactly on its stop
	out := make([]filter, nMels)
	for m := range out {
		lo, mid, hi := edges[m], edges[m+1], edges[m+2]
		norm := 2 / (hi - lo)
		row := make([]float64, nBins)
		for k := range row {
			f := float64(k) * float64(sr) / float64(nFFT)
			w := math.Max(0, math.Min((f-lo)/(mid-lo), (hi-f)/(hi-mid)))
			row[k] = float64(float32(w * norm))
		}
		out[m] = sparse(row)
	}
	return out
}

// kaldiMelScale is the HTK mel scale Kaldi uses.
func kaldiMelScale(f float64) float64 { return 1127 * math.Log(1+f/700) }

// kaldiFilters is Kaldi's MelBanks (as torchaudio.compliance.kaldi.get_mel_banks without VTLN):
// triangles of peak 1, evenly spaced on the HTK mel scale between lowFreq and highFreq, over FFT
// bins 0 .. nFFT/2-1 (the Nyquist bin gets no weight).
func kaldiFilters(sr, nFFT, nMels int, lowFreq, highFreq float64) []filter {
	binWidth := float64(sr) / float64(nFFT)
	mlo, mhi := kaldiMelScale(lowFreq), kaldiMelScale(highFreq)
	delta := (mhi - mlo) / float64(nMels+1)
	out := make([]filter, nMels)
	for m := range out {
		left := mlo + float64(m)*delta
		centre := mlo + float64(m+1)*delta
		right := mlo + float64(m+2)*delta
		row := make([]float64, nFFT/2+1)
		for k := 0; k < nFFT/2; k++ {
			mel := kaldiMelScale(binWidth * float64(k))
			row[k] = math.Max(0, math.Min((mel-left)/(centre-left), (right-mel)/(right-centre)))
		}
		out[m] = sparse(row)
	}
	return out
}
