package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/voxmux/voxmux/router/audio"
	"github.com/voxmux/voxmux/router/library"
	"github.com/voxmux/voxmux/tts"
)

// DefaultMaxUploadBytes bounds an uploaded reference clip when Options leave it unset.
const DefaultMaxUploadBytes = 20 << 20

// Bounds of a reference clip's length: a prompt needs some speech to copy a voice from, and its
// speech tokens count against the model's prompt on every request that speaks in it. The minimum
// is the instances' (which count speech once leading and trailing silence is trimmed), so that a
// clip the router takes is not refused for its length by the model.
const (
	minClipSeconds = 3.0
	maxClipSeconds = 30.0
)

// VoiceExtractor is what cloning needs of an instance (tts.Instance.ExtractVoice); a backend
// whose Synth lacks it cannot clone.
type VoiceExtractor interface {
	ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error)
}

// errNoExtractor is an instance that cannot compute voices although its model clones.
var errNoExtractor = errors.New("the instance cannot compute voices")

// uploadBodyBytes is the largest body that carries an upload of max bytes: base64 in JSON (4/3),
// with room for the other fields.
func uploadBodyBytes(max int) int { return max/3*4 + 4 + MaxBodyBytes }

// refBodyBytes bounds a request that may carry ref_audio (a speech request, a WebSocket
// session.config): room for a clip on a model that clones, MaxBodyBytes on others.
func (s *Server) refBodyBytes() int {
	if s.o.Pool.Model().Cloning {
		return uploadBodyBytes(s.o.MaxUploadBytes)
	}
	return MaxBodyBytes
}

// notCloning is the error for cloning on a model that cannot.
func (s *Server) notCloning(param string) *apiError {
	e := newError(fasthttp.StatusNotImplemented, "invalid_request_error", "cloning_not_supported",
		fmt.Sprintf("model %q cannot clone voices; a model that can (CosyVoice3, VoxCPM) is needed", s.o.Pool.Model().Name))
	if param != "" {
		e.Param = &param
	}
	return e
}

