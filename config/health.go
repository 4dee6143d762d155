package config

import (
	"fmt"
	"path/filepath"
	"regexp"
)

// Health tunes GPU health monitoring (NVML) and the recovery of unhealthy groups. Zero values
// take the defaults named below (applied where the values are used, in package health).
type Health struct {
	// IgnoredXids are application-caused Xids that leave a GPU healthy. Unset means
	// 13, 31, 43, 45, 68, 109; an empty list ignores none.
	IgnoredXids []uint64 `yaml:"ignored_xids"`
	// MaxTemperature (°C) above which a GPU is unhealthy; 0 means each GPU's own slowdown
	// threshold (90 when it reports none).
	MaxTemperature int `yaml:"max_temperature"`
	// PollInterval is how often GPU figures are read (default 1s).
	PollInterval Duration `yaml:"poll_interval"`
	// RecoveryPasses is how many probes in a row an unhealthy group must pass (default 3).
	RecoveryPasses int `yaml:"recovery_passes"`
	// ProbeInterval is the pause between recovery probes (default 10s).
	ProbeInterval Duration `yaml:"probe_interval"`
	// RestartUnhealthy restarts an unhealthy group's instances once its in-flight requests are
	// done (default true).
	RestartUnhealthy *bool `yaml:"restart_unhealthy"`
}

// Restart reports whether unhealthy groups are restarted.
func (h Health) Restart() bool { return h.RestartUnhealthy == nil || *h.RestartUnhealthy }

// Consul registers the router as a service in the local Consul agent.
type Consul struct {
	Enabled bool `yaml:"enabled"`
	// Address of the agent's HTTP API, e.g. 127.0.0.1:8500 or https://127.0.0.1:8501; empty means
	// $CONSUL_HTTP_ADDR, then 127.0.0.1:8500.
	Address string `yaml:"address"`
	// Token is the ACL token; empty means token_file, then $CONSUL_HTTP_TOKEN.
	Token      string    `yaml:"token"`
	TokenFile  string    `yaml:"token_file"`
	Datacenter string    `yaml:"datacenter"`
	TLS        ConsulTLS `yaml:"tls"`
	// Service is the name clients resolve, <service>.service.consul (default voxmux).
	Service string `yaml:"service"`
	// ServiceID is unique per host and port (default <service>-<hostname>-<port>).
	ServiceID string `yaml:"service_id"`
	// Advertise is the address registered for clients; empty means the listen host, or the
	// agent's node address when listening on all interfaces.
	Advertise string   `yaml:"advertise"`
	Tags      []string `yaml:"tags"`
	// CheckInterval and CheckTimeout of the agent's HTTP check of /readyz (default 2s, 1s).
	CheckInterval Duration `yaml:"check_interval"`
	CheckTimeout  Duration `yaml:"check_timeout"`
	// DeregisterCriticalAfter removes a registration critical this long (default 1m).
	DeregisterCriticalAfter Duration `yaml:"deregister_critical_after"`
	// GroupService, when set, registers each group as an instance of this service with a TTL
	// check that mirrors the group's state.
	GroupService string `yaml:"group_service"`
	// ReconcileInterval is how often the registration is checked against the agent (default 5s).
	ReconcileInterval Duration `yaml:"reconcile_interval"`
}

// ConsulTLS configures TLS to the agent; empty fields fall back to the CONSUL_* variables.
type ConsulTLS struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// serviceName is what Consul's DNS interface can answer for.
var serviceName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$`)

func (c *Config) validateHealth() error {
	h := c.Health
	if h.MaxTemperature < 0 || h.MaxTemperature > 150 {
		return bad("$.health.max_temperature", "health.max_temperature", "%d is not a temperature in °C between 1 and 150 (0 means the GPU's own limit)", h.MaxTemperature)
	}
	if h.PollInterval < 0 {
		return bad("$.health.poll_interval", "health.poll_interval", "must be positive")
	}
	if h.ProbeInterval < 0 {
		return bad("$.health.probe_interval", "health.probe_interval", "must be positive")
	}
	if h.RecoveryPasses < 0 {
		return bad("$.health.recovery_passes", "health.recovery_passes", "must be at least 1")
	}
	k := c.Consul
	for _, f := range []struct{ key, v string }{{"service", k.Service}, {"group_service", k.GroupService}} {
		if f.v != "" && !serviceName.MatchString(f.v) {
			return bad("$.consul."+f.key, "consul."+f.key, "%q is not a DNS label (letters, digits and '-')", f.v)
		}
	}
	if k.Service != "" && k.Service == k.GroupService {
		return bad("$.consul.group_service", "consul.group_service", "must differ from consul.service, or clients would resolve groups as routers")
	}
	for _, f := range []struct {
		key string
		d   Duration
	}{{"check_interval", k.CheckInterval}, {"check_timeout", k.CheckTimeout},
		{"deregister_critical_after", k.DeregisterCriticalAfter}, {"reconcile_interval", k.ReconcileInterval}} {
		if f.d < 0 {
			return bad("$.consul."+f.key, "consul."+f.key, "must be positive")
		}
	}
	if (k.TLS.CertFile == "") != (k.TLS.KeyFile == "") {
		return bad("$.consul.tls", "consul.tls", "cert_file and key_file go together")
	}
	if k.Token != "" && k.TokenFile != "" {
		return bad("$.consul.token_file", "consul.token_file", "set token or token_file, not both")
	}
	for i, t := range k.Tags {
		if t == "" {
			return bad(fmt.Sprintf("$.consul.tags[%d]", i), fmt.Sprintf("consul.tags[%d]", i), "is empty")
		}
	}
	return nil
}

// Path resolves a path written in the config file (relative to the file's folder).
func (c *Config) Path(p string) string {
	if p == "" || c.File == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(c.File), p)
}
