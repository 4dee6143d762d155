package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// Agent is the part of the local Consul agent's API the registrar uses.
type Agent interface {
	ServiceRegister(ctx context.Context, reg *api.AgentServiceRegistration) error
	// ServiceDeregister succeeds when the agent does not know the service.
	ServiceDeregister(ctx context.Context, id string) error
	// Service returns the service registered under id, or nil (and no error) when there is none.
	Service(ctx context.Context, id string) (*api.AgentService, error)
	UpdateTTL(ctx context.Context, checkID, output, status string) error
}

// NewConsulAgent adapts a consul/api client (built in main from api.DefaultConfig(), which reads
// CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN and the CONSUL_* TLS variables, plus the config file).
func NewConsulAgent(c *api.Client) Agent { return consulAgent{c.Agent()} }

type consulAgent struct{ a *api.Agent }

func (c consulAgent) ServiceRegister(ctx context.Context, reg *api.AgentServiceRegistration) error {
	// ReplaceExistingChecks drops checks an older voxmux registered under the same ID.
	return c.a.ServiceRegisterOpts(reg, api.ServiceRegisterOpts{ReplaceExistingChecks: true}.WithContext(ctx))
}

func (c consulAgent) ServiceDeregister(ctx context.Context, id string) error {
	err := c.a.ServiceDeregisterOpts(id, (&api.QueryOptions{}).WithContext(ctx))
	if isNotFound(err) {
		return nil
	}
	return err
}

func (c consulAgent) Service(ctx context.Context, id string) (*api.AgentService, error) {
	s, _, err := c.a.Service(id, (&api.QueryOptions{}).WithContext(ctx))
	if isNotFound(err) {
		return nil, nil
	}
	return s, err
}

func (c consulAgent) UpdateTTL(ctx context.Context, checkID, output, status string) error {
	return c.a.UpdateTTLOpts(checkID, output, status, (&api.QueryOptions{}).WithContext(ctx))
}

func isNotFound(err error) bool {
	var se api.StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}

// RegistrationStatus is what the registrar publishes of the router; the Status callback builds
// it from the pool each time the registrar reconciles.
type RegistrationStatus struct {
	Model       string
	Voices      []string
	GroupsReady int
	GroupsTotal int
	// Capacity is how many requests the ready groups accept at once.
	Capacity int
	Groups   []GroupStatus
}

// GroupStatus is one GPU group, for its own service instance (RegistrarConfig.GroupService).
type GroupStatus struct {
	Name  string
	State string // the supervisor's word: starting, ready, draining, restarting, unhealthy, failed
	Ready bool   // in rotation
	GPUs  []int
}

// Defaults of RegistrarConfig.
const (
	DefaultService           = "voxmux"
	DefaultCheckInterval     = 2 * time.Second
	DefaultCheckTimeout      = time.Second
	DefaultDeregisterAfter   = time.Minute
	DefaultReconcileInterval = 5 * time.Second
	DefaultMaxBackoff        = 30 * time.Second
)

// RegistrarConfig says how the router appears in Consul; zero values take the defaults.
type RegistrarConfig struct {
	// Service is the service name clients resolve (<Service>.service.consul).
	Service string
	// ID is unique per host and port (see ServiceID).
	ID string
	// Address is the address clients reach the router on; empty means the agent's node address.
	Address string
	Port    int
	Tags    []string
	// CheckURL is the router's /readyz as the agent reaches it.
	CheckURL        string
	CheckInterval   time.Duration
	CheckTimeout    time.Duration
	DeregisterAfter time.Duration // DeregisterCriticalServiceAfter
	// GroupService, when set, registers each group as an instance of this service, with a TTL
	// check that mirrors the group's state.
	GroupService string
	// ReconcileInterval is how often the registration is compared with the agent's.
	ReconcileInterval time.Duration
	// MaxBackoff bounds the retry pause while the agent is unreachable.
	MaxBackoff time.Duration
}

// ServiceID is the default registration ID: unique per host and port, stable across restarts
// so that a restarted router replaces its old entry.
func ServiceID(service, host string, port int) string {
	return fmt.Sprintf("%s-%s-%d", service, host, port)
}

