// Package library is the library of cloned voices: one folder per voice on disk, in the format
// of an export's voice folders (docs/pipeline.md, "Voices"), and a bounded cache of the prompts
// loaded from them. It knows no model family: it stores the tts.VoicePrompt values instances
// compute.
package library

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/voxmux/voxmux/tts"
	"github.com/voxmux/voxmux/tts/promptfile"
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
	// LatentFrames are the prompt's latent frames (a latent-space model's voice).
	LatentFrames int `json:"latent_frames,omitempty"`
	// Family is the model family that made the voice (tts.PromptFamily of its files: speech
	// tokens are the staged family's, latents voxcpm's), the only one whose models speak in it.
	Family string `json:"family"`
}

// writeFolder writes a voice's files into dir (which exists and is empty), each synced, so that
// a rename of dir publishes complete files.
func writeFolder(dir string, p *tts.VoicePrompt, m Meta) error {
	f, files, err := promptfile.FromPrompt(p)
	if err != nil {
		return fmt.Errorf("the voice prompt: %w", err)
	}
	f.Transcript, f.CreatedAt, f.Consent = m.Text, m.CreatedAt.UTC(), m.Consent
	f.Source = promptfile.Source{SampleRate: m.SampleRate, Seconds: m.Seconds}
	for _, ff := range files {
		if err := writeSynced(filepath.Join(dir, ff.Name), promptfile.EncodeFloats(ff.Values)); err != nil {
			return err
		}
	}
	y, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode %s: %w", promptfile.YAMLName, err)
	}
	return writeSynced(filepath.Join(dir, promptfile.YAMLName), y)
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
func readMeta(dir, name string) (promptfile.File, Meta, error) {
	file := filepath.Join(dir, promptfile.YAMLName)
	data, err := os.ReadFile(file)
	if err != nil {
		return promptfile.File{}, Meta{}, err
	}
	f, err := promptfile.Parse(data, file)
	if err != nil {
		return promptfile.File{}, Meta{}, err
	}
	if err := f.Check(); err != nil {
		return promptfile.File{}, Meta{}, fmt.Errorf("%s: %w", file, err)
	}
	text := f.Transcript
	if text == "" { // a voice copied from an export
		text = f.Text
	}
	m := Meta{Name: name, Text: text, CreatedAt: f.CreatedAt, Consent: f.Consent, SampleRate: f.Source.SampleRate,
		Seconds: f.Source.Seconds, Tokens: len(f.SpeechTokens), Family: tts.PromptFamily(len(f.SpeechTokens) > 0, f.Latents != "")}
	if f.Latents != "" && f.Latents == filepath.Base(f.Latents) {
		// The file's size tells its frames without reading it; Prompt checks them whole.
		if st, err := os.Stat(filepath.Join(dir, f.Latents)); err == nil {
			m.LatentFrames = int(st.Size() / 4 / int64(f.LatentDim))
		}
	}
	return f, m, nil
}

// readPrompt reads a whole voice folder into a prompt.
func readPrompt(dir, name string) (*tts.VoicePrompt, Meta, error) {
	f, m, err := readMeta(dir, name)
	if err != nil {
		return nil, Meta{}, err
	}
	p, err := f.Prompt(dir)
	if err != nil {
		return nil, Meta{}, err
	}
	return p, m, nil
}
