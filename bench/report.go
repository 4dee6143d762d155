package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Report is the result of a run.
type Report struct {
	Label     string         `json:"label,omitempty"`
	StartedAt time.Time      `json:"started_at"`
	Settings  Settings       `json:"settings"`
	Targets   []TargetResult `json:"targets"`
	// Comparison holds, per concurrency level measured on both targets, the first target's
	// figures divided by the second's; empty with one target.
	Comparison []LevelRatio `json:"comparison,omitempty"`
}

// Settings records how the run was made.
type Settings struct {
	Format           string  `json:"format"`
	SampleRate       int     `json:"sample_rate"`
	Model            string  `json:"model,omitempty"`
	Voice            string  `json:"voice,omitempty"`
	RequestsPerLevel int     `json:"requests_per_level,omitempty"`
	DurationPerLevel string  `json:"duration_per_level,omitempty"`
	Warmup           int     `json:"warmup"`
	TimeoutSeconds   float64 `json:"timeout_seconds"`
	CorpusSentences  int     `json:"corpus_sentences"`
	RequestLength    string  `json:"request_length,omitempty"`
	VoicePrompt      string  `json:"voice_prompt,omitempty"`
}

// TargetResult is one target's sweep.
type TargetResult struct {
	Name         string        `json:"name"`
	URL          string        `json:"url"`
	GPUSource    string        `json:"gpu_source"` // "server /metrics", "local" or "none"
	WarmupFailed int           `json:"warmup_failed,omitempty"`
	Levels       []LevelResult `json:"levels"`
}

// LevelRatio compares the two targets at one concurrency level: subject / baseline. Above 1 is
// better for throughput; below 1 is better for TTFB and RTF.
type LevelRatio struct {
	Concurrency    int   `json:"concurrency"`
	RealTimeX      Value `json:"x_real_time"`
	CharsPerSecond Value `json:"chars_per_second"`
	TTFBP50        Value `json:"ttfb_p50"`
	TTFBP95        Value `json:"ttfb_p95"`
	RTFP50         Value `json:"rtf_p50"`
	RTFP95         Value `json:"rtf_p95"`
}

func (r *Report) compare() {
	r.Comparison = nil
	if len(r.Targets) < 2 {
		return
	}
	base := map[int]LevelResult{}
	for _, l := range r.Targets[1].Levels {
		base[l.Concurrency] = l
	}
	for _, s := range r.Targets[0].Levels {
		b, ok := base[s.Concurrency]
		if !ok {
			continue
		}
		r.Comparison = append(r.Comparison, LevelRatio{
			Concurrency:    s.Concurrency,
			RealTimeX:      ratio(s.RealTimeX, b.RealTimeX),
			CharsPerSecond: ratio(s.CharsPerSecond, b.CharsPerSecond),
			TTFBP50:        ratio(s.TTFBP50Ms, b.TTFBP50Ms),
			TTFBP95:        ratio(s.TTFBP95Ms, b.TTFBP95Ms),
			RTFP50:         ratio(s.RTFP50, b.RTFP50),
			RTFP95:         ratio(s.RTFP95, b.RTFP95),
		})
	}
}

