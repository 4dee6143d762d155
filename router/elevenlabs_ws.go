package router

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/voxmux/voxmux/tts"
)

// ElevenLabs' text-to-speech sockets, as its API reference documents them:
//
//   - multi-stream-input: several contexts on one socket, each named by context_id. A context
//     opens with its first message (a blank " " opens it without text). Text is cut into
//     segments as on voxmux's own socket (realtime_segment.go), each one request on the pool;
//     flush speaks what waits. close_context drops the text not yet flushed and cancels its
//     requests (barge-in frees the instance), lets the text flushed before it finish, then the
//     context ends with {"isFinal": true}. close_socket flushes every context, ends each with
//     isFinal and closes the socket.
//   - stream-input: one context; {"text": ""} ends it (flushed, spoken, isFinal, then the socket
//     closes).
//
// Audio messages carry base64 audio in output_format, one per engine chunk, with the alignment of
// the characters the chunk speaks in milliseconds from the start of the message's audio. Errors
// of a context name it; errors of the socket close it with 1008, as ElevenLabs does.

// elevenInactivity is ElevenLabs' default inactivity_timeout; it takes at most elevenMaxInactivity.
const (
	elevenInactivity    = 20 * time.Second
	elevenMaxInactivity = 180 * time.Second
)

// elevenIn is a client message of either socket.
type elevenIn struct {
	Text          *string              `json:"text"`
	ContextID     string               `json:"context_id"`
	ContextIDAlt  string               `json:"contextId"`
	Flush         bool                 `json:"flush"`
	TryTrigger    bool                 `json:"try_trigger_generation"`
	CloseContext  bool                 `json:"close_context"`
	CloseSocket   bool                 `json:"close_socket"`
	Key           string               `json:"xi_api_key"`
	KeyAlt        string               `json:"xi-api-key"`
	Authorization string               `json:"authorization"`
	VoiceSettings *elevenVoiceSettings `json:"voice_settings"`
	Generation    *struct {
		ChunkLengthSchedule []float64 `json:"chunk_length_schedule"`
	} `json:"generation_config"`
}

// elevenAudio is an audio message; ContextID is empty (and left out) on stream-input.
type elevenAudio struct {
	Audio               string           `json:"audio"`
	IsFinal             *bool            `json:"isFinal"`
	NormalizedAlignment *elevenAlignment `json:"normalizedAlignment"`
	Alignment           *elevenAlignment `json:"alignment"`
	ContextID           string           `json:"contextId,omitempty"`
}

type elevenFinal struct {
	IsFinal   bool   `json:"isFinal"`
	ContextID string `json:"contextId,omitempty"`
}

type elevenWSError struct {
	Error     string `json:"error"`
	Message   string `json:"message"`
	ContextID string `json:"contextId,omitempty"`
}

type elevenOut struct {
	seg       *elevenSegment // nil: sent whatever happened to its context
	json      any
	closeCode int // then a close frame with closeText, and the session's writing ends
	closeText string
}

type elevenSession struct {
	s     *Server
	shell *wsSession // registers the connection with the server, which ends it at shutdown
	conn  *websocket.Conn
	ctx   context.Context // ends with the socket
	log   *slog.Logger
	opt   RealtimeOptions
	multi bool

	voice  string
	prompt *tts.VoicePrompt
	format elevenFormat
	seed   uint64
	authed bool // the key was valid at the upgrade, or no key is needed

	out        chan elevenOut
	wg         sync.WaitGroup
	activity   chan struct{} // a client message or audio sent: the inactivity clock restarts
	inactivity time.Duration

	mu       sync.Mutex
	contexts map[string]*elevenContext // open ones; a closed one finishes outside it
	live     int                       // contexts whose worker runs
	closing  bool
}

type elevenContext struct {
	id     string
	ctx    context.Context
	cancel context.CancelFunc
	speed  float64
	seg    segmenter

	// Guarded by the session's mu.
	buf     string
	lead    string // whitespace taken from buf that the next segment's alignment starts with
	queue   []*elevenSegment
	nextIdx int
	flushed int  // segments below this index were flushed: close_context still speaks them
	ending  bool // closed: speak what is kept, then isFinal
	idle    *time.Timer
	wake    chan struct{}
}

