package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fasthttp/websocket"
	dto "github.com/prometheus/client_model/go"
)

// The voice-agent benchmark (voxmux bench --ws): at each level, that many agents hold a
// WebSocket session on WS /v1/audio/speech/stream each. An agent's turn is a reply of two corpus
// sentences sent as LLM tokens (a word or two CJK characters each) at TokenRate per second; with
// probability BargeIn the user interrupts it at a random moment of its first two seconds of audio
// (close_context), else the turn runs to its context.closed. Then the agent thinks for a moment
// and takes its next turn, until the level's time is up.

// WSOptions configure RunWS.
type WSOptions struct {
	URL      string
	Sessions []int         // levels: concurrent sessions
	Duration time.Duration // of a level
	// TokenRate is the LLM's pace, tokens per second per agent.
	TokenRate float64
	// BargeIn is the share of turns the user interrupts.
	BargeIn float64
	Voice   string
	Model   string
	Seed    uint64 // of the agents' choices; equal seeds give equal runs of choices
	Logger  *slog.Logger
}

// WSLevel is one level's figures. Times are in milliseconds.
type WSLevel struct {
	Sessions int `json:"sessions"`
	Turns    int `json:"turns"`
	BargeIns int `json:"barge_ins"`
	Errors   int `json:"errors"`
	// FirstAudio is from a turn's first token sent to its first audio received.
	FirstAudioP50 Value `json:"first_audio_p50_ms"`
	FirstAudioP95 Value `json:"first_audio_p95_ms"`
	// CancelAck is from close_context sent to context.closed received: the router has cancelled
	// the context's requests and will send nothing more of it.
	CancelAckP50 Value `json:"cancel_ack_p50_ms"`
	CancelAckP95 Value `json:"cancel_ack_p95_ms"`
	// LateAudio counts audio of a context that arrived after its context.closed (must be 0).
	LateAudio int `json:"late_audio"`
	// EngineCancels and EngineFreeingMean come from the server's counters over the level
	// (voxmux_engine_cancels_total, voxmux_engine_cancel_freeing_seconds_total): requests the
	// engines dropped, and the mean time from a cancel until no stage held the request (the
	// slot freed on the GPU). Null when the server does not export them.
	EngineCancels     Value   `json:"engine_cancels"`
	EngineFreeingMean Value   `json:"engine_freeing_mean_ms"`
	AudioSeconds      float64 `json:"audio_seconds"`
	WallSeconds       float64 `json:"wall_seconds"`
	FirstError        string  `json:"first_error,omitempty"`
}

// WSReport is the benchmark's result.
type WSReport struct {
	URL       string    `json:"url"`
	TokenRate float64   `json:"token_rate"`
	BargeIn   float64   `json:"barge_in"`
	Levels    []WSLevel `json:"levels"`
}

