package router

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/voxmux/voxmux/router/audio"
	"github.com/voxmux/voxmux/tts"
)

// WS /v1/audio/speech/stream: text streamed in, audio streamed out, for voice agents that speak
// an LLM's tokens as they come and stop the moment the user talks. The protocol is in
// docs/api.md; its message names follow vLLM-Omni's speech stream (session.config, input.text,
// input.done, audio.start, audio.done, session.done) and its contexts ElevenLabs' stream-input
// socket (several per connection, flush, close_context, close).
//
// A session's text is cut into segments (segmenter); each segment is one request on the pool,
// queued and limited as any HTTP request, with the session's voice and a seed drawn from the
// session's seed, so every segment of a context speaks in the same voice. A context speaks its
// segments in order, the next one synthesized while the one before plays. Closing a context or
// the socket cancels its requests: the instance drops them from its batches (tts.CancelStats).

// RealtimePath is the WebSocket endpoint.
const RealtimePath = "/v1/audio/speech/stream"

// realtimeProtocol is the WebSocket subprotocol the server selects when offered; a browser, which
// cannot send an Authorization header, offers it with its key as "bearer.KEY".
const realtimeProtocol = "voxmux.v1"

// The server pings every pingEvery; a connection from which nothing (a message, a pong) has
// arrived for idleTimeout is dead (a peer gone without closing) and its session ends.
const (
	pingEvery   = 30 * time.Second
	idleTimeout = 75 * time.Second
)

// wsSendQueue bounds the messages a session has waiting for the socket; with the kernel's send
// buffer capped (streamSendBuffer), a client that stops reading blocks the writer after that
// much, and the write deadline (write_timeout) then ends its session.
const wsSendQueue = 64

// maxQueuedSegments bounds the segments a context may have waiting, so a client that sends text
// far faster than it is spoken is told so instead of growing the server's memory.
const maxQueuedSegments = 64

var upgrader = websocket.FastHTTPUpgrader{
	Subprotocols: []string{realtimeProtocol},
	// Browsers on any origin may connect: access is the API key's to grant, as for HTTP.
	CheckOrigin: func(*fasthttp.RequestCtx) bool { return true },
}

// wsKey is the API key a browser offers as a WebSocket subprotocol "bearer.KEY".
func wsKey(ctx *fasthttp.RequestCtx) (string, bool) {
	for _, p := range strings.Split(string(ctx.Request.Header.Peek("Sec-WebSocket-Protocol")), ",") {
		if k, ok := strings.CutPrefix(strings.TrimSpace(p), "bearer."); ok {
			return k, true
		}
	}
	return "", false
}

func (s *Server) speechStream(ctx *fasthttp.RequestCtx) {
	if !websocket.FastHTTPIsWebSocketUpgrade(ctx) {
		writeError(ctx, newError(fasthttp.StatusBadRequest, "invalid_request_error", "websocket_required",
			RealtimePath+" is a WebSocket endpoint: connect with GET and Upgrade: websocket"))
		return
	}
	id, _ := ctx.UserValue(userRequestID).(string)
	err := upgrader.Upgrade(ctx, func(conn *websocket.Conn) {
		ss := s.newSession(conn, id)
		ss.serve()
	})
	if err != nil {
		s.o.Logger.Info("speech stream", "request_id", id, "error", err)
	}
}

// Client messages.
type wsIn struct {
	Type      string `json:"type"`
	ContextID string `json:"context_id"`
	Text      string `json:"text"`
	Flush     bool   `json:"flush"`
	// session.config
	Model          string          `json:"model"`
	Voice          json.RawMessage `json:"voice"`
	ResponseFormat string          `json:"response_format"`
	SampleRate     int             `json:"sample_rate"`
	Seed           *uint64         `json:"seed"`
	AudioEncoding  string          `json:"audio_encoding"`
	// RefAudio (base64 audio) and RefText (its transcript) clone the session's voice, as in a
	// speech request.
	RefAudio *string `json:"ref_audio"`
	RefText  *string `json:"ref_text"`
}

// wsOut is a message to the client: JSON, then its audio as a binary frame when the session
// sends audio in binary.
type wsOut struct {
	c     *wsContext // nil: the session's own
	json  any
	bin   []byte
	final bool // sent even after c was closed: its context.closed
	close bool // then the close frame, and the session ends
}