type elevenSegment struct {
	index   int
	text    string // the request's text
	lead    string // whitespace before it in the context's text
	st      *stream
	cancel  context.CancelFunc
	dropped atomic.Bool // by close_context: nothing more of it is sent
}

// elevenSocket upgrades a request on an ElevenLabs socket path.
func (s *Server) elevenSocket(ctx *fasthttp.RequestCtx, voiceID string, multi bool) {
	if !websocket.FastHTTPIsWebSocketUpgrade(ctx) {
		elevenError(ctx, fasthttp.StatusBadRequest, "websocket_required", excerpt(string(ctx.Path()))+" is a WebSocket endpoint: connect with GET and Upgrade: websocket")
		return
	}
	q := ctx.QueryArgs()
	if err := s.elevenModel(string(q.Peek("model_id"))); err != nil {
		elevenError(ctx, fasthttp.StatusBadRequest, "model_not_found", err.Error())
		return
	}
	format, err := parseElevenFormat(string(q.Peek("output_format")))
	if err == nil {
		err = format.encodable(s.o.Pool.Model().SampleRate)
	}
	if err != nil {
		elevenError(ctx, fasthttp.StatusBadRequest, "invalid_output_format", err.Error())
		return
	}
	voice, prompt, aerr := s.elevenVoice(voiceID)
	if aerr != nil {
		elevenError(ctx, fasthttp.StatusBadRequest, "voice_not_found", aerr.Message)
		return
	}
	inactivity := elevenInactivity
	if v := q.Peek("inactivity_timeout"); v != nil {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || time.Duration(n)*time.Second > elevenMaxInactivity {
			elevenError(ctx, fasthttp.StatusBadRequest, "invalid_inactivity_timeout", fmt.Sprintf("inactivity_timeout %q is not a whole number of seconds from 1 to %d", excerpt(string(v)), int(elevenMaxInactivity.Seconds())))
			return
		}
		inactivity = time.Duration(n) * time.Second
	}
	// language_code, sync_alignment (alignment always follows its audio), auto_mode,
	// apply_text_normalization, enable_logging and enable_ssml_parsing are accepted: none changes
	// what the model does.
	key, hasKey := elevenKey(ctx)
	authed := !hasKey && strings.HasPrefix(string(ctx.Request.Header.Peek("Authorization")), "Bearer ") || hasKey && s.validKey(key) || len(s.keys) == 0
	id, _ := ctx.UserValue(userRequestID).(string)
	route := elevenRoute(string(ctx.Path()))
	err = upgrader.Upgrade(ctx, func(conn *websocket.Conn) {
		ss := &elevenSession{s: s, shell: s.newSession(conn, id), conn: conn, log: s.o.Logger.With("request_id", id, "route", route),
			opt: s.o.Realtime.withDefaults(s.o.MaxInputChars), multi: multi, voice: voice, prompt: prompt, format: format,
			seed: randomSeed(), authed: authed, out: make(chan elevenOut, 64), activity: make(chan struct{}, 1),
			inactivity: inactivity, contexts: map[string]*elevenContext{}}
		ss.ctx = ss.shell.ctx
		ss.serve()
	})
	if err != nil {
		s.o.Logger.Info("elevenlabs socket", "request_id", id, "error", err)
	}
}

