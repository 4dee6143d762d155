package piper

import (
	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/tts"
)

// Family serves Piper (VITS) voices: an .onnx with its .onnx.json, an .onnx.json, a folder of
// voices, or a manifest with kind: piper (docs/piper.md).
type Family struct{}

var _ instance.Family = Family{}

// Claims reports whether path names Piper voices.
func (Family) Claims(path string) bool { return isPiperPath(path) }

// Describe reads the voices at path and checks each against its graph, loading none.
func (Family) Describe(path string) (tts.Description, error) {
	m, err := loadPiperModel(path)
	if err != nil {
		return tts.Description{}, err
	}
	return m.description(), nil
}

// Open starts espeak-ng and ONNX Runtime for the voices; each voice's session loads on its first
// request.
func (Family) Open(cfg tts.LoadConfig) (instance.Runner, tts.Description, error) {
	r, d, err := openPiper(cfg)
	if err != nil {
		return nil, tts.Description{}, err
	}
	return r, d, nil
}
