package plugin

import (
	"context"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogSlog is an hclog.Logger that writes through a slog.Logger, so that go-plugin's own lines
// and the lines it relays from an instance's stderr come out in the router's format and level.
type hclogSlog struct {
	l    *slog.Logger
	name string
	args []any
}

// NewHCLogger returns an hclog.Logger for go-plugin that logs through l.
func NewHCLogger(l *slog.Logger) hclog.Logger { return &hclogSlog{l: l} }

func toSlogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (h *hclogSlog) Log(level hclog.Level, msg string, args ...any) {
	lv := toSlogLevel(level)
	if !h.l.Enabled(context.Background(), lv) {
		return
	}
	attrs := make([]any, 0, len(h.args)+len(args)+2)
	if h.name != "" {
		attrs = append(attrs, "logger", h.name)
	}
	attrs = append(attrs, h.args...)
	for i := 0; i+1 < len(args); i += 2 {
		// go-plugin adds the instance's own timestamp to each relayed line; the record has one.
		if k, ok := args[i].(string); ok && k == "timestamp" {
			continue
		}
		attrs = append(attrs, args[i], args[i+1])
	}
	h.l.Log(context.Background(), lv, msg, attrs...)
}

func (h *hclogSlog) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogSlog) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogSlog) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogSlog) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogSlog) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogSlog) enabled(level hclog.Level) bool {
	return h.l.Enabled(context.Background(), toSlogLevel(level))
}
func (h *hclogSlog) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *hclogSlog) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hclogSlog) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hclogSlog) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hclogSlog) IsError() bool { return h.enabled(hclog.Error) }

func (h *hclogSlog) ImpliedArgs() []any { return h.args }

func (h *hclogSlog) With(args ...any) hclog.Logger {
	return &hclogSlog{l: h.l, name: h.name, args: append(append([]any(nil), h.args...), args...)}
}

func (h *hclogSlog) Name() string { return h.name }

func (h *hclogSlog) Named(name string) hclog.Logger {
	n := name
	if h.name != "" {
		n = h.name + "." + name
	}
	return &hclogSlog{l: h.l, name: n, args: h.args}
}

func (h *hclogSlog) ResetNamed(name string) hclog.Logger {
	return &hclogSlog{l: h.l, name: name, args: h.args}
}

// SetLevel is ignored: the slog handler's level rules.
func (h *hclogSlog) SetLevel(hclog.Level) {}

// GetLevel reports the most verbose level the handler takes; go-plugin drops relayed lines below it.
func (h *hclogSlog) GetLevel() hclog.Level {
	for _, lv := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn} {
		if h.enabled(lv) {
			return lv
		}
	}
	return hclog.Error
}

func (h *hclogSlog) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogSlog) StandardWriter(*hclog.StandardLoggerOptions) io.Writer { return stdWriter{h} }

type stdWriter struct{ h *hclogSlog }

func (w stdWriter) Write(p []byte) (int, error) {
	w.h.Info(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// LogLevelEnv carries the router's log level to its instances.
const LogLevelEnv = "VOXMUX_LOG_LEVEL"

// ParseLevel reads debug, info, warn or error.
func ParseLevel(s string) (slog.Level, bool) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo, false
	}
	return l, true
}

// DurationsAsStrings is a slog ReplaceAttr that writes durations as Go duration strings ("1.5s"),
// where the JSON handler would write nanoseconds.
func DurationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
