package router

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/voxmux/voxmux/router/audio"
	"github.com/voxmux/voxmux/tts"
)

// DefaultFormat is used when a request names no response_format, as at OpenAI.
const DefaultFormat = "mp3"

// openAIVoices are OpenAI's voice names; clients written for OpenAI send them, and they map to
// the model's first voice.
var openAIVoices = []string{"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar"}

type speechRequest struct {
	Model          string          `json:"model"`
	Input          *string         `json:"input"`
	Voice          json.RawMessage `json:"voice"`
	Instructions   string          `json:"instructions"`
	ResponseFormat string          `json:"response_format"`
	Speed          *float64        `json:"speed"`
	StreamFormat   string          `json:"stream_format"`
	// Stream false asks for the whole file in one body with its length (and complete WAV and
	// FLAC headers) instead of audio as it is made.
	Stream *bool `json:"stream"`
	// Timestamps adds speech.audio.timestamps events to an SSE stream (router/timestamps.go).
	Timestamps bool `json:"timestamps"`
	// Seed makes the audio reproducible: the same request with the same seed gives the same
	// audio. Absent: a random seed per request.
	Seed *uint64 `json:"seed"`
	// RefAudio (base64 audio) and RefText (its transcript) clone a voice for this request alone,
	// on a model that clones; nothing is kept.
	RefAudio *string `json:"ref_audio"`
	RefText  *string `json:"ref_text"`
}

// speechJob is a validated request.
type speechJob struct {
	req    tts.Request
	model  string // as the client named it
	format string
	speed  float64 // applied to the audio by the router
	sse    bool
	whole  bool // "stream": false
	stamps bool // speech.audio.timestamps events
	// clip, when set, is a reference clip (ref_audio) to compute the request's voice from first.
	clip *tts.VoiceClip
}

func (s *Server) parseSpeech(body []byte) (*speechJob, *apiError) {
	limit := s.refBodyBytes()
	if len(body) > limit {
		return nil, newError(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
			fmt.Sprintf("request body is larger than %s", sizeText(limit)))
	}
	var r speechRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&r); err != nil {
		if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) && te.Field == "seed" {
			return nil, invalid("seed", "seed must be an integer from 0 to 18446744073709551615")
		}
		field, msg := jsonProblem(err)
		return nil, invalid(field, "request body: "+msg)
	}
	if dec.More() {
		return nil, invalid("", "request body has data after the JSON object")
	}
	m := s.o.Pool.Model()
	// Names and enumerations match case-insensitively (MP3, ALLOY, TTS-1), as clients differ.
	if r.Model != "" && !strings.EqualFold(r.Model, m.Name) && !slices.ContainsFunc(s.o.ModelAliases, func(a string) bool { return strings.EqualFold(a, r.Model) }) {
		e := newError(fasthttp.StatusNotFound, "invalid_request_error", "model_not_found",
			fmt.Sprintf("model %q is not served here; use %q", excerpt(r.Model), m.Name))
		p := "model"
		e.Param = &p
		return nil, e
	}
	if r.Input == nil {
		return nil, invalid("input", "input is required")
	}
	text := strings.TrimSpace(*r.Input)
	if text == "" {
		return nil, invalid("input", "input is empty")
	}
	if !utf8.ValidString(text) {
		return nil, invalid("input", "input is not valid UTF-8")
	}
	if n := utf8.RuneCountInString(text); n > s.o.MaxInputChars {
		return nil, invalid("input", fmt.Sprintf("input has %d characters; the limit is %d", n, s.o.MaxInputChars))
	}
	voice, prompt, aerr := s.resolveVoice(r.Voice)
	if aerr != nil {
		return nil, aerr
	}
	clip, aerr := s.refClip(r.RefAudio, r.RefText, prompt != nil)
	if aerr != nil {
		return nil, aerr
	}
	format := strings.ToLower(r.ResponseFormat)
	if format == "" {
		format = DefaultFormat
	}
	if audio.ContentType(format) == "" {
		return nil, invalid("response_format", fmt.Sprintf("response_format %q is not supported; use one of %s", excerpt(format), strings.Join(audio.Formats(), ", ")))
	}
	streamFormat := strings.ToLower(r.StreamFormat)
	if streamFormat != "" && streamFormat != "audio" && streamFormat != "sse" {
		return nil, invalid("stream_format", fmt.Sprintf("stream_format %q is not supported; use audio or sse", excerpt(r.StreamFormat)))
	}
	speed := 1.0
	if r.Speed != nil {
		speed = *r.Speed
		if speed < 0.25 || speed > 4 {
			return nil, invalid("speed", fmt.Sprintf("speed %g is outside 0.25 to 4.0", speed))
		}
	}
	if r.Timestamps && streamFormat != "sse" {
		return nil, invalid("timestamps", "timestamps need stream_format sse")
	}
	job := &speechJob{req: tts.Request{Text: text, Voice: voice, Speed: 1, Seed: randomSeed(), Prompt: prompt}, model: r.Model, format: format,
		speed: speed, sse: streamFormat == "sse", stamps: r.Timestamps, clip: clip}
	if r.Seed != nil {
		job.req.Seed = *r.Seed
	}
	if r.Stream != nil && !*r.Stream {
		if job.sse {
			return nil, invalid("stream", `"stream": false asks for one whole file; stream_format "sse" is a stream of events`)
		}
		job.whole = true
	}
	if m.Instructions {
		job.req.Instructions = r.Instructions
	} // else accepted and dropped: the model cannot follow them
	if job.model == "" {
		job.model = m.Name
	}
	if m.NativeSpeed {
		// The model speaks faster or slower itself (Piper's length_scale).
		job.req.Speed, job.speed = float32(speed), 1
	}
	// Otherwise the router time-stretches the audio (pitch kept) and instances get 1.
	return job, nil
}

