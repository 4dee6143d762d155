package piper

import (
	"slices"
	"strings"
)

// datasetAttribution is the credit a Piper voice dataset's licence asks software that generates
// audio with it to show, "" for a dataset that asks none or is not known here. The key is the
// "dataset" of the voice's .onnx.json, which piper_train writes into every voice config whether
// it comes from a Go module (with a MODEL_CARD and LICENSE beside it) or from the voices
// collection (without them); the MODEL_CARD only points at the dataset ("License: See URL"), and
// a module's LICENSE is its packager's, not the dataset's, so neither carries the credit.
func datasetAttribution(dataset string) string {
	switch dataset {
	case "jenny_dioco":
		// jenny-tts-dataset's licence: software, websites and voice interfaces that generate
		// audio with the voice must attribute it and call it "Jenny", where practical
		// "Jenny (Dioco)"; the generated clips need no attribution.
		return "Voice: Jenny (Dioco), from the jenny-tts-dataset (https://github.com/dioco-group/jenny-tts-dataset)"
	}
	return ""
}

// attribution joins the credits of the model's voice files, each once, in file order.
func (m *piperModel) attribution() string {
	var out []string
	for _, f := range m.Files {
		if a := datasetAttribution(f.Config.Dataset); a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return strings.Join(out, "; ")
}
