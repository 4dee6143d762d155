package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/voxmux/voxmux/bench"
)

// benchCmd is `voxmux bench`. localGPU reads this host's GPUs for targets that do not export GPU
// gauges on /metrics; nil when main has no such sampler.
func benchCmd(localGPU bench.GPUSampler) *cobra.Command {
	o := bench.Options{}
	var url, name, compareURL, compareName, outDir string
	var compareLevels []int
	var quiet, ws bool
	wo := bench.WSOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure a running server: TTFB, real-time factor and throughput over a concurrency sweep",
		Long: "bench sends streaming POST /v1/audio/speech requests to a running server at each concurrency level,\n" +
			"from a fixed corpus of English, Chinese and Spanish sentences, and writes bench.md, bench.json and\n" +
			"bench.png to --out. With --compare it runs the same sweep against a second server (a baseline) and\n" +
			"states the first server's throughput and latency as ratios to it. It exits with status 1 when no\n" +
			"request to a server got audio (the server is down, or refused them all), after writing the report;\n" +
			"when every warm-up request fails it stops there.\n\n" +
			"With --ws it simulates voice agents instead (docs/api.md, WS /v1/audio/speech/stream): at each level\n" +
			"(--concurrency, default 1,4,16,64,256) that many sessions stream replies as LLM tokens at --token-rate,\n" +
			"the user barging in on --barge-in of the turns, for --duration-per-level (default 30s); it writes\n" +
			"ws.md and ws.json to --out.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ws {
				return runWSBench(cmd, wo, url, o, outDir)
			}
			if o.RequestsPerLevel < 0 {
				return errors.New("--requests-per-level: must not be negative")
			}
			if o.DurationPerLevel < 0 {
				return errors.New("--duration-per-level: must not be negative")
			}
			if o.Format != "pcm" && o.Format != "wav" {
				return fmt.Errorf("--format %q: want pcm or wav", o.Format)
			}
			for _, c := range append(append([]int(nil), o.Concurrency...), compareLevels...) {
				if c < 1 {
					return fmt.Errorf("--concurrency: level %d must be at least 1", c)
				}
			}
			o.Targets = []bench.Target{{Name: name, URL: url}}
			if compareURL != "" {
				t := bench.Target{Name: compareName, URL: compareURL}
				if cmd.Flags().Changed("compare-concurrency") {
					t.Concurrency = compareLevels
				}
				o.Targets = append(o.Targets, t)
			} else if cmd.Flags().Changed("compare-concurrency") {
				return errors.New("--compare-concurrency: needs --compare")
			}
			o.LocalGPU = localGPU

			tty := term.IsTerminal(int(os.Stderr.Fd()))
			level := slog.LevelInfo
			if !quiet && tty {
				o.Progress = bench.NewBar(os.Stderr)
				level = slog.LevelWarn // info lines would break the bar
			}
			o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rep, runErr := bench.Run(ctx, o)
			if rep == nil {
				return runErr
			}
			if runErr == nil {
				runErr = rep.Check() // every request failed: exit non-zero, after writing the report
			}
			if err := rep.WriteFiles(outDir); err != nil {
				return errors.Join(runErr, err)
			}
			if err := rep.WriteMarkdown(cmd.OutOrStdout()); err != nil {
				return errors.Join(runErr, err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s, %s and %s\n", filepath.Join(outDir, "bench.md"),
				filepath.Join(outDir, "bench.json"), filepath.Join(outDir, "bench.png"))
			if errors.Is(runErr, context.Canceled) {
				return fmt.Errorf("stopped early; the report has the levels that finished: %w", runErr)
			}
			return runErr
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "http://127.0.0.1:8080", "base URL of the server to measure")
	f.StringVar(&name, "name", "voxmux", "name of that server in the report")
	f.IntSliceVar(&o.Concurrency, "concurrency", bench.DefaultConcurrency, "concurrency levels, e.g. 1,4,8")
	f.IntVar(&o.RequestsPerLevel, "requests-per-level", 0, "requests per level, at least one per worker (default: 4 per worker, at least 16, unless --duration-per-level is set)")
	f.DurationVar(&o.DurationPerLevel, "duration-per-level", 0, "stop starting requests at a level after this long (e.g. 60s); with --requests-per-level, whichever comes first")
	f.IntVar(&o.Warmup, "warmup", 4, "requests sent to each server before its sweep, not counted")
	f.StringVar(&o.Format, "format", "pcm", "response_format: pcm (16-bit mono at --sample-rate) or wav (rate from the header)")
	f.IntVar(&o.SampleRate, "sample-rate", 24000, "sample rate of pcm responses, Hz")
	f.StringVar(&o.Model, "model", "", `"model" sent with each request (default: none, the server's own)`)
	f.StringVar(&o.Voice, "voice", "", `"voice" sent with each request (default: none)`)
	f.DurationVar(&o.Timeout, "timeout", 0, "limit per request; a request past it counts as failed (default 5m)")
	f.StringVar(&compareURL, "compare", "", "base URL of a second server (e.g. the baseline) to run through the same sweep")
	f.StringVar(&compareName, "compare-name", "baseline", "name of the --compare server in the report")
	f.IntSliceVar(&compareLevels, "compare-concurrency", nil, "levels for the --compare server when they should differ from --concurrency")
	f.StringVar(&outDir, "out", "bench-results", "folder for bench.md, bench.json and bench.png")
	f.StringVar(&o.GPUMetricsURL, "gpu-metrics", "", "base URL whose /metrics GPU gauges are sampled for every server (default: each server's own)")
	f.StringVar(&o.Label, "label", "", "title of the report, e.g. the GPU and the model")
	f.StringVar(&o.RequestLength, "request-length", "", `how the servers were set to make requests long, stated under every table (e.g. "realistic, 9 speech tokens per text token")`)
	f.StringVar(&o.VoicePrompt, "voice-prompt", "", `the voice's prompt, stated under every table (e.g. "5.0 s")`)
	f.BoolVar(&quiet, "quiet", false, "no progress bar")
	f.BoolVar(&ws, "ws", false, "simulate voice agents over the WebSocket text-in API instead")
	f.Float64Var(&wo.TokenRate, "token-rate", 25, "with --ws: tokens per second each agent's LLM sends")
	f.Float64Var(&wo.BargeIn, "barge-in", 0.3, "with --ws: share of turns the user interrupts, 0 to 1")
	cmd.AddCommand(stagesCmd())
	return cmd
}

