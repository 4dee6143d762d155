// Package router is voxmux's HTTP front: the OpenAI-shaped speech API, health endpoints, and
// balancing of requests over the instances in a Pool.
package router

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/voxmux/voxmux/router/library"
	"github.com/voxmux/voxmux/tts"
)

// MaxBodyBytes bounds a request body (OpenAI's 413 limit).
const MaxBodyBytes = 1 << 20

// ReadBufferSize bounds a request's line and headers together. fasthttp's default, 4 KiB, turns
// away browsers behind proxies that carry many cookies; beyond this a request gets 431.
const ReadBufferSize = 32 << 10

// Options configure a Server.
type Options struct {
	// Metrics, when set, is served at GET /metrics in Prometheus' text format.
	Metrics        prometheus.Gatherer
	Pool           *Pool
	MaxInputChars  int
	RequestTimeout time.Duration
	// WriteTimeout bounds each write to a client: a whole small response, each piece of an audio
	// stream. A client that reads nothing for this long is cut off and its slot freed.
	WriteTimeout time.Duration
	// ModelAliases are other names clients may send as "model" (besides the model's own).
	ModelAliases []string
	// APIKeys, when not empty, are the keys /v1/* requires as Authorization: Bearer KEY. The
	// status page, /status.json, /metrics, /healthz and /readyz stay open.
	APIKeys map[string]struct{}
	// CORS, when set with origins, lets pages on those origins call /v1/*; nil leaves CORS off.
	CORS *CORSOptions
	// RequestMetrics records requests, latencies and the pool's figures (NewMetrics); nil records
	// nothing.
	RequestMetrics *Metrics
	// GroupExtra adds fields to each group of /status.json (GPU figures, for one).
	GroupExtra func(g *Group) map[string]any
	// Realtime tunes WS /v1/audio/speech/stream; zero values take config.Realtime's defaults.
	Realtime RealtimeOptions
	// Voices is the library of cloned voices; nil: there is none (ad hoc cloning with ref_audio
	// still works on a model that clones).
	Voices *library.Library
	// MaxUploadBytes bounds an uploaded reference clip; 0: DefaultMaxUploadBytes.
	MaxUploadBytes int
	// AdminToken, when set, may create and delete library voices, as may VoiceKeys. With neither
	// set and no APIKeys, anyone may.
	AdminToken string
	VoiceKeys  map[string]struct{}
	Logger     *slog.Logger
}

// Server is the router's HTTP server.
type Server struct {
	o        Options
	srv      *fasthttp.Server
	draining atomic.Bool
	metrics  fasthttp.RequestHandler
	recent   *recentRing
	started  time.Time
	// keys holds the API keys as byte slices for constant-time comparison.
	keys [][]byte
	// sessions are the open WebSocket sessions (realtime.go), ended at shutdown.
	sessions sync.Map
}

// New makes a Server.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 10 * time.Minute
	}
	if o.MaxUploadBytes == 0 {
		o.MaxUploadBytes = DefaultMaxUploadBytes
	}
	s := &Server{o: o, recent: newRecentRing(100), started: time.Now()}
	for k := range o.APIKeys {
		s.keys = append(s.keys, []byte(k))
	}
	if o.Metrics != nil {
		s.metrics = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(o.Metrics, promhttp.HandlerOpts{}))
	}
	s.srv = &fasthttp.Server{
		Handler: s.Handler,
		Name:    "voxmux",
		// Bodies are read by the handler, after the API key and the route's limit are checked
		// (body.go); fasthttp reads only their first 8 KiB, and parses no multipart form itself.
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           max(MaxBodyBytes, uploadBodyBytes(o.MaxUploadBytes)),
		ReadBufferSize:               ReadBufferSize,
		ErrorHandler:                 s.readError,
		ReadTimeout:                  30 * time.Second,
		WriteTimeout:                 o.WriteTimeout,
		IdleTimeout:                  2 * time.Minute,
		CloseOnShutdown:              true,
		Logger:                       connLogger{o.Logger},
	}
	return s
}

