package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
)

// LaunchConfig says how to start one instance process.
type LaunchConfig struct {
	// Executable and Args start the instance (normally this binary with "instance").
	Executable string
	Args       []string
	// Name labels the instance's logs.
	Name string
	// GPUs become the instance's CUDA_VISIBLE_DEVICES; empty hides every GPU.
	GPUs []int
	// HostEnv is the router's environment; only the variables an instance needs are passed on.
	HostEnv []string
	// Env are more variables for the instance (its log level, for one).
	Env []string
	// Logger receives the go-plugin client's and the instance's log lines; nil drops them.
	Logger *slog.Logger
	// SocketDir is where the instance's socket directory is made (empty: the system's temporary
	// folder); each process gets its own, removed when it is stopped, so that a crashed process
	// leaves no socket behind.
	SocketDir string
	// StartTimeout bounds the handshake.
	StartTimeout time.Duration
}

// Process is a running instance: the Instance it serves plus the go-plugin client that owns it.
// A go-plugin client cannot be restarted, so every launch makes a new Process.
type Process struct {
	Instance
	client  *goplugin.Client
	cmd     *exec.Cmd
	sockDir string
}

// Launch starts an instance process and completes the handshake.
func Launch(ctx context.Context, lc LaunchConfig) (*Process, error) {
	sockDir, err := os.MkdirTemp(lc.SocketDir, "instance-")
	if err != nil {
		return nil, fmt.Errorf("start instance %s: socket directory: %w", lc.Name, err)
	}
	cmd := exec.Command(lc.Executable, lc.Args...)
	// The whole environment is built here: go-plugin is told to add nothing of the host's.
	cmd.Env = append(append(InstanceEnv(lc.HostEnv, lc.GPUs), lc.Env...), goplugin.EnvUnixSocketDir+"="+sockDir)
	// The kernel kills the instance when the router dies, even by SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	log := lc.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := lc.StartTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          goplugin.PluginSet{Name: &GRPCPlugin{}},
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		GRPCDialOptions:  dialOptions(),
		// go-plugin would append the host environment after cmd.Env, and the last value of a
		// duplicated variable wins: an inherited CUDA_VISIBLE_DEVICES would undo the placement.
		SkipHostEnv:  true,
		StartTimeout: timeout,
		// The instance's lines and go-plugin's own come out through the router's slog handler.
		Logger: NewHCLogger(log.With("instance", lc.Name)),
	})
	p := &Process{client: client, cmd: cmd, sockDir: sockDir}
	rpc, err := client.Client()
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("start instance %s: %w", lc.Name, err)
	}
	raw, err := rpc.Dispense(Name)
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("instance %s: %w", lc.Name, err)
	}
	inst, ok := raw.(Instance)
	if !ok {
		p.Stop()
		return nil, fmt.Errorf("instance %s: plugin is %T, not an Instance", lc.Name, raw)
	}
	p.Instance = inst
	return p, nil
}

// Stop ends the process through go-plugin (graceful shutdown, then a kill after a grace period).
// Signals are not used: ONNX Runtime's CUDA provider replaces the instance's signal handlers.
func (p *Process) Stop() {
	p.client.Kill()
	_ = os.RemoveAll(p.sockDir) // a crashed instance leaves its socket
}

// Kill ends a process that does not answer: go-plugin's graceful stop asks the process over RPC
// and would wait on a stopped one forever, so SIGKILL goes first (a signal the CUDA provider
// cannot catch), then go-plugin cleans up.
func (p *Process) Kill() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
	p.Stop()
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool { return p.client.Exited() }

// ExitStatus says how the process ended ("exit status 2", "signal: killed"); "" while it runs.
func (p *Process) ExitStatus() string {
	// go-plugin marks the client exited only after cmd.Wait has returned, so ProcessState is set.
	if !p.client.Exited() || p.cmd.ProcessState == nil {
		return ""
	}
	return p.cmd.ProcessState.String()
}

// PID is the instance's process ID, 0 when unknown.
func (p *Process) PID() int {
	if rc := p.client.ReattachConfig(); rc != nil && rc.Pid != 0 {
		return rc.Pid
	}
	return 0
}

// passEnv are the host variables an instance may inherit; everything else is left behind.
// VOXMUX_ORT_TELEMETRY=1 lets ONNX Runtime's telemetry run (instance/ort.TelemetryEnv).
var passEnv = []string{"PATH", "HOME", "USER", "TMPDIR", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "GODEBUG", "GOTRACEBACK",
	"VOXMUX_ORT_TELEMETRY"}

// InstanceEnv builds an instance's whole environment: the allowed host variables (plus CUDA_* and
// NVIDIA_* settings other than the device list), CUDA_DEVICE_ORDER=PCI_BUS_ID unless the host
// sets it, and CUDA_VISIBLE_DEVICES set to gpus.
func InstanceEnv(host []string, gpus []int) []string {
	var env []string
	order := "CUDA_DEVICE_ORDER=PCI_BUS_ID"
	for _, kv := range host {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "CUDA_VISIBLE_DEVICES" || k == Handshake.MagicCookieKey {
			continue
		}
		if k == "CUDA_DEVICE_ORDER" {
			order = "" // the operator's choice stands
		}
		pass := strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "NVIDIA_")
		for _, p := range passEnv {
			pass = pass || k == p
		}
		if pass {
			env = append(env, kv)
		}
	}
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = strconv.Itoa(g)
	}
	if order != "" {
		// Config GPU indices are NVML's, which follow the PCI bus; CUDA's default order is
		// fastest-first, so without this "GPU 3" could be another device.
		env = append(env, order)
	}
	return append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(ids, ","))
}
