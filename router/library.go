package router

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/voxmux/voxmux/router/library"
)

// Bounds of a library voice's transcript and consent statement.
const (
	maxTranscriptChars = 1000
	maxConsentChars    = 1000
)

// voiceView is a library voice in GET /v1/audio/voices/{name} and the answer to its creation.
type voiceView struct {
	ID         string    `json:"id"`
	Object     string    `json:"object"`
	Name       string    `json:"name"`
	Type       string    `json:"type"`
	Text       string    `json:"text,omitempty"`
	CreatedAt  time.Time `json:"created_at,omitzero"`
	Consent    string    `json:"consent,omitempty"`
	Seconds    float64   `json:"seconds,omitempty"`
	SampleRate int       `json:"sample_rate,omitempty"`
	Tokens     int       `json:"tokens,omitempty"`
	// LatentFrames are a latent-space model's prompt frames, where Tokens are a token model's.
	LatentFrames int `json:"latent_frames,omitempty"`
	// Family is the model family that made the voice; only its models speak in it.
	Family string `json:"family,omitempty"`
}

// Types of voices in the lists.
const (
	voiceBuiltin = "builtin"
	voiceCloned  = "cloned"
)

func clonedView(m library.Meta) voiceView {
	return voiceView{ID: m.Name, Object: "voice", Name: m.Name, Type: voiceCloned, Text: m.Text, CreatedAt: m.CreatedAt,
		Consent: m.Consent, Seconds: m.Seconds, SampleRate: m.SampleRate, Tokens: m.Tokens,
		LatentFrames: m.LatentFrames, Family: m.Family}
}

// noLibrary is the error of library calls on a server without one.
func noLibrary(status int) *apiError {
	return newError(status, "invalid_request_error", "voice_library_disabled",
		"this server has no voice library; its operator enables one with voices.dir in the config")
}

// builtinName reports whether name is, but for case, a voice of the served model or one of
// OpenAI's names (which map to it): a library voice of that name could never be reached.
func (s *Server) builtinName(name string) bool {
	fold := func(v string) bool { return strings.EqualFold(v, name) }
	return slices.ContainsFunc(s.o.Pool.Model().Voices, fold) || slices.ContainsFunc(openAIVoices, fold)
}

// mayManageVoices checks the caller may create and delete library voices: the admin token or an
// API key with the voices right. A server with neither an admin token nor API keys is open.
func (s *Server) mayManageVoices(ctx *fasthttp.RequestCtx) *apiError {
	if s.o.AdminToken == "" && len(s.keys) == 0 {
		return nil
	}
	key, _ := strings.CutPrefix(string(ctx.Request.Header.Peek("Authorization")), "Bearer ")
	found := 0
	if s.o.AdminToken != "" {
		found |= subtle.ConstantTimeCompare([]byte(key), []byte(s.o.AdminToken))
	}
	for k := range s.o.VoiceKeys {
		found |= subtle.ConstantTimeCompare([]byte(key), []byte(k))
	}
	if found == 1 && key != "" {
		return nil
	}
	if len(s.keys) > 0 && key != "" {
		// Handler let the request in, so the key is a speech key without the right.
		return newError(fasthttp.StatusForbidden, "invalid_request_error", "insufficient_permissions",
			"this API key may not create or delete voices; use the admin token or a key with the voices right")
	}
	return newError(fasthttp.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
		"creating and deleting voices needs Authorization: Bearer <admin token or a key with the voices right>")
}

// voiceUpload is a POST /v1/audio/voices request, from either body shape.
type voiceUpload struct {
	Name    string `json:"name"`
	Text    string `json:"text"`
	Consent string `json:"consent"`
	Audio   string `json:"audio"` // base64, JSON bodies only
	file    []byte
}

