// Package router is voxmux's HTTP front: the OpenAI-shaped speech API, health endpoints, and
// balancing of requests over the instances in a Pool.
package router

import (
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

// MaxBodyBytes bounds a request body (OpenAI's 413 limit).
const MaxBodyBytes = 1 << 20

// Options configure a Server.
type Options struct {
	// Metrics, when set, is served at GET /metrics in Prometheus' text format.
	Metrics        prometheus.Gatherer
	Pool           *Pool
	MaxInputChars  int
	RequestTimeout time.Duration
	// ModelAliases are other names clients may send as "model" (besides the model's own).
	ModelAliases []string
	Logger       *slog.Logger
}

// Server is the router's HTTP server.
type Server struct {
	o        Options
	srv      *fasthttp.Server
	draining atomic.Bool
	metrics  fasthttp.RequestHandler
}

// New makes a Server.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 10 * time.Minute
	}
	s := &Server{o: o}
	if o.Metrics != nil {
		s.metrics = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(o.Metrics, promhttp.HandlerOpts{}))
	}
	s.srv = &fasthttp.Server{
		Handler: s.Handler,
		Name:    "voxmux",
		// Well over the API limit, so that fasthttp reads an oversized body whole and we answer
		// 413 in OpenAI's shape; beyond this fasthttp's ErrorHandler answers and closes.
		MaxRequestBodySize: 16 * MaxBodyBytes,
		ErrorHandler:       s.readError,
		ReadTimeout:        30 * time.Second,
		IdleTimeout:        2 * time.Minute,
		CloseOnShutdown:    true,
	}
	return s
}

// Serve serves HTTP on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

// SetDraining makes /readyz answer 503 (the first step of a clean shutdown).
func (s *Server) SetDraining() { s.draining.Store(true) }

// Shutdown stops taking requests and waits for in-flight ones until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.SetDraining()
	return s.srv.ShutdownWithContext(ctx)
}

// Handler routes a request.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	switch {
	case path == "/v1/audio/speech":
		if !ctx.IsPost() {
			s.methodNotAllowed(ctx, "POST")
			return
		}
		s.speech(ctx)
	case path == "/v1/audio/voices":
		if !ctx.IsGet() {
			s.methodNotAllowed(ctx, "GET")
			return
		}
		s.voices(ctx)
	case path == "/metrics" && s.metrics != nil:
		s.metrics(ctx)
	case path == "/healthz":
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
	default:
		writeError(ctx, newError(fasthttp.StatusNotFound, "invalid_request_error", "not_found", "no route for "+path))
	}
}

func (s *Server) methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	writeError(ctx, newError(fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
		"use "+allow+" for "+string(ctx.Path())))
	ctx.Response.Header.Set("Allow", allow) // after writeError, which resets the headers
}

// readError answers requests fasthttp could not read, in OpenAI's shape.
func (s *Server) readError(ctx *fasthttp.RequestCtx, err error) {
	if err == fasthttp.ErrBodyTooLarge {
		writeError(ctx, newError(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
			"request body is larger than 1 MiB"))
		return
	}
	writeError(ctx, newError(fasthttp.StatusBadRequest, "invalid_request_error", "bad_request", "cannot read request: "+err.Error()))
}
