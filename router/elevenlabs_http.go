package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/voxmux/voxmux/tts"
)

// ElevenLabs' HTTP text to speech: POST /v1/text-to-speech/{voice_id} (the audio file),
// …/stream (the same, as it is made), …/with-timestamps (JSON: the audio in base64 and its
// character alignment) and …/stream/with-timestamps (one such JSON object a line, per chunk).
// All stream: the first bytes leave with the engine's first chunk.

type elevenSpeechBody struct {
	Text          *string              `json:"text"`
	ModelID       string               `json:"model_id"`
	VoiceSettings *elevenVoiceSettings `json:"voice_settings"`
	Seed          *uint64              `json:"seed"`
	// language_code, previous_text, next_text, apply_text_normalization and the others are
	// accepted and have no effect on the model.
}

// elevenStamped is a with-timestamps response or line.
type elevenStamped struct {
	AudioBase64         string               `json:"audio_base64"`
	Alignment           *elevenHTTPAlignment `json:"alignment"`
	NormalizedAlignment *elevenHTTPAlignment `json:"normalized_alignment"`
}

func (s *Server) elevenSpeech(ctx *fasthttp.RequestCtx, rest string) {
	voiceID, mode, _ := strings.Cut(rest, "/")
	switch mode {
	case "", "stream", "with-timestamps", "stream/with-timestamps":
	default:
		elevenError(ctx, fasthttp.StatusNotFound, "not_found", "no route for "+excerpt(string(ctx.Path())))
		return
	}
	if voiceID == "" {
		elevenError(ctx, fasthttp.StatusNotFound, "not_found", "no route for "+excerpt(string(ctx.Path())))
		return
	}
	if !ctx.IsPost() {
		elevenError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "use POST for "+excerpt(string(ctx.Path())))
		ctx.Response.Header.Set("Allow", "POST")
		return
	}
	start := time.Now()
	id, _ := ctx.UserValue(userRequestID).(string)
	log := s.o.Logger.With("request_id", id, "route", elevenRoute(string(ctx.Path())))
	req, format, speed, status, code, msg := s.parseElevenSpeech(ctx, voiceID)
	if status != 0 {
		log.Info("elevenlabs speech", "status", status, "error", msg)
		s.recent.add(recentRequest{At: start, Status: status, Outcome: "invalid", TotalMillis: millis(time.Since(start))})
		elevenError(ctx, status, code, msg)
		return
	}
	req.ID = id
	ctx.SetUserValue(userFormat, format.name)
	chars := utf8.RuneCountInString(req.Text)
	log = log.With("voice", req.Voice, "format", format.name, "chars", chars)

	rctx, cancel := context.WithTimeout(context.Background(), s.o.RequestTimeout)
	stopWatch := watchClient(ctx.Conn(), cancel)
	st := s.startStream(rctx, req)
	first, ok := <-st.chunks
	stopWatch()
	if !ok {
		cancel()
		e := synthError(st.err)
		code := "synthesis_failed"
		if e.Code != nil {
			code = *e.Code
		}
		if rctx.Err() == context.Canceled {
			e.Status = statusClientGone
		}
		log.Warn("elevenlabs speech", "status", e.Status, "error", st.err)
		s.recent.add(recentRequest{At: start, Status: e.Status, Format: format.name, Voice: req.Voice, Chars: chars, TotalMillis: millis(time.Since(start)), Outcome: "error"})
		elevenError(ctx, e.Status, code, e.Message)
		return
	}
	ttfb := time.Since(start)
	var out bytes.Buffer
	enc, err := newElevenEncoder(format, first.SampleRate, speed, &out)
	if err != nil {
		cancel()
		st.drain()
		log.Error("elevenlabs speech", "status", 500, "error", err)
		elevenError(ctx, fasthttp.StatusInternalServerError, "encoder_error", err.Error())
		return
	}
	stamps := strings.HasSuffix(mode, "with-timestamps")
	al := spanAligner{text: req.Text}
	var times charTimes
	made := 0.0 // seconds of audio
	samples := 0
	// next encodes the next chunk (first, then the stream's) into out and times; false at the end.
	pendingFirst := &first
	next := func() (bool, error) {
		var c tts.Chunk
		if pendingFirst != nil {
			c, pendingFirst = *pendingFirst, nil
		} else if v, ok := <-st.chunks; ok {
			c = v
		} else {
			if st.err != nil {
				return false, st.err
			}
			if err := enc.Close(); err != nil {
				return false, err
			}
			if al.pos >= 0 && al.pos < len(req.Text) {
				times.spread(req.Text[al.pos:], made, made)
			}
			return false, nil
		}
		if err := enc.Write(c.PCM); err != nil {
			return false, err
		}
		samples += len(c.PCM)
		t1 := made + float64(len(c.PCM))/float64(c.SampleRate)/speed
		al.chunk(c.Text, made, t1, &times)
		made = t1
		return true, nil
	}
	finish := func(outcome string, sent int64, err error) {
		cancel()
		enc.Abort()
		st.drain()
		r := recentRequest{At: start, Status: fasthttp.StatusOK, Format: format.name, Voice: req.Voice, Chars: chars,
			AudioSeconds: made, TTFBMillis: millis(ttfb), TotalMillis: millis(time.Since(start)), Outcome: outcome}
		s.recent.add(r)
		s.o.RequestMetrics.spoke(r, outcome, sent)
		attrs := []any{"status", 200, "audio_seconds", made, "ttfb_ms", ttfb.Milliseconds(), "total_ms", time.Since(start).Milliseconds(), "bytes", sent, "outcome", outcome}
		if err != nil {
			log.Warn("elevenlabs speech", append(attrs, "error", err)...)
			return
		}
		log.Info("elevenlabs speech", attrs...)
	}
	ctx.Response.Header.Set("X-Voxmux-Instance", st.backend)
	if mode == "with-timestamps" {
		// One JSON object: everything is made before it leaves.
		for {
			more, err := next()
			if err != nil {
				finish("failed_mid_stream", 0, err)
				elevenError(ctx, fasthttp.StatusBadGateway, "synthesis_failed", "synthesis failed on the instance before the audio was complete")
				return
			}
			if !more {
				break
			}
		}
		a := times.http()
		body, _ := json.Marshal(elevenStamped{AudioBase64: base64.StdEncoding.EncodeToString(out.Bytes()), Alignment: a, NormalizedAlignment: a})
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
		finish("ok", int64(len(body)), nil)
		return
	}
	if stamps {
		ctx.SetContentType("application/json")
	} else {
		ctx.SetContentType(format.contentType())
	}
	conn := ctx.Conn()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		var sent int64
		for {
			more, err := next()
			if err != nil {
				// Audio has left: the connection is cut, so the client sees a failed transfer.
				finish("failed_mid_stream", sent, err)
				conn.Close()
				return
			}
			if out.Len() > 0 || stamps && !times.empty() {
				var b []byte
				if stamps {
					a := times.http()
					b, _ = json.Marshal(elevenStamped{AudioBase64: base64.StdEncoding.EncodeToString(out.Bytes()), Alignment: a, NormalizedAlignment: a})
					b = append(b, '\n')
					times.reset()
				} else {
					b = out.Bytes()
				}
				if s.o.WriteTimeout > 0 {
					_ = conn.SetWriteDeadline(time.Now().Add(s.o.WriteTimeout))
				}
				_, err = w.Write(b)
				if err == nil {
					err = w.Flush()
				}
				out.Reset()
				sent += int64(len(b))
				if err != nil {
					finish("client_gone", sent, fmt.Errorf("the client left or stopped reading: %w", err))
					return
				}
			}
			if !more {
				finish("ok", sent, nil)
				return
			}
		}
	})
}

