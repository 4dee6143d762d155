package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/plugin"
	"github.com/voxmux/voxmux/router"
)

func serveCmd() *cobra.Command {
	var cfgPath, listen string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP router and its inference instances",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if listen != "" {
				cfg.Listen = listen
			}
			return serve(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "configs/cpu.yaml", "config file")
	cmd.Flags().StringVar(&listen, "listen", "", "HOST:PORT to serve on (overrides the config's listen)")
	return cmd
}

func serve(ctx context.Context, cfg *config.Config) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	manifest, err := instance.Describe(cfg.ModelPath())
	if err != nil {
		return fmt.Errorf("config %s: model: %w", cfg.File, err)
	}
	ortLib, err := findORT(cfg)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close()

	pool := router.NewPool(router.Model{Name: manifest.Name, SampleRate: manifest.SampleRate, Voices: manifest.Voices})
	srv := router.New(router.Options{
		Pool:           pool,
		MaxInputChars:  cfg.MaxInputChars,
		RequestTimeout: cfg.RequestTimeout.Std(),
		ModelAliases:   []string{"tts-1", "tts-1-hd", "gpt-4o-mini-tts"},
		Logger:         log,
	})
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "model", manifest.Name, "provider", cfg.Provider)

	procs, err := startInstances(ctx, log, cfg, exe, ortLib, pool)
	defer func() {
		for _, p := range procs {
			p.Stop()
		}
	}()
	if err != nil {
		return err
	}
	log.Info("ready", "instances", len(procs), "try", fmt.Sprintf(`curl -s %s/v1/audio/speech -d '{"model":"%s","input":"Hello world.","voice":"%s","response_format":"wav"}' -o out.wav`, "http://"+ln.Addr().String(), manifest.Name, manifest.Voices[0]))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
	case err := <-serveErr:
		return fmt.Errorf("http server: %w", err)
	}
	srv.SetDraining()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("shutdown", "error", err)
	}
	return nil
}

// startInstances launches, loads and warms up every instance of every group. It fails when none
// becomes ready; an instance that fails while others succeed is logged and left out.
func startInstances(ctx context.Context, log *slog.Logger, cfg *config.Config, exe, ortLib string, pool *router.Pool) ([]*plugin.Process, error) {
	type result struct {
		p   *plugin.Process
		err error
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var results []result
	for _, g := range cfg.Groups {
		for i := 0; i < g.Instances; i++ {
			name := fmt.Sprintf("%s/%d", g.Name, i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := startInstance(ctx, log, cfg, g, name, exe, ortLib)
				if err == nil {
					b := &router.Backend{Name: name, Group: g.Name, Synth: p, Capacity: g.MaxInflight}
					pool.Add(b)
					b.SetReady(true)
				} else {
					log.Error("instance failed to start", "instance", name, "error", err)
				}
				mu.Lock()
				results = append(results, result{p, err})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	var procs []*plugin.Process
	var errs []error
	for _, r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
		} else {
			procs = append(procs, r.p)
		}
	}
	if len(procs) == 0 {
		return nil, fmt.Errorf("no instance could start: %w", errors.Join(errs...))
	}
	return procs, nil
}

func startInstance(ctx context.Context, log *slog.Logger, cfg *config.Config, g config.Group, name, exe, ortLib string) (*plugin.Process, error) {
	p, err := plugin.Launch(ctx, plugin.LaunchConfig{
		Executable: exe,
		Args:       []string{"instance"},
		Name:       name,
		GPUs:       g.GPUs,
		HostEnv:    os.Environ(),
		LogOutput:  os.Stderr,
	})
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	info, err := p.Load(lctx, instance.LoadConfig{
		Manifest:    cfg.ModelPath(),
		Provider:    cfg.Provider,
		ORTLibrary:  ortLib,
		MaxInflight: g.MaxInflight,
	})
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("instance %s: %w", name, err)
	}
	// Warm up: the instance is ready only after a real synthesis succeeds.
	if err := p.Synthesize(lctx, instance.Request{ID: "warmup", Text: "Warm up."}, func(instance.Chunk) error { return nil }); err != nil {
		p.Stop()
		return nil, fmt.Errorf("instance %s: warm-up synthesis: %w", name, err)
	}
	log.Info("instance ready", "instance", name, "pid", info.PID, "provider", info.Provider, "cuda_visible_devices", info.CUDAVisibleDevices)
	return p, nil
}

// findORT locates libonnxruntime.so: the config's onnxruntime key, then $ORT_LIB, then the
// folder scripts/install-onnxruntime.sh fills, beside the binary or under the working directory.
func findORT(cfg *config.Config) (string, error) {
	if cfg.ONNXRuntime != "" {
		p := cfg.ONNXRuntime
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(cfg.File), p)
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("config %s: onnxruntime: %w", cfg.File, err)
		}
		return filepath.Abs(p)
	}
	if p := os.Getenv("ORT_LIB"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("ORT_LIB: %w", err)
		}
		return filepath.Abs(p)
	}
	var tried []string
	if exe, err := os.Executable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), "..", "third_party", "onnxruntime", "libonnxruntime.so"))
	}
	tried = append(tried, filepath.Join("third_party", "onnxruntime", "libonnxruntime.so"))
	for _, p := range tried {
		if _, err := os.Stat(p); err == nil {
			return filepath.Abs(p)
		}
	}
	return "", fmt.Errorf("ONNX Runtime not found (tried %v); run scripts/install-onnxruntime.sh, set ORT_LIB, or set onnxruntime: in %s", tried, cfg.File)
}