// builtinVoice is the model's voice that name asks for: the first for "" and for OpenAI's names,
// else the first of voices that matches name but for case; false for none.
func builtinVoice(name string, voices []string) (string, bool) {
	fold := func(v string) bool { return strings.EqualFold(v, name) }
	switch {
	case name == "":
		return voices[0], true
	case slices.Contains(voices, name):
		return name, true
	case slices.ContainsFunc(voices, fold):
		return voices[slices.IndexFunc(voices, fold)], true
	case slices.ContainsFunc(openAIVoices, fold):
		return voices[0], true
	}
	return "", false
}

func (s *Server) speech(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	id, _ := ctx.UserValue(userRequestID).(string) // set by Handler for every /v1/ request
	log := s.o.Logger.With("request_id", id)

	job, aerr := s.parseSpeech(ctx.PostBody())
	if aerr != nil {
		log.Info("speech", "status", aerr.Status, "error", aerr.Message)
		s.recent.add(recentRequest{At: start, Status: aerr.Status, Outcome: "invalid", TotalMillis: millis(time.Since(start))})
		writeError(ctx, aerr)
		return
	}
	ctx.SetUserValue(userFormat, job.format)
	job.req.ID = id
	chars := utf8.RuneCountInString(job.req.Text)
	log = log.With("model", job.model, "voice", job.req.Voice, "format", job.format, "chars", chars)
	rctx, cancel := context.WithTimeout(context.Background(), s.o.RequestTimeout)
	// A client that leaves while its request waits for an instance or for the first audio gives
	// up its place and its synthesis at once.
	var left atomic.Bool
	stopWatch := watchClient(ctx.Conn(), func() { left.Store(true); cancel() })
	if job.clip != nil {
		p, err := s.extractVoice(rctx, *job.clip)
		if err != nil {
			stopWatch()
			cancel()
			e := extractError(err, "ref_audio")
			log.Warn("speech", "status", e.Status, "error", err, "stage", "ref_audio", "total_ms", time.Since(start).Milliseconds())
			s.recent.add(recentRequest{At: start, Status: e.Status, Format: job.format, Voice: job.req.Voice, Chars: chars,
				TotalMillis: millis(time.Since(start)), Outcome: "error"})
			writeError(ctx, e)
			return
		}
		job.req.Prompt = p
	}
	st := s.startStream(rctx, job.req)
	first, ok := <-st.chunks
	stopWatch()
	if !ok && left.Load() {
		cancel()
		log.Info("speech", "status", statusClientGone, "error", "the client left before any audio", "total_ms", time.Since(start).Milliseconds())
		s.recent.add(recentRequest{At: start, Status: statusClientGone, Format: job.format, Voice: job.req.Voice, Chars: chars,
			TotalMillis: millis(time.Since(start)), Outcome: "client_gone"})
		ctx.SetStatusCode(statusClientGone) // for the metrics; nobody reads it
		ctx.SetConnectionClose()
		return
	}
	if !ok {
		cancel()
		e := s.synthError(st.err)
		log.Warn("speech", "status", e.Status, "error", st.err, "total_ms", time.Since(start).Milliseconds())
		s.recent.add(recentRequest{At: start, Status: e.Status, Format: job.format, Voice: job.req.Voice, Chars: chars,
			TotalMillis: millis(time.Since(start)), Outcome: "error"})
		writeError(ctx, e)
		return
	}
	ttfb := time.Since(start)
	ctx.Response.Header.Set("X-Voxmux-Instance", st.backend)
	body := &audioBody{st: st, next: &first, sse: job.sse, cancel: cancel, chars: chars, conn: ctx.Conn(), writeTimeout: s.o.WriteTimeout}
	if job.stamps {
		body.stamps = newTimestamper(job.req.Text, first.SampleRate, job.speed)
	}
	var w io.Writer = &body.pending
	if job.sse {
		w = audio.SSEWriter{W: &body.pending}
	}
	enc, err := audio.NewEncoder(job.format, first.SampleRate, job.speed, w)
	if err != nil {
		cancel()
		st.drain()
		log.Error("speech", "status", 500, "error", err)
		writeError(ctx, newError(fasthttp.StatusInternalServerError, "server_error", "encoder_error", "cannot encode "+job.format))
		return
	}
	body.enc = enc
	if job.sse {
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
	} else {
		ctx.SetContentType(audio.ContentType(job.format))
		ctx.Response.Header.Set("Content-Disposition", `attachment; filename="speech.`+job.format+`"`)
	}
	body.secondsOf = func(samples int) float64 { return float64(samples) / float64(first.SampleRate) / job.speed }
	body.done = func(outcome string, samples int, sent int64, err error) {
		modelSecs := float64(samples) / float64(first.SampleRate)
		status := fasthttp.StatusOK
		if job.whole && outcome != "ok" {
			status = fasthttp.StatusBadGateway // nothing had left: the client gets an error
		}
		r := recentRequest{At: start, Status: status, Format: job.format, Voice: job.req.Voice, Chars: chars,
			AudioSeconds: modelSecs / job.speed, TTFBMillis: millis(ttfb), TotalMillis: millis(time.Since(start)), Outcome: outcome}
		if outcome == "ok" && modelSecs > 0 {
			// Synthesis time over the audio the model made (before any speed change).
			r.RTF = st.doneAt.Sub(start).Seconds() / modelSecs
		}
		s.recent.add(r)
		s.o.RequestMetrics.spoke(r, outcome, sent)
		attrs := []any{"status", status, "audio_seconds", r.AudioSeconds, "ttfb_ms", ttfb.Milliseconds(),
			"total_ms", time.Since(start).Milliseconds(), "rtf", r.RTF, "bytes", sent, "outcome", outcome}
		if err != nil {
			log.Warn("speech", append(attrs, "error", err)...)
			return
		}
		log.Info("speech", attrs...)
	}
	if job.whole {
		s.sendWhole(ctx, job.format, body)
		return
	}
	if tc, ok := ctx.Conn().(*net.TCPConn); ok {
		// Without a cap the kernel grows the send buffer to megabytes, minutes of compressed
		// audio: a client that stops reading would hold its slot that long before any write
		// blocked and write_timeout could start counting.
		_ = tc.SetWriteBuffer(streamSendBuffer)
	}
	// Headers leave now, even when the first chunk is shorter than a codec frame.
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStream(body, -1)
}

