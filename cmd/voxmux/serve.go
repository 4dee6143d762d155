package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/health"
	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/plugin"
	"github.com/voxmux/voxmux/router"
	"github.com/voxmux/voxmux/router/library"
	"github.com/voxmux/voxmux/tts"
)

func serveCmd(families instance.Families) *cobra.Command {
	var cfgPath, listen, logLevel, logFormat string
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
			log, err := newLogger(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cfg, families, log, logLevel)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "configs/cpu.yaml", "config file")
	cmd.Flags().StringVar(&listen, "listen", "", "HOST:PORT to serve on (overrides the config's listen)")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "least level logged, by the router and its instances: debug, info, warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "json", "log line format: json or text")
	return cmd
}

// newLogger makes the one logger of serve; its instances' lines are relayed through it.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	lv, ok := plugin.ParseLevel(level)
	if !ok {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: plugin.DurationsAsStrings}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use json or text", format)
}

func serve(ctx context.Context, cfg *config.Config, families instance.Families, log *slog.Logger, logLevel string) error {
	// First of all, so that a signal during start-up shuts down cleanly rather than killing serve
	// (and leaving its instances' sockets behind).
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	// The instances' sockets live in a folder of this serve's, removed when it exits; one left by a
	// serve that was killed is removed by the next.
	sockDir, err := makeSocketDir(log)
	if err != nil {
		return err
	}
	defer os.RemoveAll(sockDir)
	model, err := families.Describe(cfg.ModelPath())
	if err != nil {
		return fmt.Errorf("config %s: model: %w", cfg.File, err)
	}
	// Only the family serving the model knows its engine options: it parses each group's now, so
	// a bad one stops serve with its line before any instance starts.
	if err := cfg.CheckEngines(families); err != nil {
		return err
	}
	ortLib, err := findORT(cfg)
	if err != nil {
		return err
	}
	// Read once here and handed to the router; never logged.
	keyRights, err := cfg.LoadAPIKeyRights(os.Getenv)
	if err != nil {
		return err
	}
	apiKeys, err := cfg.LoadAPIKeys(os.Getenv)
	if err != nil {
		return err
	}
	var voices *library.Library
	if dir := cfg.VoicesDir(); dir != "" {
		voices, err = library.Open(library.Options{Dir: dir, MaxEntries: cfg.Voices.Cache.MaxEntries,
			MaxBytes: int64(cfg.Voices.Cache.MaxBytes), Logger: log})
		if err != nil {
			return fmt.Errorf("config %s: voices.dir: %w", cfg.File, err)
		}
		if !model.Cloning {
			log.Warn("voices.dir is set, but the model cannot clone voices: the library serves none", "model", model.Name, "file", cfg.File)
		}
	}
	// The admin token also manages library voices on the speech API.
	var adminToken string
	if cfg.Admin.Listen != "" {
		if adminToken, err = cfg.AdminToken(os.Getenv); err != nil {
			return err
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	mon := openGPUMonitor(log, cfg)
	if mon != nil {
		defer mon.Close()
		if err := cfg.CheckGPUs(len(mon.Snapshot())); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close()

	pool := router.NewPool(router.Model{Name: model.Name, SampleRate: model.SampleRate, Voices: model.Voices, NativeSpeed: model.NativeSpeed, Instructions: model.Instructions, Cloning: model.Cloning, Family: model.Kind, Attribution: model.Attribution},
		router.QueueOptions{Size: cfg.Queue.Size, Timeout: cfg.Queue.Timeout.Std()})
	supCtx, stopInstances := context.WithCancel(context.Background())
	defer stopInstances()
	var supervised sync.WaitGroup
	var members []*plugin.Member
	for _, g := range cfg.Groups {
		group := &router.Group{Name: g.Name, GPUs: g.GPUs}
		for i := 0; i < g.Instances; i++ {
			spec := memberSpec(cfg, g, i, exe, ortLib)
			spec.Launch.Logger, spec.Launch.SocketDir = log, sockDir
			spec.Launch.Env = []string{plugin.LogLevelEnv + "=" + logLevel}
			m := plugin.NewMember(spec, plugin.Backoff{
				Initial:      cfg.Restart.BackoffInitial.Std(),
				Max:          cfg.Restart.BackoffMax.Std(),
				MaxFailures:  cfg.Restart.MaxFailures,
				StartTimeout: cfg.Restart.StartTimeout.Std(),
				ResetAfter:   cfg.Restart.ResetAfter.Std(),
				Liveness: plugin.Liveness{
					Interval: cfg.Liveness.Interval.Std(),
					Timeout:  cfg.Liveness.Timeout.Std(),
					Failures: cfg.Liveness.Failures,
				},
			}, plugin.ProcessLauncher, log)
			members = append(members, m)
			group.Backends = append(group.Backends, &router.Backend{Name: m.Name(), Synth: m, Member: m, Capacity: g.MaxInflight})
			supervised.Add(1)
			go func() { defer supervised.Done(); m.Run(supCtx) }()
		}
		pool.AddGroup(group)
	}
	stop := func() {
		stopInstances()
		supervised.Wait()
	}

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if mon != nil {
		metrics.MustRegister(health.NewCollector(mon.Snapshot))
		go mon.Run(supCtx)
	}
	watchGPUs(supCtx, mon, cfg, pool, log)
	requestMetrics := router.NewMetrics(metrics, pool)
	go requestMetrics.PollInstances(supCtx, 2*time.Second)

	srv := router.New(router.Options{
		Metrics:        metrics,
		RequestMetrics: requestMetrics,
		Pool:           pool,
		MaxInputChars:  cfg.MaxInputChars,
		RequestTimeout: cfg.RequestTimeout.Std(),
		WriteTimeout:   cfg.WriteTimeout.Std(),
		ModelAliases:   cfg.Aliases(),
		APIKeys:        apiKeys,
		CORS:           &router.CORSOptions{Origins: cfg.CORS.Origins(), MaxAge: cfg.CORS.MaxAge.Std()},
		GroupExtra:     gpuView(mon),
		Realtime: router.RealtimeOptions{MinChars: cfg.Realtime.MinChars, MaxChars: cfg.Realtime.MaxChars,
			IdleFlush: cfg.Realtime.Idle(), MaxContexts: cfg.Realtime.MaxContexts},
		Voices:         voices,
		MaxUploadBytes: int(cfg.Voices.MaxUploadBytes),
		AdminToken:     adminToken,
		VoiceKeys:      config.KeysWith(keyRights, config.RightVoices),
		Logger:         log,
	})
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "model", model.Name, "provider", cfg.Provider, "groups", len(cfg.Groups),
		"api_keys", len(apiKeys), "status_page", "http://"+ln.Addr().String()+"/")

	var admin *router.Admin
	if cfg.Admin.Listen != "" {
		token := adminToken
		if len(token) < config.MinAdminTokenLen {
			log.Warn("the admin token is short; use at least 16 random characters", "key", "admin.token", "file", cfg.File)
		}
		aln, err := net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			stop()
			return fmt.Errorf("config %s: admin.listen %s: %w", cfg.File, cfg.Admin.Listen, err)
		}
		admin = router.NewAdmin(router.AdminOptions{Pool: pool, Token: token, DrainTimeout: cfg.Shutdown.DrainTimeout.Std(), Extra: gpuView(mon), Logger: log})
		go func() { serveErr <- admin.Serve(aln) }()
		log.Info("admin API listening", "addr", aln.Addr().String())
	}

	registrar, err := newRegistrar(log, cfg, ln.Addr(), func() health.RegistrationStatus { return registrationStatus(pool) })
	if err != nil {
		stop()
		return err
	}
	if registrar != nil {
		go registrar.Run(supCtx)
		go notifyChanges(supCtx, pool, registrar)
	}

	if err := awaitFirstReady(ctx, members, sig); err != nil {
		stop()
		if errors.Is(err, errSignal) {
			log.Info("stopped during start-up", "signal", err.Error())
			return nil
		}
		return err
	}
	auth := ""
	if len(apiKeys) > 0 {
		auth = `-H "Authorization: Bearer $KEY" `
	}
	log.Info("ready", "try", fmt.Sprintf(`curl -s %s%s/v1/audio/speech -d '{"model":"%s","input":"Hello world.","voice":"%s","response_format":"wav","stream":false}' -o out.wav`,
		auth, "http://"+ln.Addr().String(), model.Name, model.Voices[0]))

	select {
	case s := <-sig:
		log.Info("shutting down: /readyz now answers 503", "signal", s.String(), "grace", cfg.Shutdown.Grace.Std())
	case err := <-serveErr:
		stop()
		return fmt.Errorf("http server: %w", err)
	}
	// Load balancers see /readyz fail first, then the service leaves Consul; new requests are
	// still served during the grace period.
	srv.SetDraining()
	if registrar != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := registrar.Deregister(dctx); err != nil {
			log.Warn("consul deregister", "error", err)
		}
		cancel()
	}
	select {
	case <-time.After(cfg.Shutdown.Grace.Std()):
	case <-sig:
		log.Warn("second signal: stopping now")
		// The listener closes before the instances stop, so that no request starts on an instance
		// about to go (requests still in flight get 503, the shutdown's answer).
		now, cancel := context.WithCancel(context.Background())
		cancel()
		srv.Shutdown(now)
		if admin != nil {
			admin.Shutdown(now)
		}
		stop()
		return nil
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Shutdown.DrainTimeout.Std())
	defer cancel()
	go func() {
		<-sig
		log.Warn("second signal: stopping now")
		cancel()
	}()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("in-flight requests did not finish in time", "error", err)
	}
	if admin != nil {
		admin.Shutdown(sctx)
	}
	stop()
	log.Info("stopped")
	return nil
}

