// Package clipfeat computes the inputs of a CosyVoice3 zero-shot voice prompt from a reference
// clip, in pure Go, as scripts/cosyvoice3/voice.py and CosyVoice's own frontend do:
//
//	speech tokens   16 kHz -> WhisperLogMel [128][T]       -> speech_tokenizer_v3.onnx
//	embedding       16 kHz -> KaldiFbank, SubtractMean      -> campplus.onnx
//	prompt mel      24 kHz -> FlowMel [frames][80]          (the voice file's mel)
//
// then Align trims the tokens and the mel to two mel frames per token. Resample brings a clip
// to 16 and 24 kHz with torchaudio's default kernel. Samples are float32 in [-1, 1], as
// torchaudio.load gives them; nothing here rescales by 32768.
//
// Spectra are computed in float64 and returned as float32.
//
// ClipSpeech checks a reference clip and trims its silence for every family that makes voices
// from clips.
package clipfeat
