package tts

import (
	"fmt"
	"slices"
	"strings"
)

// maxVoiceQuote bounds a voice name quoted back in an error.
const maxVoiceQuote = 64

// CheckVoice applies Request.Voice's rule for d's model: nil for "" (the default voice) and for
// one of d.Voices; any other name is an invalid request that names it and lists d.Voices. Every
// family checks a request's Voice with it, so the refusal reads the same whatever the family.
func (d Description) CheckVoice(name string) error {
	if name == "" || slices.Contains(d.Voices, name) {
		return nil
	}
	return InvalidVoice(fmt.Sprintf("voice %q is not a voice of model %q; its voices: %s",
		Excerpt(name, maxVoiceQuote), d.Name, strings.Join(d.Voices, ", ")))
}

// CheckPrompt refuses a voice prompt made by another family than d's (VoicePrompt.Family), as
// an invalid request naming both families. A prompt whose family cannot be told passes: the
// family's own checks of its fields refuse what it cannot speak in.
func (d Description) CheckPrompt(p *VoicePrompt) error {
	if f := p.Family(); f != "" && f != d.Kind {
		return d.ForeignVoice("the voice prompt", f, "")
	}
	return nil
}

// CheckRequest applies the voice rules to req: its Prompt when it has one (Voice is then a
// label), else its Voice.
func (d Description) CheckRequest(req Request) error {
	if req.Prompt != nil {
		return d.CheckPrompt(req.Prompt)
	}
	return d.CheckVoice(req.Voice)
}

// ForeignVoice is the invalid-request error for a voice (what: `voice "anna"`, "the voice
// prompt") made by family (and model, when known) that d's model, of another family, cannot
// speak in: each family's voices hold what its own networks read.
func (d Description) ForeignVoice(what, family, model string) *Error {
	by := "the " + family + " family"
	if model != "" {
		by += fmt.Sprintf(" (model %q)", model)
	}
	return InvalidVoice(fmt.Sprintf("%s was made by %s and cannot be used with model %q, served by the %s family",
		what, by, d.Name, d.Kind))
}

// Excerpt is s cut to at most max characters, then "…" where there was more, as valid UTF-8
// (invalid bytes become U+FFFD): a client's value bounded before an error quotes it back or a log
// records it.
func Excerpt(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	n := 0
	for i := range s {
		if n == max {
			return s[:i] + "…"
		}
		n++
	}
	return s
}
