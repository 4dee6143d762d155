package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/consul/api"

	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/health"
)

// Construction of the health clients from the config, for serve: the GPU monitor (NVML) and the
// Consul registrar. Environment variables are read here, in main, and nowhere in health/.

// monitorConfig maps the config's health: section.
func monitorConfig(h config.Health) health.MonitorConfig {
	return health.MonitorConfig{IgnoredXids: h.IgnoredXids, MaxTemperature: h.MaxTemperature, PollInterval: h.PollInterval.Std()}
}

// recoveryConfig maps the config's health: section onto a group recovery; the caller sets Probe.
func recoveryConfig(h config.Health) health.Recovery {
	return health.Recovery{Passes: h.RecoveryPasses, Interval: h.ProbeInterval.Std()}
}

// openGPUMonitor opens NVML when a group has GPUs. A host with CPU groups only, or without the
// NVIDIA driver, gets nil (which health.Monitor's methods take as a host without GPUs), said
// once in the log.
func openGPUMonitor(log *slog.Logger, cfg *config.Config) *health.Monitor {
	gpus := false
	for _, g := range cfg.Groups {
		gpus = gpus || len(g.GPUs) > 0
	}
	if !gpus {
		log.Info("GPU health monitoring off: no group has GPUs, NVML not used")
		return nil
	}
	m, err := health.NewMonitor(health.NewNVML(nvml.New()), monitorConfig(cfg.Health), log.With("component", "gpu-health"))
	if err != nil {
		log.Warn("GPU health monitoring off", "error", err)
		return nil
	}
	for _, g := range m.Snapshot() {
		log.Info("GPU", "index", g.Index, "uuid", g.UUID, "name", g.Name, "healthy", g.Healthy, "reason", g.Reason)
	}
	return m
}

// consulAPIConfig is consul/api's default (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN,
// CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY,
// CONSUL_TLS_SERVER_NAME, CONSUL_HTTP_SSL_VERIFY, else 127.0.0.1:8500), with what the config
// file sets on top.
func consulAPIConfig(cfg *config.Config) *api.Config {
	c := api.DefaultConfig()
	k := cfg.Consul
	if k.Address != "" {
		c.Address = k.Address
	}
	switch {
	case k.Token != "":
		c.Token, c.TokenFile = k.Token, ""
	case k.TokenFile != "":
		c.TokenFile = cfg.Path(k.TokenFile)
	}
	if k.Datacenter != "" {
		c.Datacenter = k.Datacenter
	}
	if k.TLS.CAFile != "" {
		c.TLSConfig.CAFile = cfg.Path(k.TLS.CAFile)
	}
	if k.TLS.CertFile != "" {
		c.TLSConfig.CertFile, c.TLSConfig.KeyFile = cfg.Path(k.TLS.CertFile), cfg.Path(k.TLS.KeyFile)
	}
	if k.TLS.ServerName != "" {
		c.TLSConfig.Address = k.TLS.ServerName
	}
	if k.TLS.InsecureSkipVerify {
		c.TLSConfig.InsecureSkipVerify = true
	}
	return c
}

// registrarConfig describes the router at addr (the address it really listens on) for Consul.
// The agent checks /readyz from this host: through loopback when the router listens on all
// interfaces, else on the address it listens on.
func registrarConfig(cfg *config.Config, addr net.Addr, hostname string) (health.RegistrarConfig, error) {
	k := cfg.Consul
	host, portS, err := net.SplitHostPort(addr.String())
	if err != nil {
		return health.RegistrarConfig{}, fmt.Errorf("consul: listen address %s: %w", addr, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return health.RegistrarConfig{}, fmt.Errorf("consul: listen port %s: %w", portS, err)
	}
	checkHost, advertise := host, k.Advertise
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		checkHost = "127.0.0.1"
	} else if advertise == "" {
		advertise = host
	}
	service := k.Service
	if service == "" {
		service = health.DefaultService
	}
	id := k.ServiceID
	if id == "" {
		id = health.ServiceID(service, hostname, port)
	}
	return health.RegistrarConfig{
		Service:           service,
		ID:                id,
		Address:           advertise,
		Port:              port,
		Tags:              k.Tags,
		CheckURL:          "http://" + net.JoinHostPort(checkHost, portS) + "/readyz",
		CheckInterval:     k.CheckInterval.Std(),
		CheckTimeout:      k.CheckTimeout.Std(),
		DeregisterAfter:   k.DeregisterCriticalAfter.Std(),
		GroupService:      k.GroupService,
		ReconcileInterval: k.ReconcileInterval.Std(),
	}, nil
}

// newRegistrar builds the Consul registrar for the router listening at addr; nil when the
// config leaves Consul off. status is called on every reconcile (build it from the pool).
func newRegistrar(log *slog.Logger, cfg *config.Config, addr net.Addr, status func() health.RegistrationStatus) (*health.Registrar, error) {
	if !cfg.Consul.Enabled {
		return nil, nil
	}
	client, err := api.NewClient(consulAPIConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("config %s: consul: %w", cfg.File, err)
	}
	hostname, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("consul: service ID: %w", err)
	}
	rc, err := registrarConfig(cfg, addr, hostname)
	if err != nil {
		return nil, err
	}
	return health.NewRegistrar(health.NewConsulAgent(client), rc, status, log.With("component", "consul"))
}