func (ss *elevenSession) serve() {
	start := time.Now()
	ss.s.sessions.Store(ss.shell, struct{}{})
	defer func() {
		ss.s.sessions.Delete(ss.shell)
		ss.shell.connMu.Lock()
		ss.shell.ended = true
		ss.shell.connMu.Unlock()
	}()
	_ = ss.conn.NetConn().SetDeadline(time.Time{})
	alive := func() { _ = ss.conn.SetReadDeadline(time.Now().Add(idleTimeout)) }
	alive()
	ss.conn.SetPongHandler(func(string) error { alive(); return nil })
	ss.conn.SetReadLimit(MaxBodyBytes)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ss.writer()
	}()
	go ss.keepAlive()
	for {
		mt, data, err := ss.conn.ReadMessage()
		if err != nil {
			break
		}
		alive()
		ss.touch()
		if mt != websocket.TextMessage {
			ss.closeWith(websocket.ClosePolicyViolation, "invalid_message", "send JSON messages as text frames")
			continue
		}
		ss.handle(data)
	}
	ss.shell.cancel()
	ss.mu.Lock()
	for _, c := range ss.contexts {
		c.cancel()
	}
	ss.mu.Unlock()
	ss.wg.Wait()
	<-done
	ss.conn.Close()
	ss.log.Info("elevenlabs socket", "seconds", time.Since(start).Seconds())
}

// keepAlive pings the client and closes the socket after inactivity_timeout without a client
// message or audio sent.
func (ss *elevenSession) keepAlive() {
	ping := time.NewTicker(pingEvery)
	defer ping.Stop()
	idle := time.NewTimer(ss.inactivity)
	defer idle.Stop()
	for {
		select {
		case <-ss.ctx.Done():
			return
		case <-ping.C:
			_ = ss.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(5*time.Second))
		case <-ss.activity:
			idle.Reset(ss.inactivity)
		case <-idle.C:
			ss.mu.Lock()
			busy := ss.live > len(ss.contexts) // a closed context still speaks
			for _, c := range ss.contexts {
				busy = busy || len(c.queue) > 0
			}
			ss.mu.Unlock()
			if busy {
				idle.Reset(ss.inactivity)
				continue
			}
			ss.send(elevenOut{json: elevenWSError{Error: "input_timeout_exceeded",
				Message: fmt.Sprintf("no text arrived within the inactivity_timeout of %d seconds", int(ss.inactivity.Seconds()))},
				closeCode: websocket.ClosePolicyViolation, closeText: "inactivity timeout"})
			return
		}
	}
}

func (ss *elevenSession) touch() {
	select {
	case ss.activity <- struct{}{}:
	default:
	}
}

// writer sends the session's messages in order, each within the write timeout; audio of a
// segment that close_context dropped is not sent.
func (ss *elevenSession) writer() {
	wt := ss.s.o.WriteTimeout
	if wt <= 0 {
		wt = 30 * time.Second
	}
	for {
		var o elevenOut
		select {
		case o = <-ss.out:
		case <-ss.ctx.Done():
			return
		}
		if o.seg != nil && o.seg.dropped.Load() {
			continue
		}
		if o.json != nil {
			b, _ := json.Marshal(o.json)
			_ = ss.conn.SetWriteDeadline(time.Now().Add(wt))
			if err := ss.conn.WriteMessage(websocket.TextMessage, b); err != nil {
				ss.shell.cancel()
				return
			}
		}
		if o.closeCode != 0 {
			_ = ss.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(o.closeCode, o.closeText), time.Now().Add(5*time.Second))
			_ = ss.conn.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
			return
		}
	}
}

func (ss *elevenSession) send(o elevenOut) {
	select {
	case ss.out <- o:
	case <-ss.ctx.Done():
	}
}

// fail reports an error of context c (nil: of the socket, which stays open).
func (ss *elevenSession) fail(c *elevenContext, code, msg string) {
	e := elevenWSError{Error: code, Message: msg}
	if c != nil && ss.multi {
		e.ContextID = c.id
	}
	ss.send(elevenOut{json: e})
}

// closeWith reports an error of the socket and closes it.
func (ss *elevenSession) closeWith(closeCode int, code, msg string) {
	ss.send(elevenOut{json: elevenWSError{Error: code, Message: msg}, closeCode: closeCode, closeText: tts.Excerpt(msg, 100)})
}