// RunWS runs every level; a failed level is reported with its errors and the sweep goes on.
func RunWS(ctx context.Context, o WSOptions) (*WSReport, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.TokenRate <= 0 || o.BargeIn < 0 || o.BargeIn > 1 || o.Duration <= 0 {
		return nil, errors.New("ws bench: token rate and duration must be positive, barge-in in [0, 1]")
	}
	rep := &WSReport{URL: o.URL, TokenRate: o.TokenRate, BargeIn: o.BargeIn}
	ms := &MetricsSampler{Client: http.DefaultClient, URL: o.URL}
	for _, n := range o.Sessions {
		before, berr := ms.families(ctx)
		start := time.Now()
		lv := runWSLevel(ctx, o, n)
		lv.WallSeconds = time.Since(start).Seconds()
		after, aerr := ms.families(ctx)
		lv.EngineCancels, lv.EngineFreeingMean = unknown, unknown
		if berr == nil && aerr == nil && after["voxmux_engine_cancels_total"] != nil {
			dc := familySum(after, "voxmux_engine_cancels_total") - familySum(before, "voxmux_engine_cancels_total")
			df := familySum(after, "voxmux_engine_cancel_freeing_seconds_total") - familySum(before, "voxmux_engine_cancel_freeing_seconds_total")
			lv.EngineCancels = Value(dc)
			if dc > 0 {
				lv.EngineFreeingMean = Value(df / dc * 1000)
			}
		}
		o.Logger.Info("ws level", "sessions", n, "turns", lv.Turns, "barge_ins", lv.BargeIns, "errors", lv.Errors,
			"first_audio_p50_ms", float64(lv.FirstAudioP50), "cancel_ack_p50_ms", float64(lv.CancelAckP50))
		rep.Levels = append(rep.Levels, lv)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

func familySum(f map[string]*dto.MetricFamily, name string) float64 {
	s := 0.0
	for _, m := range f[name].GetMetric() {
		s += counterValue(m)
	}
	return s
}

// turnResult is one agent turn.
type turnResult struct {
	firstAudio time.Duration // 0: none
	cancelAck  time.Duration // 0: not interrupted
	barged     bool
	late       int
	audioSec   float64
	err        error
}

func runWSLevel(ctx context.Context, o WSOptions, n int) WSLevel {
	lctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var mu sync.Mutex
	var turns []turnResult
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(o.Seed, uint64(n)<<32|uint64(i)))
			res := runAgent(lctx, o, rnd)
			mu.Lock()
			turns = append(turns, res...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	lv := WSLevel{Sessions: n}
	var first, ack []float64
	for _, t := range turns {
		lv.Turns++
		lv.LateAudio += t.late
		lv.AudioSeconds += t.audioSec
		if t.err != nil {
			lv.Errors++
			if lv.FirstError == "" {
				lv.FirstError = t.err.Error()
			}
			continue
		}
		if t.firstAudio > 0 {
			first = append(first, ms(t.firstAudio))
		}
		if t.barged {
			lv.BargeIns++
			ack = append(ack, ms(t.cancelAck))
		}
	}
	lv.FirstAudioP50, lv.FirstAudioP95 = quantile(0.5, first), quantile(0.95, first)
	lv.CancelAckP50, lv.CancelAckP95 = quantile(0.5, ack), quantile(0.95, ack)
	return lv
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// wsEvent is a server message as the agent sees it.
type wsEvent struct {
	Type      string `json:"type"`
	ContextID string `json:"context_id"`
	Message   string `json:"message"`
	Bytes     int    `json:"bytes"`
	at        time.Time
}

// runAgent holds one session until ctx ends and returns its turns.
func runAgent(ctx context.Context, o WSOptions, rnd *rand.Rand) []turnResult {
	url := "ws" + strings.TrimPrefix(strings.TrimRight(o.URL, "/"), "http") + "/v1/audio/speech/stream"
	conn, _, err := (&websocket.Dialer{HandshakeTimeout: 30 * time.Second}).DialContext(ctx, url, nil)
	if err != nil {
		return []turnResult{{err: fmt.Errorf("connect: %w", err)}}
	}
	defer conn.Close()
	events := make(chan wsEvent, 256)
	go func() {
		defer close(events)
		for {
			mt, b, err := conn.ReadMessage()
			if err != nil {
				return
			}
			if mt != websocket.TextMessage {
				continue // audio: its audio.delta counted it
			}
			var e wsEvent
			if json.Unmarshal(b, &e) == nil {
				e.at = time.Now()
				events <- e
			}
		}
	}()
	var wmu sync.Mutex
	send := func(v any) error {
		wmu.Lock()
		defer wmu.Unlock()
		return conn.WriteJSON(v)
	}
	cfg := map[string]any{"type": "session.config", "response_format": "pcm", "seed": rnd.Uint64()}
	if o.Voice != "" {
		cfg["voice"] = o.Voice
	}
	if o.Model != "" {
		cfg["model"] = o.Model
	}
	if err := send(cfg); err != nil {
		return []turnResult{{err: fmt.Errorf("session.config: %w", err)}}
	}
	if e, ok := <-events; !ok || e.Type != "session.created" {
		return []turnResult{{err: fmt.Errorf("session.config answered %q %s", e.Type, e.Message)}}
	}
	var out []turnResult
	closed := map[string]bool{}
	for turn := 0; ctx.Err() == nil; turn++ {
		id := fmt.Sprintf("turn-%d", turn)
		out = append(out, agentTurn(ctx, o, rnd, id, send, events, closed))
		if out[len(out)-1].err != nil && ctx.Err() == nil {
			break // the session is broken
		}
		select { // the user answers
		case <-ctx.Done():
		case <-time.After(time.Duration(200+rnd.IntN(800)) * time.Millisecond):
		}
	}
	_ = send(map[string]string{"type": "close"})
	return out
}

// agentTurn streams one reply and waits for its end or the user's barge-in.
func agentTurn(ctx context.Context, o WSOptions, rnd *rand.Rand, id string, send func(any) error, events <-chan wsEvent, closed map[string]bool) turnResult {
	k := rnd.IntN(len(Corpus))
	reply := Corpus[k].Text + " " + Corpus[(k+1)%len(Corpus)].Text
	tokens := llmTokens(reply)
	barge := rnd.Float64() < o.BargeIn
	bargeAfter := time.Duration(rnd.Float64() * float64(2*time.Second))
	stop := make(chan struct{})
	start := time.Now()
	sendErr := make(chan error, 1)
	go func() {
		tick := time.Duration(float64(time.Second) / o.TokenRate)
		for i, tok := range tokens {
			if i > 0 {
				select {
				case <-stop:
					sendErr <- nil
					return
				case <-time.After(tick):
				}
			}
			if err := send(map[string]string{"type": "input.text", "context_id": id, "text": tok}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- send(map[string]string{"type": "input.done", "context_id": id})
	}()
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }) }
	defer halt()
	var r turnResult
	var bargeC <-chan time.Time
	var cancelAt time.Time
	const bytesPerSecond = 2 * 24000 // pcm
	for {
		select {
		case err := <-sendErr:
			if err != nil {
				r.err = fmt.Errorf("send: %w", err)
				return r
			}
			sendErr = nil
		case <-bargeC:
			bargeC = nil
			// The LLM stops first: text for the closed context would open a new one.
			halt()
			if sendErr != nil {
				if err := <-sendErr; err != nil {
					r.err = fmt.Errorf("send: %w", err)
					return r
				}
				sendErr = nil
			}
			cancelAt = time.Now()
			if err := send(map[string]string{"type": "close_context", "context_id": id}); err != nil {
				r.err = fmt.Errorf("close_context: %w", err)
				return r
			}
		case e, ok := <-events:
			if !ok {
				r.err = errors.New("the server closed the socket")
				return r
			}
			if e.ContextID != id {
				if closed[e.ContextID] && e.Type == "audio.delta" {
					r.late++
				}
				continue
			}
			switch e.Type {
			case "audio.delta":
				r.audioSec += float64(e.Bytes) / bytesPerSecond
				if r.firstAudio == 0 {
					r.firstAudio = e.at.Sub(start)
					if barge {
						bargeC = time.After(bargeAfter)
					}
				}
			case "error":
				r.err = errors.New(e.Message)
			case "context.closed":
				closed[id] = true
				if !cancelAt.IsZero() {
					r.barged, r.cancelAck = true, e.at.Sub(cancelAt)
				}
				return r
			}
		case <-ctx.Done():
			return r
		}
	}
}

// llmTokens cuts text as an LLM's tokenizer roughly would: a word with its leading space, or two
// characters of a script written without spaces.
func llmTokens(text string) []string {
	var out []string
	var cur strings.Builder
	for _, r := range text {
		cjk := unicode.Is(unicode.Han, r) || unicode.Is(unicode.Hiragana, r) || unicode.Is(unicode.Katakana, r)
		if r == ' ' && cur.Len() > 0 || cjk && utf8.RuneCountInString(cur.String()) >= 2 {
			out = append(out, cur.String())
			cur.Reset()
		}
		cur.WriteRune(r)
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// WriteFiles writes ws.md and ws.json to dir.
func (r *WSReport) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "ws.md"), r.WriteMarkdown); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "ws.json"), func(w io.Writer) error {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(r)
	})
}

