// Package promptfile is the on-disk form of a voice prompt (docs/pipeline.md, "Voices"): a
// folder's voice.yaml and the little-endian float32 files it names. An export's voices, the
// staged engine and the router's voice library read and write the same folders, so one folder
// can move between them.
package promptfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/voxmux/voxmux/tts"
)

// The files of a voice's folder.
const (
	YAMLName      = "voice.yaml"
	MelName       = "mel.f32"
	EmbeddingName = "embedding.f32"
	LatentsName   = "latents.f32"
)

// File is voice.yaml. The first keys are the prompt's (tts.VoicePrompt's fields; each family's
// voices have its own, the others absent); the rest record where a library voice came from, and
// an export's voices leave them out.
type File struct {
	Text         string  `yaml:"text"`
	SpeechTokens []int64 `yaml:"speech_tokens,flow,omitempty"`
	Mel          string  `yaml:"mel,omitempty"`
	MelBins      int     `yaml:"mel_bins,omitempty"`
	Embedding    string  `yaml:"embedding,omitempty"`
	// Latents names the latent-space model's clip latents, frame-major [frames][LatentDim].
	Latents   string `yaml:"latents,omitempty"`
	LatentDim int    `yaml:"latent_dim,omitempty"`

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

// FloatFile is one of a voice folder's float32 files.
type FloatFile struct {
	Name   string
	Values []float32
}

// FromPrompt is p as a voice folder: voice.yaml's prompt keys (the caller sets the others) and
// the float32 files they name. Empty fields are left out, so a folder holds one family's keys. A
// prompt that would not read back (Check, Prompt) is an error.
func FromPrompt(p *tts.VoicePrompt) (File, []FloatFile, error) {
	f := File{Text: p.Text, SpeechTokens: p.SpeechTokens}
	var files []FloatFile
	if len(p.Mel) > 0 {
		f.Mel, f.MelBins = MelName, p.MelBins
		files = append(files, FloatFile{MelName, p.Mel})
	}
	if len(p.Embedding) > 0 {
		f.Embedding = EmbeddingName
		files = append(files, FloatFile{EmbeddingName, p.Embedding})
	}
	if len(p.Latents) > 0 {
		f.Latents, f.LatentDim = LatentsName, p.LatentDim
		files = append(files, FloatFile{LatentsName, p.Latents})
	}
	errs := []error{f.Check()}
	if f.MelBins > 0 && len(p.Mel)%f.MelBins != 0 {
		errs = append(errs, fmt.Errorf("mel: %d values are not whole frames of mel_bins %d", len(p.Mel), f.MelBins))
	}
	if f.LatentDim > 0 && len(p.Latents)%f.LatentDim != 0 {
		errs = append(errs, fmt.Errorf("latents: %d values are not whole frames of latent_dim %d", len(p.Latents), f.LatentDim))
	}
	if err := errors.Join(errs...); err != nil {
		return File{}, nil, err
	}
	return f, files, nil
}

// Parse reads a voice.yaml (path names it in errors); an unknown key is an error. It checks only
// the keys' own form; Check checks that they make a prompt.
func Parse(data []byte, path string) (File, error) {
	var f File
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.Strict()); err != nil {
		return File{}, fmt.Errorf("%s: %s", path, yaml.FormatError(err, false, true))
	}
	return f, nil
}

// Check reports whether f describes a voice prompt any family could speak in: speech tokens or
// latents, each file with its size key (mel with mel_bins, latents with latent_dim). What a
// model further needs (a token family's mel and embedding, the sizes it was built with) is the
// model's to check.
func (f *File) Check() error {
	var errs []error
	if f.Mel != "" && f.MelBins <= 0 {
		errs = append(errs, errors.New("mel_bins: is required with mel"))
	}
	if f.Latents != "" && f.LatentDim <= 0 {
		errs = append(errs, errors.New("latent_dim: is required with latents"))
	}
	if len(f.SpeechTokens) == 0 && f.Latents == "" {
		errs = append(errs, errors.New("holds no prompt: neither speech_tokens nor latents"))
	}
	return errors.Join(errs...)
}

// Prompt reads the prompt f describes, its float32 files from dir. A file name that is not a
// file of dir is refused: a voice keeps its files in its folder.
func (f *File) Prompt(dir string) (*tts.VoicePrompt, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	p := &tts.VoicePrompt{Text: f.Text, SpeechTokens: f.SpeechTokens, MelBins: f.MelBins, LatentDim: f.LatentDim}
	for _, x := range []struct {
		key, name string
		dst       *[]float32
		dimKey    string // the key of the values per frame; "": any count
		dim       int
	}{
		{"mel", f.Mel, &p.Mel, "mel_bins", f.MelBins},
		{"embedding", f.Embedding, &p.Embedding, "", 0},
		{"latents", f.Latents, &p.Latents, "latent_dim", f.LatentDim},
	} {
		if x.name == "" {
			continue
		}
		if filepath.IsAbs(x.name) || x.name != filepath.Base(x.name) {
			return nil, fmt.Errorf("%s: %q is not a file of the voice's folder", x.key, x.name)
		}
		v, err := ReadFloats(filepath.Join(dir, x.name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", x.key, err)
		}
		if x.dimKey != "" && len(v)%x.dim != 0 {
			return nil, fmt.Errorf("%s: %d values are not whole frames of %s %d", x.key, len(v), x.dimKey, x.dim)
		}
		*x.dst = v
	}
	return p, nil
}
