// Package config loads and validates the voxmux server configuration (YAML).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/voxmux/voxmux/tts"
)

// Providers the instances can run the pipeline on.
const (
	ProviderCPU  = "cpu"
	ProviderCUDA = "cuda"
)

// Config is the whole server configuration.
type Config struct {
	// Listen is the HOST:PORT the router serves HTTP on.
	Listen string `yaml:"listen"`
	// Model is the path of the pipeline manifest, relative to the config file.
	Model string `yaml:"model"`
	// Provider is the ONNX Runtime execution provider: cpu or cuda.
	Provider string `yaml:"provider"`
	// ONNXRuntime is the path of libonnxruntime.so; empty means the built-in search.
	ONNXRuntime string `yaml:"onnxruntime"`
	// MaxInputChars bounds the "input" of a speech request.
	MaxInputChars int `yaml:"max_input_chars"`
	// RequestTimeout bounds one synthesis, e.g. "5m".
	RequestTimeout Duration `yaml:"request_timeout"`
	// WriteTimeout bounds each write of a response to a client; a client that reads nothing for
	// that long is cut off and its instance slot freed.
	WriteTimeout Duration `yaml:"write_timeout"`
	Groups       []Group  `yaml:"groups"`
	Queue        Queue    `yaml:"queue"`
	Admin        Admin    `yaml:"admin"`
	Restart      Restart  `yaml:"restart"`
	Liveness     Liveness `yaml:"liveness"`
	Shutdown     Shutdown `yaml:"shutdown"`
	// Health tunes GPU health monitoring and group recovery (config/health.go).
	Health Health `yaml:"health"`
	// Consul registers the router in a Consul agent when enabled (config/health.go).
	Consul Consul `yaml:"consul"`
	// ModelAliases are other names clients may send as "model"; nil (the key left out) means
	// DefaultModelAliases (config/api.go).
	ModelAliases *[]string `yaml:"model_aliases"`
	// APIKeys, when set, makes /v1/* require Authorization: Bearer KEY (config/api.go).
	APIKeys APIKeys `yaml:"api_keys"`
	// CORS lets browser apps on other origins call /v1/* (config/http.go).
	CORS CORS `yaml:"cors"`
	// Realtime tunes WS /v1/audio/speech/stream (config/realtime.go).
	Realtime Realtime `yaml:"realtime"`
	// Voices is the library of cloned voices (config/voices.go).
	Voices Voices `yaml:"voices"`

	// File is where the config was read from (for messages and relative paths).
	File string `yaml:"-"`
	// data is the file's text, for the lines of errors found after Parse (CheckEngines).
	data []byte
}

// Group is a set of GPUs that runs its own instances.
type Group struct {
	Name string `yaml:"name"`
	// GPUs are host GPU indices; the group's instances see exactly these (CUDA_VISIBLE_DEVICES).
	GPUs []int `yaml:"gpus"`
	// Instances is how many instance processes share the group.
	Instances int `yaml:"instances"`
	// MaxInflight is the number of concurrent requests one instance accepts.
	MaxInflight int `yaml:"max_inflight"`
	// Placement is where the stages run inside the group: replicated (a whole pipeline on every
	// GPU of the group) or split (LM on the first GPU, flow and vocoder on the second).
	Placement string `yaml:"placement"`
	// GPUMemoryLimit caps ONNX Runtime's CUDA arena per GPU: bytes ("8GiB") or a fraction of the
	// device ("0.4"). Empty leaves ONNX Runtime's default.
	GPUMemoryLimit string `yaml:"gpu_memory_limit"`
	// GPUMemory is GPUMemoryLimit as Parse read it.
	GPUMemory tts.MemoryLimit `yaml:"-"`
	// ArenaExtendStrategy is ONNX Runtime's arena_extend_strategy: kNextPowerOfTwo or kSameAsRequested.
	ArenaExtendStrategy string `yaml:"arena_extend_strategy"`
	// ProviderOptions are passed to ONNX Runtime's execution provider as they are (e.g.
	// cudnn_conv_algo_search); the engine's own switches are under Engine.
	ProviderOptions map[string]string `yaml:"provider_options"`
	// Engine is the group's `engine:` section, the options of the model family serving it, kept
	// as JSON: only that family knows its keys, and parses it (CheckEngines).
	Engine tts.EngineSection `yaml:"engine"`
}

