package router

import (
	"embed"
	"encoding/json"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/voxmux/voxmux/router/audio"
)

// The status page: plain HTML, CSS and JS in router/status/, embedded in the binary and served
// as they are (no build step, nothing fetched from elsewhere).
//
//go:embed status
var statusFiles embed.FS

// recentRequest is one finished speech request as the status page shows it.
type recentRequest struct {
	At           time.Time `json:"at"`
	Status       int       `json:"status"`
	Format       string    `json:"format,omitempty"`
	Voice        string    `json:"voice,omitempty"`
	Chars        int       `json:"chars"`
	AudioSeconds float64   `json:"audio_seconds"`
	TTFBMillis   float64   `json:"ttfb_ms"`
	TotalMillis  float64   `json:"total_ms"`
	RTF          float64   `json:"rtf"`
	Outcome      string    `json:"outcome"`
}

// recentRing keeps the last requests for the status page.
type recentRing struct {
	mu   sync.Mutex
	buf  []recentRequest
	next int
}

func newRecentRing(n int) *recentRing { return &recentRing{buf: make([]recentRequest, 0, n)} }

func (r *recentRing) add(x recentRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) < cap(r.buf) {
		r.buf = append(r.buf, x)
		return
	}
	r.buf[r.next] = x
	r.next = (r.next + 1) % len(r.buf)
}

// list returns the requests newest first.
func (r *recentRing) list() []recentRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]recentRequest, 0, len(r.buf))
	for i := range r.buf {
		out = append(out, r.buf[(r.next+len(r.buf)-1-i)%len(r.buf)])
	}
	return out
}

// RecentSummary sums up the recent requests that produced audio.
type RecentSummary struct {
	Count    int             `json:"count"`
	TTFBp50  float64         `json:"ttfb_ms_p50"`
	TTFBp95  float64         `json:"ttfb_ms_p95"`
	RTFp50   float64         `json:"rtf_p50"`
	RTFp95   float64         `json:"rtf_p95"`
	Errors   int             `json:"errors"`
	Requests []recentRequest `json:"requests"`
}

func summarize(reqs []recentRequest) RecentSummary {
	s := RecentSummary{Requests: reqs}
	var ttfb, rtf []float64
	for _, r := range reqs {
		if r.Status != fasthttp.StatusOK {
			s.Errors++
			continue
		}
		ttfb = append(ttfb, r.TTFBMillis)
		if r.RTF > 0 {
			rtf = append(rtf, r.RTF)
		}
	}
	s.Count = len(ttfb)
	s.TTFBp50, s.TTFBp95 = quantile(ttfb, .5), quantile(ttfb, .95)
	s.RTFp50, s.RTFp95 = quantile(rtf, .5), quantile(rtf, .95)
	return s
}

// quantile is the nearest-rank quantile, 0 for no values.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	i := int(q*float64(len(v))+0.5) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// StatusView is the body of GET /status.json: what the status page shows. It is public, so it
// carries no API key, no process ID and no error text of instances.
type StatusView struct {
	Model         StatusModel   `json:"model"`
	Formats       []string      `json:"formats"`
	DefaultFormat string        `json:"default_format"`
	MaxInputChars int           `json:"max_input_chars"`
	AuthRequired  bool          `json:"auth_required"`
	Ready         bool          `json:"ready"`
	QueueLength   int           `json:"queue_length"`
	QueueSize     int           `json:"queue_size"`
	Groups        []GroupView   `json:"groups"`
	Recent        RecentSummary `json:"recent"`
	UptimeSeconds float64       `json:"uptime_seconds"`
}

// StatusModel is the served model in StatusView.
type StatusModel struct {
	Name       string   `json:"name"`
	Aliases    []string `json:"aliases"`
	SampleRate int      `json:"sample_rate"`
	// Attribution is the credit the voices' licences ask for; "" for none.
	Attribution string `json:"attribution"`
}

func (s *Server) statusView() StatusView {
	m := s.o.Pool.Model()
	g := groupsView(s.o.Pool, s.o.GroupExtra)
	for i := range g.Groups {
		for j := range g.Groups[i].Instances {
			iv := &g.Groups[i].Instances[j]
			iv.PID, iv.LastError = 0, ""
		}
	}
	aliases := s.o.ModelAliases
	if aliases == nil {
		aliases = []string{}
	}
	return StatusView{
		Model:         StatusModel{Name: m.Name, Aliases: aliases, SampleRate: m.SampleRate, Attribution: m.Attribution},
		Formats:       audio.Formats(),
		DefaultFormat: DefaultFormat,
		MaxInputChars: s.o.MaxInputChars,
		AuthRequired:  len(s.o.APIKeys) > 0,
		Ready:         s.o.Pool.AnyReady() && !s.draining.Load(),
		QueueLength:   g.QueueLength,
		QueueSize:     g.QueueSize,
		Groups:        g.Groups,
		Recent:        summarize(s.recent.list()),
		UptimeSeconds: time.Since(s.started).Seconds(),
	}
}

func (s *Server) statusJSON(ctx *fasthttp.RequestCtx) {
	b, _ := json.Marshal(s.statusView())
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

var statusTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
}

// statusFile serves a file of the status page; false when there is none at that path.
func (s *Server) statusFile(ctx *fasthttp.RequestCtx, p string) bool {
	name := "status/index.html"
	if p != "/" {
		name = path.Clean(p[1:])
	}
	b, err := statusFiles.ReadFile(name)
	if err != nil || statusTypes[path.Ext(name)] == "" {
		return false
	}
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.SetContentType(statusTypes[path.Ext(name)])
	ctx.SetBody(b)
	return true
}