type wsSession struct {
	s      *Server
	conn   *websocket.Conn
	id     string
	log    *slog.Logger
	opt    RealtimeOptions
	seg    segmenter
	ctx    context.Context // ends with the socket
	cancel context.CancelFunc
	out    chan wsOut
	wg     sync.WaitGroup // context workers

	// Set by session.config, read-only after.
	configured bool
	voice      string
	prompt     *tts.VoicePrompt // a library voice's, or the one computed from ref_audio
	format     string
	rate       int // of pcm output
	seed       uint64
	binary     bool

	mu       sync.Mutex
	contexts map[string]*wsContext
	closing  bool

	// connMu orders closeSessions' use of the connection before its end: once ended, fasthttp
	// takes the connection back.
	connMu sync.Mutex
	ended  bool
}

type wsContext struct {
	id     string
	ctx    context.Context
	cancel context.CancelFunc
	closed atomic.Bool // by close_context or the socket: nothing more of it is sent

	// Guarded by the session's mu.
	buf     string
	queue   []*wsSegment
	ending  bool // input.done: close once the queue is spoken
	chars   int  // characters of the context's text cut into segments
	nextIdx int
	idle    *time.Timer
	wake    chan struct{}

	// The worker's.
	seconds float64 // audio sent so far
}

type wsSegment struct {
	index    int
	text     string // the request's text: the segment trimmed
	charBase int    // characters of the context's text before text
	st       *stream
	cancel   context.CancelFunc // ends st's request
}

func (s *Server) newSession(conn *websocket.Conn, id string) *wsSession {
	ctx, cancel := context.WithCancel(context.Background())
	o := s.o.Realtime.withDefaults(s.o.MaxInputChars)
	return &wsSession{s: s, conn: conn, id: id, log: s.o.Logger.With("request_id", id, "route", RealtimePath),
		opt: o, seg: segmenter{minChars: o.MinChars, maxChars: o.MaxChars},
		ctx: ctx, cancel: cancel, out: make(chan wsOut, wsSendQueue), contexts: map[string]*wsContext{}}
}

func (ss *wsSession) serve() {
	start := time.Now()
	ss.s.sessions.Store(ss, struct{}{})
	defer func() {
		ss.s.sessions.Delete(ss)
		ss.connMu.Lock()
		ss.ended = true
		ss.connMu.Unlock()
	}()
	// The server's read timeout was for the HTTP request; from now on the pings keep it alive.
	_ = ss.conn.NetConn().SetDeadline(time.Time{})
	if tc, ok := ss.conn.NetConn().(*net.TCPConn); ok {
		// As for an HTTP stream: a client that stops reading blocks the writes after at most this
		// much audio, and write_timeout starts counting.
		_ = tc.SetWriteBuffer(streamSendBuffer)
	}
	alive := func() { _ = ss.conn.SetReadDeadline(time.Now().Add(idleTimeout)) }
	alive()
	ss.conn.SetPongHandler(func(string) error { alive(); return nil })
	pingDone := make(chan struct{})
	go func() {
		defer close(pingDone)
		t := time.NewTicker(pingEvery)
		defer t.Stop()
		for {
			select {
			case <-ss.ctx.Done():
				return
			case <-t.C:
				_ = ss.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(5*time.Second))
			}
		}
	}()
	// Until session.config, room for its ref_audio; then the bound of every other message.
	ss.conn.SetReadLimit(int64(ss.s.refBodyBytes()))
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		ss.writer()
	}()
	for {
		mt, data, err := ss.conn.ReadMessage()
		if err != nil {
			break
		}
		alive()
		if mt != websocket.TextMessage {
			ss.fail(nil, "invalid_message", "send JSON messages as text frames")
			continue
		}
		ss.handle(data)
		if ss.configured {
			ss.conn.SetReadLimit(MaxBodyBytes)
		}
		// The time a message took to handle (session.config's voice extraction) is not the
		// peer's silence.
		alive()
	}
	// The socket is closed: every context's requests are cancelled.
	ss.cancel()
	ss.mu.Lock()
	for _, c := range ss.contexts {
		c.closed.Store(true)
		c.cancel()
	}
	ss.mu.Unlock()
	ss.wg.Wait()
	<-writerDone
	<-pingDone
	ss.conn.Close()
	ss.log.Info("speech stream", "seconds", time.Since(start).Seconds())
}