// Registrar keeps the router registered in the local Consul agent while it runs: it registers,
// re-registers when the agent lost the service (an agent restart), updates the meta as groups
// come and go, feeds the groups' TTL checks, and keeps retrying while the agent is down. Consul
// being unreachable never stops the router serving. A nil *Registrar (Consul off) does nothing.
type Registrar struct {
	agent  Agent
	cfg    RegistrarConfig
	status func() RegistrationStatus
	log    *slog.Logger
	wake   chan struct{}

	// op serialises reconciling with Deregister, so that nothing is registered after it.
	op         sync.Mutex
	stopped    bool
	registered bool
	down       bool
}

// NewRegistrar makes a registrar; status is called on every reconcile.
func NewRegistrar(agent Agent, cfg RegistrarConfig, status func() RegistrationStatus, log *slog.Logger) (*Registrar, error) {
	if cfg.Service == "" {
		cfg.Service = DefaultService
	}
	if cfg.ID == "" {
		return nil, errors.New("consul registration: empty service ID")
	}
	if cfg.CheckURL == "" {
		return nil, errors.New("consul registration: empty check URL")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.CheckInterval, DefaultCheckInterval)
	def(&cfg.CheckTimeout, DefaultCheckTimeout)
	def(&cfg.DeregisterAfter, DefaultDeregisterAfter)
	def(&cfg.ReconcileInterval, DefaultReconcileInterval)
	def(&cfg.MaxBackoff, DefaultMaxBackoff)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registrar{agent: agent, cfg: cfg, status: status, log: log, wake: make(chan struct{}, 1)}, nil
}

