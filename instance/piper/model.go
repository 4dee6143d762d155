package piper

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/voxmux/voxmux/instance/manifest"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// Piper voices (docs/piper.md): a VITS graph `NAME.onnx` with its config `NAME.onnx.json`, as the
// Piper voices collection publishes them. A model of kind piper is one or more such voices.

// Manifest is the optional YAML that makes a folder of voices (or a list of them) a model, and
// sets what a voice file cannot say.
type Manifest struct {
	Kind string `yaml:"kind"` // piper
	// Name is the model name clients send as "model"; default: the manifest's folder name.
	Name string `yaml:"name"`
	// Voices are .onnx files or folders of them, relative to the manifest; default: its folder.
	Voices []string `yaml:"voices"`
	// MaxLoadedVoices bounds how many voice files have a loaded session at once (least recently
	// used first out); default 4.
	MaxLoadedVoices int `yaml:"max_loaded_voices"`
	// SentenceSilence is the silence put between sentences, in seconds; default 0.2 (Piper's).
	SentenceSilence *float64 `yaml:"sentence_silence"`
	// ESpeakData is the espeak-ng-data folder; default: found at run time (espeak.DataDirs).
	ESpeakData string `yaml:"espeak_data"`
}

// Defaults of a piper model.
const (
	DefaultMaxLoadedVoices = 4
	DefaultSentenceSilence = 0.2
)

// piperConfig is a voice's .onnx.json, in the schema piper_train writes (rhasspy/piper
// src/python/piper_train/preprocess.py; OHF-Voice/piper1-gpl src/piper/config.py reads it).
// Keys voxmux does not use (language, audio.quality, piper_version, hop_length) are accepted and
// ignored; dataset names the credit its licence may ask for (attribution.go).
type piperConfig struct {
	Audio struct {
		SampleRate int `json:"sample_rate"`
	} `json:"audio"`
	ESpeak struct {
		Voice string `json:"voice"`
	} `json:"espeak"`
	Inference struct {
		NoiseScale  *float32 `json:"noise_scale"`
		LengthScale *float32 `json:"length_scale"`
		NoiseW      *float32 `json:"noise_w"`
	} `json:"inference"`
	Dataset       string              `json:"dataset"`
	PhonemeType   string              `json:"phoneme_type"`
	PhonemeMap    map[string][]string `json:"phoneme_map"`
	PhonemeIDMap  map[string][]int64  `json:"phoneme_id_map"`
	NumSymbols    int                 `json:"num_symbols"`
	NumSpeakers   int                 `json:"num_speakers"`
	SpeakerIDMap  map[string]int64    `json:"speaker_id_map"`
	VowelClusters [][]string          `json:"vowel_clusters"`
}

// Piper's inference defaults (piper1-gpl config.py), used where the .onnx.json leaves them out.
const (
	piperNoiseScale  = 0.667
	piperLengthScale = 1.0
	piperNoiseW      = 0.8
)

// Piper's special symbols (piper-phonemize phoneme_ids.hpp): pad, beginning and end of sentence.
const (
	piperPad = "_"
	piperBOS = "^"
	piperEOS = "$"
)

// piperFile is one voice file and its checked config.
type piperFile struct {
	Path       string // the .onnx
	ConfigPath string // the .onnx.json
	Stem       string // file name without .onnx
	Config     piperConfig
	HasSID     bool // the graph takes sid (multi-speaker)
	scales     [3]float32
}

// piperVoice is one voice name a client can ask for: a file and, for multi-speaker files, a speaker.
type piperVoice struct {
	Name    string
	File    *piperFile
	Speaker int64 // speaker id; unused when !File.HasSID
}

// piperModel is a loaded (described, not yet run) piper model.
type piperModel struct {
	Name            string
	Source          string // what the config named
	Files           []*piperFile
	Voices          []piperVoice
	MaxLoaded       int
	SentenceSilence float64
	ESpeakData      string
}

// isPiperPath reports whether the model path names piper voices rather than a staged manifest:
// an .onnx or .onnx.json file, a folder, or a YAML manifest whose kind is piper.
func isPiperPath(path string) bool {
	if strings.HasSuffix(path, ".onnx") || strings.HasSuffix(path, ".onnx.json") {
		return true
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return true
	}
	return manifest.Kind(path) == "piper"
}