// writer sends the session's messages in order; audio of a closed context is dropped.
func (ss *wsSession) writer() {
	for {
		var o wsOut
		select {
		case o = <-ss.out:
		case <-ss.ctx.Done():
			return
		}
		if o.c != nil && o.c.closed.Load() && !o.final {
			continue
		}
		if o.json != nil {
			b, _ := json.Marshal(o.json)
			if err := ss.write(websocket.TextMessage, b); err != nil {
				ss.cut(err)
				return
			}
		}
		if o.bin != nil {
			if err := ss.write(websocket.BinaryMessage, o.bin); err != nil {
				ss.cut(err)
				return
			}
		}
		if o.close {
			_ = ss.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "session done"), time.Now().Add(5*time.Second))
			// The client answers with its close frame, which ends the read loop; one that does not
			// is cut off.
			_ = ss.conn.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
			return
		}
	}
}

// write sends one message, within write_timeout as every write to an HTTP client.
func (ss *wsSession) write(mt int, b []byte) error {
	if d := ss.s.o.WriteTimeout; d > 0 {
		_ = ss.conn.SetWriteDeadline(time.Now().Add(d))
	}
	return ss.conn.WriteMessage(mt, b)
}

// cut ends a session whose client left or stopped reading: its requests are cancelled (their
// slots freed) and the read loop ends now rather than at idleTimeout.
func (ss *wsSession) cut(err error) {
	ss.log.Info("speech stream", "outcome", "client_gone", "error", tts.Excerpt(err.Error(), 200))
	ss.cancel()
	_ = ss.conn.NetConn().SetReadDeadline(time.Now())
}

func (ss *wsSession) send(o wsOut) {
	select {
	case ss.out <- o:
	case <-ss.ctx.Done():
	}
}

type wsError struct {
	Type      string `json:"type"`
	ContextID string `json:"context_id,omitempty"`
	Code      string `json:"code"`
	Message   string `json:"message"`
	Param     string `json:"param,omitempty"` // the session.config field at fault, where the HTTP API names one
}

func (ss *wsSession) fail(c *wsContext, code, msg string) {
	e := wsError{Type: "error", Code: code, Message: msg}
	if c != nil {
		e.ContextID = c.id
	}
	ss.send(wsOut{c: c, json: e})
}

// failAPI sends an error of the HTTP API's as the session's: its code, message and param.
func (ss *wsSession) failAPI(e *apiError) {
	w := wsError{Type: "error", Code: "invalid_value", Message: e.Message}
	if e.Code != nil {
		w.Code = *e.Code
	}
	if e.Param != nil {
		w.Param = *e.Param
	}
	ss.send(wsOut{json: w})
}

func (ss *wsSession) handle(data []byte) {
	var m wsIn
	if err := json.Unmarshal(data, &m); err != nil {
		_, msg := jsonProblem(err)
		ss.fail(nil, "invalid_message", "message: "+msg)
		return
	}
	if !ss.configured && m.Type != "session.config" {
		ss.fail(nil, "session_not_configured", "send session.config first")
		return
	}
	switch m.Type {
	case "session.config":
		ss.config(m)
	case "input.text", "flush", "input.done", "close_context":
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if m.Type == "close_context" { // also while the session closes: a barge-in on its last words
			ss.closeContextLocked(m.ContextID)
			return
		}
		if ss.closing {
			ss.fail(nil, "session_closing", "the session is closing: no more input")
			return
		}
		c, err := ss.contextLocked(m.ContextID)
		if err != nil {
			ss.fail(nil, "too_many_contexts", err.Error())
			return
		}
		if c.ending {
			ss.fail(c, "context_closing", fmt.Sprintf("input.done was sent for context %q; its audio is finishing, use another context_id", excerpt(c.id)))
			return
		}
		switch m.Type {
		case "input.text":
			if !utf8.ValidString(m.Text) {
				ss.fail(c, "invalid_text", "text is not valid UTF-8")
				return
			}
			c.buf += m.Text
			ss.cutLocked(c, m.Flush)
		case "flush":
			ss.cutLocked(c, true)
		case "input.done":
			ss.cutLocked(c, true)
			c.ending = true
			c.poke()
		}
	case "close":
		ss.mu.Lock()
		if ss.closing {
			ss.mu.Unlock()
			return
		}
		ss.closing = true
		for _, c := range ss.contexts {
			ss.cutLocked(c, true)
			c.ending = true
			c.poke()
		}
		ss.mu.Unlock()
		go func() {
			ss.wg.Wait() // every context spoke what it had
			ss.send(wsOut{json: map[string]string{"type": "session.done"}, close: true})
		}()
	default:
		ss.fail(nil, "invalid_message", fmt.Sprintf("unknown message type %q", excerpt(m.Type)))
	}
}