// Placements of the stages inside a group.
const (
	PlacementReplicated = "replicated"
	PlacementSplit      = "split"
)

// Defaults applied to keys a config leaves out.
const (
	DefaultListen        = "127.0.0.1:8080"
	DefaultMaxInputChars = 4096
	DefaultMaxInflight   = 16
	DefaultWriteTimeout  = 15 * time.Second
)

// Load reads, defaults and validates the config at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes data (read from file) strictly: an unknown key is an error naming it and its line.
func Parse(file string, data []byte) (*Config, error) {
	var c Config
	if err := yaml.UnmarshalWithOptions(data, &c, yaml.DisallowUnknownField(), yaml.Strict(),
		yaml.CustomUnmarshaler(unmarshalEngine)); err != nil {
		return nil, fmt.Errorf("config %s: %s", file, yaml.FormatError(err, false, true))
	}
	c.File, c.data = file, data
	c.applyDefaults()
	if err := c.validate(); err != nil {
		return nil, c.located(err)
	}
	return &c, nil
}

// unmarshalEngine keeps a group's engine section as JSON, for the family that parses it.
func unmarshalEngine(s *tts.EngineSection, b []byte) error {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return err
	}
	var c bytes.Buffer
	if err := json.Compact(&c, j); err != nil {
		return err
	}
	if c.String() == "null" {
		*s = nil
		return nil
	}
	*s = c.Bytes()
	return nil
}

// located prefixes err with the file, and the line of the key a *fieldError names.
func (c *Config) located(err error) error {
	var fe *fieldError
	if errors.As(err, &fe) {
		if line := lineOf(c.data, fe.path); line > 0 {
			return fmt.Errorf("config %s:%d: %w", c.File, line, err)
		}
	}
	return fmt.Errorf("config %s: %w", c.File, err)
}

// Engines are the model families, which alone know the keys of a group's `engine:` section
// (instance.Families).
type Engines interface {
	// CheckOptions parses section with the family that serves the model at path; an error about
	// one key is a *tts.OptionError naming it.
	CheckOptions(path string, section tts.EngineSection) error
	// OptionFamily names the families that have the engine option key, "" when none has it.
	OptionFamily(key string) string
}

// CheckEngines has the family serving the model parse each group's `engine:` section, so a bad
// option stops the load with its key, line and file, and refuses a provider_options entry that is
// an engine option (which ONNX Runtime would refuse with a less helpful message).
func (c *Config) CheckEngines(e Engines) error {
	for i, g := range c.Groups {
		p := fmt.Sprintf("$.groups[%d]", i)
		k := fmt.Sprintf("groups[%d]", i)
		for _, key := range slices.Sorted(maps.Keys(g.ProviderOptions)) {
			if fam := e.OptionFamily(key); fam != "" {
				return c.located(bad(p+".provider_options", k+".provider_options."+key,
					"group %q: %s is an engine option (of the %s family), not ONNX Runtime's: set it as %s.engine.%s", g.Name, key, fam, k, key))
			}
		}
		if err := e.CheckOptions(c.ModelPath(), g.Engine); err != nil {
			var oe *tts.OptionError
			if errors.As(err, &oe) {
				return c.located(bad(p+".engine."+oe.Key, k+".engine."+oe.Key, "group %q: %s", g.Name, oe.Msg))
			}
			return c.located(bad(p+".engine", k+".engine", "group %q: %v", g.Name, err))
		}
	}
	return nil
}

func (c *Config) applyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Provider == "" {
		c.Provider = ProviderCPU
	}
	if c.MaxInputChars == 0 {
		c.MaxInputChars = DefaultMaxInputChars
	}
	c.applyOpsDefaults()
	c.applyHTTPDefaults()
	c.applyRealtimeDefaults()
	c.applyVoicesDefaults()
	for i := range c.Groups {
		g := &c.Groups[i]
		if g.Instances == 0 {
			g.Instances = 1
		}
		if g.MaxInflight == 0 {
			g.MaxInflight = DefaultMaxInflight
		}
	}
}

// fieldError names the offending key by its YAML path, e.g. $.groups[1].gpus.
type fieldError struct {
	path string
	key  string
	msg  string
}

