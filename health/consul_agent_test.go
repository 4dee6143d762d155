package health

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// These tests run the registrar against a real Consul agent (`consul agent -dev`), built by
// scripts/install-consul.sh (make test runs it) or found on PATH.

func consulBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("consul"); err == nil {
		return p
	}
	p, err := filepath.Abs("../third_party/consul/consul")
	if err == nil {
		if _, err = os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("VOXMUX_REQUIRE_CONSUL") != "" {
		t.Fatalf("no consul binary on PATH or at %s, and VOXMUX_REQUIRE_CONSUL is set", p)
	}
	t.Skipf("no consul binary on PATH or at %s: run scripts/install-consul.sh (make test does)", p)
	return ""
}

// devAgent is a dev-mode Consul agent on loopback, with fixed ports so that it can be restarted
// in place (a dev agent keeps no state across restarts, like an agent that lost its data).
type devAgent struct {
	t       *testing.T
	bin     string
	http    int
	dns     int
	serfLAN int
	serfWAN int
	server  int
	log     string
	cmd     *exec.Cmd
	exited  chan struct{}
}

func newDevAgent(t *testing.T) *devAgent {
	ports := freePorts(t, 5)
	a := &devAgent{t: t, bin: consulBinary(t), http: ports[0], dns: ports[1], serfLAN: ports[2], serfWAN: ports[3], server: ports[4],
		log: filepath.Join(t.TempDir(), "consul.log")}
	t.Cleanup(a.stop)
	return a
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

func (a *devAgent) addr() string { return "127.0.0.1:" + strconv.Itoa(a.http) }

func (a *devAgent) start() {
	a.t.Helper()
	logf, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		a.t.Fatal(err)
	}
	defer logf.Close()
	p := strconv.Itoa
	a.cmd = exec.Command(a.bin, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1", "-node", "voxmux-test",
		"-http-port", p(a.http), "-dns-port", p(a.dns), "-serf-lan-port", p(a.serfLAN), "-serf-wan-port", p(a.serfWAN),
		"-server-port", p(a.server), "-grpc-port", "-1", "-grpc-tls-port", "-1", "-log-level", "info")
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		a.t.Fatalf("start consul: %v", err)
	}
	a.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait() // a dev agent exits 1 on a signal: not a failure here
		close(exited)
	}(a.cmd, a.exited)
	c, err := api.NewClient(&api.Config{Address: a.addr()})
	if err != nil {
		a.t.Fatal(err)
	}
	a.eventually("the agent elects itself leader", func() bool {
		leader, err := c.Status().Leader()
		return err == nil && leader != ""
	})
}

func (a *devAgent) stop() {
	if a.cmd == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
	}
	a.cmd = nil
}