func (ss *wsSession) config(m wsIn) {
	if ss.configured {
		ss.fail(nil, "invalid_message", "session.config was already sent")
		return
	}
	model := ss.s.o.Pool.Model()
	if m.Model != "" && m.Model != model.Name && !slices.Contains(ss.s.o.ModelAliases, m.Model) {
		ss.fail(nil, "model_not_found", fmt.Sprintf("model %q is not served here; use %q", excerpt(m.Model), model.Name))
		return
	}
	voice, prompt, aerr := ss.s.resolveVoice(m.Voice)
	if aerr != nil {
		ss.fail(nil, "invalid_voice", aerr.Message)
		return
	}
	clip, aerr := ss.s.refClip(m.RefAudio, m.RefText, prompt != nil)
	if aerr != nil {
		ss.failAPI(aerr)
		return
	}
	format := m.ResponseFormat
	if format == "" {
		format = "pcm"
	}
	if audio.ContentType(format) == "" {
		ss.fail(nil, "invalid_response_format", fmt.Sprintf("response_format %q is not supported; use one of %s", excerpt(format), strings.Join(audio.Formats(), ", ")))
		return
	}
	rate := audio.PCMRate
	if m.SampleRate != 0 {
		if format != "pcm" {
			ss.fail(nil, "invalid_sample_rate", "sample_rate applies to pcm only; the other formats are at the model's rate")
			return
		}
		if m.SampleRate < 8000 || m.SampleRate > 48000 {
			ss.fail(nil, "invalid_sample_rate", fmt.Sprintf("sample_rate %d is outside 8000 to 48000", m.SampleRate))
			return
		}
		rate = m.SampleRate
	}
	var binary bool
	switch m.AudioEncoding {
	case "", "binary":
		binary = true
	case "base64":
	default:
		ss.fail(nil, "invalid_audio_encoding", fmt.Sprintf("audio_encoding %q is not binary or base64", excerpt(m.AudioEncoding)))
		return
	}
	if clip != nil {
		// Last, so that a config refused for another field costs no instance time. The read loop
		// waits meanwhile: whatever the client sends next finds the session configured.
		start := time.Now()
		ctx, cancel := context.WithTimeout(ss.ctx, ss.s.o.RequestTimeout)
		p, err := ss.s.extractVoice(ctx, *clip)
		cancel()
		if err != nil {
			e := extractError(err, "ref_audio")
			ss.log.Warn("speech stream", "status", e.Status, "error", err, "stage", "ref_audio", "ms", time.Since(start).Milliseconds())
			ss.failAPI(e)
			return
		}
		ss.log.Info("speech stream", "stage", "ref_audio", "ms", time.Since(start).Milliseconds())
		prompt, voice = p, refAudioVoice
	}
	if m.Seed != nil {
		ss.seed = *m.Seed
	}
	ss.configured, ss.voice, ss.prompt, ss.format, ss.rate, ss.binary = true, voice, prompt, format, rate, binary
	created := map[string]any{"type": "session.created", "session_id": ss.id, "model": model.Name, "voice": voice,
		"response_format": format, "audio_encoding": map[bool]string{true: "binary", false: "base64"}[ss.binary],
		"min_chars": ss.opt.MinChars, "max_chars": ss.opt.MaxChars}
	if format == "pcm" {
		created["sample_rate"] = rate
	} else {
		created["sample_rate"] = model.SampleRate
	}
	ss.send(wsOut{json: created})
}

