package health

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// fakeAgent is an in-memory Consul agent for the registrar's logic; consul_agent_test.go runs
// the same registrar against a real agent.
type fakeAgent struct {
	mu        sync.Mutex
	services  map[string]*api.AgentServiceRegistration
	ttl       map[string][2]string // check ID -> status, output
	down      bool
	registers int
}

func newFakeAgent() *fakeAgent {
	return &fakeAgent{services: map[string]*api.AgentServiceRegistration{}, ttl: map[string][2]string{}}
}

var errDown = errors.New("dial tcp 127.0.0.1:8500: connect: connection refused")

func (a *fakeAgent) ServiceRegister(_ context.Context, reg *api.AgentServiceRegistration) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return errDown
	}
	a.services[reg.ID] = reg
	a.registers++
	return nil
}

func (a *fakeAgent) ServiceDeregister(_ context.Context, id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return errDown
	}
	delete(a.services, id)
	return nil
}

func (a *fakeAgent) Service(_ context.Context, id string) (*api.AgentService, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return nil, errDown
	}
	r, ok := a.services[id]
	if !ok {
		return nil, nil
	}
	return &api.AgentService{ID: r.ID, Service: r.Name, Address: r.Address, Port: r.Port, Tags: r.Tags, Meta: r.Meta}, nil
}

func (a *fakeAgent) UpdateTTL(_ context.Context, checkID, output, status string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return errDown
	}
	a.ttl[checkID] = [2]string{status, output}
	return nil
}

func (a *fakeAgent) get(id string) *api.AgentServiceRegistration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.services[id]
}

// logRecorder keeps the messages logged at or above Info.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.msgs)
}

func (l *logRecorder) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// routerState stands in for the pool: what the status callback reports.
type routerState struct {
	mu sync.Mutex
	st RegistrationStatus
}

func (s *routerState) get() RegistrationStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *routerState) set(f func(*RegistrationStatus)) {
	s.mu.Lock()
	f(&s.st)
	s.mu.Unlock()
}

func newRouterState() *routerState {
	return &routerState{st: RegistrationStatus{
		Model: "tiny", Voices: []string{"default", "alto"}, GroupsReady: 1, GroupsTotal: 2, Capacity: 16,
		Groups: []GroupStatus{{Name: "g0", State: "ready", Ready: true, GPUs: []int{0, 1}}, {Name: "g1", State: "unhealthy", GPUs: []int{2}}},
	}}
}