// sendWhole reads the whole encoded file and sends it with its length and complete headers; a
// failure before the end is an error response, since nothing has left yet.
func (s *Server) sendWhole(ctx *fasthttp.RequestCtx, format string, body *audioBody) {
	b, err := io.ReadAll(body)
	body.Close()
	if err != nil {
		writeError(ctx, newError(fasthttp.StatusBadGateway, "server_error", "instance_error", "synthesis failed on the instance before the audio was complete"))
		return
	}
	ctx.SetBody(completeHeader(format, b))
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// errCut ends a response body that failed after audio had left: fasthttp then closes the
// connection without the final chunk, so the client sees a failed transfer, never short audio
// that looks complete. An SSE stream instead ends with an error event.
var errCut = errors.New("synthesis failed mid-stream")

// audioBody encodes a stream's chunks as the response body, chunk by chunk.
type audioBody struct {
	st      *stream
	next    *tts.Chunk
	enc     audio.Encoder // writes into pending
	sse     bool
	chars   int
	failed  error // an encoding failure; st.err belongs to the producer until chunks closes
	pending bytes.Buffer
	samples int
	sent    int64
	ended   error // io.EOF or errCut once the stream is over
	// midErr is the failure an SSE stream reported in an error event (it then ends cleanly).
	midErr    error
	cancel    context.CancelFunc
	stamps    *timestamper              // nil: no timestamp events
	secondsOf func(samples int) float64 // seconds of the audio sent for samples from the model
	done      func(outcome string, samples int, sent int64, err error)
	// conn gets a fresh write deadline before each piece of the body is written, so that a
	// client that stops reading is cut after writeTimeout while a long stream that is read goes on.
	conn         net.Conn
	writeTimeout time.Duration
}

func (b *audioBody) Read(p []byte) (int, error) {
	for b.pending.Len() == 0 {
		if b.ended != nil {
			b.extendWrite() // for the last chunk and trailer
			return 0, b.ended
		}
		c := b.next
		b.next = nil
		if c == nil {
			if v, ok := <-b.st.chunks; ok {
				c = &v
			}
		}
		if c == nil {
			b.ended = io.EOF
			if b.st.err != nil {
				b.fail(b.st.err)
				continue
			}
			// The tail of the audio and the container's trailer.
			if err := b.enc.Close(); err != nil {
				b.failed = err
				b.fail(err)
				continue
			}
			if b.sse {
				if b.stamps != nil {
					b.pending.Write(b.stamps.finish())
				}
				b.pending.Write(audio.SSEDone(b.usage()))
			}
			continue
		}
		if err := b.enc.Write(c.PCM); err != nil {
			b.failed = err
			b.fail(err)
			continue
		}
		b.samples += len(c.PCM)
		if b.stamps != nil {
			b.pending.Write(b.stamps.chunk(*c))
		}
	}
	n, err := b.pending.Read(p)
	b.sent += int64(n)
	b.extendWrite()
	return n, err
}

// extendWrite gives the write fasthttp makes of what Read returned writeTimeout from now.
func (b *audioBody) extendWrite() {
	if b.conn != nil && b.writeTimeout > 0 {
		_ = b.conn.SetWriteDeadline(time.Now().Add(b.writeTimeout))
	}
}

// fail ends the body after a failure: an SSE stream gets an error event in OpenAI's shape and
// ends; an audio stream is cut.
func (b *audioBody) fail(err error) {
	if !b.sse {
		b.ended = errCut
		return
	}
	b.midErr = err
	b.ended = io.EOF
	// The cause stays in the log (done): it is instance text, not the client's business.
	e := newError(fasthttp.StatusInternalServerError, "server_error", "synthesis_failed", "synthesis failed after audio was sent")
	ev, _ := json.Marshal(struct {
		Type  string    `json:"type"`
		Error *apiError `json:"error"`
	}{"error", e})
	b.pending.WriteString("data: ")
	b.pending.Write(ev)
	b.pending.WriteString("\n\n")
}

// usage is the speech.audio.done event's usage: input tokens are the input's characters, output
// tokens the milliseconds of audio sent (docs/api.md).
func (b *audioBody) usage() audio.Usage {
	out := int(math.Round(b.secondsOf(b.samples) * 1000))
	return audio.Usage{InputTokens: b.chars, OutputTokens: out, TotalTokens: b.chars + out}
}

// Close is called by fasthttp when the body is done, written or not; it stops the synthesis if the
// client went away.
func (b *audioBody) Close() error {
	b.cancel()
	if b.ended != io.EOF || b.midErr != nil {
		b.enc.Abort() // frees it; a no-op after Close
	}
	switch {
	case b.ended == io.EOF && b.midErr != nil:
		b.done("failed_mid_stream", b.samples, b.sent, b.midErr)
	case b.ended == io.EOF:
		b.done("ok", b.samples, b.sent, nil)
	case b.ended == errCut:
		err := b.failed
		if err == nil {
			err = b.st.err
		}
		b.done("failed_mid_stream", b.samples, b.sent, err)
	default:
		b.done("client_gone", b.samples, b.sent, errors.New("the client left or stopped reading (write_timeout)"))
		b.st.drain()
	}
	return nil
}

// stream carries one request's audio from an instance to the HTTP response.
type stream struct {
	chunks  chan tts.Chunk
	err     error     // valid once chunks is closed
	doneAt  time.Time // when synthesis ended, valid once chunks is closed
	backend string    // the instance serving it, valid once a chunk arrived
}

// drain lets the stream's producer finish after its reader has stopped (the request cancelled, the
// client gone): what it still sends is dropped.
func (st *stream) drain() {
	go func() {
		for range st.chunks {
		}
	}()
}

// startStream runs req on the least-loaded ready backend. If that backend fails before any audio
// reached the router, the request runs once more on another one, unseen by the client.
func (s *Server) startStream(ctx context.Context, req tts.Request) *stream {
	st := &stream{chunks: make(chan tts.Chunk, 4)}
	go func() {
		defer close(st.chunks)
		defer func() { st.doneAt = time.Now() }()
		var failed *Backend
		for attempt := 0; attempt < 2; attempt++ {
			t0 := time.Now()
			b, err := s.o.Pool.Acquire(ctx, failed)
			s.o.RequestMetrics.waited(time.Since(t0))
			if err != nil {
				if attempt == 0 {
					st.err = err
				} // else keep the first failure
				return
			}
			sent := false
			st.backend = b.Name
			err = b.Synth.Synthesize(ctx, req, func(c tts.Chunk) error {
				select {
				case st.chunks <- c:
					sent = true
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			s.o.Pool.Release(b)
			st.err = err
			if err == nil || sent || !retryable(err) || ctx.Err() != nil {
				return
			}
			s.o.Logger.Warn("instance failed before audio; retrying on another", "request_id", req.ID, "backend", b.Name, "error", err)
			failed = b
		}
	}()
	return st
}

// streamSendBuffer caps the kernel's send buffer of a connection that streams audio (Linux
// doubles it): 256 KiB in flight still carries 2.5 MB/s at 100 ms of round trip, 50 times the
// rate of pcm.
const streamSendBuffer = 128 << 10

// statusClientGone is logged for a request whose client left before any response (nginx's 499).
const statusClientGone = 499

// instanceDied reports whether the request's instance died or was killed as hung while the request
// ran on it (plugin.DiedError); such a request may be the cause, so it is never retried elsewhere,
// where it could take the next instance down too.
func instanceDied(err error) bool {
	var d interface{ InstanceDied() bool }
	return errors.As(err, &d) && d.InstanceDied()
}

func retryable(err error) bool {
	if instanceDied(err) {
		return false
	}
	var ie *tts.Error
	if errors.As(err, &ie) {
		return ie.Kind != tts.ErrInvalid
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// synthError maps a failure before any audio to an HTTP error. Only the router's own messages and
// an instance's verdict on the input reach the client; anything else an instance or its
// connection says (socket paths, gRPC transport text) stays in the log line.
func synthError(err error) *apiError {
	var ie *tts.Error
	switch {
	case errors.Is(err, errQueueFull):
		return newError(fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded", err.Error())
	case errors.Is(err, errNoneReady), errors.Is(err, errQueueTimeout):
		return newError(fasthttp.StatusServiceUnavailable, "server_error", "service_unavailable", err.Error())
	case instanceDied(err):
		// Why it died is in the log line; its text can name sockets and processes.
		return newError(fasthttp.StatusBadGateway, "server_error", "instance_error",
			"the instance died during this request, which was not retried on another instance since it may have caused this")
	case errors.Is(err, context.DeadlineExceeded):
		return newError(fasthttp.StatusGatewayTimeout, "server_error", "timeout", "synthesis timed out")
	case errors.As(err, &ie) && ie.Kind == tts.ErrInvalid:
		// The instance's verdict is meant for the client (the prompt-token limit, say); it is
		// bounded all the same, more loosely than a client's own values.
		// Param names the field it is about ("voice"); without one it is about the input.
		param := "input"
		if ie.Param != "" {
			param = ie.Param
		}
		return invalid(param, tts.Excerpt(ie.Msg, maxVerdict))
	case errors.As(err, &ie) && ie.Kind == tts.ErrBusy:
		return newError(fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded", "every instance is at its max_inflight; retry later")
	case err == nil:
		return newError(fasthttp.StatusInternalServerError, "server_error", "no_audio", "the model produced no audio for this input")
	}
	// An instance the pool took as ready failed (ErrNotReady here is a process that died or is
	// going away between the pool's pick and the call: a connection refused, for one).
	return newError(fasthttp.StatusBadGateway, "server_error", "instance_error", "synthesis failed on the instance before any audio")
}

// synthError is synthError, except that while the server shuts down an instance that failed
// without dying (stopped with the server, or already gone) is the shutdown's doing: 503, which
// clients retry elsewhere, rather than 502.
func (s *Server) synthError(err error) *apiError {
	e := synthError(err)
	if s.draining.Load() && e.Status == fasthttp.StatusBadGateway && !instanceDied(err) {
		return newError(fasthttp.StatusServiceUnavailable, "server_error", "service_unavailable", "the server is shutting down; retry on another")
	}
	return e
}

// randomSeed is the seed of a request that names none.
func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