// runWSBench is `voxmux bench --ws`.
func runWSBench(cmd *cobra.Command, wo bench.WSOptions, url string, o bench.Options, outDir string) error {
	wo.URL, wo.Voice, wo.Model = url, o.Voice, o.Model
	wo.Sessions = []int{1, 4, 16, 64, 256}
	if cmd.Flags().Changed("concurrency") {
		wo.Sessions = o.Concurrency
	}
	for _, n := range wo.Sessions {
		if n < 1 {
			return fmt.Errorf("--concurrency: level %d must be at least 1", n)
		}
	}
	wo.Duration = 30 * time.Second
	if o.DurationPerLevel > 0 {
		wo.Duration = o.DurationPerLevel
	}
	if wo.TokenRate <= 0 {
		return errors.New("--token-rate: must be positive")
	}
	if wo.BargeIn < 0 || wo.BargeIn > 1 {
		return errors.New("--barge-in: must be from 0 to 1")
	}
	wo.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, runErr := bench.RunWS(ctx, wo)
	if rep == nil {
		return runErr
	}
	if err := rep.WriteFiles(outDir); err != nil {
		return errors.Join(runErr, err)
	}
	if err := rep.WriteMarkdown(cmd.OutOrStdout()); err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s and %s\n", filepath.Join(outDir, "ws.md"), filepath.Join(outDir, "ws.json"))
	return runErr
}
