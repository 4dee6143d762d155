package router

import (
	"encoding/json"
	"strings"

	"github.com/valyala/fasthttp"
)

// apiError is an error in OpenAI's shape: {"error":{"message","type","param","code"}}.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func invalid(param, msg string) *apiError {
	code := "invalid_value"
	e := &apiError{Status: fasthttp.StatusBadRequest, Message: msg, Type: "invalid_request_error", Code: &code}
	if param != "" {
		e.Param = &param
	}
	return e
}

func newError(status int, typ, code, msg string) *apiError {
	e := &apiError{Status: status, Message: msg, Type: typ}
	if code != "" {
		e.Code = &code
	}
	return e
}

func writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	body, _ := json.Marshal(struct {
		Error *apiError `json:"error"`
	}{e})
	id := string(ctx.Response.Header.Peek("X-Request-Id"))
	ctx.Response.Reset()
	if id != "" {
		ctx.Response.Header.Set("X-Request-Id", id)
	}
	ctx.SetStatusCode(e.Status)
	if e.Status == fasthttp.StatusTooManyRequests {
		ctx.Response.Header.Set("Retry-After", "1")
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// maxExcerpt is how many characters of a client's value an error message or a log line quotes.
const maxExcerpt = 64

// maxVerdict bounds the message of an instance that refused the input.
const maxVerdict = 512

// excerpt bounds a client-supplied value before it is quoted back or logged: at most maxExcerpt
// characters, then "…" when there was more. Invalid UTF-8 becomes U+FFFD; quote it with %q so
// that control characters are escaped.
func excerpt(s string) string { return excerptN(s, maxExcerpt) }

// excerptN is excerpt with a limit of max characters.
func excerptN(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	n := 0
	for i := range s {
		if n == max {
			return s[:i] + "…"
		}
		n++
	}
	return s
}
