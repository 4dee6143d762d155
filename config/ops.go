package config

import (
	"fmt"
	"net"

	"strconv"
	"strings"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// Queue bounds the requests that wait while every instance is at its max_inflight.
type Queue struct {
	// Size is how many requests may wait; one more is refused at once with 429.
	Size int `yaml:"size"`
	// Timeout is how long a request may wait before it is answered 503.
	Timeout Duration `yaml:"timeout"`
}

// Admin is the operations API; it is off unless Listen is set. A listen address without a host
// binds to 127.0.0.1; one that is not a loopback address needs a token of MinAdminTokenLen
// characters or more.
type Admin struct {
	Listen string `yaml:"listen"`
	// Token is the bearer token every admin call needs; TokenEnv names an environment variable
	// holding it instead (read by main at start-up).
	Token    string `yaml:"token"`
	TokenEnv string `yaml:"token_env"`
}

// Restart is how the supervisor brings crashed instances back.
type Restart struct {
	// BackoffInitial doubles after each failed start up to BackoffMax.
	BackoffInitial Duration `yaml:"backoff_initial"`
	BackoffMax     Duration `yaml:"backoff_max"`
	// MaxFailures consecutive failures mark an instance failed (no more restarts until an
	// operator restarts its group).
	MaxFailures int `yaml:"max_failures"`
	// StartTimeout bounds launch, load and warm-up of one instance.
	StartTimeout Duration `yaml:"start_timeout"`
	// ResetAfter is the healthy run after which the next crash is retried after backoff_initial
	// again.
	ResetAfter Duration `yaml:"reset_after"`
}

// Liveness is how the supervisor checks that a ready instance still makes progress: a health RPC
// every Interval, each bounded by Timeout; Failures in a row mark the instance hung, and it is
// killed and restarted.
type Liveness struct {
	Interval Duration `yaml:"interval"`
	Timeout  Duration `yaml:"timeout"`
	Failures int      `yaml:"failures"`
}

// Shutdown is what SIGTERM does: /readyz turns 503 at once, the listener closes after Grace,
// in-flight streams get up to DrainTimeout to finish.
type Shutdown struct {
	Grace        Duration `yaml:"grace"`
	DrainTimeout Duration `yaml:"drain_timeout"`
}

// MinAdminTokenLen is the shortest admin token accepted for an admin API reachable from other
// hosts.
const MinAdminTokenLen = 16

// AdminLoopback reports whether admin.listen binds only to this host.
func (c *Config) AdminLoopback() bool {
	host, _, err := net.SplitHostPort(c.Admin.Listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// AdminToken returns the admin token: admin.token, or the variable admin.token_env names. An empty
// variable, or a short token on an address other hosts can reach, is an error naming the key and
// the file.
func (c *Config) AdminToken(getenv func(string) string) (string, error) {
	token := c.Admin.Token
	key := "admin.token"
	if c.Admin.TokenEnv != "" {
		key = "admin.token_env"
		if token = getenv(c.Admin.TokenEnv); token == "" {
			return "", fmt.Errorf("config %s: admin.token_env: $%s is empty", c.File, c.Admin.TokenEnv)
		}
	}
	if !c.AdminLoopback() && len(token) < MinAdminTokenLen {
		return "", fmt.Errorf("config %s: %s: admin.listen %s is not a loopback address, so the token must have at least %d characters (it has %d)",
			c.File, key, c.Admin.Listen, MinAdminTokenLen, len(token))
	}
	return token, nil
}

func (c *Config) applyOpsDefaults() {
	if c.Queue.Size == 0 {
		c.Queue.Size = 256
	}
	if c.Queue.Timeout == 0 {
		c.Queue.Timeout = Duration(30 * time.Second)
	}
	if c.Restart.BackoffInitial == 0 {
		c.Restart.BackoffInitial = Duration(time.Second)
	}
	if c.Restart.BackoffMax == 0 {
		c.Restart.BackoffMax = Duration(time.Minute)
	}
	if c.Restart.MaxFailures == 0 {
		c.Restart.MaxFailures = 5
	}
	if c.Restart.StartTimeout == 0 {
		c.Restart.StartTimeout = Duration(5 * time.Minute)
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = Duration(DefaultWriteTimeout)
	}
	if c.Restart.ResetAfter == 0 {
		c.Restart.ResetAfter = Duration(5 * time.Minute)
	}
	if c.Liveness.Interval == 0 {
		c.Liveness.Interval = Duration(5 * time.Second)
	}
	if c.Liveness.Timeout == 0 {
		c.Liveness.Timeout = Duration(5 * time.Second)
	}
	if c.Liveness.Failures == 0 {
		c.Liveness.Failures = 3
	}
	if c.Shutdown.Grace == 0 {
		c.Shutdown.Grace = Duration(2 * time.Second)
	}
	if c.Shutdown.DrainTimeout == 0 {
		c.Shutdown.DrainTimeout = Duration(60 * time.Second)
	}
	for i := range c.Groups {
		if c.Groups[i].Placement == "" {
			c.Groups[i].Placement = PlacementReplicated
		}
	}
}

func (c *Config) validateOps() error {
	if c.Queue.Size < 0 {
		return bad("$.queue.size", "queue.size", "must not be negative")
	}
	if c.Queue.Timeout < 0 {
		return bad("$.queue.timeout", "queue.timeout", "must be positive")
	}
	if c.Admin.Listen != "" && c.Admin.Token == "" && c.Admin.TokenEnv == "" {
		return bad("$.admin", "admin.token", "the admin API needs a token or token_env")
	}
	if c.Admin.Listen != "" {
		host, port, err := net.SplitHostPort(c.Admin.Listen)
		if err != nil {
			return bad("$.admin.listen", "admin.listen", "%q is not HOST:PORT", c.Admin.Listen)
		}
		if host == "" {
			// A bare ":PORT" would listen on every interface; the admin API stays local unless asked.
			c.Admin.Listen = net.JoinHostPort("127.0.0.1", port)
		} else if c.Admin.Token != "" && !c.AdminLoopback() && len(c.Admin.Token) < MinAdminTokenLen {
			return bad("$.admin.token", "admin.token", "admin.listen %s is not a loopback address, so the token must have at least %d characters (it has %d)",
				c.Admin.Listen, MinAdminTokenLen, len(c.Admin.Token))
		}
	}
	if c.WriteTimeout < 0 {
		return bad("$.write_timeout", "write_timeout", "must be positive")
	}
	if c.Restart.BackoffInitial < 0 || c.Restart.BackoffMax < c.Restart.BackoffInitial {
		return bad("$.restart", "restart.backoff_max", "must be at least restart.backoff_initial")
	}
	if c.Restart.MaxFailures < 0 {
		return bad("$.restart.max_failures", "restart.max_failures", "must be positive")
	}
	if c.Restart.ResetAfter < 0 {
		return bad("$.restart.reset_after", "restart.reset_after", "must be positive")
	}
	if c.Liveness.Interval < 0 {
		return bad("$.liveness.interval", "liveness.interval", "must be positive")
	}
	if c.Liveness.Timeout < 0 {
		return bad("$.liveness.timeout", "liveness.timeout", "must be positive")
	}
	if c.Liveness.Failures < 0 {
		return bad("$.liveness.failures", "liveness.failures", "must be at least 1")
	}
	for i, g := range c.Groups {
		p := fmt.Sprintf("$.groups[%d]", i)
		k := fmt.Sprintf("groups[%d]", i)
		switch g.Placement {
		case PlacementReplicated:
		case PlacementSplit:
			if c.Provider != ProviderCUDA || len(g.GPUs) < 2 {
				return bad(p+".placement", k+".placement", "group %q: split placement needs provider cuda and at least 2 GPUs (it has %d)", g.Name, len(g.GPUs))
			}
		default:
			return bad(p+".placement", k+".placement", "group %q: %q is not replicated or split", g.Name, g.Placement)
		}
		if g.GPUMemoryLimit != "" {
			if c.Provider != ProviderCUDA {
				return bad(p+".gpu_memory_limit", k+".gpu_memory_limit", "group %q: a GPU memory limit needs provider cuda", g.Name)
			}
			l, err := ParseMemoryLimit(g.GPUMemoryLimit)
			if err != nil {
				return bad(p+".gpu_memory_limit", k+".gpu_memory_limit", "group %q: %v", g.Name, err)
			}
			c.Groups[i].GPUMemory = l
		}
		switch g.ArenaExtendStrategy {
		case "", "kNextPowerOfTwo", "kSameAsRequested":
		default:
			return bad(p+".arena_extend_strategy", k+".arena_extend_strategy", "group %q: %q is not kNextPowerOfTwo or kSameAsRequested", g.Name, g.ArenaExtendStrategy)
		}
	}
	return nil
}

// ParseMemoryLimit reads "8GiB", "512MiB", "1000000000" (bytes) or a fraction of the device such
// as "0.4".
func ParseMemoryLimit(s string) (tts.MemoryLimit, error) {
	b, f, err := parseMemoryLimit(s)
	return tts.MemoryLimit{Bytes: b, Fraction: f}, err
}

func parseMemoryLimit(s string) (bytes uint64, fraction float64, err error) {
	s = strings.TrimSpace(s)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(n), 64)
			if err != nil || v <= 0 {
				return 0, 0, fmt.Errorf("%q is not a size like 8GiB", s)
			}
			return uint64(v * float64(u.mult)), 0, nil
		}
	}
	if strings.Contains(s, ".") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f <= 0 || f > 1 {
			return 0, 0, fmt.Errorf("%q is neither a size like 8GiB nor a fraction of the device in (0, 1]", s)
		}
		return 0, f, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, 0, fmt.Errorf("%q is neither a size like 8GiB nor a fraction of the device like 0.4", s)
	}
	return n, 0, nil
}