// authorize checks the key of the socket's first message when the upgrade carried none.
func (ss *elevenSession) authorize(m *elevenIn) bool {
	if ss.authed {
		return true
	}
	key := m.Key
	if key == "" {
		key = m.KeyAlt
	}
	if key == "" {
		key, _ = strings.CutPrefix(m.Authorization, "Bearer ")
	}
	if key == "" || !ss.s.validKey(key) {
		ss.closeWith(websocket.ClosePolicyViolation, "invalid_api_key", "missing or incorrect API key: send xi-api-key as a header or xi_api_key in the first message")
		return false
	}
	ss.authed = true
	return true
}

func (ss *elevenSession) handle(data []byte) {
	var m elevenIn
	if err := json.Unmarshal(data, &m); err != nil {
		ss.closeWith(websocket.ClosePolicyViolation, "invalid_message", "message is not valid JSON: "+excerpt(err.Error()))
		return
	}
	if !ss.authorize(&m) {
		return
	}
	id := m.ContextID
	if id == "" {
		id = m.ContextIDAlt
	}
	if !ss.multi {
		id = ""
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	switch {
	case m.CloseSocket:
		ss.closeSocketLocked()
		return
	case m.CloseContext && ss.multi:
		c := ss.contexts[ctxKey(id)]
		if c == nil {
			ss.fail(&elevenContext{id: ctxKey(id)}, "context_not_found", fmt.Sprintf("context %q is not open", excerpt(ctxKey(id))))
			return
		}
		ss.closeContextLocked(c)
		return
	}
	if ss.closing {
		ss.fail(nil, "socket_closing", "close_socket was sent: no more input")
		return
	}
	c := ss.contexts[ctxKey(id)]
	if c == nil && ss.multi && m.Text != nil && *m.Text == "" && !m.Flush {
		return // a keep-alive of a context already closed opens nothing
	}
	if c == nil {
		var err error
		if c, err = ss.openLocked(ctxKey(id), &m); err != nil {
			ss.fail(&elevenContext{id: ctxKey(id)}, "invalid_context", err.Error())
			return
		}
	}
	text := ""
	if m.Text != nil {
		text = *m.Text
	}
	if !ss.multi && m.Text != nil && text == "" {
		// stream-input's end of input: everything is spoken, then isFinal and the socket closes.
		ss.closeSocketLocked()
		return
	}
	if !utf8.ValidString(text) {
		ss.fail(c, "invalid_text", "text is not valid UTF-8")
		return
	}
	if c.buf == "" && strings.TrimSpace(text) == "" && !m.Flush {
		return // " " opens a context, "" keeps it alive: neither is text to speak
	}
	c.buf += text
	ss.cutLocked(c, m.Flush, true)
}

// ctxKey names the default context.
func ctxKey(id string) string {
	if id == "" {
		return "default"
	}
	return id
}

// openLocked opens context id with the settings of its first message.
func (ss *elevenSession) openLocked(id string, m *elevenIn) (*elevenContext, error) {
	if ss.live >= ss.opt.MaxContexts {
		return nil, fmt.Errorf("a connection may have %d contexts at once; close one first", ss.opt.MaxContexts)
	}
	var vs elevenVoiceSettings
	if m.VoiceSettings != nil {
		vs = *m.VoiceSettings
	}
	speed, err := elevenSpeed(vs.Speed)
	if err != nil {
		return nil, err
	}
	seg := ss.seg()
	if m.Generation != nil && len(m.Generation.ChunkLengthSchedule) > 0 {
		// Its first value is how much text may wait for a clause boundary; a sentence end starts
		// speech sooner, as on voxmux's own socket.
		first := m.Generation.ChunkLengthSchedule[0]
		if !(first >= 5 && first <= 500) {
			return nil, fmt.Errorf("generation_config.chunk_length_schedule[0] %g is outside 5 to 500", first)
		}
		seg.minChars = min(int(first), seg.maxChars)
	}
	ctx, cancel := context.WithCancel(ss.ctx)
	c := &elevenContext{id: id, ctx: ctx, cancel: cancel, speed: speed, seg: seg, wake: make(chan struct{}, 1)}
	ss.contexts[id] = c
	ss.live++
	ss.wg.Add(1)
	go ss.run(c)
	return c, nil
}

func (ss *elevenSession) seg() segmenter {
	return segmenter{minChars: ss.opt.MinChars, maxChars: ss.opt.MaxChars}
}

// cutLocked moves the segments c's text holds (all of it with flush) to its queue. A flush the
// client asked for (byClient) marks them flushed, which close_context keeps; realtime.idle_flush's
// does not.
func (ss *elevenSession) cutLocked(c *elevenContext, flush, byClient bool) {
	before := c.buf
	segs, rest := c.seg.split(c.buf, flush)
	c.buf = rest
	// The whitespace no segment speaks (between segments, or dropped by a flush) goes with the
	// next segment's characters, so that a context's alignment spells its text.
	consumed := before[:len(before)-len(rest)]
	pos := 0
	for _, raw := range segs {
		if len(c.queue) >= maxQueuedSegments {
			ss.fail(c, "context_full", fmt.Sprintf("%d segments wait to be spoken; text arrives faster than it is spoken", maxQueuedSegments))
			c.buf, consumed, pos = "", "", 0
			break
		}
		at := pos + strings.Index(consumed[pos:], raw)
		text := strings.TrimSpace(raw)
		start := at + len(raw) - len(strings.TrimLeftFunc(raw, unicode.IsSpace))
		c.queue = append(c.queue, &elevenSegment{index: c.nextIdx, text: text, lead: c.lead + consumed[pos:start]})
		c.lead = ""
		c.nextIdx++
		pos = start + len(text)
	}
	c.lead += consumed[pos:]
	if flush && byClient {
		c.flushed = c.nextIdx
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
			if ss.contexts[c.id] == c && !c.ending {
				ss.cutLocked(c, true, false)
			}
		})
	}
}