// connLogger takes fasthttp's own messages about connections. Their text quotes the bytes of a
// request it could not parse (an Authorization header among them), so that part is cut, and the
// rest is bounded; they log at debug level, since each request has its own line already.
type connLogger struct{ l *slog.Logger }

func (c connLogger) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if i := strings.Index(msg, "buffer size="); i >= 0 {
		msg = msg[:i] + "…"
	}
	c.l.Debug("http connection", "error", tts.Excerpt(msg, 200))
}

// Serve serves HTTP on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

// SetDraining makes /readyz answer 503 (the first step of a clean shutdown).
func (s *Server) SetDraining() { s.draining.Store(true) }

// Shutdown stops taking requests and waits for in-flight ones until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.SetDraining()
	s.closeSessions() // fasthttp does not track the connections WebSocket sessions took over
	return s.srv.ShutdownWithContext(ctx)
}

// Handler routes a request.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	route := routeOf(path)
	if strings.HasPrefix(path, "/v1/") {
		if s.preflight(ctx) {
			return // browsers send no key with a preflight
		}
		defer s.corsResponse(ctx)
		id := requestID(ctx.Request.Header.Peek("X-Request-Id"))
		ctx.Response.Header.Set("X-Request-Id", id)
		ctx.SetUserValue(userRequestID, id)
		if !s.authorized(ctx) {
			writeError(ctx, newError(fasthttp.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
				"missing or incorrect API key: send Authorization: Bearer <key>"))
			s.o.Logger.Info("request", "request_id", id, "route", route, "status", fasthttp.StatusUnauthorized, "error", "invalid_api_key")
			s.o.RequestMetrics.request(route, fasthttp.StatusUnauthorized, "")
			skipBody(ctx)
			return
		}
	}
	if e := readBody(ctx, s.bodyLimit(path)); e != nil {
		writeError(ctx, e)
		skipBody(ctx)
		s.o.Logger.Info("request", "request_id", ctx.UserValue(userRequestID), "route", route, "status", e.Status, "error", *e.Code)
		s.o.RequestMetrics.request(route, e.Status, "")
		return
	}
	s.route(ctx, path)
	format, _ := ctx.UserValue(userFormat).(string)
	s.o.RequestMetrics.request(route, ctx.Response.StatusCode(), format)
	if route != "/v1/audio/speech" && strings.HasPrefix(path, "/v1/") {
		s.o.Logger.Info("request", "request_id", ctx.UserValue(userRequestID), "route", route, "method", string(ctx.Method()), "status", ctx.Response.StatusCode())
	}
}

// Keys of the request's user values.
const (
	userRequestID = "voxmux.request_id"
	userFormat    = "voxmux.format"
)

// routes are the paths that get their own label in voxmux_requests_total.
var routes = []string{"/v1/audio/speech", RealtimePath, "/v1/audio/voices", "/v1/audio/models", "/v1/models", "/", "/status.json", "/metrics", "/healthz", "/health", "/readyz"}

func routeOf(path string) string {
	if strings.HasPrefix(path, "/v1/models/") {
		return "/v1/models"
	}
	if strings.HasPrefix(path, "/v1/audio/voices/") {
		return "/v1/audio/voices"
	}
	if strings.HasPrefix(path, "/status/") {
		return "/"
	}
	if r := elevenRoute(path); r != "" {
		return r
	}
	if slices.Contains(routes, path) {
		return path
	}
	return "other"
}

// authorized checks the bearer key against every configured key in constant time.
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	if len(s.keys) == 0 {
		return true
	}
	key, ok := strings.CutPrefix(string(ctx.Request.Header.Peek("Authorization")), "Bearer ")
	if !ok {
		key, ok = elevenKey(ctx) // ElevenLabs' clients send xi-api-key
	}
	if !ok && elevenKeyLater(ctx) {
		return true // its socket's first message carries the key (elevenlabs_ws.go)
	}
	if !ok {
		// A browser's WebSocket cannot send headers; it offers its key as a subprotocol.
		if key, ok = wsKey(ctx); !ok || string(ctx.Path()) != RealtimePath {
			return false
		}
	}
	found := 0
	for _, k := range s.keys {
		found |= subtle.ConstantTimeCompare([]byte(key), k)
	}
	// The admin token manages library voices without being a speech API key.
	if strings.HasPrefix(string(ctx.Path()), "/v1/audio/voices") && s.o.AdminToken != "" {
		found |= subtle.ConstantTimeCompare([]byte(key), []byte(s.o.AdminToken))
	}
	return found == 1
}