func (e *fieldError) Error() string { return e.key + ": " + e.msg }

func bad(path, key, format string, a ...any) error {
	return &fieldError{path: path, key: key, msg: fmt.Sprintf(format, a...)}
}

func (c *Config) validate() error {
	if c.Model == "" {
		return bad("$", "model", "is required (path of a pipeline manifest)")
	}
	switch c.Provider {
	case ProviderCPU, ProviderCUDA:
	default:
		return bad("$.provider", "provider", "%q is not one of cpu, cuda", c.Provider)
	}
	if c.MaxInputChars < 0 {
		return bad("$.max_input_chars", "max_input_chars", "must be positive")
	}
	if c.RequestTimeout < 0 {
		return bad("$.request_timeout", "request_timeout", "must be positive")
	}
	if len(c.Groups) == 0 {
		return bad("$", "groups", "at least one group is required")
	}
	names := map[string]bool{}
	owner := map[int]string{}
	for i, g := range c.Groups {
		p := fmt.Sprintf("$.groups[%d]", i)
		k := fmt.Sprintf("groups[%d]", i)
		if g.Name == "" {
			return bad(p, k+".name", "is required")
		}
		if strings.ContainsAny(g.Name, "/ \t") {
			return bad(p+".name", k+".name", "%q must not contain '/' or spaces", g.Name)
		}
		if names[g.Name] {
			return bad(p+".name", k+".name", "group %q is defined twice", g.Name)
		}
		names[g.Name] = true
		if g.Instances < 0 {
			return bad(p+".instances", k+".instances", "group %q: must be at least 1", g.Name)
		}
		if g.MaxInflight < 0 {
			return bad(p+".max_inflight", k+".max_inflight", "group %q: must be at least 1", g.Name)
		}
		if _, err := g.Engine.Fields(); err != nil {
			return bad(p+".engine", k+".engine", "group %q: %v", g.Name, err)
		}
		if c.Provider == ProviderCUDA && len(g.GPUs) == 0 {
			return bad(p, k+".gpus", "group %q: provider cuda needs at least one GPU", g.Name)
		}
		for _, gpu := range g.GPUs {
			if gpu < 0 {
				return bad(p+".gpus", k+".gpus", "group %q: GPU index %d is negative", g.Name, gpu)
			}
			if other, ok := owner[gpu]; ok {
				return bad(p+".gpus", k+".gpus", "group %q: GPU %d is already in group %q", g.Name, gpu, other)
			}
			owner[gpu] = g.Name
		}
	}
	if err := c.validateOps(); err != nil {
		return err
	}
	if err := c.validateHealth(); err != nil {
		return err
	}
	if err := c.validateHTTP(); err != nil {
		return err
	}
	if err := c.validateRealtime(); err != nil {
		return err
	}
	if err := c.validateVoices(); err != nil {
		return err
	}
	return c.validateAPI()
}

// CheckGPUs rejects GPU indices the host does not have (count from NVML, when it can list them).
func (c *Config) CheckGPUs(count int) error {
	for i, g := range c.Groups {
		for _, gpu := range g.GPUs {
			if gpu >= count {
				return fmt.Errorf("config %s: groups[%d].gpus: group %q: GPU %d does not exist (this host has %d: 0..%d)", c.File, i, g.Name, gpu, count, count-1)
			}
		}
	}
	return nil
}

// ModelPath resolves Model relative to the config file.
func (c *Config) ModelPath() string {
	if filepath.IsAbs(c.Model) || c.File == "" {
		return c.Model
	}
	return filepath.Join(filepath.Dir(c.File), c.Model)
}

// lineOf finds the line of the node at a YAML path, 0 when it cannot.
func lineOf(data []byte, path string) int {
	if path == "$" {
		return 0 // a missing top-level key has no line of its own
	}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return 0
	}
	p, err := yaml.PathString(path)
	if err != nil {
		return 0
	}
	n, err := p.FilterFile(f)
	if err != nil || n == nil {
		return 0
	}
	if m, ok := n.(*ast.MappingNode); ok && len(m.Values) > 0 {
		return m.Values[0].GetToken().Position.Line
	}
	return n.GetToken().Position.Line
}
