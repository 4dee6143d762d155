package router

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"
	"github.com/voxmux/voxmux/tts"
)

// ElevenLabs' text-to-speech API beside OpenAI's, on the same engine, voices, library, keys and
// limits, so that agent frameworks' ElevenLabs plugins and ElevenLabs' SDKs reach voxmux by
// their base URL (docs/api.md, ElevenLabs):
//
//	WS   /v1/text-to-speech/{voice_id}/multi-stream-input   elevenlabs_ws.go
//	WS   /v1/text-to-speech/{voice_id}/stream-input
//	POST /v1/text-to-speech/{voice_id}[/stream][/with-timestamps]   elevenlabs_http.go
//	GET  /v1/voices, GET /v1/models (asked with xi-api-key)
//
// The key comes as ElevenLabs sends it, in the xi-api-key header (or on the socket, in its first
// message's xi_api_key); it is checked against the same API keys as a bearer key.

const elevenPrefix = "/v1/text-to-speech/"

// elevenModelIDs are ElevenLabs' model ids, which its clients send by default; like OpenAI's
// model names they reach the served model.
var elevenModelIDs = []string{
	"eleven_multilingual_v2", "eleven_turbo_v2_5", "eleven_turbo_v2", "eleven_flash_v2_5", "eleven_flash_v2",
	"eleven_monolingual_v1", "eleven_multilingual_v1", "eleven_v3",
}

// elevenVoiceIDs are ElevenLabs' premade voices that its SDKs' examples and the agent frameworks'
// plugins use by default; like OpenAI's voice names they map to the model's first voice.
var elevenVoiceIDs = []string{
	"21m00Tcm4TlvDq8ikWAM", "JBFqnCBsd6RMkjVDRZzb", "EXAVITQu4vr4xnSDxMaL", "bIHbv24MWmeRgasZH58o",
	"pNInz6obpgDQGcFmaJgB", "ErXwobaYiN019PkySvjV", "TxGEqnHWrfWFTfGW9XjX", "cgSgspJ2msm6clMCkdW9",
}

// elevenKey is the key of a request from an ElevenLabs client: its xi-api-key header.
func elevenKey(ctx *fasthttp.RequestCtx) (string, bool) {
	k := ctx.Request.Header.Peek("xi-api-key")
	return string(k), k != nil
}

// elevenKeyLater tells that a request is an ElevenLabs socket's upgrade without a key: its key may
// come in its first message, which the session checks (elevenSession.authorize).
func elevenKeyLater(ctx *fasthttp.RequestCtx) bool {
	_, _, ok := elevenSocketPath(string(ctx.Path()))
	return ok && ctx.IsGet() && len(ctx.Request.Header.Peek("Authorization")) == 0
}

// validKey checks key against every API key in constant time; with none configured every key
// is valid.
func (s *Server) validKey(key string) bool {
	if len(s.keys) == 0 {
		return true
	}
	found := 0
	for _, k := range s.keys {
		found |= subtle.ConstantTimeCompare([]byte(key), k)
	}
	return found == 1
}

// elevenSocketPath splits a socket path into its voice id and whether it is the multi-context one.
func elevenSocketPath(path string) (voice string, multi, ok bool) {
	rest, ok := strings.CutPrefix(path, elevenPrefix)
	if !ok {
		return "", false, false
	}
	if v, found := strings.CutSuffix(rest, "/multi-stream-input"); found && v != "" && !strings.Contains(v, "/") {
		return v, true, true
	}
	if v, found := strings.CutSuffix(rest, "/stream-input"); found && v != "" && !strings.Contains(v, "/") {
		return v, false, true
	}
	return "", false, false
}

// elevenRoute is the route label of an ElevenLabs path in voxmux_requests_total; "" for others.
func elevenRoute(path string) string {
	switch {
	case strings.HasPrefix(path, elevenPrefix):
		if _, multi, ok := elevenSocketPath(path); ok {
			if multi {
				return elevenPrefix + "{voice_id}/multi-stream-input"
			}
			return elevenPrefix + "{voice_id}/stream-input"
		}
		return elevenPrefix + "{voice_id}"
	case path == "/v1/voices" || strings.HasPrefix(path, "/v1/voices/"):
		return "/v1/voices"
	}
	return ""
}

// elevenLabs serves path if it is one of ElevenLabs' API, and tells whether it was. GET
// /v1/models, which OpenAI's API has too, answers in ElevenLabs' shape when asked with xi-api-key.
func (s *Server) elevenLabs(ctx *fasthttp.RequestCtx, path string) bool {
	_, fromEleven := elevenKey(ctx)
	switch {
	case strings.HasPrefix(path, elevenPrefix):
		if voice, multi, ok := elevenSocketPath(path); ok {
			s.elevenSocket(ctx, voice, multi)
			return true
		}
		s.elevenSpeech(ctx, strings.TrimPrefix(path, elevenPrefix))
	case path == "/v1/voices" || strings.HasPrefix(path, "/v1/voices/"):
		if !readable(ctx) {
			elevenError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "use GET for "+excerpt(path))
			return true
		}
		s.elevenVoices(ctx, strings.TrimPrefix(strings.TrimPrefix(path, "/v1/voices"), "/"))
	case path == "/v1/models" && fromEleven && readable(ctx):
		s.elevenModels(ctx)
	default:
		return false
	}
	return true
}

// elevenError answers in ElevenLabs' error shape: {"detail": {"status", "message"}}.
func elevenError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	body, _ := json.Marshal(map[string]any{"detail": map[string]string{"status": code, "message": msg}})
	id := string(ctx.Response.Header.Peek("X-Request-Id"))
	ctx.Response.Reset()
	if id != "" {
		ctx.Response.Header.Set("X-Request-Id", id)
	}
	ctx.SetStatusCode(status)
	if status == fasthttp.StatusTooManyRequests {
		ctx.Response.Header.Set("Retry-After", "1")
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// elevenModel checks a model_id: the served model, one of its aliases, or one of ElevenLabs' ids.
func (s *Server) elevenModel(id string) error {
	m := s.o.Pool.Model()
	fold := func(a string) bool { return strings.EqualFold(a, id) }
	if id == "" || strings.EqualFold(id, m.Name) || slices.ContainsFunc(s.o.ModelAliases, fold) || slices.Contains(elevenModelIDs, id) {
		return nil
	}
	return fmt.Errorf("model_id %q is not served here; use %q", excerpt(id), m.Name)
}

// elevenVoice resolves a voice_id as the OpenAI API resolves "voice": a voice of the model or of
// the library; ElevenLabs' premade voice ids are the model's first voice.
func (s *Server) elevenVoice(id string) (string, *tts.VoicePrompt, *apiError) {
	if slices.Contains(elevenVoiceIDs, id) {
		id = ""
	}
	raw, _ := json.Marshal(id)
	return s.resolveVoice(raw)
}

// elevenSpeed checks voice_settings.speed (ElevenLabs takes 0.7 to 1.2); nil is 1.
func elevenSpeed(v *float64) (float64, error) {
	if v == nil {
		return 1, nil
	}
	if !(*v >= 0.7 && *v <= 1.2) {
		return 0, fmt.Errorf("voice_settings.speed %g is outside 0.7 to 1.2", *v)
	}
	return *v, nil
}

// elevenVoiceSettings are the voice_settings a client sends; speed applies, the others (stability,
// similarity_boost, style, use_speaker_boost) are ElevenLabs' models' own and are accepted.
type elevenVoiceSettings struct {
	Speed *float64 `json:"speed"`
}