// refAudioVoice is the voice session.created names for a session that speaks in a voice cloned
// from its ref_audio.
const refAudioVoice = "ref_audio"

// contextLocked finds or opens the context id ("" is "default").
func (ss *wsSession) contextLocked(id string) (*wsContext, error) {
	if id == "" {
		id = "default"
	}
	if c := ss.contexts[id]; c != nil {
		return c, nil
	}
	if len(ss.contexts) >= ss.opt.MaxContexts {
		return nil, fmt.Errorf("a connection may have %d contexts open at once; close one first", ss.opt.MaxContexts)
	}
	ctx, cancel := context.WithCancel(ss.ctx)
	c := &wsContext{id: id, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
	ss.contexts[id] = c
	ss.wg.Add(1)
	go ss.run(c)
	return c, nil
}

func (ss *wsSession) closeContextLocked(id string) {
	if id == "" {
		id = "default"
	}
	c := ss.contexts[id]
	if c == nil {
		ss.fail(nil, "context_not_found", fmt.Sprintf("context %q is not open", excerpt(id)))
		return
	}
	// Closed before the cancel, so the writer drops whatever of it is still on the way.
	c.closed.Store(true)
	c.cancel()
	if c.idle != nil {
		c.idle.Stop()
	}
	delete(ss.contexts, id)
	ss.send(wsOut{c: c, final: true, json: map[string]string{"type": "context.closed", "context_id": id, "reason": "cancelled"}})
}

// cutLocked moves the segments c's text holds (all of it with flush) to its queue.
func (ss *wsSession) cutLocked(c *wsContext, flush bool) {
	segs, rest := ss.seg.split(c.buf, flush)
	c.buf = rest
	for _, raw := range segs {
		if len(c.queue) >= maxQueuedSegments {
			ss.fail(c, "context_full", fmt.Sprintf("%d segments wait to be spoken; text arrives faster than it is spoken", maxQueuedSegments))
			c.buf = ""
			return
		}
		lead := len(raw) - len(strings.TrimLeft(raw, " \t\r\n"))
		text := strings.TrimSpace(raw)
		c.queue = append(c.queue, &wsSegment{index: c.nextIdx, text: text, charBase: c.chars + utf8.RuneCountInString(raw[:lead])})
		c.nextIdx++
		c.chars += utf8.RuneCountInString(raw)
	}
	if len(segs) > 0 {
		c.poke()
	}
	if c.idle != nil {
		c.idle.Stop()
	}
	if d := ss.opt.IdleFlush; d > 0 && c.buf != "" {
		c.idle = time.AfterFunc(d, func() {
			ss.mu.Lock()
			defer ss.mu.Unlock()
			if ss.contexts[c.id] == c {
				ss.cutLocked(c, true)
			}
		})
	}
}

func (c *wsContext) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run speaks c's segments in order until input.done (then context.closed) or a cancel.
func (ss *wsSession) run(c *wsContext) {
	defer ss.wg.Done()
	for {
		ss.mu.Lock()
		var seg *wsSegment
		if len(c.queue) > 0 {
			seg = c.queue[0]
		}
		ending := c.ending
		ss.mu.Unlock()
		if seg == nil {
			if ending {
				ss.mu.Lock()
				if ss.contexts[c.id] == c {
					delete(ss.contexts, c.id)
				}
				ss.mu.Unlock()
				c.cancel()
				ss.send(wsOut{c: c, json: map[string]string{"type": "context.closed", "context_id": c.id, "reason": "done"}})
				return
			}
			select {
			case <-c.wake:
				continue
			case <-c.ctx.Done():
				return
			}
		}
		if seg.st == nil {
			ss.start(c, seg)
		}
		ss.speak(c, seg)
		ss.mu.Lock()
		c.queue = c.queue[1:]
		ss.mu.Unlock()
		if c.ctx.Err() != nil {
			return
		}
	}
}

// start sends seg to the pool as one request.
func (ss *wsSession) start(c *wsContext, seg *wsSegment) {
	ctx, cancel := context.WithTimeout(c.ctx, ss.s.o.RequestTimeout)
	req := tts.Request{ID: fmt.Sprintf("%s/%s/%d", ss.id, c.id, seg.index), Text: seg.text, Voice: ss.voice, Prompt: ss.prompt, Speed: 1,
		Seed: segmentSeed(ss.seed, seg.index)}
	seg.st, seg.cancel = ss.s.startStream(ctx, req), cancel
}

// segmentSeed draws segment i's seed from the session's (SplitMix64): a session replayed with
// the same text, cut the same way, gives the same audio.
func segmentSeed(seed uint64, i int) uint64 {
	z := seed + uint64(i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Server messages of a segment.
type wsAudioStart struct {
	Type         string `json:"type"`
	ContextID    string `json:"context_id"`
	SegmentIndex int    `json:"segment_index"`
	Text         string `json:"text"`
	CharStart    int    `json:"char_start"`
	CharEnd      int    `json:"char_end"`
}

type wsAudioDelta struct {
	Type         string `json:"type"`
	ContextID    string `json:"context_id"`
	SegmentIndex int    `json:"segment_index"`
	// The text the audio speaks, in characters of the context's text.
	CharStart int `json:"char_start"`
	CharEnd   int `json:"char_end"`
	// Start and End are where the audio lies in the context's audio, in seconds.
	Start float64 `json:"start"`
	End   float64 `json:"end"`
	Words []Word  `json:"words"`
	Bytes int     `json:"bytes"`
	Audio *string `json:"audio,omitempty"` // base64, when the session asked for it
}

type wsAudioDone struct {
	Type         string  `json:"type"`
	ContextID    string  `json:"context_id"`
	SegmentIndex int     `json:"segment_index"`
	AudioSeconds float64 `json:"audio_seconds"`
	Words        []Word  `json:"words"` // the words no audio.delta placed
}

// speak streams seg's audio to the client; the first audio starts the next segment's synthesis.
func (ss *wsSession) speak(c *wsContext, seg *wsSegment) {
	st := seg.st
	defer func() {
		seg.cancel()
		st.drain()
	}()
	runes := utf8.RuneCountInString(seg.text)
	ss.send(wsOut{c: c, json: wsAudioStart{Type: "audio.start", ContextID: c.id, SegmentIndex: seg.index, Text: seg.text,
		CharStart: seg.charBase, CharEnd: seg.charBase + runes}})
	var enc *segmentEncoder
	var al *aligner
	samples, rate := 0, ss.s.o.Pool.Model().SampleRate
	for {
		var ch tts.Chunk
		var ok bool
		select {
		case ch, ok = <-st.chunks:
		case <-c.ctx.Done():
			return
		}
		if !ok {
			break
		}
		if enc == nil {
			rate = ch.SampleRate
			var err error
			if enc, err = ss.newEncoder(rate); err != nil {
				ss.fail(c, "encoder_error", err.Error())
				return
			}
			defer enc.abort()
			al = newAligner(seg.text, seg.charBase, c.seconds, rate)
			ss.startNext(c, seg)
		}
		b, err := enc.write(ch.PCM)
		if err != nil {
			c.seconds += float64(samples) / float64(rate)
			ss.fail(c, "encoder_error", err.Error())
			return
		}
		t0 := c.seconds + float64(samples)/float64(rate)
		samples += len(ch.PCM)
		d := wsAudioDelta{Type: "audio.delta", ContextID: c.id, SegmentIndex: seg.index,
			Start: round3(t0), End: round3(c.seconds + float64(samples)/float64(rate)),
			CharStart: seg.charBase, CharEnd: seg.charBase + runes, Words: al.chunk(len(ch.PCM), ch.Text)}
		if sp := ch.Text; sp != nil && sp.Start <= sp.End && sp.End <= len(seg.text) {
			d.CharStart = seg.charBase + utf8.RuneCountInString(seg.text[:sp.Start])
			d.CharEnd = seg.charBase + utf8.RuneCountInString(seg.text[:sp.End])
		}
		if d.Words == nil {
			d.Words = []Word{}
		}
		ss.sendAudio(c, d, b)
	}
	if c.ctx.Err() != nil {
		return
	}
	if st.err != nil || enc == nil {
		// The next segment's timestamps follow the audio of this one that was sent.
		c.seconds += float64(samples) / float64(rate)
		e := ss.s.synthError(st.err)
		code := "synthesis_failed"
		if e.Code != nil {
			code = *e.Code
		}
		ss.fail(c, code, fmt.Sprintf("segment %d: %s", seg.index, e.Message))
		return
	}
	end := c.seconds + float64(samples)/float64(rate)
	tail, err := enc.close()
	if err != nil {
		c.seconds = end
		ss.fail(c, "encoder_error", err.Error())
		return
	}
	if len(tail) > 0 {
		ss.sendAudio(c, wsAudioDelta{Type: "audio.delta", ContextID: c.id, SegmentIndex: seg.index, Start: round3(end), End: round3(end),
			CharStart: seg.charBase + runes, CharEnd: seg.charBase + runes, Words: []Word{}}, tail)
	}
	words := al.finish()
	if words == nil {
		words = []Word{}
	}
	c.seconds = end
	ss.send(wsOut{c: c, json: wsAudioDone{Type: "audio.done", ContextID: c.id, SegmentIndex: seg.index,
		AudioSeconds: round3(float64(samples) / float64(rate)), Words: words}})
}

func (ss *wsSession) sendAudio(c *wsContext, d wsAudioDelta, b []byte) {
	d.Bytes = len(b)
	if !ss.binary {
		a := base64.StdEncoding.EncodeToString(b)
		d.Audio = &a
		ss.send(wsOut{c: c, json: d})
		return
	}
	if b == nil {
		b = []byte{}
	}
	ss.send(wsOut{c: c, json: d, bin: b})
}

// startNext starts the segment after seg, if it is queued, so that it is ready when seg ends.
func (ss *wsSession) startNext(c *wsContext, seg *wsSegment) {
	ss.mu.Lock()
	var next *wsSegment
	if i := slices.Index(c.queue, seg); i >= 0 && i+1 < len(c.queue) {
		next = c.queue[i+1]
	}
	ss.mu.Unlock()
	if next != nil && next.st == nil {
		ss.start(c, next)
	}
}

// segmentEncoder encodes one segment's audio: pcm as 16-bit little-endian at the session's
// rate, the other formats as one file per segment at the model's rate.
type segmentEncoder struct {
	rs  audio.Stage
	enc audio.Encoder
	buf strings.Builder
}

func (ss *wsSession) newEncoder(rate int) (*segmentEncoder, error) {
	e := &segmentEncoder{}
	if ss.format == "pcm" {
		rs, err := audio.NewResampler(rate, ss.rate)
		if err != nil {
			return nil, fmt.Errorf("pcm at %d Hz: %w", ss.rate, err)
		}
		e.rs = rs
		return e, nil
	}
	enc, err := audio.NewEncoder(ss.format, rate, 1, &e.buf)
	if err != nil {
		return nil, err
	}
	e.enc = enc
	return e, nil
}

func (e *segmentEncoder) write(pcm []float32) ([]byte, error) {
	if e.rs != nil {
		out, err := e.rs.Process(pcm)
		return pcm16(out), err
	}
	if err := e.enc.Write(pcm); err != nil {
		return nil, err
	}
	return e.take(), nil
}

func (e *segmentEncoder) close() ([]byte, error) {
	if e.rs != nil {
		out, err := e.rs.Flush()
		e.rs.Close()
		e.rs = nil
		return pcm16(out), err
	}
	err := e.enc.Close()
	e.enc = nil
	return e.take(), err
}

func (e *segmentEncoder) abort() {
	if e.rs != nil {
		e.rs.Close()
	}
	if e.enc != nil {
		e.enc.Abort()
	}
}

func (e *segmentEncoder) take() []byte {
	b := []byte(e.buf.String())
	e.buf.Reset()
	return b
}

func pcm16(pcm []float32) []byte {
	b := make([]byte, 2*len(pcm))
	for i, v := range pcm {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(int16(math.Round(float64(max(-1, min(1, v)))*32767))))
	}
	return b
}

// closeSessions ends every WebSocket session (the server shuts down): going away, their
// requests cancelled.
func (s *Server) closeSessions() {
	s.sessions.Range(func(k, _ any) bool {
		ss := k.(*wsSession)
		ss.connMu.Lock()
		defer ss.connMu.Unlock()
		if !ss.ended {
			_ = ss.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "server shutting down"), time.Now().Add(time.Second))
			_ = ss.conn.NetConn().SetReadDeadline(time.Now())
		}
		return true
	})
}