// readUpload reads a multipart/form-data or a JSON body.
func (s *Server) readUpload(ctx *fasthttp.RequestCtx) (*voiceUpload, *apiError) {
	ct := string(ctx.Request.Header.ContentType())
	var u voiceUpload
	switch {
	case strings.HasPrefix(ct, "multipart/form-data"):
		form, err := ctx.MultipartForm()
		if err != nil {
			return nil, invalid("", "the multipart/form-data body cannot be read: "+excerpt(err.Error()))
		}
		value := func(k string) string {
			if v := form.Value[k]; len(v) > 0 {
				return v[0]
			}
			return ""
		}
		u.Name, u.Text, u.Consent = value("name"), value("text"), value("consent")
		files := form.File["file"]
		if len(files) == 0 {
			return nil, invalid("file", "file is required: the reference clip (WAV, or mp3, flac, ogg, opus, ...)")
		}
		if files[0].Size > int64(s.o.MaxUploadBytes) {
			return nil, tooLarge("file", files[0].Size, s.o.MaxUploadBytes)
		}
		f, err := files[0].Open()
		if err != nil {
			return nil, invalid("file", "the file cannot be read")
		}
		u.file, err = io.ReadAll(io.LimitReader(f, int64(s.o.MaxUploadBytes)+1))
		f.Close()
		if err != nil {
			return nil, invalid("file", "the file cannot be read")
		}
	case strings.HasPrefix(ct, "application/json") || ct == "":
		dec := json.NewDecoder(strings.NewReader(string(ctx.PostBody())))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&u); err != nil {
			field, msg := jsonProblem(err)
			return nil, invalid(field, "request body, JSON of {name, text, consent, audio}: "+msg)
		}
		if u.Audio == "" {
			return nil, invalid("audio", "audio is required: the reference clip, base64")
		}
		var aerr *apiError
		if u.file, aerr = s.decodeBase64Audio(u.Audio, "audio"); aerr != nil {
			return nil, aerr
		}
	default:
		return nil, newError(fasthttp.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_media_type",
			"send multipart/form-data (file, name, text, consent) or application/json (name, text, consent, audio as base64)")
	}
	return &u, nil
}

func tooLarge(param string, size int64, limit int) *apiError {
	e := newError(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "file_too_large",
		fmt.Sprintf("the audio file has %d bytes; the limit is %d (voices.max_upload_bytes)", size, limit))
	e.Param = &param
	return e
}

// decodeBase64Audio reads base64 audio (standard or URL alphabet, padded or not; a data: URL's
// prefix is skipped).
func (s *Server) decodeBase64Audio(b64, param string) ([]byte, *apiError) {
	if _, rest, ok := strings.Cut(b64, ";base64,"); ok && strings.HasPrefix(b64, "data:") {
		b64 = rest
	}
	b64 = strings.TrimRight(strings.TrimSpace(b64), "=")
	if n := base64.RawStdEncoding.DecodedLen(len(b64)); n > s.o.MaxUploadBytes {
		return nil, tooLarge(param, int64(n), s.o.MaxUploadBytes)
	}
	data, err := base64.RawStdEncoding.DecodeString(b64)
	if err != nil {
		if data, err = base64.RawURLEncoding.DecodeString(b64); err != nil {
			return nil, invalid(param, param+" is not base64")
		}
	}
	return data, nil
}

