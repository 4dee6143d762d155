// Package voicefile is the on-disk form of a voice prompt (docs/pipeline.md, "Voices"): a
// folder's voice.yaml and the little-endian float32 files it names. An export's voices, the
// staged engine and the router's voice library read and write the same folders, so one folder
// can move between them.
package voicefile

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"time"
)

// The files of a voice's folder.
const (
	YAMLName      = "voice.yaml"
	MelName       = "mel.f32"
	EmbeddingName = "embedding.f32"
)

// File is voice.yaml. The first keys are the prompt's; the rest record where a library voice
// came from, and an export's voices leave them out.
type File struct {
	Text         string  `yaml:"text"`
	SpeechTokens []int64 `yaml:"speech_tokens,flow"`
	Mel          string  `yaml:"mel,omitempty"`
	MelBins      int     `yaml:"mel_bins,omitempty"`
	Embedding    string  `yaml:"embedding,omitempty"`

	Transcript string    `yaml:"transcript"` // the clip's, as uploaded; Text is the model's prompt text
	CreatedAt  time.Time `yaml:"created_at"`
	Consent    string    `yaml:"consent"`
	Source     Source    `yaml:"source"`
}

// Source describes the clip a library voice was made from.
type Source struct {
	SampleRate int     `yaml:"sample_rate"`
	Seconds    float64 `yaml:"seconds"`
}

// ReadFloats reads a file of little-endian float32 values (a voice's mel or embedding, a noise
// table).
func ReadFloats(path string) ([]float32, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(data)%4 != 0 {
		return nil, fmt.Errorf("%s: %d bytes is not a whole number of float32 values", path, len(data))
	}
	out := make([]float32, len(data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return out, nil
}

// EncodeFloats is v as ReadFloats reads it.
func EncodeFloats(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
