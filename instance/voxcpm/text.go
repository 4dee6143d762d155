package voxcpm

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/voxmux/voxmux/tts"
)

// tokenizer turns text into the LM's text ids (no special tokens added).
type tokenizer interface {
	Encode(text string) []int64
}

// cleanText is the text as the reference tokenizes it: every run of white space (new lines
// included) one space, none at the ends.
func cleanText(s string) string {
	return strings.Join(strings.FieldsFunc(s, unicode.IsSpace), " ")
}

// prompt is what one request's prefill reads: [voice text + target text, audio_start, voice
// patches].
type prompt struct {
	// ids are the text's ids then audio_start.
	ids   []int64
	voice *voice // nil: no voice prompt
	// targetTokens counts the target text's own ids, which bound the request's patches.
	targetTokens int
}

// length is the prompt's positions in the caches.
func (p *prompt) length() int {
	n := len(p.ids)
	if p.voice != nil {
		n += p.voice.patches
	}
	return n
}

// buildPrompt tokenizes a request's text in voice v (nil: none): the voice's transcript and the
// target text in one tokenization, as the reference does, then audio_start.
func (m *Manifest) buildPrompt(tok tokenizer, v *voice, target string) (*prompt, error) {
	target = cleanText(target)
	if target == "" {
		return nil, tts.ErrEmptyText
	}
	p := &prompt{voice: v, targetTokens: len(tok.Encode(target))}
	all := target
	if v != nil {
		all = cleanText(v.text + target)
	}
	p.ids = append(tok.Encode(all), *m.Tokenizer.AudioStart)
	return p, nil
}

// patchBound is the most patches a request of prompt p may make: generation.max_len, the
// reference's int(target_tokens · len_ratio + 10), and the room its prompt leaves in the caches.
// A prompt that leaves no room for the fewest patches a row can end with is the request's error.
func (m *Manifest) patchBound(p *prompt) (int, error) {
	g := m.Generation
	bound := min(g.MaxLen, int(float64(p.targetTokens)*g.LenRatio+10))
	room := m.LM.MaxPositions - p.length()
	// A row stops at the earliest after patch index min_len, so with min_len+2 patches.
	if least := min(bound, g.MinLen+2); room < least {
		what := "the text makes"
		if p.voice != nil {
			what = "the voice's prompt and the text make"
		}
		return 0, tts.Invalid(fmt.Sprintf("input is too long for model %s: %s %d prompt positions and the speech needs at least %d more, over the model's %d (lm.max_positions)",
			m.Name, what, p.length(), least, m.LM.MaxPositions))
	}
	return min(bound, room), nil
}

// prefillStep is the step of the prefill's padded lengths: a batch runs as many positions as
// its longest prompt, rounded up to a whole number of steps, so that shapes repeat (ONNX
// Runtime's first run of each new shape costs more than later ones) and can be warmed at load.
const prefillStep = 16

// prefillLength is the positions a prefill of prompts of at most n positions runs: n rounded up
// to a whole number of prefillSteps, at most lm.max_positions.
func (m *Manifest) prefillLength(n int) int {
	return min(m.LM.MaxPositions, (n+prefillStep-1)/prefillStep*prefillStep)
}

// prefillBatch lays out prompts ps as rows rows (at least len(ps)) of T positions each, right-
// padded: text_ids, text_mask, feat, feat_mask and seqlens_k (each row's length minus one). The
// rows past len(ps) are placeholders of one position; padding has ids and masks 0.
func (m *Manifest) prefillBatch(ps []*prompt, rows, T int) (ids []int64, textMask, feat, featMask []float32, seqlens []int32) {
	PD := m.patchFloats()
	ids = make([]int64, rows*T)
	textMask = make([]float32, rows*T)
	featMask = make([]float32, rows*T)
	feat = make([]float32, rows*T*PD)
	seqlens = make([]int32, rows)
	for b, p := range ps {
		i, tm, f, fm := m.prefillInputs(p)
		copy(ids[b*T:], i)
		copy(textMask[b*T:], tm)
		copy(feat[b*T*PD:], f)
		copy(featMask[b*T:], fm)
		seqlens[b] = int32(p.length() - 1)
	}
	return ids, textMask, feat, featMask, seqlens
}

// prefillInputs are the prefill's text_ids, text_mask, feat and feat_mask for p alone.
func (m *Manifest) prefillInputs(p *prompt) (ids []int64, textMask, feat, featMask []float32) {
	T, nText, PD := p.length(), len(p.ids), m.patchFloats()
	ids = make([]int64, T)
	copy(ids, p.ids)
	textMask = make([]float32, T)
	featMask = make([]float32, T)
	feat = make([]float32, T*PD)
	for t := range T {
		if t < nText {
			textMask[t] = 1
		} else {
			featMask[t] = 1
		}
	}
	if p.voice != nil {
		copy(feat[nText*PD:], p.voice.latents)
	}
	return ids, textMask, feat, featMask
}
