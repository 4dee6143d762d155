package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
	"github.com/voxmux/voxmux/tts"
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
func excerpt(s string) string { return tts.Excerpt(s, maxExcerpt) }

// jsonProblem says what is wrong with a client's JSON in the client's terms: the field and the
// kind of value it takes, never a Go type, and any value of the client's as an excerpt.
func jsonProblem(err error) (field, msg string) {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		want := jsonKind(te.Type)
		if te.Field == "" {
			return "", fmt.Sprintf("the JSON is %s; it must be %s", te.Value, want)
		}
		return te.Field, fmt.Sprintf("%s must be %s, not %s", excerpt(te.Field), want, excerpt(te.Value))
	case errors.As(err, &se):
		return "", fmt.Sprintf("not valid JSON at byte %d: %s", se.Offset, excerpt(strings.TrimPrefix(se.Error(), "json: ")))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "", "the JSON ends early"
	}
	msg = strings.TrimPrefix(err.Error(), "json: ")
	if name, ok := strings.CutPrefix(msg, "unknown field "); ok {
		name, _ = strconv.Unquote(name)
		return "", fmt.Sprintf("unknown field %q", excerpt(name))
	}
	return "", excerpt(msg)
}

// jsonKind names the JSON value a Go type takes.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "another value"
}