// awaitFirstReady waits until an instance is ready. If instead every instance has failed its
// first start (a broken model, a provider that cannot load), it returns their errors, so that a
// misconfigured server exits at once rather than retrying forever.
func awaitFirstReady(ctx context.Context, members []*plugin.Member, sig <-chan os.Signal) error {
	for {
		var errs []error
		chs := make([]<-chan struct{}, len(members))
		for i, m := range members {
			chs[i] = m.Changed()
			s := m.Status()
			if s.State == tts.StateReady {
				return nil
			}
			if s.Failures > 0 {
				errs = append(errs, fmt.Errorf("instance %s: %s", s.Name, s.LastError))
			}
		}
		if len(errs) == len(members) {
			return fmt.Errorf("no instance could start: %w", errors.Join(errs...))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case s := <-sig:
			return fmt.Errorf("%s: %w", s, errSignal)
		case <-anyOf(chs):
		}
	}
}

// errSignal ends the start-up when serve is told to stop.
var errSignal = errors.New("signal")

func anyOf(chs []<-chan struct{}) <-chan struct{} {
	out := make(chan struct{})
	var once sync.Once
	for _, c := range chs {
		go func() {
			<-c
			once.Do(func() { close(out) })
		}()
	}
	return out
}

func memberSpec(cfg *config.Config, g config.Group, i int, exe, ortLib string) plugin.MemberSpec {
	name := fmt.Sprintf("%s/%d", g.Name, i)
	opts := map[string]string{}
	for k, v := range g.ProviderOptions {
		opts[k] = v
	}
	if g.ArenaExtendStrategy != "" {
		opts["arena_extend_strategy"] = g.ArenaExtendStrategy
	}
	return plugin.MemberSpec{
		Name: name,
		Launch: plugin.LaunchConfig{
			Executable: exe,
			Args:       []string{"instance"},
			Name:       name,
			GPUs:       g.GPUs,
			HostEnv:    os.Environ(),
		},
		Load: tts.LoadConfig{
			Manifest:        cfg.ModelPath(),
			Provider:        cfg.Provider,
			ORTLibrary:      ortLib,
			ProviderOptions: opts,
			MaxInflight:     g.MaxInflight,
			Placement:       g.Placement,
			GPUMemoryLimit:  g.GPUMemory,
			Engine:          g.Engine,
		},
	}
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