// loadPiperModel reads the voices the path names and checks each against its graph. It loads no
// graph into ONNX Runtime, so the router can call it at start-up.
func loadPiperModel(path string) (*piperModel, error) {
	m := &piperModel{Source: path, MaxLoaded: DefaultMaxLoadedVoices, SentenceSilence: DefaultSentenceSilence}
	var sources []string
	switch {
	case strings.HasSuffix(path, ".onnx.json"):
		sources = []string{strings.TrimSuffix(path, ".json")}
		m.Name = strings.TrimSuffix(filepath.Base(path), ".onnx.json")
	case strings.HasSuffix(path, ".onnx"):
		sources = []string{path}
		m.Name = strings.TrimSuffix(filepath.Base(path), ".onnx")
	default:
		if st, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("piper model: %w", err)
		} else if st.IsDir() {
			sources = []string{path}
			abs, _ := filepath.Abs(path)
			m.Name = filepath.Base(abs)
			break
		}
		man, err := loadPiperManifest(path)
		if err != nil {
			return nil, err
		}
		dir := filepath.Dir(path)
		abs, _ := filepath.Abs(dir)
		m.Name = cmp.Or(man.Name, filepath.Base(abs))
		if man.MaxLoadedVoices != 0 {
			m.MaxLoaded = man.MaxLoadedVoices
		}
		if man.SentenceSilence != nil {
			m.SentenceSilence = *man.SentenceSilence
		}
		if man.ESpeakData != "" {
			m.ESpeakData = man.ESpeakData
			if !filepath.IsAbs(m.ESpeakData) {
				m.ESpeakData = filepath.Join(dir, m.ESpeakData)
			}
		}
		for _, v := range cmpOrSlice(man.Voices, []string{"."}) {
			if !filepath.IsAbs(v) {
				v = filepath.Join(dir, v)
			}
			sources = append(sources, v)
		}
	}
	seen := map[string]bool{}
	for _, src := range sources {
		files, err := voiceFiles(src)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if seen[f] {
				continue
			}
			seen[f] = true
			pf, err := loadPiperFile(f)
			if err != nil {
				return nil, err
			}
			m.Files = append(m.Files, pf)
		}
	}
	if len(m.Files) == 0 {
		return nil, fmt.Errorf("piper model %s: no voice (.onnx with its .onnx.json) found", path)
	}
	owner := map[string]string{}
	for _, f := range m.Files {
		for _, v := range f.voices() {
			if other, ok := owner[v.Name]; ok {
				return nil, fmt.Errorf("piper model %s: voice name %q is in both %s and %s", path, v.Name, other, f.ConfigPath)
			}
			owner[v.Name] = f.ConfigPath
			m.Voices = append(m.Voices, v)
		}
	}
	return m, nil
}

func loadPiperManifest(path string) (*Manifest, error) {
	var man Manifest
	if err := manifest.Read(path, "piper manifest", &man); err != nil {
		return nil, err
	}
	switch {
	case man.Kind != "piper":
		return nil, fmt.Errorf("piper manifest %s: kind: %q, want piper", path, man.Kind)
	case man.MaxLoadedVoices < 0:
		return nil, fmt.Errorf("piper manifest %s: max_loaded_voices: must be at least 1", path)
	case man.SentenceSilence != nil && (*man.SentenceSilence < 0 || *man.SentenceSilence > 10):
		return nil, fmt.Errorf("piper manifest %s: sentence_silence: %g is not between 0 and 10 seconds", path, *man.SentenceSilence)
	}
	return &man, nil
}