// Changed asks for a reconcile now (a group changed state), instead of at the next interval.
func (r *Registrar) Changed() {
	if r == nil {
		return
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// callTimeout bounds one call to the agent, so that a hung agent is an outage, not a hang.
const callTimeout = 5 * time.Second

// Run reconciles until ctx ends or Deregister is called.
func (r *Registrar) Run(ctx context.Context) error {
	if r == nil {
		return nil
	}
	var backoff time.Duration
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.wake:
		}
		err := r.reconcile(ctx)
		if errors.Is(err, errStopped) {
			return nil
		}
		wait := r.cfg.ReconcileInterval
		if err != nil && ctx.Err() == nil {
			backoff = min(max(2*backoff, time.Second), r.cfg.MaxBackoff)
			wait = backoff
		} else {
			backoff = 0
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
	}
}

var errStopped = errors.New("deregistered")

// reconcile makes the agent's view match the router's, once.
func (r *Registrar) reconcile(ctx context.Context) error {
	r.op.Lock()
	defer r.op.Unlock()
	if r.stopped {
		return errStopped
	}
	err := r.sync(ctx)
	switch {
	case err != nil && ctx.Err() == nil && !r.down:
		r.down = true
		r.log.Warn("consul: agent unreachable; serving on and retrying with backoff", "error", err)
	case err == nil && r.down:
		r.down = false
		r.log.Info("consul: agent reachable again")
	}
	return err
}

func (r *Registrar) call(ctx context.Context, f func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return f(cctx)
}

func (r *Registrar) sync(ctx context.Context) error {
	st := r.status()
	want := r.registration(st)
	if err := r.ensure(ctx, want); err != nil {
		return err
	}
	if r.cfg.GroupService == "" {
		return nil
	}
	for _, g := range st.Groups {
		reg := r.groupRegistration(g)
		if err := r.ensure(ctx, reg); err != nil {
			return err
		}
		status, output := api.HealthCritical, "group "+g.Name+": "+g.State
		if g.Ready {
			status = api.HealthPassing
		}
		if err := r.call(ctx, func(c context.Context) error { return r.agent.UpdateTTL(c, reg.Check.CheckID, output, status) }); err != nil {
			return fmt.Errorf("consul: update TTL of %s: %w", reg.ID, err)
		}
	}
	return nil
}

// ensure registers want unless the agent already has it as it is.
func (r *Registrar) ensure(ctx context.Context, want *api.AgentServiceRegistration) error {
	var have *api.AgentService
	err := r.call(ctx, func(c context.Context) (err error) { have, err = r.agent.Service(c, want.ID); return err })
	if err != nil {
		return fmt.Errorf("consul: read service %s: %w", want.ID, err)
	}
	if have != nil && same(have, want) {
		return nil
	}
	if err := r.call(ctx, func(c context.Context) error { return r.agent.ServiceRegister(c, want) }); err != nil {
		return fmt.Errorf("consul: register %s: %w", want.ID, err)
	}
	switch {
	case want.ID != r.cfg.ID:
	case have == nil && r.registered:
		r.log.Warn("consul: re-registered; the agent had lost the service (restarted?)", "id", want.ID, "service", want.Name)
	case have == nil:
		r.log.Info("consul: registered", "id", want.ID, "service", want.Name, "check", r.cfg.CheckURL)
	}
	if want.ID == r.cfg.ID {
		r.registered = true
	}
	return nil
}

// same reports whether the agent's service is the registration wanted (the fields voxmux sets).
func same(have *api.AgentService, want *api.AgentServiceRegistration) bool {
	return have.Service == want.Name && have.Address == want.Address && have.Port == want.Port &&
		slices.Equal(nonNil(have.Tags), nonNil(want.Tags)) && maps.Equal(have.Meta, want.Meta)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// maxMetaValue is Consul's limit on a meta value.
const maxMetaValue = 512

func (r *Registrar) registration(st RegistrationStatus) *api.AgentServiceRegistration {
	initial := api.HealthCritical
	if st.GroupsReady > 0 {
		initial = api.HealthPassing // what /readyz says too; saves a flap until the first check
	}
	return &api.AgentServiceRegistration{
		ID:      r.cfg.ID,
		Name:    r.cfg.Service,
		Address: r.cfg.Address,
		Port:    r.cfg.Port,
		Tags:    slices.Clone(r.cfg.Tags),
		Meta: map[string]string{
			"model":        st.Model,
			"voices":       clip(strings.Join(st.Voices, ","), maxMetaValue),
			"groups_ready": strconv.Itoa(st.GroupsReady),
			"groups_total": strconv.Itoa(st.GroupsTotal),
			"capacity":     strconv.Itoa(st.Capacity),
		},
		Check: &api.AgentServiceCheck{
			CheckID:                        r.cfg.ID + ":readyz",
			Name:                           "voxmux /readyz",
			HTTP:                           r.cfg.CheckURL,
			Method:                         http.MethodGet,
			Interval:                       r.cfg.CheckInterval.String(),
			Timeout:                        r.cfg.CheckTimeout.String(),
			Status:                         initial,
			DeregisterCriticalServiceAfter: r.cfg.DeregisterAfter.String(),
		},
	}
}

// groupTTL is how long a group's check stays as last set: several reconciles, so that only a
// router that stopped reconciling (hung or killed) lets it lapse to critical.
func (r *Registrar) groupTTL() time.Duration {
	return max(3*r.cfg.ReconcileInterval, 10*time.Second)
}

func (r *Registrar) groupID(name string) string { return r.cfg.ID + "-group-" + name }

func (r *Registrar) groupRegistration(g GroupStatus) *api.AgentServiceRegistration {
	gpus := make([]string, len(g.GPUs))
	for i, x := range g.GPUs {
		gpus[i] = strconv.Itoa(x)
	}
	id := r.groupID(g.Name)
	return &api.AgentServiceRegistration{
		ID:      id,
		Name:    r.cfg.GroupService,
		Address: r.cfg.Address,
		Port:    r.cfg.Port,
		Tags:    []string{"group-" + g.Name},
		Meta:    map[string]string{"group": g.Name, "gpus": strings.Join(gpus, ","), "router_id": r.cfg.ID},
		Check: &api.AgentServiceCheck{
			CheckID:                        id + ":state",
			Name:                           "voxmux group " + g.Name,
			TTL:                            r.groupTTL().String(),
			Status:                         api.HealthCritical,
			DeregisterCriticalServiceAfter: r.cfg.DeregisterAfter.String(),
		},
	}
}

// clip cuts s to at most n bytes at a comma, so a long voice list stays a list.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	if i := strings.LastIndexByte(s, ','); i > 0 {
		return s[:i]
	}
	return s
}

// Deregister removes the router (and its groups) from the agent and stops Run from registering
// again. Call it after /readyz answers 503 and before draining, so clients stop resolving this
// host while its in-flight requests finish.
func (r *Registrar) Deregister(ctx context.Context) error {
	if r == nil {
		return nil
	}
	r.op.Lock()
	defer r.op.Unlock()
	r.stopped = true
	r.Changed() // let Run return now
	ids := []string{r.cfg.ID}
	if r.cfg.GroupService != "" {
		for _, g := range r.status().Groups {
			ids = append(ids, r.groupID(g.Name))
		}
	}
	var errs []error
	for _, id := range ids {
		if err := r.agent.ServiceDeregister(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("consul: deregister %s: %w", id, err))
		}
	}
	if len(errs) == 0 {
		r.log.Info("consul: deregistered", "id", r.cfg.ID)
	}
	return errors.Join(errs...)
}