// decodeClip reads an uploaded reference clip; param names the field in errors.
func (s *Server) decodeClip(data []byte, text, param string) (tts.VoiceClip, *apiError) {
	if len(data) > s.o.MaxUploadBytes {
		e := newError(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "file_too_large",
			fmt.Sprintf("the audio file has %d bytes; the limit is %d (voices.max_upload_bytes)", len(data), s.o.MaxUploadBytes))
		e.Param = &param
		return tts.VoiceClip{}, e
	}
	if len(data) == 0 {
		return tts.VoiceClip{}, invalid(param, "the audio file is empty")
	}
	pcm, rate, err := audio.Decode(data, maxClipSeconds)
	switch {
	case errors.Is(err, audio.ErrUnsupported):
		e := newError(fasthttp.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_audio", err.Error())
		e.Param = &param
		return tts.VoiceClip{}, e
	case errors.Is(err, audio.ErrTooLong):
		return tts.VoiceClip{}, invalid(param, fmt.Sprintf("the clip is longer than %g seconds; use %g to %g seconds of speech", maxClipSeconds, minClipSeconds, maxClipSeconds))
	case err != nil:
		return tts.VoiceClip{}, invalid(param, "the audio file cannot be read: "+tts.Excerpt(err.Error(), 200))
	}
	if secs := float64(len(pcm)) / float64(rate); secs < minClipSeconds {
		return tts.VoiceClip{}, invalid(param, fmt.Sprintf("the clip is %.2f seconds; use %g to %g seconds of speech", secs, minClipSeconds, maxClipSeconds))
	}
	return tts.VoiceClip{PCM: pcm, SampleRate: rate, Text: text}, nil
}

// extractVoice computes a voice from clip on a ready instance, taken from the pool as a synthesis
// takes one (same queue, same readiness). A failure before the instance answered is retried once
// on another instance.
func (s *Server) extractVoice(ctx context.Context, clip tts.VoiceClip) (*tts.VoicePrompt, error) {
	var failed *Backend
	var first error
	for attempt := 0; attempt < 2; attempt++ {
		b, err := s.o.Pool.Acquire(ctx, failed)
		if err != nil {
			if first != nil {
				return nil, first
			}
			return nil, err
		}
		x, ok := b.Synth.(VoiceExtractor)
		if !ok {
			s.o.Pool.Release(b)
			return nil, errNoExtractor
		}
		p, err := x.ExtractVoice(ctx, clip)
		s.o.Pool.Release(b)
		if err == nil {
			return &p, nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return nil, err
		}
		s.o.Logger.Warn("voice extraction failed; retrying on another instance", "backend", b.Name, "error", err)
		first, failed = err, b
	}
	return nil, first
}

// extractError maps a failed extraction to an HTTP error; param names the clip's field.
func extractError(err error, param string) *apiError {
	if errors.Is(err, errNoExtractor) {
		return newError(fasthttp.StatusNotImplemented, "server_error", "cloning_not_supported", "the instances cannot compute voices")
	}
	e := synthError(err)
	if e.Status == fasthttp.StatusBadRequest {
		e.Param = &param // the instance's verdict on the clip
	} else if e.Status == fasthttp.StatusBadGateway || e.Status == fasthttp.StatusInternalServerError {
		e.Message = "computing the voice failed on the instance"
	}
	return e
}

// resolveVoice resolves a request's "voice" (tts.Request.Voice's rule, applied where clients'
// names are known): empty is the model's first voice; a voice of the model, matched but for case;
// an OpenAI name, which maps to the first; or a library voice the model can speak in, which comes
// with its prompt. Anything else is a 400 naming "voice" that lists the voices the model can use,
// library voices included.
func (s *Server) resolveVoice(raw json.RawMessage) (string, *tts.VoicePrompt, *apiError) {
	m := s.o.Pool.Model()
	name, aerr := voiceName(raw)
	if aerr != nil {
		return "", nil, aerr
	}
	if v, ok := builtinVoice(name, m.Voices); ok {
		return v, nil, nil
	}
	if s.o.Voices == nil {
		return "", nil, s.unknownVoice(name)
	}
	meta, err := s.o.Voices.Get(name)
	if err != nil {
		if !errors.Is(err, library.ErrNotFound) {
			s.o.Logger.Error("voice library", "voice", name, "error", err)
		}
		return "", nil, s.unknownVoice(name)
	}
	switch {
	case !m.Cloning:
		return "", nil, invalid("voice", fmt.Sprintf("voice %q is a cloned voice, and model %q cannot speak in cloned voices", name, m.Name))
	case !speaksIn(m, meta):
		d := tts.Description{Kind: m.Family, Name: m.Name}
		e := d.ForeignVoice(fmt.Sprintf("voice %q", name), meta.Family, "")
		return "", nil, invalid("voice", e.Msg)
	}
	p, err := s.o.Voices.Prompt(name)
	if err != nil {
		s.o.Logger.Error("voice library", "voice", name, "error", err)
		return "", nil, newError(fasthttp.StatusInternalServerError, "server_error", "voice_unreadable", fmt.Sprintf("voice %q cannot be loaded", name))
	}
	return name, p, nil
}

// speaksIn tells whether model m can speak in library voice v: it clones, and v was made by its
// family (either unknown refuses none).
func speaksIn(m Model, v library.Meta) bool {
	return m.Cloning && (m.Family == "" || v.Family == "" || v.Family == m.Family)
}

// maxListedLibraryVoices bounds the library voices an unknown voice's error lists.
const maxListedLibraryVoices = 20

// unknownVoice is the 400 for a voice name that is neither the model's nor a library voice it
// speaks in; it lists both kinds.
func (s *Server) unknownVoice(name string) *apiError {
	m := s.o.Pool.Model()
	msg := fmt.Sprintf("voice %q is not available; voices: %s", excerpt(name), strings.Join(m.Voices, ", "))
	var lib []string
	more := 0
	if s.o.Voices != nil {
		for _, v := range s.o.Voices.List() {
			switch {
			case !speaksIn(m, v):
			case len(lib) == maxListedLibraryVoices:
				more++
			default:
				lib = append(lib, v.Name)
			}
		}
	}
	if len(lib) > 0 {
		msg += "; library voices: " + strings.Join(lib, ", ")
		if more > 0 {
			msg += fmt.Sprintf(" and %d more (GET /v1/audio/voices)", more)
		}
	}
	return invalid("voice", msg)
}

// voiceName is the name in a "voice" field: a string or {"id": ...}; "" when it is absent.
func voiceName(raw json.RawMessage) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err == nil {
		return name, nil
	}
	var obj struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.ID == "" {
		return "", invalid("voice", `voice must be a string or an object {"id": "..."}`)
	}
	return obj.ID, nil
}

// refClip reads a request's ref_audio and ref_text (a speech request's or a WebSocket
// session.config's); nil when it has neither. library tells that its voice is a library voice,
// which a reference clip would contradict.
func (s *Server) refClip(refAudio, refText *string, fromLibrary bool) (*tts.VoiceClip, *apiError) {
	if refAudio == nil && refText == nil {
		return nil, nil
	}
	switch {
	case !s.o.Pool.Model().Cloning:
		return nil, s.notCloning("ref_audio")
	case refAudio == nil || *refAudio == "":
		return nil, invalid("ref_audio", "ref_text needs ref_audio: the reference clip, base64")
	case refText == nil || strings.TrimSpace(*refText) == "":
		return nil, invalid("ref_text", "ref_audio needs ref_text: the transcript of the clip")
	case fromLibrary:
		return nil, invalid("ref_audio", "voice names a cloned voice and ref_audio brings another; send one of them")
	case !utf8.ValidString(*refText) || utf8.RuneCountInString(*refText) > maxTranscriptChars:
		return nil, invalid("ref_text", fmt.Sprintf("ref_text must be UTF-8 of at most %d characters", maxTranscriptChars))
	}
	data, aerr := s.decodeBase64Audio(*refAudio, "ref_audio")
	if aerr != nil {
		return nil, aerr
	}
	clip, aerr := s.decodeClip(data, strings.TrimSpace(*refText), "ref_audio")
	if aerr != nil {
		return nil, aerr
	}
	return &clip, nil
}

// sizeText writes a byte count for messages: "1 MiB", "27 MiB", "512 KiB".
func sizeText(n int) string {
	if n%(1<<20) == 0 || n > 8<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