// closeContextLocked closes c as close_context does: the text not flushed is dropped and its
// requests cancelled; what was flushed is spoken; then isFinal.
func (ss *elevenSession) closeContextLocked(c *elevenContext) {
	c.buf = ""
	if c.idle != nil {
		c.idle.Stop()
	}
	c.queue = slices.DeleteFunc(c.queue, func(seg *elevenSegment) bool {
		if seg.index < c.flushed {
			return false
		}
		seg.dropped.Store(true)
		if seg.cancel != nil {
			seg.cancel()
		}
		return true
	})
	c.ending = true
	delete(ss.contexts, c.id) // the id may open a new context at once
	c.poke()
}

// closeSocketLocked flushes every context, ends each with isFinal, then closes the socket.
func (ss *elevenSession) closeSocketLocked() {
	if ss.closing {
		return
	}
	ss.closing = true
	for _, c := range ss.contexts {
		ss.cutLocked(c, true, true)
		c.ending = true
		delete(ss.contexts, c.id)
		c.poke()
	}
	go func() {
		ss.wg.Wait()
		ss.send(elevenOut{closeCode: websocket.CloseNormalClosure, closeText: "closed"})
	}()
}

func (c *elevenContext) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run speaks c's segments in order until it is closed and has spoken what it keeps.
func (ss *elevenSession) run(c *elevenContext) {
	defer ss.wg.Done()
	defer func() {
		ss.mu.Lock()
		ss.live--
		ss.mu.Unlock()
		c.cancel()
	}()
	for {
		ss.mu.Lock()
		var seg *elevenSegment
		if len(c.queue) > 0 {
			seg = c.queue[0]
		}
		ending := c.ending
		ss.mu.Unlock()
		if seg == nil {
			if ending {
				final := elevenFinal{IsFinal: true}
				if ss.multi {
					final.ContextID = c.id
				}
				ss.send(elevenOut{json: final})
				return
			}
			select {
			case <-c.wake:
				continue
			case <-c.ctx.Done():
				return
			}
		}
		ss.mu.Lock()
		if seg.st == nil && !seg.dropped.Load() {
			ss.start(c, seg)
		}
		ss.mu.Unlock()
		if !seg.dropped.Load() {
			ss.speak(c, seg)
		}
		ss.mu.Lock()
		c.queue = slices.DeleteFunc(c.queue, func(x *elevenSegment) bool { return x == seg })
		ss.mu.Unlock()
		if c.ctx.Err() != nil {
			return
		}
	}
}