// parseElevenSpeech reads a text-to-speech request; status 0 when it is valid.
func (s *Server) parseElevenSpeech(ctx *fasthttp.RequestCtx, voiceID string) (req tts.Request, f elevenFormat, speed float64, status int, code, msg string) {
	bad := func(code, msg string) (tts.Request, elevenFormat, float64, int, string, string) {
		return tts.Request{}, elevenFormat{}, 0, fasthttp.StatusBadRequest, code, msg
	}
	body := ctx.PostBody()
	if len(body) > MaxBodyBytes {
		return tts.Request{}, elevenFormat{}, 0, fasthttp.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("request body is larger than %d MiB", MaxBodyBytes>>20)
	}
	var b elevenSpeechBody
	if err := json.Unmarshal(body, &b); err != nil {
		return bad("invalid_json", "request body is not valid JSON: "+excerpt(err.Error()))
	}
	f, err := parseElevenFormat(string(ctx.QueryArgs().Peek("output_format")))
	if err == nil {
		err = f.encodable(s.o.Pool.Model().SampleRate)
	}
	if err != nil {
		return bad("invalid_output_format", err.Error())
	}
	if err := s.elevenModel(b.ModelID); err != nil {
		return bad("model_not_found", err.Error())
	}
	if b.Text == nil {
		return bad("invalid_text", "text is required")
	}
	text := strings.TrimSpace(*b.Text)
	switch {
	case text == "":
		return bad("invalid_text", "text is empty")
	case !utf8.ValidString(text):
		return bad("invalid_text", "text is not valid UTF-8")
	case utf8.RuneCountInString(text) > s.o.MaxInputChars:
		return bad("text_too_long", fmt.Sprintf("text has %d characters; the limit is %d", utf8.RuneCountInString(text), s.o.MaxInputChars))
	}
	var vs elevenVoiceSettings
	if b.VoiceSettings != nil {
		vs = *b.VoiceSettings
	}
	speed, err = elevenSpeed(vs.Speed)
	if err != nil {
		return bad("invalid_voice_settings", err.Error())
	}
	voice, prompt, aerr := s.elevenVoice(voiceID)
	if aerr != nil {
		code := "voice_not_found"
		if aerr.Status != fasthttp.StatusBadRequest {
			code = "voice_unreadable"
		}
		return tts.Request{}, elevenFormat{}, 0, aerr.Status, code, aerr.Message
	}
	req = tts.Request{Text: text, Voice: voice, Prompt: prompt, Speed: 1, Seed: randomSeed()}
	if b.Seed != nil {
		req.Seed = *b.Seed
	}
	if s.o.Pool.Model().NativeSpeed {
		req.Speed, speed = float32(speed), 1
	}
	return req, f, speed, 0, "", ""
}

