package router

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// CORSOptions let pages on other origins call /v1/*.
type CORSOptions struct {
	// Origins allowed to call, or ["*"] for any.
	Origins []string
	// MaxAge is how long a browser may cache a preflight's answer.
	MaxAge time.Duration
}

// corsHeaders are the request headers a preflight is granted when it names none; otherwise the
// ones it names are (the OpenAI SDKs send headers of their own, X-Stainless-*, and a wildcard
// would not cover Authorization).
const corsHeaders = "Authorization, Content-Type, X-Request-Id"

// corsExposed are the response headers a page may read.
const corsExposed = "X-Request-Id, X-Voxmux-Instance, Content-Disposition"

// allowOrigin is the Access-Control-Allow-Origin for a request from origin, "" when it is not
// allowed (or CORS is off).
func (s *Server) allowOrigin(origin string) string {
	c := s.o.CORS
	if c == nil || len(c.Origins) == 0 || origin == "" {
		return ""
	}
	if c.Origins[0] == "*" {
		return "*"
	}
	if slices.Contains(c.Origins, origin) {
		return origin
	}
	return ""
}

// preflight answers a CORS preflight (OPTIONS with Access-Control-Request-Method) for /v1/*; false
// when the request is none, or CORS is off, and routes as usual.
func (s *Server) preflight(ctx *fasthttp.RequestCtx) bool {
	if s.o.CORS == nil || len(s.o.CORS.Origins) == 0 || !ctx.IsOptions() ||
		len(ctx.Request.Header.Peek("Access-Control-Request-Method")) == 0 {
		return false
	}
	allow := s.allowOrigin(string(ctx.Request.Header.Peek("Origin")))
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	ctx.Response.Header.Set("Vary", "Origin, Access-Control-Request-Headers")
	if allow == "" {
		return true // no CORS headers: the browser refuses the call
	}
	ctx.Response.Header.Set("Access-Control-Allow-Origin", allow)
	ctx.Response.Header.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, DELETE, OPTIONS")
	headers := corsHeaders
	if h := string(ctx.Request.Header.Peek("Access-Control-Request-Headers")); h != "" && len(h) <= 1024 && isHeaderList(h) {
		headers = h
	}
	ctx.Response.Header.Set("Access-Control-Allow-Headers", headers)
	ctx.Response.Header.Set("Access-Control-Max-Age", strconv.Itoa(int(s.o.CORS.MaxAge.Seconds())))
	return true
}

// corsResponse adds the CORS headers to a /v1/* response (errors included, so that a page can
// read them).
func (s *Server) corsResponse(ctx *fasthttp.RequestCtx) {
	allow := s.allowOrigin(string(ctx.Request.Header.Peek("Origin")))
	if allow == "" {
		return
	}
	ctx.Response.Header.Set("Access-Control-Allow-Origin", allow)
	ctx.Response.Header.Set("Access-Control-Expose-Headers", corsExposed)
	if allow != "*" {
		ctx.Response.Header.Set("Vary", "Origin")
	}
}

// isHeaderList reports whether h is a comma-separated list of header names (RFC 9110 tokens).
func isHeaderList(h string) bool {
	for _, name := range strings.Split(h, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			return false
		}
		for _, r := range name {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
				return false
			}
		}
	}
	return true
}

// maxRequestID bounds a client's X-Request-Id.
const maxRequestID = 128

// requestID is the ID a /v1/* request goes by: the client's X-Request-Id when it is at most
// maxRequestID characters of [A-Za-z0-9._:-], else a generated one (a client's value is echoed
// and logged, so it is never taken unchecked).
func requestID(h []byte) string {
	if len(h) == 0 || len(h) > maxRequestID {
		return newRequestID()
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return newRequestID()
		}
	}
	return string(h)
}

// readable reports whether the method reads a resource: GET, or HEAD, which fasthttp answers with
// GET's headers and no body.
func readable(ctx *fasthttp.RequestCtx) bool { return ctx.IsGet() || ctx.IsHead() }