// WriteFiles writes bench.md, bench.json and bench.png into dir, creating it if needed.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report dir: %w", err)
	}
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{
		{"bench.md", r.WriteMarkdown},
		{"bench.json", r.WriteJSON},
		{"bench.png", r.WritePNG},
	} {
		if err := writeFile(filepath.Join(dir, f.name), f.write); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("report %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("report %s: %w", path, err)
	}
	return nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// PublishedFigures are other servers' published figures that voxmux sets out to beat; the
// markdown report quotes them beside the measured ones. They were measured on other hardware.
const PublishedFigures = "CosyVoice3-0.5B behind vLLM on one RTX 5090: 53–55 chars/s, P95 TTFB ≈ 2 s at 8 users. " +
	"VoxCPM: 157× real time per 2-GPU group at 128 streams, TTFB 357 ms."

// WriteMarkdown writes one table per target, then the comparison.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	title := "voxmux bench"
	if r.Label != "" {
		title += ": " + r.Label
	}
	fmt.Fprintf(&b, "# %s\n\n", title)
	s := r.Settings
	bound := fmt.Sprintf("%d requests per level", s.RequestsPerLevel)
	switch {
	case s.RequestsPerLevel > 0 && s.DurationPerLevel != "0s":
		bound = fmt.Sprintf("%d requests or %s per level, whichever ends first", s.RequestsPerLevel, s.DurationPerLevel)
	case s.RequestsPerLevel == 0 && s.DurationPerLevel != "0s":
		bound = s.DurationPerLevel + " per level"
	case s.RequestsPerLevel == 0:
		bound = "4 requests per worker per level (at least 16)"
	}
	fmt.Fprintf(&b, "Started %s. Streaming `%s` responses; %s; %d warm-up requests per target; corpus of %d English, Chinese and Spanish sentences, taken round-robin.\n\n",
		r.StartedAt.Format(time.RFC3339), s.Format, bound, s.Warmup, s.CorpusSentences)
	b.WriteString("TTFB: request sent → first audio byte. RTF: request time ÷ audio duration (below 1 is faster than real time). " +
		"Throughput counts successful requests over the level's wall time; × real time = audio seconds per wall second. " +
		"GPU memory is the device-wide peak and utilization the mean of samples taken every 500 ms.\n\n")
	for _, t := range r.Targets {
		fmt.Fprintf(&b, "## %s (%s)\n\n", t.Name, t.URL)
		if t.WarmupFailed > 0 {
			fmt.Fprintf(&b, "%d warm-up requests failed.\n\n", t.WarmupFailed)
		}
		b.WriteString("| concurrency | requests | success | TTFB P50 (ms) | TTFB P95 (ms) | RTF P50 | RTF P95 | chars/s | × real time | GPU peak memory | GPU util |\n")
		b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
		for _, l := range t.Levels {
			fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				l.Concurrency, l.Requests, pct(l.SuccessRate), num(l.TTFBP50Ms, 0), num(l.TTFBP95Ms, 0),
				num(l.RTFP50, 3), num(l.RTFP95, 3), num(l.CharsPerSecond, 1), num(l.RealTimeX, 1),
				gpuMem(l), gpuUtil(l))
		}
		b.WriteString("\n")
		if errs := errorLines(t); errs != "" {
			b.WriteString(errs + "\n")
		}
		b.WriteString(requestsLine(s, t) + "\n\n")
		fmt.Fprintf(&b, "GPU figures from: %s.\n\n", t.GPUSource)
		b.WriteString(stageTable(t))
	}
	if len(r.Comparison) > 0 {
		fmt.Fprintf(&b, "## %s ÷ %s\n\n", r.Targets[0].Name, r.Targets[1].Name)
		b.WriteString("Throughput ratios above 1 and latency ratios below 1 favour " + r.Targets[0].Name + ".\n\n")
		b.WriteString("| concurrency | × real time | chars/s | TTFB P50 | TTFB P95 | RTF P50 | RTF P95 |\n")
		b.WriteString("|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.Comparison {
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s |\n", c.Concurrency,
				times(c.RealTimeX), times(c.CharsPerSecond), times(c.TTFBP50), times(c.TTFBP95),
				times(c.RTFP50), times(c.RTFP95))
		}
		b.WriteString("\n")
	}
	b.WriteString("Published figures of other servers, for reference (other hardware): " + PublishedFigures + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// requestsLine states how the requests of t's table were made and what they measured: the
// voice and its prompt, the request length the servers were set to, the audio a request gave
// and the characters of text a second of it carried (English speech: 12–15).
func requestsLine(s Settings, t TargetResult) string {
	parts := []string{}
	if s.Voice != "" {
		v := "voice `" + s.Voice + "`"
		if s.VoicePrompt != "" {
			v += " (voice prompt " + s.VoicePrompt + ")"
		}
		parts = append(parts, v)
	} else if s.VoicePrompt != "" {
		parts = append(parts, "voice prompt "+s.VoicePrompt)
	}
	if s.RequestLength != "" {
		parts = append(parts, "request length: "+s.RequestLength)
	}
	var audio float64
	var n, chars int
	for _, l := range t.Levels {
		audio += l.AudioSeconds
		n += l.Succeeded
		chars += l.Chars
	}
	if n > 0 && audio > 0 {
		parts = append(parts, fmt.Sprintf("≈%.1f s of audio per request, %.1f characters per second of audio (mean of %d requests)",
			audio/float64(n), float64(chars)/audio, n))
	}
	if len(parts) == 0 {
		return "Requests: none succeeded."
	}
	return "Requests: " + strings.Join(parts, "; ") + "."
}

func num(v Value, digits int) string {
	if !v.Known() {
		return "–"
	}
	return fmt.Sprintf("%.*f", digits, float64(v))
}

func pct(v Value) string {
	if !v.Known() {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(v))
}

func times(v Value) string {
	if !v.Known() {
		return "–"
	}
	return fmt.Sprintf("%.2f×", float64(v))
}

func gpuMem(l LevelResult) string {
	if len(l.GPUs) == 0 {
		return "–"
	}
	parts := make([]string, len(l.GPUs))
	for i, g := range l.GPUs {
		parts[i] = fmt.Sprintf("%d: %.2f GiB", g.Index, float64(g.PeakMemoryBytes)/(1<<30))
	}
	return strings.Join(parts, ", ")
}

func gpuUtil(l LevelResult) string {
	if len(l.GPUs) == 0 {
		return "–"
	}
	parts := make([]string, len(l.GPUs))
	for i, g := range l.GPUs {
		parts[i] = fmt.Sprintf("%d: %s", g.Index, num(g.MeanUtilPct, 0)+"%")
		if !g.MeanUtilPct.Known() {
			parts[i] = fmt.Sprintf("%d: –", g.Index)
		}
	}
	return strings.Join(parts, ", ")
}

func errorLines(t TargetResult) string {
	var b strings.Builder
	for _, l := range t.Levels {
		if len(l.Errors) == 0 && l.GPUError == "" {
			continue
		}
		kinds := make([]string, 0, len(l.Errors))
		for k := range l.Errors {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		parts := make([]string, len(kinds))
		for i, k := range kinds {
			parts[i] = fmt.Sprintf("%s × %d", k, l.Errors[k])
		}
		if l.GPUError != "" {
			parts = append(parts, "GPU sampling: "+l.GPUError)
		}
		fmt.Fprintf(&b, "- concurrency %d: %s\n", l.Concurrency, strings.Join(parts, "; "))
	}
	if b.Len() == 0 {
		return ""
	}
	return "Failures:\n\n" + b.String()
}