func TestRegistrarReconcile(t *testing.T) {
	agent, state, logs := newFakeAgent(), newRouterState(), &logRecorder{}
	r, err := NewRegistrar(agent, RegistrarConfig{
		ID: "voxmux-host-8080", Address: "10.0.0.7", Port: 8080, Tags: []string{"tts"},
		CheckURL: "http://10.0.0.7:8080/readyz",
	}, state.get, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	reg := agent.get("voxmux-host-8080")
	if reg == nil {
		t.Fatal("not registered")
	}
	if reg.Name != "voxmux" || reg.Address != "10.0.0.7" || reg.Port != 8080 || strings.Join(reg.Tags, ",") != "tts" {
		t.Errorf("registration = %+v", reg)
	}
	wantMeta := map[string]string{"model": "tiny", "voices": "default,alto", "groups_ready": "1", "groups_total": "2", "capacity": "16"}
	for k, v := range wantMeta {
		if reg.Meta[k] != v {
			t.Errorf("meta %s = %q, want %q", k, reg.Meta[k], v)
		}
	}
	c := reg.Check
	if c.HTTP != "http://10.0.0.7:8080/readyz" || c.Interval != "2s" || c.Timeout != "1s" || c.DeregisterCriticalServiceAfter != "1m0s" || c.Status != api.HealthPassing {
		t.Errorf("check = %+v", c)
	}
	if logs.count("consul: registered") != 1 {
		t.Errorf("logs = %v", logs.all())
	}

	// Nothing changed: nothing is registered again (a re-registration resets the check).
	if err := r.reconcile(ctx); err != nil || agent.registers != 1 {
		t.Fatalf("second reconcile: %v, %d registrations", err, agent.registers)
	}

	// A group went down: the meta follows, and the check starts from critical.
	state.set(func(s *RegistrationStatus) { s.GroupsReady, s.Capacity = 0, 0 })
	if err := r.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	reg = agent.get("voxmux-host-8080")
	if agent.registers != 2 || reg.Meta["groups_ready"] != "0" || reg.Meta["capacity"] != "0" || reg.Check.Status != api.HealthCritical {
		t.Errorf("after the change: %d registrations, %+v %+v", agent.registers, reg.Meta, reg.Check)
	}

	// The agent lost its state (restarted): registered again, and said so.
	agent.mu.Lock()
	agent.services = map[string]*api.AgentServiceRegistration{}
	agent.mu.Unlock()
	if err := r.reconcile(ctx); err != nil || agent.get("voxmux-host-8080") == nil {
		t.Fatalf("after the agent lost state: %v", err)
	}
	if logs.count("consul: re-registered") != 1 {
		t.Errorf("logs = %v", logs.all())
	}
}

func TestRegistrarOutageLogsOnce(t *testing.T) {
	agent, state, logs := newFakeAgent(), newRouterState(), &logRecorder{}
	agent.down = true
	r, _ := NewRegistrar(agent, RegistrarConfig{ID: "v-1", CheckURL: "http://127.0.0.1:1/readyz"}, state.get, slog.New(logs))
	for range 3 {
		if err := r.reconcile(context.Background()); err == nil {
			t.Fatal("reconcile with the agent down succeeded")
		}
	}
	if n := logs.count("consul: agent unreachable"); n != 1 {
		t.Fatalf("%d outage logs for one outage, want 1: %v", n, logs.all())
	}
	agent.mu.Lock()
	agent.down = false
	agent.mu.Unlock()
	if err := r.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if logs.count("consul: agent reachable again") != 1 || agent.get("v-1") == nil {
		t.Fatalf("after the outage: %v", logs.all())
	}
	agent.mu.Lock()
	agent.down = true
	agent.mu.Unlock()
	_ = r.reconcile(context.Background())
	_ = r.reconcile(context.Background())
	if n := logs.count("consul: agent unreachable"); n != 2 {
		t.Fatalf("%d outage logs for two outages, want 2", n)
	}
}

func TestRegistrarGroupServices(t *testing.T) {
	agent, state := newFakeAgent(), newRouterState()
	r, _ := NewRegistrar(agent, RegistrarConfig{ID: "v-1", Port: 8080, CheckURL: "http://127.0.0.1:8080/readyz", GroupService: "voxmux-group"}, state.get, nil)
	if err := r.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	g0, g1 := agent.get("v-1-group-g0"), agent.get("v-1-group-g1")
	if g0 == nil || g1 == nil {
		t.Fatalf("group services: %v", agent.services)
	}
	if g0.Name != "voxmux-group" || g0.Port != 8080 || g0.Meta["gpus"] != "0,1" || g0.Meta["router_id"] != "v-1" || g0.Check.TTL != "15s" {
		t.Errorf("g0 = %+v %+v", g0, g0.Check)
	}
	if got := agent.ttl["v-1-group-g0:state"]; got != [2]string{api.HealthPassing, "group g0: ready"} {
		t.Errorf("g0 TTL = %v", got)
	}
	if got := agent.ttl["v-1-group-g1:state"]; got != [2]string{api.HealthCritical, "group g1: unhealthy"} {
		t.Errorf("g1 TTL = %v", got)
	}
	state.set(func(s *RegistrationStatus) { s.Groups[1].State, s.Groups[1].Ready = "ready", true })
	if err := r.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := agent.ttl["v-1-group-g1:state"]; got != [2]string{api.HealthPassing, "group g1: ready"} {
		t.Errorf("g1 TTL after recovery = %v", got)
	}
	if err := r.Deregister(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(agent.services) != 0 {
		t.Errorf("left after Deregister: %v", agent.services)
	}
}

func TestDeregisterStopsRun(t *testing.T) {
	agent, state := newFakeAgent(), newRouterState()
	r, _ := NewRegistrar(agent, RegistrarConfig{ID: "v-1", CheckURL: "http://127.0.0.1:8080/readyz", ReconcileInterval: time.Millisecond}, state.get, nil)
	done := make(chan error)
	go func() { done <- r.Run(context.Background()) }()
	for agent.get("v-1") == nil {
		time.Sleep(time.Millisecond)
	}
	if err := r.Deregister(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := r.reconcile(context.Background()); !errors.Is(err, errStopped) || agent.get("v-1") != nil {
		t.Fatalf("registered again after Deregister: %v", err)
	}
}

func TestNilRegistrarIsConsulOff(t *testing.T) {
	var r *Registrar
	r.Changed()
	if err := r.Run(context.Background()); err != nil {
		t.Error(err)
	}
	if err := r.Deregister(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestRegistrarConfigErrors(t *testing.T) {
	if _, err := NewRegistrar(newFakeAgent(), RegistrarConfig{CheckURL: "http://x/readyz"}, nil, nil); err == nil {
		t.Error("empty ID accepted")
	}
	if _, err := NewRegistrar(newFakeAgent(), RegistrarConfig{ID: "x"}, nil, nil); err == nil {
		t.Error("empty check URL accepted")
	}
}

func TestClip(t *testing.T) {
	if got := clip("alpha,beta,gamma", 12); got != "alpha,beta" {
		t.Errorf("clip = %q", got)
	}
	if got := clip("alpha", 12); got != "alpha" {
		t.Errorf("clip = %q", got)
	}
	if got := ServiceID("voxmux", "host1", 8080); got != "voxmux-host1-8080" {
		t.Errorf("ServiceID = %q", got)
	}
}
