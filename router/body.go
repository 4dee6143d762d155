package router

import (
	"fmt"
	"io"

	"github.com/valyala/fasthttp"
)

// Request bodies are streamed (fasthttp's StreamRequestBody): before the handler the server reads
// a request's headers and at most the first 8 KiB of its body. The handler checks the API key and
// the route's limit, from the headers, before it reads the rest into a buffer of its own, which
// the garbage collector returns after the request (fasthttp's pooled buffers would keep the
// largest body any client ever sent).

// smallBodyBytes bounds the body of a route that takes none (GET, DELETE, the probes).
const smallBodyBytes = 64 << 10

// discardBodyBytes: a refused body up to this size is read and dropped, so that its client reads
// the answer on a connection that stays open; a larger one is refused by closing the connection.
const discardBodyBytes = 4 << 20

// bodyLimit is the largest body path takes.
func (s *Server) bodyLimit(path string) int {
	switch path {
	case "/v1/audio/speech":
		return s.refBodyBytes()
	case "/v1/audio/voices":
		return uploadBodyBytes(s.o.MaxUploadBytes)
	}
	return smallBodyBytes
}

// readBody reads the request's body, at most limit bytes, and makes it the body the handlers see;
// a larger one is 413 and is not read.
func readBody(ctx *fasthttp.RequestCtx, limit int) *apiError {
	r := ctx.RequestBodyStream()
	if r == nil {
		return nil // no body
	}
	n := ctx.Request.Header.ContentLength()
	if n > limit {
		return bodyTooLarge(limit)
	}
	var body []byte
	var err error
	if n >= 0 {
		body = make([]byte, n)
		_, err = io.ReadFull(r, body)
	} else { // chunked
		body, err = io.ReadAll(io.LimitReader(r, int64(limit)+1))
		if err == nil && len(body) > limit {
			return bodyTooLarge(limit)
		}
	}
	if err != nil {
		ctx.SetConnectionClose()
		return newError(fasthttp.StatusBadRequest, "invalid_request_error", "bad_request", "the request body could not be read")
	}
	ctx.Request.SetBodyRaw(body)
	return nil
}

func bodyTooLarge(limit int) *apiError {
	return newError(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
		fmt.Sprintf("request body is larger than %s", sizeText(limit)))
}

// skipBody drops the body of a request refused before it was read: read when small, so that the
// connection can carry the next request, else the connection closes after the answer.
func skipBody(ctx *fasthttp.RequestCtx) {
	r := ctx.RequestBodyStream()
	if r == nil {
		return
	}
	if n := ctx.Request.Header.ContentLength(); n >= 0 && n <= discardBodyBytes {
		if _, err := io.CopyN(io.Discard, r, int64(n)); err == nil {
			return
		}
	}
	ctx.SetConnectionClose()
}