// start sends seg to the pool as one request; the caller holds mu.
func (ss *elevenSession) start(c *elevenContext, seg *elevenSegment) {
	ctx, cancel := context.WithTimeout(c.ctx, ss.s.o.RequestTimeout)
	req := tts.Request{ID: fmt.Sprintf("%s/%s/%d", ss.shell.id, c.id, seg.index), Text: seg.text, Voice: ss.voice, Prompt: ss.prompt,
		Speed: 1, Seed: segmentSeed(ss.seed, seg.index)}
	if ss.s.o.Pool.Model().NativeSpeed {
		req.Speed = float32(c.speed)
	}
	seg.st, seg.cancel = ss.s.startStream(ctx, req), cancel
}

// startNext starts the segment after seg, so that it is ready when seg ends.
func (ss *elevenSession) startNext(c *elevenContext, seg *elevenSegment) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if i := slices.Index(c.queue, seg); i >= 0 && i+1 < len(c.queue) && c.queue[i+1].st == nil {
		ss.start(c, c.queue[i+1])
	}
}

// speak sends seg's audio, one message per engine chunk, with the alignment of what it says.
func (ss *elevenSession) speak(c *elevenContext, seg *elevenSegment) {
	st := seg.st
	defer func() {
		seg.cancel()
		st.drain()
	}()
	speed := c.speed // the router's time stretch; a model with its own speed is at 1 here
	if ss.s.o.Pool.Model().NativeSpeed {
		speed = 1
	}
	var enc *chunkEncoder
	al := spanAligner{text: seg.text, lead: seg.lead}
	var pending charTimes
	var sent, made float64 // seconds of audio sent in messages, and made by the engine
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
			var err error
			if enc, err = newChunkEncoder(ss.format, ch.SampleRate, speed); err != nil {
				ss.fail(c, "encoder_error", err.Error())
				return
			}
			defer enc.enc.Abort()
			ss.startNext(c, seg)
		}
		b, err := enc.write(ch.PCM)
		if err != nil {
			ss.fail(c, "encoder_error", err.Error())
			return
		}
		t1 := made + float64(len(ch.PCM))/float64(ch.SampleRate)/speed
		al.chunk(ch.Text, made, t1, &pending)
		made = t1
		if len(b) > 0 {
			// A codec that holds a partial frame sends its audio with the next message; the
			// characters wait with it.
			ss.sendAudio(c, seg, b, &pending, sent)
			sent = made
		}
	}
	if seg.dropped.Load() || c.ctx.Err() != nil {
		return
	}
	if st.err != nil || enc == nil {
		e := synthError(st.err)
		code := "synthesis_failed"
		if e.Code != nil {
			code = *e.Code
		}
		ss.fail(c, code, e.Message)
		return
	}
	tail, err := enc.close()
	if err != nil {
		ss.fail(c, "encoder_error", err.Error())
		return
	}
	if al.pos >= 0 && al.pos < len(seg.text) {
		pending.spread(seg.text[al.pos:], made, made)
	}
	if len(tail) > 0 || !pending.empty() {
		ss.sendAudio(c, seg, tail, &pending, sent)
	}
}

func (ss *elevenSession) sendAudio(c *elevenContext, seg *elevenSegment, b []byte, pending *charTimes, offset float64) {
	a := pending.socket(offset)
	pending.reset()
	m := elevenAudio{Audio: base64.StdEncoding.EncodeToString(b), Alignment: a, NormalizedAlignment: a}
	if ss.multi {
		m.ContextID = c.id
	}
	ss.touch()
	ss.send(elevenOut{seg: seg, json: m})
}