// createVoice is POST /v1/audio/voices: a clip and its transcript become a library voice.
func (s *Server) createVoice(ctx *fasthttp.RequestCtx) {
	fail := func(e *apiError) { writeError(ctx, e) }
	m := s.o.Pool.Model()
	switch {
	case s.o.Voices == nil:
		fail(noLibrary(fasthttp.StatusNotImplemented))
		return
	case !m.Cloning:
		fail(s.notCloning(""))
		return
	}
	if e := s.mayManageVoices(ctx); e != nil {
		fail(e)
		return
	}
	u, aerr := s.readUpload(ctx)
	if aerr != nil {
		fail(aerr)
		return
	}
	u.Text, u.Consent = strings.TrimSpace(u.Text), strings.TrimSpace(u.Consent)
	switch {
	case u.Name == "":
		fail(invalid("name", "name is required"))
		return
	case !library.ValidName(u.Name):
		fail(invalid("name", fmt.Sprintf("name %q is not 1 to 64 of A-Z, a-z, 0-9, _ and -", excerpt(u.Name))))
		return
	case s.builtinName(u.Name):
		fail(conflict(fmt.Sprintf("%q is the name of a built-in voice; choose another", u.Name)))
		return
	case u.Text == "":
		fail(invalid("text", "text is required: the transcript of the clip"))
		return
	case !utf8.ValidString(u.Text) || utf8.RuneCountInString(u.Text) > maxTranscriptChars:
		fail(invalid("text", fmt.Sprintf("text must be UTF-8 of at most %d characters", maxTranscriptChars)))
		return
	case u.Consent == "":
		fail(invalid("consent", "consent is required: a statement that the speaker agreed to the cloning of their voice"))
		return
	case !utf8.ValidString(u.Consent) || utf8.RuneCountInString(u.Consent) > maxConsentChars:
		fail(invalid("consent", fmt.Sprintf("consent must be UTF-8 of at most %d characters", maxConsentChars)))
		return
	}
	if _, err := s.o.Voices.Get(u.Name); err == nil {
		fail(conflict(fmt.Sprintf("a voice named %q exists; delete it first or choose another name", u.Name)))
		return
	}
	clip, aerr := s.decodeClip(u.file, u.Text, "file")
	if aerr != nil {
		fail(aerr)
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), s.o.RequestTimeout)
	defer cancel()
	stopWatch := watchClient(ctx.Conn(), cancel)
	p, err := s.extractVoice(rctx, clip)
	stopWatch()
	if err != nil {
		s.o.Logger.Warn("voice extraction", "voice", u.Name, "error", err)
		fail(extractError(err, "file"))
		return
	}
	meta := library.Meta{Text: u.Text, Consent: u.Consent, CreatedAt: time.Now().UTC().Truncate(time.Second),
		SampleRate: clip.SampleRate, Seconds: float64(len(clip.PCM)) / float64(clip.SampleRate)}
	switch err := s.o.Voices.Create(u.Name, p, meta); {
	case errors.Is(err, library.ErrExists):
		fail(conflict(fmt.Sprintf("a voice named %q exists; delete it first or choose another name", u.Name)))
		return
	case err != nil:
		s.o.Logger.Error("voice library", "voice", u.Name, "error", err)
		fail(newError(fasthttp.StatusInternalServerError, "server_error", "voice_not_saved", "the voice could not be saved"))
		return
	}
	saved, _ := s.o.Voices.Get(u.Name)
	s.o.Logger.Info("voice created", "voice", u.Name, "seconds", meta.Seconds, "tokens", saved.Tokens)
	writeJSON(ctx, fasthttp.StatusCreated, clonedView(saved))
}

func conflict(msg string) *apiError {
	return newError(fasthttp.StatusConflict, "invalid_request_error", "voice_exists", msg)
}

// getVoice is GET /v1/audio/voices/{name}.
func (s *Server) getVoice(ctx *fasthttp.RequestCtx, name string) {
	m := s.o.Pool.Model()
	if slices.Contains(m.Voices, name) {
		writeJSON(ctx, fasthttp.StatusOK, voiceView{ID: name, Object: "voice", Name: name, Type: voiceBuiltin})
		return
	}
	if s.o.Voices == nil {
		writeError(ctx, noLibrary(fasthttp.StatusNotFound))
		return
	}
	meta, err := s.o.Voices.Get(name)
	switch {
	case errors.Is(err, library.ErrNotFound):
		writeError(ctx, newError(fasthttp.StatusNotFound, "invalid_request_error", "voice_not_found", fmt.Sprintf("no voice named %q", excerpt(name))))
	case err != nil:
		s.o.Logger.Error("voice library", "voice", name, "error", err)
		writeError(ctx, newError(fasthttp.StatusInternalServerError, "server_error", "voice_unreadable", "the voice's files cannot be read"))
	default:
		writeJSON(ctx, fasthttp.StatusOK, clonedView(meta))
	}
}

// deleteVoice is DELETE /v1/audio/voices/{name}.
func (s *Server) deleteVoice(ctx *fasthttp.RequestCtx, name string) {
	if s.o.Voices == nil {
		writeError(ctx, noLibrary(fasthttp.StatusNotImplemented))
		return
	}
	if e := s.mayManageVoices(ctx); e != nil {
		writeError(ctx, e)
		return
	}
	if slices.Contains(s.o.Pool.Model().Voices, name) {
		writeError(ctx, invalid("", fmt.Sprintf("%q is a built-in voice of the model; only cloned voices can be deleted", name)))
		return
	}
	switch err := s.o.Voices.Delete(name); {
	case errors.Is(err, library.ErrNotFound):
		writeError(ctx, newError(fasthttp.StatusNotFound, "invalid_request_error", "voice_not_found", fmt.Sprintf("no voice named %q", excerpt(name))))
	case err != nil:
		s.o.Logger.Error("voice library", "voice", name, "error", err)
		writeError(ctx, newError(fasthttp.StatusInternalServerError, "server_error", "voice_not_deleted", "the voice could not be deleted"))
	default:
		s.o.Logger.Info("voice deleted", "voice", name)
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"id": name, "object": "voice.deleted", "deleted": true})
	}
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	body, _ := json.Marshal(v)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}