// WriteMarkdown writes the report's table.
func (r *WSReport) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "# Voice agents over WS /v1/audio/speech/stream (%s)\n\n", r.URL)
	fmt.Fprintf(w, "Tokens at %g/s per agent; %.0f%% of turns interrupted (close_context) within their first 2 s of audio.\n\n", r.TokenRate, 100*r.BargeIn)
	fmt.Fprintln(w, "| sessions | turns | barge-ins | errors | first text → first audio P50 / P95 ms | cancel → context.closed P50 / P95 ms | cancel → engine freed, mean ms (cancels) | late audio | audio s |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, l := range r.Levels {
		fmt.Fprintf(w, "| %d | %d | %d | %d | %s / %s | %s / %s | %s (%s) | %d | %.1f |\n", l.Sessions, l.Turns, l.BargeIns, l.Errors,
			num(l.FirstAudioP50, 0), num(l.FirstAudioP95, 0), num(l.CancelAckP50, 1), num(l.CancelAckP95, 1),
			num(l.EngineFreeingMean, 1), num(l.EngineCancels, 0), l.LateAudio, l.AudioSeconds)
	}
	for _, l := range r.Levels {
		if l.FirstError != "" {
			fmt.Fprintf(w, "\n%d sessions, first error: %s\n", l.Sessions, l.FirstError)
		}
	}
	return nil
}