// elevenVoice is a voice of GET /v1/voices in ElevenLabs' shape.
type elevenVoiceInfo struct {
	VoiceID  string            `json:"voice_id"`
	Name     string            `json:"name"`
	Category string            `json:"category"`
	Labels   map[string]string `json:"labels"`
}

// elevenVoices answers GET /v1/voices ({"voices": [...]}: the model's voices, then the library's
// when the model clones) and GET /v1/voices/{voice_id}.
func (s *Server) elevenVoices(ctx *fasthttp.RequestCtx, id string) {
	m := s.o.Pool.Model()
	var list []elevenVoiceInfo
	for _, v := range m.Voices {
		list = append(list, elevenVoiceInfo{VoiceID: v, Name: v, Category: "premade", Labels: map[string]string{}})
	}
	if s.o.Voices != nil && m.Cloning {
		for _, v := range s.o.Voices.List() {
			list = append(list, elevenVoiceInfo{VoiceID: v.Name, Name: v.Name, Category: "cloned", Labels: map[string]string{}})
		}
	}
	var body any = map[string]any{"voices": list}
	if id != "" {
		body = nil
		for _, v := range list {
			if v.VoiceID == id {
				body = v
			}
		}
		if body == nil {
			elevenError(ctx, fasthttp.StatusNotFound, "voice_not_found", fmt.Sprintf("voice %q is not available", excerpt(id)))
			return
		}
	}
	b, _ := json.Marshal(body)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// elevenModelInfo is a model of GET /v1/models in ElevenLabs' shape.
type elevenModelInfo struct {
	ModelID             string `json:"model_id"`
	Name                string `json:"name"`
	CanDoTextToSpeech   bool   `json:"can_do_text_to_speech"`
	MaximumTextLength   int    `json:"maximum_text_length_per_request"`
	Description         string `json:"description"`
	CanDoVoiceConvert   bool   `json:"can_do_voice_conversion"`
	RequiresAlphaAccess bool   `json:"requires_alpha_access"`
}

// elevenModels answers GET /v1/models asked with xi-api-key: the served model, then the names that
// reach it (its aliases and ElevenLabs' model ids), as a JSON array.
func (s *Server) elevenModels(ctx *fasthttp.RequestCtx) {
	m := s.o.Pool.Model()
	ids := append(append([]string{m.Name}, s.o.ModelAliases...), elevenModelIDs...)
	list := make([]elevenModelInfo, len(ids))
	for i, id := range ids {
		desc := "served by voxmux as " + m.Name
		list[i] = elevenModelInfo{ModelID: id, Name: id, CanDoTextToSpeech: true, MaximumTextLength: s.o.MaxInputChars, Description: desc}
	}
	b, _ := json.Marshal(list)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
