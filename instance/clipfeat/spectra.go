package clipfeat

import (
	"math"

	"gonum.org/v1/gonum/dsp/fourier"
)

// Whisper's front end (speech_tokenizer_v3.onnx's input).
const (
	whisperRate = 16000
	whisperNFFT = 400
	whisperHop  = 160
	// WhisperBins is the number of mel channels WhisperLogMel gives.
	WhisperBins = 128
)

// The flow's mel (matcha's mel_spectrogram with CosyVoice3's settings).
const (
	flowRate = 24000
	flowNFFT = 1920
	flowHop  = 480
	flowFMax = 12000
	// FlowBins is the number of mel channels FlowMel gives.
	FlowBins = 80
)

// Kaldi fbank with CosyVoice's arguments (campplus's input).
const (
	fbankRate     = 16000
	fbankWindow   = 400 // 25 ms
	fbankShift    = 160 // 10 ms
	fbankNFFT     = 512 // the window rounded up to a power of two
	fbankPreemph  = 0.97
	fbankLowFreq  = 20
	fbankHighFreq = fbankRate / 2 // high_freq 0 means the Nyquist rate
	// FbankBins is the number of mel bins KaldiFbank gives.
	FbankBins = 80
)

// float32's machine epsilon: Kaldi's (and torchaudio's) floor before the log.
const float32Eps = 1.1920928955078125e-07

// WhisperFrames is the number of frames WhisperLogMel gives for n samples: a centred STFT has
// 1 + n/hop frames and Whisper drops the last.
func WhisperFrames(n int) int { return n / whisperHop }

// FlowFrames is the number of frames FlowMel gives for n samples: reflect padding of
// (n_fft-hop)/2 on each side and an uncentred STFT come to n/hop.
func FlowFrames(n int) int { return n / flowHop }

// FbankFrames is the number of frames KaldiFbank gives for n samples: whole windows only
// (snip_edges), none for a clip shorter than one window.
func FbankFrames(n int) int {
	if n < fbankWindow {
		return 0
	}
	return 1 + (n-fbankWindow)/fbankShift
}

// WhisperLogMel is Whisper's log_mel_spectrogram with 128 mel channels, as
// speech_tokenizer_v3.onnx takes it: channel-major [128][frames] (its [1, 128, T] input). Periodic
// Hann window of 400, hop 160, centred with reflect padding, power spectrum, the last frame
// dropped, Slaney mel filters, log10 floored at 1e-10, values raised to at least 8 below the
// clip's maximum (an 80 dB range), then (x + 4) / 4.
func WhisperLogMel(pcm16k []float32) (feats []float32, frames int) {
	frames = WhisperFrames(len(pcm16k))
	if frames == 0 {
		return nil, 0
	}
	filters := slaneyFilters(whisperRate, whisperNFFT, WhisperBins, 0, whisperRate/2)
	logm := make([]float64, WhisperBins*frames)
	peak := math.Inf(-1)
	stft(pcm16k, whisperNFFT, whisperHop, whisperNFFT/2, frames, func(t int, re, im []float64) {
		power := re // reused: the spectrum is not needed after this
		for k := range re {
			power[k] = re[k]*re[k] + im[k]*im[k]
		}
		for m, f := range filters {
			v := math.Log10(math.Max(f.apply(power), 1e-10))
			logm[m*frames+t] = v
			peak = math.Max(peak, v)
		}
	})
	feats = make([]float32, len(logm))
	for i, v := range logm {
		feats[i] = float32((math.Max(v, peak-8) + 4) / 4)
	}
	return feats, frames
}

// FlowMel is the flow's prompt mel, matcha's mel_spectrogram as CosyVoice3 configures it:
// frame-major [frames][80] (the voice file's layout). The clip is reflect-padded by
// (n_fft-hop)/2 = 720 on each side, then an uncentred STFT (n_fft = window = 1920, periodic Hann,
// hop 480), magnitude sqrt(re² + im² + 1e-9), Slaney mel filters from 0 to 12 kHz, natural log
// floored at 1e-5.
func FlowMel(pcm24k []float32) (mel []float32, frames int) {
	frames = FlowFrames(len(pcm24k))
	if frames == 0 {
		return nil, 0
	}
	filters := slaneyFilters(flowRate, flowNFFT, FlowBins, 0, flowFMax)
	mel = make([]float32, frames*FlowBins)
	// An uncentred STFT of the padded clip is a centred one, without padding of its own, whose
	// frame t starts at sample t*hop - pad of the clip.
	stft(pcm24k, flowNFFT, flowHop, (flowNFFT-flowHop)/2, frames, func(t int, re, im []float64) {
		mag := re
		for k := range re {
			mag[k] = math.Sqrt(re[k]*re[k] + im[k]*im[k] + 1e-9)
		}
		row := mel[t*FlowBins : (t+1)*FlowBins]
		for m, f := range filters {
			row[m] = float32(math.Log(math.Max(f.apply(mag), 1e-5)))
		}
	})
	return mel, frames
}