// voiceFiles lists the .onnx voice files a source names: the file itself, or a folder's, sorted.
func voiceFiles(src string) ([]string, error) {
	st, err := os.Stat(src)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("piper voice %s is missing (a voice from a Go module is unpacked by `voxmux voices fetch`, `make voices`; a downloaded one is NAME.onnx with NAME.onnx.json): %w", src, err)
	}
	if err != nil {
		return nil, fmt.Errorf("piper voice: %w", err)
	}
	if !st.IsDir() {
		if !strings.HasSuffix(src, ".onnx") {
			return nil, fmt.Errorf("piper voice %s: not an .onnx file or a folder", src)
		}
		return []string{src}, nil
	}
	files, err := filepath.Glob(filepath.Join(src, "*.onnx"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	return files, nil
}

// loadPiperFile reads NAME.onnx.json beside NAME.onnx and checks it against the graph. Every error
// names the file and what does not match.
func loadPiperFile(onnxPath string) (*piperFile, error) {
	f := &piperFile{Path: onnxPath, ConfigPath: onnxPath + ".json", Stem: strings.TrimSuffix(filepath.Base(onnxPath), ".onnx")}
	data, err := os.ReadFile(f.ConfigPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("piper voice %s: its config %s is missing (Piper voices come as NAME.onnx plus NAME.onnx.json; download both)", onnxPath, filepath.Base(f.ConfigPath))
	}
	if err != nil {
		return nil, fmt.Errorf("piper voice %s: %w", onnxPath, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&f.Config); err != nil {
		return nil, fmt.Errorf("piper voice config %s: not valid JSON: %w", f.ConfigPath, err)
	}
	if err := f.checkConfig(); err != nil {
		return nil, fmt.Errorf("piper voice config %s: %w", f.ConfigPath, err)
	}
	if _, err := os.Stat(onnxPath); err != nil {
		return nil, fmt.Errorf("piper voice config %s: its graph: %w", f.ConfigPath, err)
	}
	ins, outs, err := ort.ReadGraphIO(onnxPath)
	if err != nil {
		return nil, fmt.Errorf("piper voice %s: %w", onnxPath, err)
	}
	if err := f.checkGraph(ins, outs); err != nil {
		return nil, fmt.Errorf("piper voice %s does not match %s: %w", onnxPath, filepath.Base(f.ConfigPath), err)
	}
	c := f.Config.Inference
	f.scales = [3]float32{deref(c.NoiseScale, piperNoiseScale), deref(c.LengthScale, piperLengthScale), deref(c.NoiseW, piperNoiseW)}
	return f, nil
}

func (f *piperFile) checkConfig() error {
	c := &f.Config
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Audio.SampleRate <= 0 {
		bad("audio.sample_rate: missing or not positive")
	}
	switch c.PhonemeType {
	case "", "espeak":
	default:
		bad("phoneme_type: %q is not supported (voxmux phonemizes with espeak-ng only)", c.PhonemeType)
	}
	if c.ESpeak.Voice == "" {
		bad("espeak.voice: missing")
	}
	if len(c.PhonemeIDMap) == 0 {
		bad("phoneme_id_map: missing or empty")
	}
	for _, s := range []string{piperPad, piperBOS, piperEOS} {
		if len(c.PhonemeIDMap[s]) == 0 && len(c.PhonemeIDMap) > 0 {
			bad("phoneme_id_map: has no %q (Piper's pad, beginning and end symbols are _ ^ $)", s)
		}
	}
	for p, ids := range c.PhonemeIDMap {
		for _, id := range ids {
			if id < 0 || (c.NumSymbols > 0 && id >= int64(c.NumSymbols)) {
				bad("phoneme_id_map: %q maps to id %d, outside num_symbols %d", p, id, c.NumSymbols)
			}
		}
	}
	if c.NumSpeakers < 0 {
		bad("num_speakers: %d is negative", c.NumSpeakers)
	}
	for name, id := range c.SpeakerIDMap {
		if id < 0 || id >= int64(max(c.NumSpeakers, 1)) {
			bad("speaker_id_map: %q is speaker %d, outside num_speakers %d", name, id, c.NumSpeakers)
		}
	}
	if c.Inference.LengthScale != nil && *c.Inference.LengthScale <= 0 {
		bad("inference.length_scale: %g must be positive", *c.Inference.LengthScale)
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// checkGraph compares the graph's interface with Piper's export (piper_train/export_onnx.py):
// input int64 [1, T], input_lengths int64 [1], scales float32 [3], sid int64 [1] exactly when the
// config has more than one speaker, and output float32.
func (f *piperFile) checkGraph(ins, outs []ort.TensorInfo) error {
	want := map[string]int32{"input": ort.ONNXInt64, "input_lengths": ort.ONNXInt64, "scales": ort.ONNXFloat, "sid": ort.ONNXInt64}
	got := map[string]ort.TensorInfo{}
	for _, t := range ins {
		if _, ok := want[t.Name]; !ok {
			return fmt.Errorf("the graph has an input %q that Piper voices do not have (want input, input_lengths, scales and, for several speakers, sid)", t.Name)
		}
		got[t.Name] = t
	}
	for _, n := range []string{"input", "input_lengths", "scales"} {
		t, ok := got[n]
		if !ok {
			return fmt.Errorf("the graph has no input %q", n)
		}
		if t.ElemType != want[n] {
			return fmt.Errorf("graph input %q is %s, want %s", n, ort.ElemTypeName(t.ElemType), ort.ElemTypeName(want[n]))
		}
	}
	if r := got["input"].Rank; r != -1 && r != 2 {
		return fmt.Errorf("graph input \"input\" has rank %d, want 2 ([1, phonemes])", r)
	}
	_, f.HasSID = got["sid"]
	multi := f.Config.NumSpeakers > 1
	switch {
	case multi && !f.HasSID:
		return fmt.Errorf("num_speakers is %d but the graph has no sid input (a single-speaker graph)", f.Config.NumSpeakers)
	case !multi && f.HasSID:
		return fmt.Errorf("num_speakers is %d but the graph has a sid input (a multi-speaker graph)", f.Config.NumSpeakers)
	case f.HasSID && got["sid"].ElemType != ort.ONNXInt64:
		return fmt.Errorf("graph input \"sid\" is %s, want int64", ort.ElemTypeName(got["sid"].ElemType))
	}
	i := slices.IndexFunc(outs, func(t ort.TensorInfo) bool { return t.Name == "output" })
	if i < 0 {
		names := make([]string, len(outs))
		for j, t := range outs {
			names[j] = t.Name
		}
		return fmt.Errorf("the graph has no output \"output\" (it has %v)", names)
	}
	if outs[i].ElemType != ort.ONNXFloat {
		return fmt.Errorf("graph output \"output\" is %s, want float32", ort.ElemTypeName(outs[i].ElemType))
	}
	return nil
}

// voices are the names a file offers: its file name for one speaker; for several, the names in
// speaker_id_map (or STEM:N for each id when the map is empty), in speaker-id order.
func (f *piperFile) voices() []piperVoice {
	if !f.HasSID {
		return []piperVoice{{Name: f.Stem, File: f}}
	}
	var out []piperVoice
	if len(f.Config.SpeakerIDMap) == 0 {
		for id := 0; id < f.Config.NumSpeakers; id++ {
			out = append(out, piperVoice{Name: fmt.Sprintf("%s:%d", f.Stem, id), File: f, Speaker: int64(id)})
		}
		return out
	}
	for name, id := range f.Config.SpeakerIDMap {
		out = append(out, piperVoice{Name: name, File: f, Speaker: id})
	}
	slices.SortFunc(out, func(a, b piperVoice) int {
		if a.Speaker != b.Speaker {
			return int(a.Speaker - b.Speaker)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// voice finds a voice by name; an empty name is the first voice.
func (m *piperModel) voice(name string) (piperVoice, bool) {
	if name == "" {
		return m.Voices[0], true
	}
	for _, v := range m.Voices {
		if v.Name == name {
			return v, true
		}
	}
	return piperVoice{}, false
}

func (m *piperModel) description() tts.Description {
	names := make([]string, len(m.Voices))
	for i, v := range m.Voices {
		names[i] = v.Name
	}
	return tts.Description{Kind: "piper", Name: m.Name, SampleRate: m.Files[0].Config.Audio.SampleRate, Voices: names, NativeSpeed: true, Attribution: m.attribution()}
}

func deref(p *float32, def float32) float32 {
	if p == nil {
		return def
	}
	return *p
}

func cmpOrSlice(s, def []string) []string {
	if len(s) == 0 {
		return def
	}
	return s
}
