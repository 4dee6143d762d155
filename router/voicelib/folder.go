// Package voicelib is the library of cloned voices: one folder per voice on disk, in the format
// of an export's voice folders (docs/pipeline.md, "Voices"), and a bounded cache of the prompts
// loaded from them. It knows no model family: it stores the tts.VoicePrompt values instances
// compute.
package voicelib

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/voxmux/voxmux/tts"
	"github.com/voxmux/voxmux/tts/voicefile"
)

// Meta is what the library tells of a voice besides its prompt.
type Meta struct {
	Name      string    `json:"name"`
	Text      string    `json:"text"` // the clip's transcript
	CreatedAt time.Time `json:"created_at"`
	Consent   string    `json:"consent"`
	// SampleRate and Seconds describe the uploaded clip.
	SampleRate int     `json:"sample_rate"`
	Seconds    float64 `json:"seconds"`
	Tokens     int     `json:"tokens"` // speech tokens of the prompt
}

// writeFolder writes a voice's files into dir (which exists and is empty), each synced, so that
// a rename of dir publishes complete files.
func writeFolder(dir string, p *tts.VoicePrompt, m Meta) error {
	f := voicefile.File{Text: p.Text, SpeechTokens: p.SpeechTokens, Transcript: m.Text, CreatedAt: m.CreatedAt.UTC(), Consent: m.Consent,
		Source: voicefile.Source{SampleRate: m.SampleRate, Seconds: m.Seconds}}
	if f.SpeechTokens == nil {
		f.SpeechTokens = []int64{}
	}
	if len(p.Mel) > 0 {
		f.Mel, f.MelBins = voicefile.MelName, p.MelBins
		if err := writeSynced(filepath.Join(dir, voicefile.MelName), voicefile.EncodeFloats(p.Mel)); err != nil {
			return err
		}
	}
	if len(p.Embedding) > 0 {
		f.Embedding = voicefile.EmbeddingName
		if err := writeSynced(filepath.Join(dir, voicefile.EmbeddingName), voicefile.EncodeFloats(p.Embedding)); err != nil {
			return err
		}
	}
	y, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode %s: %w", voicefile.YAMLName, err)
	}
	return writeSynced(filepath.Join(dir, voicefile.YAMLName), y)
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return f.Close()
}

// readMeta reads a voice folder's voice.yaml.
func readMeta(dir, name string) (voicefile.File, Meta, error) {
	file := filepath.Join(dir, voicefile.YAMLName)
	data, err := os.ReadFile(file)
	if err != nil {
		return voicefile.File{}, Meta{}, err
	}
	var f voicefile.File
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.Strict()); err != nil {
		return voicefile.File{}, Meta{}, fmt.Errorf("%s: %s", file, yaml.FormatError(err, false, true))
	}
	if f.Mel != "" && f.MelBins <= 0 {
		return voicefile.File{}, Meta{}, fmt.Errorf("%s: mel_bins: is required with mel", file)
	}
	text := f.Transcript
	if text == "" { // a voice copied from an export
		text = f.Text
	}
	return f, Meta{Name: name, Text: text, CreatedAt: f.CreatedAt, Consent: f.Consent, SampleRate: f.Source.SampleRate,
		Seconds: f.Source.Seconds, Tokens: len(f.SpeechTokens)}, nil
}

// readPrompt reads a whole voice folder into a prompt.
func readPrompt(dir, name string) (*tts.VoicePrompt, Meta, error) {
	f, m, err := readMeta(dir, name)
	if err != nil {
		return nil, Meta{}, err
	}
	p := &tts.VoicePrompt{Text: f.Text, SpeechTokens: f.SpeechTokens, MelBins: f.MelBins}
	if f.Mel != "" {
		if p.Mel, err = readFloats(dir, f.Mel); err != nil {
			return nil, Meta{}, fmt.Errorf("mel: %w", err)
		}
		if len(p.Mel)%f.MelBins != 0 {
			return nil, Meta{}, fmt.Errorf("mel: %d values are not whole frames of mel_bins %d", len(p.Mel), f.MelBins)
		}
	}
	if f.Embedding != "" {
		if p.Embedding, err = readFloats(dir, f.Embedding); err != nil {
			return nil, Meta{}, fmt.Errorf("embedding: %w", err)
		}
	}
	return p, m, nil
}

func readFloats(dir, name string) ([]float32, error) {
	if filepath.IsAbs(name) || name != filepath.Base(name) {
		// A library voice keeps its files in its folder; a path elsewhere is not followed.
		return nil, fmt.Errorf("%q is not a file of the voice's folder", name)
	}
	return voicefile.ReadFloats(filepath.Join(dir, name))
}