// stft calls frame(t, re, im) with the one-sided spectrum of each of frames periodic-Hann-windowed
// frames of n samples, frame t starting at sample t*hop - pad of x, where samples outside x are
// reflected about its ends (reflect padding). re and im are only valid during the call.
func stft(x []float32, n, hop, pad, frames int, frame func(t int, re, im []float64)) {
	window := make([]float64, n)
	for i := range window {
		window[i] = 0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(n))
	}
	fft := fourier.NewFFT(n)
	seg := make([]float64, n)
	coef := make([]complex128, n/2+1)
	re, im := make([]float64, n/2+1), make([]float64, n/2+1)
	for t := 0; t < frames; t++ {
		start := t*hop - pad
		for i := range seg {
			seg[i] = float64(x[reflect(start+i, len(x))]) * window[i]
		}
		fft.Coefficients(coef, seg)
		for k, c := range coef {
			re[k], im[k] = real(c), imag(c)
		}
		frame(t, re, im)
	}
}

// reflect maps an index outside [0, n) back into it by reflecting about the end samples (numpy
// and torch's "reflect", the end sample not repeated); a pad longer than the clip reflects again.
func reflect(i, n int) int {
	if i >= 0 && i < n {
		return i
	}
	if n == 1 {
		return 0
	}
	p := 2 * (n - 1)
	i %= p
	if i < 0 {
		i += p
	}
	if i >= n {
		i = p - i
	}
	return i
}

// KaldiFbank is torchaudio.compliance.kaldi.fbank(wave, num_mel_bins=80, dither=0,
// sample_frequency=16000), CosyVoice's speaker-embedding features, frame-major [frames][80].
// The wave is used as given, in [-1, 1] as CosyVoice loads it. Each 25 ms frame (10 ms shift,
// whole frames only) has its mean removed, is pre-emphasised by 0.97 (its first sample against
// itself), multiplied by Povey's window (Hann to the power 0.85), zero-padded to 512; its power
// spectrum goes through 80 triangular bins on the HTK mel scale from 20 Hz to 8 kHz, and the log
// is floored at float32's epsilon. campplus takes it less its mean over time: see SubtractMean.
func KaldiFbank(pcm16k []float32) (feats []float32, frames int) {
	frames = FbankFrames(len(pcm16k))
	if frames == 0 {
		return nil, 0
	}
	filters := kaldiFilters(fbankRate, fbankNFFT, FbankBins, fbankLowFreq, fbankHighFreq)
	window := make([]float64, fbankWindow)
	for i := range window {
		hann := 0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(fbankWindow-1))
		window[i] = math.Pow(hann, 0.85)
	}
	fft := fourier.NewFFT(fbankNFFT)
	seg := make([]float64, fbankNFFT) // the tail stays zero: the padding
	coef := make([]complex128, fbankNFFT/2+1)
	power := make([]float64, fbankNFFT/2+1)
	feats = make([]float32, frames*FbankBins)
	for t := 0; t < frames; t++ {
		w := seg[:fbankWindow]
		var mean float64
		for i := range w {
			w[i] = float64(pcm16k[t*fbankShift+i])
			mean += w[i]
		}
		mean /= fbankWindow
		for i := range w {
			w[i] -= mean
		}
		for i := len(w) - 1; i > 0; i-- {
			w[i] -= fbankPreemph * w[i-1]
		}
		w[0] -= fbankPreemph * w[0]
		for i := range w {
			w[i] *= window[i]
		}
		fft.Coefficients(coef, seg)
		for k, c := range coef {
			power[k] = real(c)*real(c) + imag(c)*imag(c)
		}
		row := feats[t*FbankBins : (t+1)*FbankBins]
		for m, f := range filters {
			row[m] = float32(math.Log(math.Max(f.apply(power), float32Eps)))
		}
	}
	return feats, frames
}

// SubtractMean removes from each of the bins columns of a frame-major feats its mean over
// frames, in place: the normalization CosyVoice applies to the fbank before campplus.
func SubtractMean(feats []float32, bins int) {
	if bins <= 0 || len(feats) == 0 {
		return
	}
	frames := len(feats) / bins
	for b := 0; b < bins; b++ {
		var s float64
		for t := 0; t < frames; t++ {
			s += float64(feats[t*bins+b])
		}
		mean := s / float64(frames)
		for t := 0; t < frames; t++ {
			feats[t*bins+b] = float32(float64(feats[t*bins+b]) - mean)
		}
	}
}

// Align trims speech tokens and a frame-major mel of bins channels to CosyVoice's two mel frames
// per token: n = min(frames/2, len(tokens)), keeping n tokens and 2n frames. The results share
// the arguments' storage, with their capacity cut so that appending to one cannot overwrite it.
func Align(tokens []int64, mel []float32, bins int) ([]int64, []float32) {
	if bins <= 0 {
		return tokens[:0:0], mel[:0:0]
	}
	n := min(len(mel)/bins/2, len(tokens))
	return tokens[:n:n], mel[: 2*n*bins : 2*n*bins]
}