func (s *Server) route(ctx *fasthttp.RequestCtx, path string) {
	if s.elevenLabs(ctx, path) {
		return
	}
	switch {
	case path == "/v1/audio/speech":
		if !ctx.IsPost() {
			s.methodNotAllowed(ctx, "POST")
			return
		}
		s.speech(ctx)
	case path == RealtimePath:
		s.speechStream(ctx)
	case path == "/v1/audio/voices":
		switch {
		case readable(ctx):
			s.voices(ctx)
		case ctx.IsPost():
			s.createVoice(ctx)
		default:
			s.methodNotAllowed(ctx, "GET, HEAD, POST")
		}
	case strings.HasPrefix(path, "/v1/audio/voices/"):
		name := strings.TrimPrefix(path, "/v1/audio/voices/")
		switch {
		case readable(ctx):
			s.getVoice(ctx, name)
		case ctx.IsDelete():
			s.deleteVoice(ctx, name)
		default:
			s.methodNotAllowed(ctx, "GET, HEAD, DELETE")
		}
	case path == "/v1/audio/models":
		if !readable(ctx) {
			s.methodNotAllowed(ctx, "GET, HEAD")
			return
		}
		s.audioModels(ctx)
	case path == "/v1/models" || strings.HasPrefix(path, "/v1/models/"):
		if !readable(ctx) {
			s.methodNotAllowed(ctx, "GET, HEAD")
			return
		}
		s.models(ctx, strings.TrimPrefix(strings.TrimPrefix(path, "/v1/models"), "/"))
	case path == "/metrics" && s.metrics != nil:
		s.metrics(ctx)
	case path == "/healthz" || path == "/health": // /health is the path other TTS servers probe
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	case path == "/readyz":
		ctx.SetContentType("text/plain; charset=utf-8")
		switch {
		case s.draining.Load():
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString("draining\n")
		case !s.o.Pool.AnyReady():
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString("no instance ready\n")
		default:
			ctx.SetBodyString("ready\n")
		}
	case path == "/status.json" && readable(ctx):
		s.statusJSON(ctx)
	case (path == "/" || strings.HasPrefix(path, "/status/")) && readable(ctx) && s.statusFile(ctx, path):
	default:
		writeError(ctx, newError(fasthttp.StatusNotFound, "invalid_request_error", "not_found", "no route for "+excerpt(path)))
	}
}

func (s *Server) methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	writeError(ctx, newError(fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
		"use "+allow+" for "+excerpt(string(ctx.Path()))))
	ctx.Response.Header.Set("Allow", allow) // after writeError, which resets the headers
}

// readError answers requests fasthttp could not read, in OpenAI's shape.
func (s *Server) readError(ctx *fasthttp.RequestCtx, err error) {
	if err == fasthttp.ErrBodyTooLarge {
		writeError(ctx, newError(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
			fmt.Sprintf("request body is larger than %d MiB", s.srv.MaxRequestBodySize>>20)))
		return
	}
	// fasthttp's error text quotes the request's bytes (headers, Authorization included): none of
	// it is echoed.
	var small *fasthttp.ErrSmallBuffer
	if errors.As(err, &small) {
		writeError(ctx, newError(fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "headers_too_large",
			fmt.Sprintf("request headers are larger than %d KiB", ReadBufferSize>>10)))
		return
	}
	writeError(ctx, newError(fasthttp.StatusBadRequest, "invalid_request_error", "bad_request", "malformed HTTP request"))
}