// eventually polls cond: the agent's checks and anti-entropy run on their own clocks, so the
// test waits for each state it expects (and fails, with the agent's log, if it never comes).
func (a *devAgent) eventually(what string, cond func() bool) {
	a.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(a.log)
			if len(logs) > 8000 {
				logs = logs[len(logs)-8000:]
			}
			a.t.Fatalf("timed out waiting until %s; consul log tail:\n%s", what, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lookup resolves name through the agent's DNS interface.
func (a *devAgent) lookup(name string) ([]string, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, "127.0.0.1:"+strconv.Itoa(a.dns))
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.LookupHost(ctx, name)
}

// countingAgent counts the calls that failed, to know the registrar saw an outage.
type countingAgent struct {
	Agent
	failed atomic.Int64
}

func (c *countingAgent) Service(ctx context.Context, id string) (*api.AgentService, error) {
	s, err := c.Agent.Service(ctx, id)
	if err != nil {
		c.failed.Add(1)
	}
	return s, err
}

func TestRegistrationWithRealConsulAgent(t *testing.T) {
	agent := newDevAgent(t)

	// The router stands in as /readyz on its own loopback address, so that DNS answering
	// 127.0.0.2 shows the registered address, not the agent's node address (127.0.0.1).
	var ready atomic.Bool
	ready.Store(true)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" && ready.Load() {
			fmt.Fprintln(w, "ready")
			return
		}
		http.Error(w, "no instance ready", http.StatusServiceUnavailable)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	id := ServiceID("voxmux", "test", port)

	client, err := api.NewClient(&api.Config{Address: agent.addr()})
	if err != nil {
		t.Fatal(err)
	}
	counting := &countingAgent{Agent: NewConsulAgent(client)}
	state, logs := newRouterState(), &logRecorder{}
	reg, err := NewRegistrar(counting, RegistrarConfig{
		ID: id, Address: "127.0.0.2", Port: port, Tags: []string{"tts"},
		CheckURL:      "http://" + ln.Addr().String() + "/readyz",
		CheckInterval: time.Second, CheckTimeout: time.Second,
		GroupService: "voxmux-group", ReconcileInterval: 200 * time.Millisecond, MaxBackoff: time.Second,
	}, state.get, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- reg.Run(context.Background()) }()

	passing := func(service string) []string {
		entries, _, err := client.Health().Service(service, "", true, nil)
		if err != nil {
			return nil
		}
		var ids []string
		for _, e := range entries {
			ids = append(ids, e.Service.ID)
		}
		slices.Sort(ids)
		return ids
	}
	resolves := func(want ...string) func() bool {
		return func() bool {
			addrs, err := agent.lookup("voxmux.service.consul.")
			if len(want) == 0 {
				return err != nil || len(addrs) == 0
			}
			return err == nil && slices.Equal(addrs, want)
		}
	}

	// Consul down at start-up: the registrar keeps trying and says so once.
	agent.eventually("the registrar has failed three times", func() bool { return counting.failed.Load() >= 3 })
	if n := logs.count("consul: agent unreachable"); n != 1 {
		t.Fatalf("%d outage logs, want 1: %v", n, logs.all())
	}

	agent.start()
	agent.eventually("the router is registered and passing", func() bool { return slices.Equal(passing("voxmux"), []string{id}) })
	// The pass that registered ends by saying the outage is over.
	agent.eventually("the registrar logs the end of the outage", func() bool { return logs.count("consul: agent reachable again") == 1 })
	if logs.count("consul: registered") != 1 {
		t.Errorf("logs = %v", logs.all())
	}
	svc, _, err := client.Agent().Service(id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if svc.Address != "127.0.0.2" || svc.Port != port || svc.Meta["model"] != "tiny" || svc.Meta["groups_ready"] != "1" ||
		svc.Meta["groups_total"] != "2" || svc.Meta["capacity"] != "16" || !slices.Equal(svc.Tags, []string{"tts"}) {
		t.Errorf("registered service = %+v", svc)
	}
	agent.eventually("DNS answers the router's address", resolves("127.0.0.2"))
	// Each group is its own instance, its TTL check passing only while the group is ready.
	agent.eventually("only the ready group passes", func() bool { return slices.Equal(passing("voxmux-group"), []string{id + "-group-g0"}) })

	// No group ready: /readyz answers 503, the check turns critical, DNS stops answering.
	ready.Store(false)
	state.set(func(s *RegistrationStatus) {
		s.GroupsReady, s.Capacity = 0, 0
		s.Groups[0].State, s.Groups[0].Ready = "unhealthy", false
	})
	reg.Changed()
	agent.eventually("the router's check is critical", func() bool { return len(passing("voxmux")) == 0 })
	agent.eventually("DNS has no address for voxmux", resolves())
	agent.eventually("no group passes", func() bool { return len(passing("voxmux-group")) == 0 })
	agent.eventually("the meta says no group is ready", func() bool {
		s, _, err := client.Agent().Service(id, nil)
		return err == nil && s.Meta["groups_ready"] == "0"
	})

	// Recovery: passing again, and back in DNS.
	ready.Store(true)
	state.set(func(s *RegistrationStatus) {
		s.GroupsReady, s.Capacity = 2, 32
		for i := range s.Groups {
			s.Groups[i].State, s.Groups[i].Ready = "ready", true
		}
	})
	reg.Changed()
	agent.eventually("the router passes again", func() bool { return slices.Equal(passing("voxmux"), []string{id}) })
	agent.eventually("DNS answers again", resolves("127.0.0.2"))
	agent.eventually("both groups pass", func() bool { return len(passing("voxmux-group")) == 2 })

	// The agent restarts and forgets everything: the registrar registers again.
	failed := counting.failed.Load()
	agent.stop()
	agent.eventually("the registrar noticed the agent gone", func() bool { return counting.failed.Load() > failed })
	agent.start()
	agent.eventually("the router is registered again and passing", func() bool { return slices.Equal(passing("voxmux"), []string{id}) })
	agent.eventually("DNS answers after the restart", resolves("127.0.0.2"))
	agent.eventually("the registrar logs the end of the second outage", func() bool { return logs.count("consul: agent reachable again") == 2 })
	if logs.count("consul: re-registered") != 1 || logs.count("consul: agent unreachable") != 2 {
		t.Errorf("want one re-registration and one outage log per outage; logs = %v", logs.all())
	}

	// Clean shutdown: /readyz answers 503 first, then the router deregisters, then it drains.
	ready.Store(false)
	if err := reg.Deregister(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	services, err := client.Agent().Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(services) != 0 {
		t.Errorf("left in the agent after Deregister: %v", services)
	}
	agent.eventually("the catalog has no voxmux", func() bool {
		s, _, err := client.Catalog().Service("voxmux", "", nil)
		return err == nil && len(s) == 0
	})
	agent.eventually("DNS has no address after shutdown", resolves())
}

// registerCounter counts registrations, to show the registrar leaves an unchanged service alone
// (registering again would restart its check).
type registerCounter struct {
	Agent
	n atomic.Int64
}

func (c *registerCounter) ServiceRegister(ctx context.Context, reg *api.AgentServiceRegistration) error {
	c.n.Add(1)
	return c.Agent.ServiceRegister(ctx, reg)
}

func TestRegistrarLeavesUnchangedServiceWithRealAgent(t *testing.T) {
	agent := newDevAgent(t)
	agent.start()
	client, err := api.NewClient(&api.Config{Address: agent.addr()})
	if err != nil {
		t.Fatal(err)
	}
	counter := &registerCounter{Agent: NewConsulAgent(client)}
	// The sparsest registration: no address (the node's), no tags, no voices, no groups.
	status := func() RegistrationStatus { return RegistrationStatus{Model: "tiny", GroupsTotal: 1} }
	reg, err := NewRegistrar(counter, RegistrarConfig{ID: "voxmux-sparse", Port: 1, CheckURL: "http://127.0.0.1:1/readyz", GroupService: "voxmux-group"}, status, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := reg.reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := counter.n.Load(); n != 1 {
		t.Errorf("%d registrations of an unchanged service, want 1", n)
	}
	if err := reg.Deregister(context.Background()); err != nil {
		t.Fatal(err)
	}
}
